"""Elastic churn benchmark: what a shared cluster does to a job -- 4 workers, one 3x slower, a worker killed at about
a third of the run and a new one added at about two thirds -- under each policy against Horovod elastic with its own
optimizer, the same events for every arm. One ``horovodrun --elastic`` job per (arm, seed) on this host
(benchmarks/elastic_churn_worker.py: MNIST-1D's CNN, a Horovod elastic script committing every 10 steps).

    python -m benchmarks.elastic_churn --policies horovod,wbsp-overlap,lbbsp --seeds 3 --gloo-timeout-seconds 10

Prints per arm: time to the accuracy target (the first evaluation from which accuracy stays at or above it, as in
``python -m benchmarks``) and its ratio to Horovod's of the same seed, final accuracy, wall time for the budget, the
gap each reset left in the observer's steps (from its last step before the reset to its first after), and, for the
tick policies, the updates the survivors lost per reset. Writes --out (JSON, every run).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from .elastic_churn_worker import hosts_text
from .matrix import POLICIES, TASKS, final_accuracy, time_to_target, write_task_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def run(arm: str, seed: int, opts, workdir: str) -> dict:
    folder = tempfile.mkdtemp(dir=workdir)
    hosts = os.path.join(folder, "hosts")
    with open(hosts, "w") as f:
        f.write(hosts_text())
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(discover, 0o755)
    task = TASKS["mnist1d"]
    out = os.path.join(folder, "result.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"PYTHONPATH": ROOT, "HVD_ELASTIC_REPORT": "0", "PYTHONUNBUFFERED": "1",
                "HOROVOD_LOG_LEVEL": "warning"})
    settings = POLICIES[arm] or {}
    env.update(settings)
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "4", "--min-np", "3", "--max-np", "4",
           "--host-discovery-script", discover, "--gloo", "--elastic-timeout", "120",
           "--network-interface", "lo", "--blacklist-cooldown-range", "1", "2",
           "--gloo-timeout-seconds", str(opts.gloo_timeout_seconds),
           sys.executable, "-m", "benchmarks.elastic_churn_worker", "--out", out,
           "--data", os.path.join(workdir, "mnist1d.npz"), "--task", "mnist1d", "--seed", str(seed),
           "--global-steps", str(opts.global_steps), "--batch-size", str(task["batch"]), "--lr", f"{task['lr']:g}",
           "--momentum", "0.5", "--eval-every", str(task["eval_every"]),
           "--sample-delay", f"{task['sample_ms'] / 1000:g}", "--slow-factor", "3",
           "--hosts-file", hosts, "--commit-every", str(opts.commit_every),
           *(["--impl", "horovod"] if "HVD_ELASTIC_POLICY" not in settings else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=opts.timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        log = os.path.join(folder, "job.log")
        with open(log, "w") as f:
            f.write(proc.stdout)
        raise RuntimeError(f"{arm} seed {seed} failed (exit {proc.returncode}; the job's whole output: {log}):\n"
                           f"{proc.stdout[-4000:]}")
    res = json.load(open(out))
    shutil.rmtree(folder, ignore_errors=True)   # a failed job's folder stays, with its log (above)
    events = [ln.split("CHURN ", 1)[1] for ln in proc.stdout.splitlines() if "CHURN killed" in ln or
              "CHURN added" in ln]
    res.update({"arm": arm, "seed": seed, "job_s": time.perf_counter() - t0, "events": events})
    hit = time_to_target(res["curve"], opts.target)
    res["time_to_target_s"] = hit[0] if hit else None
    res["final_accuracy_5"] = final_accuracy(res["curve"])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.elastic_churn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="horovod,asp,zipline-R15,lbbsp,wbsp-overlap",
                    help=f"arms of benchmarks/matrix.py's POLICIES ({', '.join(POLICIES)})")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds K..K+N-1 instead of 0..N-1")
    ap.add_argument("--global-steps", type=int, default=TASKS["mnist1d"]["budget"])
    ap.add_argument("--target", type=float, default=TASKS["mnist1d"]["target"])
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--gloo-timeout-seconds", type=int, default=30,
                    help="horovodrun's: how long a Gloo operation waits for a peer (Horovod's default 30). A "
                         "survivor waiting on the killed worker's data fails only at this timeout: in this 4-worker "
                         "job it is the gap a kill leaves in every arm (docs/horovod-compat.md)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default="bench-churn.json")
    opts = ap.parse_args(argv)
    arms = opts.policies.split(",")
    bad = [a for a in arms if a not in POLICIES]
    if bad:
        ap.error(f"--policies: unknown {bad}; accepted: {','.join(POLICIES)}")
    workdir = tempfile.mkdtemp(prefix="hvde-churn-")
    write_task_data("mnist1d", os.path.join(workdir, "mnist1d.npz"))
    runs = []
    for seed in range(opts.first_seed, opts.first_seed + opts.seeds):
        for arm in arms:
            res = run(arm, seed, opts, workdir)
            runs.append(res)
            print(f"{arm} seed {seed}: to {opts.target:g} {res['time_to_target_s']} s, final "
                  f"{res['final_accuracy_5']:.3f}, wall {res['wall_s']:.1f} s, reset gaps {res['gaps_s']} s, "
                  f"events {res['events']}, {res['counters']}", flush=True)
            with open(opts.out, "w") as f:
                json.dump({"options": vars(opts), "runs": runs}, f)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n| arm | time to {opts.target:g} (s) | vs Horovod elastic | final accuracy | wall (s) | "
          f"reset gaps (s) | lost per reset |")
    print("|---|---|---|---|---|---|---|")
    ref = {r["seed"]: r["time_to_target_s"] for r in runs if r["arm"] == "horovod"}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]
        tt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
        ratios = [ref[r["seed"]] / r["time_to_target_s"] for r in rs
                  if r["time_to_target_s"] and ref.get(r["seed"])]
        med = f"{statistics.median(tt):.1f}" if len(tt) == len(rs) else "not reached"
        ratio = f"{statistics.median(ratios):.2f}x" if ratios and len(ratios) == len(rs) else "-"
        gaps = ", ".join("/".join(f"{g:.1f}" for g in r["gaps_s"]) for r in rs)
        lost = ", ".join(str(r["counters"].get("elastic_lost_updates", "-")) for r in rs)
        print(f"| {arm} | {med} | {ratio} | {statistics.median(r['final_accuracy_5'] for r in rs):.3f} | "
              f"{statistics.median(r['wall_s'] for r in rs):.1f} | {gaps} | {lost} |")


if __name__ == "__main__":
    sys.exit(main())
