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
