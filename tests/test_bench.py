"""The benchmark command (python -m benchmarks) end to end, small: real 4-rank jobs under mpirun on the
static-skew profile -- task mnist1d, plain Horovod and asp (PyTorch) on a small budget: progress lines, curves from
snapshots, results, cells, plots and the markdown table, and --from -- plus the figures' logic on hand-made numbers
(time to target that must *stay* reached, final accuracy, medians and spreads over seeds). Checks the pipeline and
the files it writes, not speed (speed figures live in docs/benchmarks.md, measured by the full command)."""
import csv
import json
import os
import subprocess
import sys

import pytest

from launch import BIN, ROOT

from benchmarks.matrix import (Eta, aggregate, check_targets, dip_after_target, final_accuracy, markdown, merge_runs,
                                      parse_args, spread, summarize, time_to_target, which_policy_table)


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def _bench(args, timeout=420):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc


STEPS = 320    # the quick budget: rank 0 takes about 80 local steps, 10 snapshots


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_mnist1d_benchmark_curves_from_snapshots(tmp_path):
    out = tmp_path / "bench"
    proc = _bench(["--task", "mnist1d", "--quick", "--policies", "horovod,asp", "--global-steps", str(STEPS),
                   "--out", str(out)], timeout=300)
    assert proc.stdout.startswith(f"task mnist1d: 2 jobs (1 seed), {STEPS} global steps of 32 samples"), \
        proc.stdout[:300]
    # progress: one line per job, numbered, with an estimate of what is left
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in lines] == ["[1/2", "[2/2"], lines
    assert "1 jobs left: ~" in lines[0] and "0 jobs left" in lines[1], lines
    data = json.load(open(out / "results.json"))
    assert data["task"] == "mnist1d" and data["target"] == 0.9
    rows, runs = data["rows"], data["runs"]
    assert [(r["policy"], r["seed"]) for r in rows] == [("horovod", 0), ("asp", 0)]
    for r, run in zip(rows, runs):
        curve = run["curve"]
        # rank 0's snapshots (every 8 of its local steps, from the initial model) evaluated after training, then the
        # final model after finish()
        assert len(curve) == 1 + r["local_steps"][0] // 8 + 1, (len(curve), r["local_steps"])
        # the final point is the job's gradient count: the budget, plus at most one step of each other rank under
        # asp (each rank checks the budget against its own view of the others' steps)
        assert curve[0][:2] == [0.0, 0] and curve[-1][2] == run["final_accuracy"]
        assert curve[-1][1] == STEPS if r["policy"] == "horovod" else STEPS <= curve[-1][1] <= STEPS + 3, curve[-1]
        assert [p[0] for p in curve] == sorted(p[0] for p in curve) and curve[-1][0] == run["wall_s"]
        assert [p[1] for p in curve] == sorted(p[1] for p in curve)
        assert all(0.0 <= p[2] <= 1.0 for p in curve)
        assert r["final_accuracy"] == round(final_accuracy(curve), 4)
        assert r["time_to_target_s"] is None or r["time_to_target_steps"] <= curve[-1][1]
        assert run["finite_weights"] is True and r["diverged"] is False
        assert r["profile"] == "static" and len(r["compute_share"]) == 4 and run["report"]["size"] == 4
        for k in range(4):
            shares = (r["compute_share"][k], r["wait_share"][k], r["comm_share"][k])
            assert all(0 <= v <= 1 for v in shares) and sum(shares) <= 1.01, r
    # STEPS gradients of a 1-D CNN: above chance, far from trained
    assert runs[0]["final_accuracy"] > max(0.15, runs[0]["curve"][0][2]), runs[0]["curve"]
    assert rows[0]["staleness"] == {"mean": 0, "p90": 0, "max": 0}      # plain Horovod: 0 by construction
    st = rows[1]["staleness"]                                            # asp: from the report, if it has it
    assert st is None or (0 <= st["mean"] <= st["max"] and st["p90"] <= st["max"]), st
    assert rows[1]["local_steps"][3] < rows[1]["local_steps"][0]
    assert len(set(rows[0]["local_steps"])) == 1, rows[0]["local_steps"]   # plain Horovod is lock-step
    cells = data["cells"]
    assert [c["policy"] for c in cells] == ["horovod", "asp"] and cells[0]["time_to_target_s"]["n"] == 1
    with open(out / "results.csv") as f:
        assert [(r["policy"], r["seed"]) for r in csv.DictReader(f)] == [("horovod", "0"), ("asp", "0")]
    with open(out / "cells.csv") as f:
        assert [(c["frontend"], c["policy"]) for c in csv.DictReader(f)] == [("torch", "horovod"), ("torch", "asp")]
    for kind in ("time-to-target", "accuracy", "shares"):
        assert _is_png(out / f"torch-static-{kind}.png"), kind
    md = (out / "benchmarks.md").read_text()
    assert "--task mnist1d" in md and "MNIST-1D" in md and "| horovod | " in md and "### Targets" in md
    # --from: the same outputs from the saved results, nothing run (the run's task and budget, not the defaults)
    again = tmp_path / "again"
    proc = _bench(["--from", str(out), "--out", str(again)], timeout=120)
    assert "[1/" not in proc.stdout and proc.stdout.startswith(f"2 runs from {out}: task mnist1d"), proc.stdout
    assert json.load(open(again / "results.json"))["cells"] == cells
    assert (again / "benchmarks.md").read_text() == md
    assert data["lr"] == 0.0375 and data["momentum"] == 0.5 and data["batch"] == 32 and data["launcher"] == "mpirun"


