"""The README's demo under bsp: it learns, and the telemetry shows the straggler's peers waiting (the problem)."""
import json

from launch import job_env, launch, run


def test_demo_learns_and_fast_ranks_wait_for_the_straggler_under_bsp(tmp_path):
    # The README's command itself (it sources ci/env.sh: its variables must not trip the plugin's settings check).
    report_path = tmp_path / "report.json"
    env = job_env({"HVD_ELASTIC_EMULATE_DELAY": "*:0.002,3:0.03", "HVD_ELASTIC_REPORT_JSON": str(report_path)})
    res = run(["bash", "ci/demo.sh", "horovodrun"], env, timeout=300)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    assert res.lines_with("[demo] policy=bsp emulate_delay=*:0.002,3:0.03 launcher=horovodrun")
    acc_lines = res.lines_with("test accuracy:")
    assert acc_lines, res.output[-3000:]
    acc = float(acc_lines[-1].split("test accuracy:")[1].split()[0])
    assert acc > 0.85, acc_lines
    assert res.lines_with("hvd_elastic report: policy=bsp, 4 ranks")
    report = json.loads(report_path.read_text())
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert len({r["steps"] for r in ranks}) == 1
    fast_wait = sum(r["wait_share"] for r in ranks[:3]) / 3
    # The straggler sleeps 15x longer than its peers each step: they spend a large share of time waiting for it,
    # far more than it waits. (It usually barely waits, but a fresh-clone CI run of the fifteenth session measured
    # fast ranks 0.54-0.77 and the straggler 0.34 under horovodrun on 2 loaded cores, so no ratio is asserted.)
    assert fast_wait > 0.4 and fast_wait > ranks[3]["wait_share"] + 0.2, [(r["rank"], r["wait_share"]) for r in ranks]
    assert ranks[3]["compute_share"] > max(r["compute_share"] for r in ranks[:3])


def test_demo_under_asp_learns_and_fast_ranks_stop_waiting(tmp_path):
    # Also the regression test for horovod.torch.broadcast_optimizer_state (the demo calls it) on a relaxed
    # optimizer: it used to push a dummy update and hang.
    report_path = tmp_path / "report.json"
    res = launch("mpirun", 4, "examples/torch_digits.py", [], timeout=240,
                 env={"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_EMULATE_DELAY": "*:0.002,3:0.03",
                      "HVD_ELASTIC_REPORT_JSON": str(report_path)})
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    acc = float(res.lines_with("test accuracy:")[-1].split("test accuracy:")[1].split()[0])
    assert acc > 0.85, acc
    ranks = json.loads(report_path.read_text())["ranks"]
    # Only peer alignment waits under asp (<= HVD_ELASTIC_PEER_WAIT=0.5 of a step: <= 33% of the wall clock, and
    # only for the equally fast ranks); waiting for the straggler would be most of it.
    assert all(r["wait_share"] < 0.34 for r in ranks), [(r["rank"], r["wait_share"]) for r in ranks]
    assert min(r["steps"] for r in ranks[:3]) > 2 * ranks[3]["steps"]
