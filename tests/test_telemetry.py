"""Telemetry accounting: splitting time blocked in lock-step collectives into waiting and communicating."""
from hvd_elastic.telemetry import build_report, format_report


def _snap(rank, blocked, compute, wall):
    return {"rank": rank, "steps": len(blocked), "wall_s": wall, "compute_s": compute, "wait_s": 0.0,
            "comm_s": 0.0, "emulated_s": 0.0, "blocked": blocked, "counters": {}}


def test_last_arriver_blocks_only_for_communication_and_others_wait():
    # Rank 1 is the straggler: it arrives last each step and blocks 1 ms (the transfer); rank 0 blocks 21 ms.
    snaps = [_snap(0, [0.021, 0.021], 0.010, 0.070), _snap(1, [0.001, 0.001], 0.060, 0.070)]
    rep = build_report(snaps, "bsp", {})
    r0, r1 = rep["ranks"]
    assert abs(r0["comm_s"] - 0.002) < 1e-12 and abs(r0["wait_s"] - 0.040) < 1e-12
    assert abs(r1["comm_s"] - 0.002) < 1e-12 and abs(r1["wait_s"]) < 1e-12
    assert abs(r0["compute_share"] + r0["wait_share"] + r0["comm_share"] - 52 / 70) < 1e-9
    text = format_report(rep)
    assert "policy=bsp, 2 ranks" in text and len(text.splitlines()) == 4


def test_the_elastic_line_gives_the_longest_reset_and_the_longest_wait_before_one():
    # rank 1 waited 10.4 s in a step before the first reset began (a lost worker noticed at Gloo's timeout)
    snaps = [_snap(0, [0.001], 0.010, 30.0), _snap(1, [0.001], 0.010, 30.0)]
    snaps[0]["counters"] = {"elastic_resets": 2, "elastic_reset_s": 6.5, "elastic_before_reset_s": [0.2, 0.05]}
    snaps[1]["counters"] = {"elastic_resets": 2, "elastic_reset_s": 4.0, "elastic_before_reset_s": [10.4, 0.1]}
    line = [ln for ln in format_report(build_report(snaps, "asp", {})).splitlines() if ln.startswith("elastic")][0]
    assert "2 reset(s)" in line and "took 6.50 s from a reset" in line and "up to 10.40 s passed" in line, line
