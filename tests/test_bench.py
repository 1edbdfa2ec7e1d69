"""The benchmark command (python -m hvd_elastic.bench) end to end, small: real 4-rank jobs under mpirun for
plain Horovod and asp (PyTorch) and asp (Keras) on the static-skew profile. Checks the pipeline and the files it
writes, not speed (speed figures live in docs/benchmarks.md, measured by the full command)."""
import csv
import json
import os
import subprocess
import sys

from launch import BIN, ROOT


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def test_quick_benchmark_writes_results_plots_and_table(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "hvd_elastic.bench", "--quick", "--frontends", "torch,keras",
                           "--policies", "horovod,asp", "--out", str(out)], cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:]
    # progress: one line per job, numbered
    assert [l.split("]")[0] for l in proc.stdout.splitlines() if l.startswith("[")] == ["[1/3", "[2/3", "[3/3"]
    data = json.load(open(out / "results.json"))
    rows = data["rows"]
    assert [(r["frontend"], r["policy"]) for r in rows] == [("torch", "horovod"), ("torch", "asp"), ("keras", "asp")]
    for r, run in zip(rows, data["runs"]):
        assert r["profile"] == "static" and len(r["compute_share"]) == 4
        for k in range(4):
            shares = (r["compute_share"][k], r["wait_share"][k], r["comm_share"][k])
            assert all(0 <= v <= 1 for v in shares) and sum(shares) <= 1.01, r
        times = [p[0] for p in run["curve"]]
        # from the initial accuracy at 0 s, global step 0, to the final one at the budget
        assert times == sorted(times) and len(times) >= 3 and run["curve"][0][:2] == [0.0, 0], run["curve"]
        assert run["curve"][-1][1] == 64, run["curve"]
        assert 0.1 < r["final_accuracy"] <= 1.0          # 64 steps: above chance (0.1), not trained
        assert run["report"]["size"] == 4
    # the straggler (rank 3, 3x slower) takes fewer local steps than a fast rank when nobody waits for it (asp)
    asp = rows[1]
    assert asp["local_steps"][3] < asp["local_steps"][0], asp["local_steps"]
    # plain Horovod is lock-step: every rank the same number of steps
    assert len(set(rows[0]["local_steps"])) == 1, rows[0]["local_steps"]
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    for name in ("torch-static-accuracy.png", "torch-static-shares.png", "keras-static-accuracy.png",
                 "keras-static-shares.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    md = (out / "benchmarks.md").read_text()
    assert "## torch, static" in md and "## keras, static" in md and "| asp |" in md and "| horovod |" in md
    assert "## Targets of issue 7" in md and "final accuracy within 1 point" in md


def test_unknown_policy_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "hvd_elastic.bench", "--policies", "bsp,fastest"], cwd=ROOT,
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--policies: unknown ['fastest']; accepted: horovod,bsp,asp" in proc.stdout


def test_update_merges_rerun_jobs_in_place():
    from hvd_elastic.bench.matrix import merge_runs
    old = [{"frontend": "torch", "profile": "static", "name": p, "wall_s": 1.0} for p in ("horovod", "asp", "bsp")]
    new = [{"frontend": "torch", "profile": "static", "name": "asp", "wall_s": 2.0},
           {"frontend": "keras", "profile": "static", "name": "asp", "wall_s": 3.0}]
    merged = merge_runs(old, new)
    assert [(r["frontend"], r["name"], r["wall_s"]) for r in merged] == [
        ("torch", "horovod", 1.0), ("torch", "asp", 2.0), ("torch", "bsp", 1.0), ("keras", "asp", 3.0)]