def test_time_to_target_counts_only_once_accuracy_stays():
    curve = [[0.0, 0, 0.1], [1.0, 10, 0.91], [2.0, 20, 0.89], [3.0, 30, 0.90], [4.0, 40, 0.95], [4.5, 48, 0.93]]
    assert time_to_target(curve, 0.9) == (3.0, 30)          # the crossing at 1 s dipped below again: not counted
    assert time_to_target(curve, 0.85) == (1.0, 10)
    assert time_to_target(curve, 0.94) is None               # reached at 4 s, but the final evaluation is below
    assert time_to_target(curve, 0.05) == (0.0, 0)
    assert time_to_target(curve[:3], 0.9) is None            # ends below after a crossing
    assert final_accuracy(curve) == pytest.approx((0.91 + 0.89 + 0.90 + 0.95 + 0.93) / 5)
    assert final_accuracy(curve[:2]) == pytest.approx((0.1 + 0.91) / 2)   # fewer than 5 evaluations: all of them


def test_dip_after_target_is_the_largest_fall_from_the_best_since_the_first_crossing():
    curve = [[0.0, 0, 0.1], [1.0, 10, 0.91], [2.0, 20, 0.89], [3.0, 30, 0.95], [4.0, 40, 0.70], [5.0, 50, 0.94]]
    assert dip_after_target(curve, 0.9) == pytest.approx(0.25)     # 0.95 -> 0.70, not 0.91 -> 0.89
    assert dip_after_target(curve[:3], 0.9) == pytest.approx(0.02)
    assert dip_after_target(curve, 0.96) is None                   # never reached
    assert dip_after_target([[0.0, 0, 0.5], [1.0, 10, 0.92], [2.0, 20, 0.93]], 0.9) == 0.0
    assert dip_after_target([[0.0, 0, 0.95], [1.0, 10, 0.2]], 0.9) == pytest.approx(0.75)   # from the first on


def test_median_and_spread_over_seeds():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "missing": 0}
    # a run that never reached counts as infinitely late: it moves the median, not the range of the others
    assert spread([4.0, None, 2.0]) == {"median": 4.0, "min": 2.0, "max": 4.0, "n": 3, "missing": 1}
    assert spread([4.0, None, None])["median"] is None
    assert spread([1.0, 2.0, 3.0, 10.0])["median"] == 2.5

    def row(policy, seed, t, acc, wall, profile="static"):
        return {"frontend": "torch", "profile": profile, "policy": policy, "seed": seed, "time_to_target_s": t,
                "time_to_target_steps": None if t is None else int(100 * t), "final_accuracy": acc, "wall_s": wall,
                "staleness": {"mean": 0, "p90": 0, "max": 0} if policy == "horovod" else
                {"mean": 1.0 + seed, "p90": 3, "max": 5 + seed},
                "fast_compute_share": 0.5, "fast_wait_share": 0.4, "compute_share": [0.5] * 4,
                "wait_share": [0.4] * 4, "comm_share": [0.0] * 4}

    rows = [row("horovod", 0, 10.0, 0.95, 20.0), row("horovod", 1, 12.0, 0.96, 22.0), row("horovod", 2, 8.0, 0.94,
                                                                                            21.0),
            row("asp", 0, 5.0, 0.94, 10.0), row("asp", 1, None, 0.93, 9.0), row("asp", 2, 4.0, 0.95, 11.0)]
    hvd, asp = aggregate(rows)
    assert hvd["policy"] == "horovod" and hvd["time_to_target_s"]["median"] == 10.0
    assert hvd["speedup"]["median"] == 1.0 and hvd["speedup"]["min"] == pytest.approx(10 / 12)
    assert hvd["final_accuracy"] == {"median": 0.95, "min": 0.94, "max": 0.96, "n": 3, "missing": 0}
    assert asp["time_to_target_s"] == {"median": 5.0, "min": 4.0, "max": 5.0, "n": 3, "missing": 1}
    assert asp["time_to_target_steps"]["median"] == 500
    assert asp["speedup"]["median"] == 2.0                          # Horovod's median 10 s / asp's median 5 s
    assert (asp["speedup"]["min"], asp["speedup"]["max"], asp["speedup"]["missing"]) == (2.0, 2.5, 1)
    assert asp["wall_s"]["median"] == 10.0 and asp["wall_speedup"] == 2.1
    # seed for seed: 10 / 5 and 8 / 4; the run that never reached counts 0
    pa, ph = asp["paired_speedup"], hvd["paired_speedup"]
    assert (pa["median"], pa["min"], pa["max"], pa["n"]) == (2.0, 0.0, 2.0, 3)
    assert ph["median"] == ph["min"] == ph["max"] == 1.0
    assert asp["staleness"] == {"mean": 2.0, "p90": 3, "max": 6}
    assert asp["median_seed"] == 0 and hvd["median_seed"] == 0     # the runs drawn in the accuracy plots
    # a relaxed run whose report has no staleness: '-' (None), never a failure
    rows[3]["staleness"] = None
    assert aggregate(rows)[1]["staleness"] is None


def test_summarize_one_run():
    curve = [[0.0, 0, 0.1], [1.0, 40, 0.92], [2.0, 80, 0.88], [3.0, 120, 0.91], [4.0, 160, 0.93], [5.0, 200, 0.94],
             [5.5, 200, 0.95]]
    ranks = [{"rank": k, "compute_share": 0.9, "wait_share": 0.05, "comm_share": 0.02, "steps": 50} for k in range(4)]
    res = {"frontend": "torch", "profile": "static", "name": "asp", "seed": 2, "wall_s": 5.5, "final_accuracy": 0.95,
           "curve": curve, "report": {"ranks": ranks, "staleness": {"mean": 1.5, "p50": 1, "p90": 3, "max": 7}}}
    r = summarize(res, 0.9)
    assert (r["time_to_target_s"], r["time_to_target_steps"], r["seed"]) == (3.0, 120, 2)
    assert r["final_accuracy"] == round((0.88 + 0.91 + 0.93 + 0.94 + 0.95) / 5, 4) and r["end_accuracy"] == 0.95
    assert r["staleness"] == {"mean": 1.5, "p90": 3, "max": 7}
    del res["report"]["staleness"]
    assert summarize(res, 0.9)["staleness"] is None
    res["name"] = "lbbsp"
    assert summarize(res, 0.9)["staleness"] == {"mean": 0, "p90": 0, "max": 0}


def test_eta_uses_the_same_cell_first():
    eta = Eta()
    eta.add(("torch", "static", "horovod"), 90.0)
    eta.add(("torch", "static", "asp"), 40.0)
    eta.add(("torch", "homogeneous", "asp"), 30.0)
    left = eta.left([("torch", "static", "horovod"), ("torch", "static", "bsp"), ("torch", "H1", "asp")])
    assert left == pytest.approx(90.0 + 65.0 + 160.0 / 3)


def test_unknown_policy_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--policies", "bsp,fastest"], cwd=ROOT,
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--policies: unknown ['fastest']; accepted: horovod,bsp,asp" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--task", "mnist1d", "--frontends", "keras"],
                          cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--frontends keras: only with --task digits" in proc.stdout


def test_from_without_results_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--from", str(tmp_path)], cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode != 0 and f"--from: no results.json in {tmp_path}" in proc.stdout, proc.stdout


def test_update_merges_rerun_jobs_in_place():
    old = [{"frontend": "torch", "profile": "static", "name": p, "seed": s, "wall_s": 1.0}
           for p in ("horovod", "asp", "bsp") for s in (0, 1)]
    new = [{"frontend": "torch", "profile": "static", "name": "asp", "seed": 1, "wall_s": 2.0},
           {"frontend": "keras", "profile": "static", "name": "asp", "seed": 0, "wall_s": 3.0}]
    merged = merge_runs(old, new)
    assert [(r["frontend"], r["name"], r["seed"], r["wall_s"]) for r in merged] == [
        ("torch", "horovod", 0, 1.0), ("torch", "horovod", 1, 1.0), ("torch", "asp", 0, 1.0),
        ("torch", "asp", 1, 2.0), ("torch", "bsp", 0, 1.0), ("torch", "bsp", 1, 1.0), ("keras", "asp", 0, 3.0)]


def test_controls_are_not_checked_against_the_targets_and_mixed_seeds_are_named():
    def row(policy, seed, t, profile="homogeneous"):
        return {"frontend": "torch", "profile": profile, "policy": policy, "seed": seed, "time_to_target_s": t,
                "time_to_target_steps": int(100 * t), "final_accuracy": 0.95 if policy != "horovod-predivide3" else 0.5,
                "wall_s": 20.0, "staleness": {"mean": 0, "p90": 0, "max": 0}, "fast_compute_share": 0.9,
                "fast_wait_share": 0.1, "compute_share": [0.9] * 4, "wait_share": [0.1] * 4, "comm_share": [0.0] * 4}

    rows = [row("horovod", s, 10.0) for s in range(5)] + [row("asp", s, 10.5) for s in range(3)] + \
        [row("horovod-predivide3", s, 30.0) for s in range(3)]
    cells = aggregate(rows)
    lines = "\n".join(check_targets(cells, 0.9, "mnist1d"))
    # the control is 3x slower and 45 points worse, yet no target line names it; asp's 0.95x is checked
    assert "horovod-predivide3" not in lines and "asp 0.95x (met)" in lines, lines
    assert "final accuracy of every policy within 1 point of Horovod's, every profile: met" in lines, lines
    md = markdown(cells, 0.9, parse_args(["--out", "x"]), [], "")
    assert "seeds 0-4: homogeneous horovod; seeds 0-2: homogeneous asp, homogeneous horovod-predivide3" in md, md[:2000]
    assert "horovod-predivide3 is a control, not a policy" in md
    assert "--first-seed must be >= 0" in subprocess.run(
        [sys.executable, "-m", "benchmarks", "--first-seed", "-1"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=60).stdout


def _cell_row(policy, seed, t, profile):
    return {"frontend": "torch", "profile": profile, "policy": policy, "seed": seed, "time_to_target_s": t,
            "time_to_target_steps": int(100 * t), "final_accuracy": 0.95, "wall_s": 20.0,
            "staleness": {"mean": 0, "p90": 0, "max": 0}, "fast_compute_share": 0.9, "fast_wait_share": 0.1,
            "compute_share": [0.9] * 4, "wait_share": [0.1] * 4, "comm_share": [0.0] * 4}


def test_a_sittings_policy_joins_the_readme_table_against_its_own_horovod():
    profiles = ("homogeneous", "static")
    main = aggregate([_cell_row(p, s, t, prof) for prof in profiles for p, t in (("horovod", 20.0), ("asp", 16.0))
                      for s in range(3)])
    # the sitting's Horovod took 30 s: auto's 15 s is 2.00x against it (1.33x against the main run's 20 s)
    own = aggregate([_cell_row(p, s, t, prof) for prof in profiles for p, t in (("horovod", 30.0), ("auto", 15.0))
                     for s in range(3)])
    table = which_policy_table(main, 0.9, [("auto", own)])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "**1.25x**" in rows["asp"] and "**2.00x** (2.00-2.00)" in rows["auto\u2020"], table
    assert "20 s" in rows["plain Horovod (time to target)"] and "horovod\u2020" not in rows, table
    notes = table.split("\n\n")[1:]      # the footnotes, one paragraph each, under the table
    assert len(notes) == 1 and notes[0].startswith("\u2020 A sitting of its own"), table
    note = " ".join(notes[0].split())
    assert "docs/bench/sitting-auto.json" in note and "equal speeds 30 s" in note, table
    # without sittings: no footnote, no extra row
    assert "\u2020" not in which_policy_table(main, 0.9)


@pytest.mark.parametrize("args, says", [
    (["--sitting", "auto", "--policies", "auto"], "horovod among --policies"),
    (["--sitting", "Auto!", "--policies", "horovod,auto"], "--sitting: a name of a-z, 0-9 and -"),
    (["--sitting", "auto", "--docs", "--policies", "horovod,auto"], "--sitting: not with --from, --update or --docs"),
])
def test_a_bad_sitting_is_a_one_line_error(args, says):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stdout, proc.stdout
