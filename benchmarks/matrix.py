"""The benchmark matrix: policies x heterogeneity profiles on real multi-rank jobs, side by side with plain Horovod.

``python -m benchmarks`` (see ``--help``) launches one 4-rank job per (frontend, profile, policy, seed) with
mpirun (or horovodrun) on one of two tasks (--task): ``mnist1d``, a 1-D CNN on MNIST-1D generated locally
(benchmarks/mnist1d_task.py; the full run's default: thousands of gradients to its 0.90 target, so
time to accuracy has room to differ), or ``digits``, an MLP on scikit-learn's digits (the quick profile's default;
the one Keras runs). Workers: benchmarks/torch_worker.py, keras_worker.py. It writes into --out:
results.json (every run and the per-cell aggregates), results.csv (one row per run), cells.csv (one row per cell:
medians and min-max over the seeds), per (frontend, profile) a bar chart of time to target per policy, accuracy
curves and each rank's compute / wait / communication share, and benchmarks.md (the tables and the targets checked).
``--docs`` writes them where the repository keeps them (docs/benchmarks.md and docs/bench/). ``--sitting NAME`` keeps a
run apart (docs/bench/sitting-NAME.json; Horovod among its policies): README.md's policy table gains its policies,
each against that sitting's own Horovod runs.

Speeds are emulated by sleeps (hvd_elastic.emulation), the same for every policy, so 4 ranks on 2 cores behave
like workers of different speeds. A worker's step is --sample-ms per sample times its speed factor.

Time to target counts only once accuracy stays: the first evaluation from which every later one (the final one
after finish() included) is at or above the target. Final accuracy: the mean of the last 5 evaluations.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .cluster import launch_command as cluster_command
from .cluster import link_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
BASE = 0.0005                     # the profiles' per-step extras are given at 0.5 ms per sample, 16 samples a step
BASE_STEP = BASE * 16             # (an 8 ms step) and scale with the task's step: batch x --sample-ms
FINAL_EVALS = 5                   # final accuracy: mean of the last evaluations

# name -> (description, per-rank time factors (x --sample-ms per sample), per-rank extra seconds per step of
#          BASE_STEP (scaled to the task's step), jitter, non-dedicated period s, non-dedicated max factor)
PROFILES: Dict[str, tuple] = {
    "homogeneous": ("every rank at speed 1", [1, 1, 1, 1], [0, 0, 0, 0], 0.0, 0.0, 1.0),
    "static": ("speeds 1 : 1 : 1 : 1/3 (rank 3 three times slower)", [1, 1, 1, 3], [0, 0, 0, 0], 0.0, 0.0, 1.0),
    "mixed": ("per-sample times 1 : 1.3 : 1.7 : 2.5, jitter +-20% per step", [1, 1.3, 1.7, 2.5], [0, 0, 0, 0],
              0.2, 0.0, 1.0),
    # transient slowness (shared clusters): every rank slowed now and then, by a different amount
    "transient": ("every rank's compute x a factor redrawn in [1, 3] every 2 s", [1, 1, 1, 1], [0, 0, 0, 0], 0.0, 2.0,
                  3.0),
    # WBSP paper: +0.5/1.0/1.5 s per iteration on half of the workers; scaled to this job's step
    "H1": ("+half a step per step on ranks 2, 3 (WBSP H1 scaled)", [1, 1, 1, 1], [0, 0, 0.004, 0.004], 0.0, 0.0, 1.0),
    "H2": ("+one step per step on ranks 2, 3 (WBSP H2 scaled)", [1, 1, 1, 1], [0, 0, 0.008, 0.008], 0.0, 0.0, 1.0),
    "H3": ("+1.5 steps per step on ranks 2, 3 (WBSP H3 scaled)", [1, 1, 1, 1], [0, 0, 0.012, 0.012], 0.0, 0.0,
           1.0),
}

# name -> environment of the job (None: plain horovod.torch.DistributedOptimizer)
POLICIES: Dict[str, Optional[Dict[str, str]]] = {
    "horovod": None,
    "bsp": {"HVD_ELASTIC_POLICY": "bsp"},
    "asp": {"HVD_ELASTIC_POLICY": "asp"},
    "asp-push-at-step": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_PUSH_AT_BACKWARD": "0"},
    "asp-inverse": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_STALENESS_COMPENSATION": "inverse"},
    "asp-damped": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_STALENESS_COMPENSATION": "damped"},
    "asp-inflight1": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "1"},
    "asp-inflight-auto": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "auto"},
    "asp-inflight1-damped": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "1",
                             "HVD_ELASTIC_STALENESS_COMPENSATION": "damped"},
    "asp-nopeerwait": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_PEER_WAIT": "0"},
    # the policies' own rules, without the lock-step fallback
    "asp-nofallback": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_RELAX_MIN_GAIN": "0"},
    "dssp-nofallback": {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_RELAX_MIN_GAIN": "0"},
    "zipline-R15-nofallback": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15",
                               "HVD_ELASTIC_RELAX_MIN_GAIN": "0"},
    "asp-join": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_TICK_PACING": "join"},
    "asp-probe": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_TICK_PACING": "probe"},
    "ssp-s0": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "0"},
    "ssp-s3": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "3"},
    "ssp-s10": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "10"},
    "dssp": {"HVD_ELASTIC_POLICY": "dssp"},
    "dssp-inflight1": {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_MAX_INFLIGHT": "1"},
    "dssp-join": {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_TICK_PACING": "join"},
    "dssp-probe": {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_TICK_PACING": "probe"},
    "zipline-R15": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15"},
    "zipline-R15-median": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15",
                           "HVD_ELASTIC_PREDICTOR": "median"},
    "zipline-R15-ewma": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15",
                         "HVD_ELASTIC_PREDICTOR": "ewma"},
    "zipline-R30": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "30"},
    "zipline-R60": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "60"},
    "zipline-R15-join": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15",
                         "HVD_ELASTIC_TICK_PACING": "join"},
    "zipline-R15-probe": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15",
                          "HVD_ELASTIC_TICK_PACING": "probe"},
    "lbbsp": {"HVD_ELASTIC_POLICY": "lbbsp"},
    "lbbsp-ewma": {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_PREDICTOR": "ewma"},
    "lbbsp-tol15": {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_PREDICTOR": "ewma",
                    "HVD_ELASTIC_LBBSP_TOLERANCE": "0.15"},
    "wbsp": {"HVD_ELASTIC_POLICY": "wbsp"},
    "wbsp-overlap": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"},
    "wbsp-overlap-lockstep": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1",
                              "HVD_ELASTIC_WBSP_LOCKSTEP": "1"},
    "auto": {"HVD_ELASTIC_POLICY": "auto"},
    # A control, not a policy: plain Horovod with only the rounding of its average changed (Horovod's
    # gradient_predivide_factor 3: each gradient x 1/3 before the sum, the sum x 3/4 after; HOROVOD_FUSION_THRESHOLD=0
    # gives identical curves here). Same algorithm, same batches: how far its time to target moves from
    # plain Horovod's is the sample path's noise, against which a policy's difference is read.
    "horovod-predivide3": {"BENCH_GRADIENT_PREDIVIDE_FACTOR": "3"},
}
CONTROLS = ("horovod-predivide3",)            # never checked against the targets
SYNCHRONOUS = ("horovod", "bsp", "lbbsp", "lbbsp-ewma", "lbbsp-tol15") + CONTROLS     # staleness 0 by construction
# drawn with the synchronous ones (they wait for the straggler)
BOUNDED = ("ssp-s0", "ssp-s3", "ssp-s10", "dssp", "dssp-nofallback")
KERAS_POLICIES = ("bsp", "asp", "ssp-s3", "zipline-R15", "lbbsp", "wbsp")
WORKERS = {"torch": "benchmarks.torch_worker", "keras": "benchmarks.keras_worker"}

# task -> its defaults. budget / quick_budget: global steps of `batch` samples; lr: per rank (x ranks for SGD).
TASKS: Dict[str, Dict] = {
    "digits": dict(
        title="MLP 64-256-256-10 on scikit-learn's digits (1437 train / 360 test)", batch=16, sample_ms=0.5,
        budget=720, quick_budget=64, target=0.93, eval_every=4, lr=0.05, frontends="torch,keras",
        profiles=",".join(PROFILES), policies=",".join(p for p in POLICIES if p not in CONTROLS)),
    "mnist1d": dict(
        title="1-D CNN (3 conv layers of 32 channels + linear, 9610 parameters) on MNIST-1D generated locally "
              "(mnist1d 0.0.2.post1, 8000 train / 2000 test)", batch=32, sample_ms=0.75,
        budget=5000, quick_budget=320, target=0.90, eval_every=8, lr=0.0375, frontends="torch",
        profiles="homogeneous,static,transient",
        policies="horovod,asp,ssp-s3,dssp,zipline-R15,lbbsp,wbsp-overlap"),
}


def launch_command(launcher: str, np_: int, module: str, args: List[str], hosts=None, exports=()) -> List[str]:
    return cluster_command(launcher, np_, [sys.executable, "-m", module, *args], hosts, exports)


def per_rank_floats(text: str, n: int) -> List[float]:
    """'a,b,c,d' (or one value for every rank) -> n floats."""
    vals = [float(v) for v in text.split(",")] if text else [0.0]
    return (vals * n)[:n] if len(vals) == 1 else vals


def worker_arguments(description: str) -> argparse.ArgumentParser:
    """The options every benchmark worker takes from run_one (the job, its data and the profile's emulation)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True, help="the task's .npz written by the driver")
    ap.add_argument("--task", choices=list(TASKS), default="digits", help="which model (the data is --data)")
    ap.add_argument("--seed", type=int, default=0, help="model initialization and batch order")
    ap.add_argument("--global-steps", type=int, default=720, help="budget in steps of --batch-size samples")
    ap.add_argument("--batch-size", type=int, default=16, help="per-rank batch (lbbsp: B = this x ranks)")
    ap.add_argument("--lr", type=float, default=0.05, help="per-rank learning rate (scaled by the ranks)")
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--sample-delay", default="", help="per-rank seconds per sample, comma separated")
    ap.add_argument("--step-delay", default="", help="per-rank seconds per step, comma separated")
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--vary-period", type=float, default=0.0)
    ap.add_argument("--vary-factor", type=float, default=1.0)
    return ap


def worker_straggler(args, rank: int, size: int):
    """This rank's emulated slowness for the profile in the worker's arguments."""
    from hvd_elastic.emulation import Straggler
    return Straggler(delay_s=per_rank_floats(args.step_delay, size)[rank],
                     sample_delay_s=per_rank_floats(args.sample_delay, size)[rank], jitter=args.jitter,
                     vary_period_s=args.vary_period, vary_factor=args.vary_factor, seed=rank)


def write_data(path: str):
    """scikit-learn's digits, scaled to [0, 1], split 80/20 (stratified, fixed seed), saved once for the jobs (so
    the ranks need not import scikit-learn: seconds per job on this machine)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    np.savez(path, x_tr=x_tr, y_tr=y_tr.astype(np.int64), x_te=x_te, y_te=y_te.astype(np.int64))


def write_task_data(task: str, path: str):
    if task == "mnist1d":
        from .mnist1d_task import write_data as write_mnist1d
        write_mnist1d(path)
    else:
        write_data(path)


def run_one(frontend: str, profile: str, policy: str, seed: int, opts, workdir: str) -> Dict:
    desc, factors, step_delay, jitter, period, vary = PROFILES[profile]
    step_s = opts.sample_ms / 1000 * opts.batch           # the task's step at speed 1
    out = os.path.join(workdir, f"{frontend}-{profile}-{policy}-{seed}.json")
    args = ["--out", out, "--data", os.path.join(workdir, f"{opts.task}.npz"), "--task", opts.task,
            "--seed", str(seed), "--global-steps", str(opts.global_steps), "--batch-size", str(opts.batch),
            "--lr", f"{opts.lr:g}", "--momentum", f"{opts.momentum:g}", "--eval-every", str(opts.eval_every),
            "--sample-delay", ",".join(f"{opts.sample_ms / 1000 * f:g}" for f in factors),
            "--step-delay", ",".join(f"{d / BASE_STEP * step_s:g}" for d in step_delay),
            "--jitter", str(jitter),
            "--vary-period", str(period), "--vary-factor", str(vary)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"HVD_ELASTIC_REPORT": "0", "PYTHONUNBUFFERED": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "PYTHONPATH": os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p),
                "TF_CPP_MIN_LOG_LEVEL": "3"})
    settings = POLICIES[policy] or {}
    if "HVD_ELASTIC_POLICY" not in settings:    # plain Horovod (or a control: Horovod with a setting of its own)
        args += ["--impl", "horovod"]
    env.update(settings)
    cmd = launch_command(opts.launcher, 4, WORKERS[frontend], args, opts.hosts,
                         exports=sorted(k for k in env if k.startswith(("HVD_ELASTIC_", "TF_CPP_"))))
    t0 = time.perf_counter()
    before = link_bytes(opts.hosts) if opts.hosts else {}
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=opts.timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{frontend}/{profile}/{policy}/seed {seed} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}")
    res = json.load(open(out))
    res.update({"frontend": frontend, "profile": profile, "name": policy, "seed": seed, "task": opts.task,
                "job_s": time.perf_counter() - t0})
    if opts.hosts:   # what crossed each host's link during the job (both directions)
        after = link_bytes(opts.hosts)
        res["link_mb"] = {h: (after[h] - before[h]) / 1e6 for h in opts.hosts}
    return res


# ---- figures of one run -------------------------------------------------------------------------------------------
def time_to_target(curve: Sequence[Sequence[float]], target: float) -> Optional[Tuple[float, int]]:
    """(wall s, global steps) of the first evaluation from which accuracy stays at or above `target` (every later
    evaluation too); None when the last evaluation is below it. curve: [wall s, global steps, accuracy] in order."""
    reached = None
    for t, steps, acc in curve:
        if acc >= target:
            if reached is None:
                reached = (t, int(steps))
        else:
            reached = None          # a dip below: the earlier crossing does not count
    return reached


def dip_after_target(curve: Sequence[Sequence[float]], target: float) -> Optional[float]:
    """Largest fall of accuracy below its best so far, counted from the first evaluation at or above `target` (how
    far a curve that got there falls back; 0.0: it never fell), or None when the curve never reached `target`."""
    best, dip = None, 0.0
    for _, _, acc in curve:
        if best is None and acc < target:
            continue
        best = acc if best is None else max(best, acc)
        dip = max(dip, best - acc)
    return None if best is None else dip


def _round(v: Optional[float], digits: int) -> Optional[float]:
    return None if v is None else round(v, digits)


def final_accuracy(curve: Sequence[Sequence[float]], k: int = FINAL_EVALS) -> float:
    """Mean accuracy of the last k evaluations (the final one after finish() included)."""
    tail = [p[2] for p in curve[-k:]]
    return sum(tail) / len(tail)


def staleness_of(res: Dict) -> Optional[Dict]:
    """mean / p90 / max of the run's staleness: the report's, 0 for the synchronous policies (by construction; their
    reports may not carry it), None when a relaxed policy's report does not have it."""
    st = res.get("report", {}).get("staleness")
    if st and all(k in st for k in ("mean", "p90", "max")):
        return {k: st[k] for k in ("mean", "p90", "max")}
    if res["name"] in SYNCHRONOUS:
        return {"mean": 0, "p90": 0, "max": 0}
    return None


def summarize(res: Dict, target: float) -> Dict:
    """One run -> one row."""
    ranks = res["report"]["ranks"]
    fast = [r for r in ranks if r["rank"] in (0, 1)]          # speed 1 in every profile
    reached = time_to_target(res["curve"], target)
    return {"frontend": res["frontend"], "profile": res["profile"], "policy": res["name"],
            "seed": res.get("seed", 0), "wall_s": round(res["wall_s"], 3),
            "time_to_target_s": None if reached is None else round(reached[0], 3),
            "time_to_target_steps": None if reached is None else reached[1],
            "final_accuracy": round(final_accuracy(res["curve"]), 4),
            "end_accuracy": round(res["final_accuracy"], 4),
            "dip_after_target": _round(dip_after_target(res["curve"], target), 4),
            "diverged": res.get("finite_weights") is False,          # NaN / inf in the final weights
            "staleness": staleness_of(res),
            "fast_compute_share": round(min(r["compute_share"] for r in fast), 3),
            "fast_wait_share": round(max(r["wait_share"] for r in fast), 3),
            "compute_share": [round(r["compute_share"], 3) for r in ranks],
            "wait_share": [round(r["wait_share"], 3) for r in ranks],
            "comm_share": [round(r["comm_share"], 3) for r in ranks],
            "local_steps": [r["steps"] for r in ranks]}


# ---- over the seeds of a cell -------------------------------------------------------------------------------------
def spread(values: Sequence[Optional[float]]) -> Dict:
    """Median and min-max of the runs' values; None (never reached) counts as +infinity: the median is None when
    half or more of the runs never reached, min / max are over the runs that did (None when none did)."""
    have = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "missing": 0}
    med = statistics.median([math.inf if v is None else v for v in values])
    return {"median": None if math.isinf(med) else med, "min": min(have) if have else None,
            "max": max(have) if have else None, "n": len(values), "missing": len(values) - len(have)}


def reference_policy(frontend: str) -> str:
    return "horovod" if frontend == "torch" else "bsp"   # Horovod's own Keras layer does not work with Keras 3


def aggregate(rows: List[Dict]) -> List[Dict]:
    """Per (frontend, profile, policy), in the rows' order: medians and min-max over the seeds of time to target
    (s and global steps), final accuracy, wall time, staleness, the fast ranks' shares, and the speed-up in time to
    target against the reference's (plain Horovod's) median: ref median / this cell's median, min-max over this
    cell's runs (ref median / each run's time)."""
    cells: Dict[tuple, List[Dict]] = {}
    for r in rows:
        cells.setdefault((r["frontend"], r["profile"], r["policy"]), []).append(r)
    out = []
    for (fe, prof, pol), rs in cells.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        stale = [r["staleness"] for r in rs]
        c = {"frontend": fe, "profile": prof, "policy": pol, "seeds": [r["seed"] for r in rs],
             "time_to_target_s": spread([r["time_to_target_s"] for r in rs]),
             "time_to_target_steps": spread([r["time_to_target_steps"] for r in rs]),
             "final_accuracy": spread([r["final_accuracy"] for r in rs]),
             "dip_after_target": spread([r["dip_after_target"] for r in rs if r.get("dip_after_target") is not None]),
             "wall_s": spread([r["wall_s"] for r in rs]),
             "staleness": (None if any(s is None for s in stale) else
                           {k: statistics.median([s[k] for s in stale]) for k in ("mean", "p90", "max")}),
             "fast_compute_share": statistics.median([r["fast_compute_share"] for r in rs]),
             "fast_wait_share": statistics.median([r["fast_wait_share"] for r in rs]),
             "compute_share": [statistics.median(v) for v in zip(*[r["compute_share"] for r in rs])],
             "wait_share": [statistics.median(v) for v in zip(*[r["wait_share"] for r in rs])],
             "comm_share": [statistics.median(v) for v in zip(*[r["comm_share"] for r in rs])],
             "median_seed": median_run(rs)["seed"], "diverged": sum(bool(r.get("diverged")) for r in rs)}
        out.append(c)
    for c in out:
        ref = next((r for r in out if (r["frontend"], r["profile"], r["policy"]) ==
                    (c["frontend"], c["profile"], reference_policy(c["frontend"]))), None)
        ref_t = ref["time_to_target_s"]["median"] if ref else None
        ref_w = ref["wall_s"]["median"] if ref else None
        runs = cells[(c["frontend"], c["profile"], c["policy"])]
        mine = [r["time_to_target_s"] for r in runs]
        c["speedup"] = spread([ref_t / t if ref_t and t else None for t in mine]) if ref_t else None
        if c["speedup"] is not None:   # the median speed-up is the ratio of the medians (not the median of ratios)
            t = c["time_to_target_s"]["median"]
            c["speedup"]["median"] = ref_t / t if t else None
        c["wall_speedup"] = ref_w / c["wall_s"]["median"] if ref_w and c["wall_s"]["median"] else None
        c["paired_speedup"] = paired_speedup(
            cells.get((c["frontend"], c["profile"], reference_policy(c["frontend"])), []), runs)
    return out


def paired_speedup(ref_runs: List[Dict], runs: List[Dict]) -> Optional[Dict]:
    """Speed-up seed for seed: the reference's time to target / this run's, for each seed both ran (a seed fixes
    the initialization and the data order of every arm, so the pair differs only by the policy). A run that never
    reached counts 0.0; seeds on which the reference never reached are left out. Median and min-max over the
    seeds, or None when no seed pairs."""
    ref = {r["seed"]: r["time_to_target_s"] for r in ref_runs}
    ratios = [0.0 if r["time_to_target_s"] is None else ref[r["seed"]] / r["time_to_target_s"]
              for r in runs if ref.get(r["seed"]) and r["time_to_target_s"] != 0]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios),
            "missing": 0}


def median_run(rs: List[Dict]) -> Dict:
    """The run of a cell drawn in the accuracy plots: the median by time to target (never reached: last), ties and
    an even count resolved towards the earlier one."""
    order = sorted(rs, key=lambda r: (math.inf if r["time_to_target_s"] is None else r["time_to_target_s"],
                                      -r["final_accuracy"], r["seed"]))
    return order[(len(order) - 1) // 2]


# ---- plots --------------------------------------------------------------------------------------------------------
def _kind_color(policy: str, frontend: str) -> str:
    if policy == reference_policy(frontend):
        return "dimgrey"
    return "tab:blue" if policy in SYNCHRONOUS + BOUNDED else "tab:orange"


def _smooth(ys: List[float], k: int) -> List[float]:
    """Centered moving average over k evaluations (shorter at the ends)."""
    h = k // 2
    return [sum(ys[max(0, i - h):i + h + 1]) / len(ys[max(0, i - h):i + h + 1]) for i in range(len(ys))]


def plot(results: List[Dict], rows: List[Dict], cells: List[Dict], outdir: str, target: float,
         smooth: int = 5) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    pairs = list(dict.fromkeys((c["frontend"], c["profile"]) for c in cells))
    for fe, prof in pairs:
        sel = [c for c in cells if (c["frontend"], c["profile"]) == (fe, prof)]
        ref = reference_policy(fe)
        # 1. time to target per policy: median bar, min-max over the seeds, x for runs that never reached it
        fig, ax = plt.subplots(figsize=(max(6.5, 0.75 * len(sel) + 4), 4))
        ax.set_xlim(-0.6, max(len(sel), 3) - 0.4)
        top = 0.0
        for i, c in enumerate(sel):
            s = c["time_to_target_s"]
            if s["median"] is not None:
                ax.bar(i, s["median"], color=_kind_color(c["policy"], fe), width=0.65)
            if s["min"] is not None and s["max"] > s["min"]:
                ax.plot([i, i], [s["min"], s["max"]], color="black", lw=1.2, marker="_", ms=10)
            missed = [r for r in rows if (r["frontend"], r["profile"], r["policy"]) == (fe, prof, c["policy"])
                      and r["time_to_target_s"] is None]
            for r in missed:
                ax.plot(i, r["wall_s"], marker="x", color="red", ms=8, mew=2, ls="none")
            h = max([v for v in (s["max"], s["median"]) if v is not None] + [r["wall_s"] for r in missed] + [0])
            top = max(top, h)
            sp = c["speedup"]["median"] if c["speedup"] else None
            label = ("not reached" if s["median"] is None else
                     "ref" if c["policy"] == ref else f"{sp:.2f}x" if sp else "")
            ax.text(i, h, label, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels([c["policy"] for c in sel], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, top * 1.15 or 1)
        n = max(len(c["seeds"]) for c in sel)
        ax.set(ylabel=f"wall s until accuracy stays >= {target:g}",
               title=f"{fe}, {prof}: time to {target:g} (median of {n} seed{'s' if n > 1 else ''}; "
                     "label: speed-up vs " + ref + ")")
        ax.title.set_fontsize(9)
        handles = [plt.Rectangle((0, 0), 1, 1, color=k) for k in ("dimgrey", "tab:blue", "tab:orange")]
        handles += [plt.Line2D([], [], color="black", marker="_", ms=10), plt.Line2D([], [], color="red", marker="x",
                                                                                  ls="none", mew=2)]
        ax.legend(handles, [ref, "synchronous / bounded\nstaleness", "relaxed", "min-max over seeds",
                            "run that never reached\nit (at its wall time)"], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        name = f"{fe}-{prof}-time-to-target.png"
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        files.append(name)

        # 2. accuracy vs wall time, the median-seed run of each policy, two panels
        groups = [("synchronous and bounded staleness", [c for c in sel if c["policy"] in SYNCHRONOUS + BOUNDED]),
                  ("relaxed", [c for c in sel if c["policy"] not in SYNCHRONOUS + BOUNDED])]
        ref_cell = next((c for c in sel if c["policy"] == ref), None)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        low = target - 0.3
        for ax, (title, group) in zip(axes, groups):
            if ref_cell is not None and ref_cell not in group:
                group = [ref_cell] + group
            for c in group:
                run = next(r for r in results if (r["frontend"], r["profile"], r["name"], r.get("seed", 0)) ==
                           (fe, prof, c["policy"], c["median_seed"]))
                xs = [p[0] for p in run["curve"]]
                ys = _smooth([p[2] for p in run["curve"]], smooth if len(xs) > 2 * smooth else 1)
                low = min(low, ys[-1] - 0.05)
                style = (dict(color="black", ls="--", lw=1.6) if c["policy"] == ref else
                         dict(lw=1.3, color=f"C{list(POLICIES).index(c['policy']) % 10}"))
                line, = ax.plot(xs, ys, label=f"{c['policy']} (seed {c['median_seed']})", **style)
                hit = time_to_target(run["curve"], target)
                if hit is not None:
                    ax.plot(hit[0], target, marker="o", color=line.get_color(), ms=5)
            ax.axhline(target, color="grey", ls=":", lw=1)
            ax.set(xlabel="wall time (s)", title=title)
            if group:
                ax.legend(fontsize=7, loc="lower right")
        axes[0].set_ylim(max(0.0, low), 1.0)
        axes[0].set_ylabel("test accuracy")
        fig.suptitle(f"{fe}, {prof}: {PROFILES[prof][0]} -- median-seed run per policy, moving average of "
                     f"{smooth} evaluations; dot: accuracy stays >= {target:g} from there", fontsize=9)
        fig.tight_layout()
        name = f"{fe}-{prof}-accuracy.png"
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        files.append(name)

        # 3. each rank's compute / wait / comm share (medians over the seeds)
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(sel) * 1.2) + 1, 4))
        x, labels = 0, []
        for r in sel:
            for k in range(len(r["compute_share"])):
                c, w, m = r["compute_share"][k], r["wait_share"][k], r["comm_share"][k]
                ax.bar(x, c, color="tab:green")
                ax.bar(x, w, bottom=c, color="tab:red")
                ax.bar(x, m, bottom=c + w, color="tab:blue")
                ax.bar(x, max(0.0, 1 - c - w - m), bottom=c + w + m, color="lightgrey")
                labels.append(f"{r['policy']} r{k}" if k == 0 else f"r{k}")
                x += 1
            x += 1
        ax.set_xticks([i for i in range(x) if i not in _gaps(sel)])
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set(ylabel="share of wall time", ylim=(0, 1),
               title=f"{fe}, {prof}: compute / wait / comm / other (median over seeds)")
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:green", "tab:red", "tab:blue",
                                                                        "lightgrey")],
                  labels=["compute", "wait", "comm", "other"], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1))
        fig.tight_layout()
        name = f"{fe}-{prof}-shares.png"
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        files.append(name)
    return files


def _gaps(srows):
    gaps, x = set(), 0
    for r in srows:
        x += len(r["compute_share"])
        gaps.add(x)
        x += 1
    return gaps


# ---- markdown -----------------------------------------------------------------------------------------------------
def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _ms(s: Optional[Dict], spec: str = ".2f", suffix: str = "") -> str:
    """'median (min-max)' of a spread; the range only when the runs differ."""
    if s is None or s["n"] == 0:
        return "-"
    med = "not reached" if s["median"] is None else format(s["median"], spec) + suffix
    if s["min"] is None or (s["n"] == 1 and s["median"] is not None):
        return med
    rng = f"{format(s['min'], spec)}-{format(s['max'], spec)}{suffix}"
    return med if s["min"] == s["max"] and not s["missing"] else f"{med} ({rng})"


def _staleness(c: Dict) -> str:
    st = c["staleness"]
    if st is None:
        return "-"
    if c["policy"] in SYNCHRONOUS and not any(st.values()):
        return "0"
    return " / ".join(_fmt(st[k], ".1f" if k == "mean" else ".0f") for k in ("mean", "p90", "max"))


def _seed_range(seeds: Sequence[int]) -> str:
    """'0-6' for consecutive seeds, else '0, 2, 5'."""
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def markdown(cells: List[Dict], target: float, opts, images: List[str], img_prefix: str) -> str:
    task = TASKS[opts.task]
    seed_sets = {tuple(sorted(c["seeds"])) for c in cells}
    if len(seed_sets) == 1:
        seeds = next(iter(seed_sets))
        runs = (f"Each cell ran {len(seeds)} time{'s' if len(seeds) > 1 else ''} "
                f"({'seeds ' + _seed_range(seeds) if len(seeds) > 1 else f'seed {seeds[0]}'}")
    else:   # --update --first-seed added seeds to some cells
        groups: Dict[tuple, List[str]] = {}
        for c in cells:
            groups.setdefault(tuple(sorted(c["seeds"])), []).append(f"{c['profile']} {c['policy']}")
        most_first = sorted(groups.items(), key=lambda kv: -len(kv[0]))
        runs = "; ".join(f"seeds {_seed_range(k)}: {', '.join(v)}" for k, v in most_first)
        runs = f"Cells ran different numbers of seeds (the reached column's denominator; {runs}"
    out = ["## Tables (generated by `python -m benchmarks" + (" --docs" if opts.docs else "") +
           f" --task {opts.task}`)", "",
           f"Task `{opts.task}`: {task['title']}. 4 ranks on one machine ({os.cpu_count()} cores), launcher "
           f"`{opts.launcher}`, per-rank batch {opts.batch} (lbbsp: global batch {4 * opts.batch}), a budget of "
           f"{opts.global_steps} global steps (gradients of {opts.batch} samples) per job, SGD lr {opts.lr:g} x 4 "
           f"ranks = {4 * opts.lr:g}, momentum {opts.momentum:g}. Emulated speed: {opts.sample_ms:g} ms per sample "
           f"x the rank's factor ({opts.sample_ms * opts.batch:g} ms a step at speed 1; sleep; the H profiles' "
           f"extra per step scales with it). {runs}: a seed sets model initialization and batch order; the "
           f"data is fixed): medians, with the min-max over the seeds in parentheses.", "",
           f"Time to {target:g}: wall seconds until the test accuracy of rank 0's model (under wbsp the global "
           f"model W) *stays* at or above {target:g}: the first evaluation from which every later one, the "
           f"final one after the final synchronization included, is too (snapshots every {opts.eval_every} local "
           f"steps of rank 0, evaluated after training). 'not reached' when the median run never got there; the "
           f"reached column counts the runs that did. Gradients to {target:g}: global steps at that point (statistical "
           f"efficiency, apart from throughput). Speed-up: plain Horovod's median time to {target:g} / the policy's "
           f"(range: over the policy's runs). Same-seed speed-up: per seed, plain Horovod's time / the policy's "
           f"(a seed fixes the initialization and the data order of every arm: torch's DistributedSampler, whose "
           f"permutation LbbspSampler draws too), median and min-max over the seeds; a run that never reached "
           f"counts 0. Final accuracy: mean of the last {FINAL_EVALS} evaluations "
           f"('diverged': non-finite final weights). Dip after {target:g}: the largest fall of the accuracy below "
           f"its best so far, from the run's first evaluation at or above {target:g} on (over the runs that got "
           f"there; plain Horovod's own curve falls back too at this learning rate). "
           f"Staleness: gradients applied between the weights a gradient was computed on and its application "
           f"(mean / p90 / max over all ranks' updates, median over the seeds; 0 for the synchronous policies by "
           f"construction, '-' where the report does not have it). Shares: of each rank's wall time; fast ranks "
           f"are ranks 0 and 1.", ""]
    if any(c["policy"] in CONTROLS for c in cells):
        out += ["horovod-predivide3 is a control, not a policy: plain Horovod with gradient_predivide_factor=3 (each "
                    "gradient scaled by 1/3 before the sum and the sum by 3/4 after, instead of the sum by 1/4): the "
                    "same algorithm on the same batches, only the rounding of the average differs. Its distance from "
                    "plain Horovod's figures is the sample path's noise; the targets are not checked on it.", ""]
    for fe in dict.fromkeys(c["frontend"] for c in cells):
        for prof in [p for p in PROFILES if any(c["profile"] == p and c["frontend"] == fe for c in cells)]:
            sel = [c for c in cells if c["frontend"] == fe and c["profile"] == prof]
            ref = reference_policy(fe)
            out += [f"### {fe}, {prof}: {PROFILES[prof][0]}", "",
                     f"| policy | reached | time to {target:g} s | speed-up vs {ref} | same-seed speed-up | "
                     f"gradients to {target:g} | final accuracy | dip after {target:g} | wall s | wall speed-up | "
                     f"staleness mean / p90 / max | fast ranks' compute / wait |",
                     "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for c in sel:
                t = c["time_to_target_s"]
                div = f" ({c['diverged']} diverged)" if c.get("diverged") else ""
                out.append(f"| {c['policy']} | {t['n'] - t['missing']}/{t['n']}{div} | {_ms(t)} | "
                           f"{_ms(c['speedup'], '.2f', 'x')} | {_ms(c['paired_speedup'], '.2f', 'x')} | "
                           f"{_ms(c['time_to_target_steps'], '.0f')} | "
                           f"{_ms(c['final_accuracy'], '.4f')} | {_ms(c['dip_after_target'], '.3f')} | "
                           f"{_ms(c['wall_s'])} | "
                           f"{_fmt(c['wall_speedup'])}{'x' if c['wall_speedup'] else ''} | "
                           f"{_staleness(c)} | {100 * c['fast_compute_share']:.0f}% / "
                           f"{100 * c['fast_wait_share']:.0f}% |")
            out.append("")
            for img in images:
                if img.startswith(f"{fe}-{prof}-"):
                    out.append(f"![{img}]({img_prefix}{img})")
            out.append("")
    out += ["### Targets (checked on the medians above)", ""] + check_targets(cells, target, opts.task)
    return "\n".join(out) + "\n"


def check_targets(cells: List[Dict], target: float, task: str = "mnist1d") -> List[str]:
    """The targets (set for task mnist1d; checked on any task, the lines say which), on the medians."""
    lines = [] if task == "mnist1d" else [f"- (the targets are set for task mnist1d; this run is task {task})"]

    def get(fe, prof, pol):
        return next((c for c in cells if (c["frontend"], c["profile"], c["policy"]) == (fe, prof, pol)), None)

    def ok(flag):
        return "met" if flag else "MISSED"

    def speedups(profile, unchecked):
        """{policy: median speed-up vs plain Horovod} on `profile`, or None (with a line saying why) when there is
        no reference run that reached the target."""
        ref = get("torch", profile, "horovod")
        rest = [c for c in cells if (c["frontend"], c["profile"]) == ("torch", profile)
                and c["policy"] != "horovod" and c["policy"] not in CONTROLS]
        if not (ref and rest):
            return None
        if ref["time_to_target_s"]["median"] is None:
            lines.append(f"- {profile}: plain Horovod's median run never reached {target:g}; {unchecked}")
            return None
        return {c["policy"]: (c["speedup"]["median"] or 0.0) for c in rest}

    sps = speedups("static", "speed-ups not checked")
    if sps:
        best = max(sps, key=sps.get)
        lines.append(f"- static, time to {target:g}, best policy >= 2.0x plain Horovod: {best} {sps[best]:.2f}x "
                     f"({ok(sps[best] >= 2.0)})")
        for pol in ("asp", "zipline-R15", "wbsp-overlap", "lbbsp"):
            if pol in sps:
                lines.append(f"- static, time to {target:g}, {pol} >= 1.5x: {sps[pol]:.2f}x "
                             f"({ok(sps[pol] >= 1.5)})")
    misses, checked = [], 0
    for c in cells:
        r = get(c["frontend"], c["profile"], reference_policy(c["frontend"]))
        if r is None or r is c or c["policy"] in CONTROLS:
            continue
        checked += 1
        gap = r["final_accuracy"]["median"] - c["final_accuracy"]["median"]
        if gap > 0.01:
            misses.append(f"{c['frontend']}/{c['profile']}/{c['policy']} {c['final_accuracy']['median']:.4f} vs "
                          f"{r['final_accuracy']['median']:.4f}")
    if checked:
        lines.append("- final accuracy of every policy within 1 point of Horovod's, every profile: " +
                     ("met" if not misses else "MISSED for " + "; ".join(misses)))
    sps = speedups("homogeneous", "not checked")
    if sps:
        worst = min(sps, key=sps.get)
        lines.append(f"- homogeneous, no policy below 0.95x Horovod's time to {target:g}: worst {worst} "
                     f"{sps[worst]:.2f}x ({ok(sps[worst] >= 0.95)}); all: "
                     + ", ".join(f"{k} {v:.2f}x" for k, v in sps.items()))
    sps = speedups("transient", "not checked")
    if sps:
        worst = min(sps, key=sps.get)
        lines.append(f"- transient, every policy >= 1.0x Horovod's time to {target:g}: worst {worst} "
                     f"{sps[worst]:.2f}x ({ok(sps[worst] >= 1.0)}); all: "
                     + ", ".join(f"{k} {v:.2f}x" for k, v in sps.items()))
        for pol in ("lbbsp", "wbsp-overlap"):
            if pol in sps:
                lines.append(f"- transient, {pol} >= 1.2x: {sps[pol]:.2f}x ({ok(sps[pol] >= 1.2)})")
        ref = get("torch", "transient", "horovod")
        low = [c for c in cells if (c["frontend"], c["profile"]) == ("torch", "transient")
               and c["policy"] not in SYNCHRONOUS + CONTROLS and c["policy"] != "horovod"]
        if ref and low:
            worst = min(low, key=lambda c: c["fast_compute_share"])
            lines.append(f"- transient, every relaxed policy's fast ranks compute at least Horovod's share "
                         f"({100 * ref['fast_compute_share']:.0f}%): lowest {worst['policy']} "
                         f"{100 * worst['fast_compute_share']:.0f}% "
                         f"({ok(worst['fast_compute_share'] >= ref['fast_compute_share'])})")
    return lines


WHICH_BEGIN = "<!-- which-policy:begin (generated by python -m benchmarks --docs) -->"
WHICH_END = "<!-- which-policy:end -->"
WHICH_PROFILES = (("homogeneous", "equal speeds"), ("static", "one rank 3x slower"),
                  ("transient", "every rank slowed now and then"))


SITTING_PREFIX = "sitting-"   # docs/bench/sitting-NAME.json: the rows of a run kept apart (--sitting NAME)


def sitting_path(name: str) -> str:
    return os.path.join(ROOT, "docs", "bench", f"{SITTING_PREFIX}{name}.json")


def saved_sittings() -> List[Tuple[str, List[Dict]]]:
    """(name, cells) of each sitting kept in docs/bench (--sitting), by name: each aggregated on its own, so its
    speed-ups are against its own plain Horovod runs."""
    folder = os.path.join(ROOT, "docs", "bench")
    names = sorted(f[len(SITTING_PREFIX):-len(".json")] for f in os.listdir(folder)
                   if f.startswith(SITTING_PREFIX) and f.endswith(".json"))
    return [(n, aggregate(json.load(open(sitting_path(n)))["rows"])) for n in names]


def which_policy_table(cells: List[Dict], target: float, sittings: Sequence[Tuple[str, List[Dict]]] = ()) -> str:
    """The README's decision table: per policy and profile, the median speed-up to the target over plain Horovod
    (min-max over the seeds) and the median final accuracy, from the same cells as docs/benchmarks.md; then a row
    per policy of each sitting (--sitting: a run kept apart), against that sitting's own Horovod runs, footnoted."""
    def cell(pol, prof, cells=cells):
        c = next((c for c in cells if (c["frontend"], c["profile"], c["policy"]) == ("torch", prof, pol)), None)
        if c is None:
            return "-"
        if pol == "horovod":
            t = c["time_to_target_s"]["median"]
            return f"{t:.0f} s, acc {c['final_accuracy']['median']:.3f}" if t else "not reached"
        sp = c["speedup"]
        if not sp or sp["median"] is None:
            return f"not reached, acc {c['final_accuracy']['median']:.3f}"
        return (f"**{sp['median']:.2f}x** ({sp['min']:.2f}-{sp['max']:.2f}), acc "
                f"{c['final_accuracy']['median']:.3f}")

    policies = [p for p in dict.fromkeys(c["policy"] for c in cells if c["frontend"] == "torch")
                if p not in CONTROLS]
    profiles = [(p, d) for p, d in WHICH_PROFILES if any(c["profile"] == p for c in cells)]
    lines = ["| policy | " + " | ".join(f"{p}: {d}" for p, d in profiles) + " |",
             "|---|" + "---|" * len(profiles)]
    for pol in ["horovod"] + [p for p in policies if p != "horovod"]:
        lines.append(f"| {pol if pol != 'horovod' else 'plain Horovod (time to target)'} | "
                     + " | ".join(cell(pol, p) for p, _ in profiles) + " |")
    notes = []
    for name, own in sittings:
        mark = "\u2020" * (len(notes) + 1)
        for pol in dict.fromkeys(c["policy"] for c in own if c["frontend"] == "torch"):
            if pol in ("horovod",) + CONTROLS:
                continue
            lines.append(f"| {pol}{mark} | " + " | ".join(cell(pol, p, own) for p, _ in profiles) + " |")
        ref = [f"{d} {cell('horovod', p, own)}" for p, d in profiles]
        notes.append(f"{mark} A sitting of its own (`python -m benchmarks --sitting {name}`, "
                     f"docs/bench/{SITTING_PREFIX}{name}.json), against that sitting's plain Horovod runs of the same "
                     f"seeds (time to target: " + "; ".join(ref) + ").")
    return "\n".join(lines) + "\n" + "".join(f"\n{textwrap.fill(n, 120, break_on_hyphens=False)}\n" for n in notes)


def write_between(path: str, begin: str, end: str, block: str):
    """Replace the text between the markers `begin` and `end` of `path` (both must be there) with `block`."""
    text = open(path).read()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: the markers {begin!r} / {end!r} are missing")
    head, rest = text.split(begin, 1)
    open(path, "w").write(f"{head}{begin}\n{block}{end}{rest.split(end, 1)[1]}")


GENERATED_BEGIN = "<!-- generated by python -m benchmarks: begin -->"
GENERATED_END = "<!-- generated by python -m benchmarks: end -->"


def write_keeping_notes(path: str, generated: str):
    """Write the generated tables into `path` between the markers; hand-written text outside them is kept."""
    before, after = "", ""
    if os.path.exists(path):
        old = open(path).read()
        if GENERATED_BEGIN in old and GENERATED_END in old:
            before = old[:old.index(GENERATED_BEGIN)]
            after = old[old.index(GENERATED_END) + len(GENERATED_END):]
    with open(path, "w") as f:
        f.write(f"{before}{GENERATED_BEGIN}\n{generated}{GENERATED_END}{after or chr(10)}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=list(TASKS), help="mnist1d (default) or digits (default with --quick)")
    ap.add_argument("--profiles", help=f"comma list of {', '.join(PROFILES)} (default: the task's: mnist1d "
                    f"{TASKS['mnist1d']['profiles']}; digits all)")
    ap.add_argument("--policies", help=f"comma list of {', '.join(POLICIES)} (default: the task's: mnist1d "
                    f"{TASKS['mnist1d']['policies']}; digits all)")
    ap.add_argument("--frontends", help="torch, keras (keras: task digits only; default for digits: both, keras "
                    f"runs profile static with policies {', '.join(KERAS_POLICIES)})")
    ap.add_argument("--seeds", type=int, help="runs per cell, seeds 0..N-1 (default 3; 1 with --quick)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds K..K+N-1 instead of 0..N-1 (with --update: more seeds for cells already run)")
    ap.add_argument("--global-steps", type=int, help="budget in global steps (default: the task's, mnist1d "
                    f"{TASKS['mnist1d']['budget']}, digits {TASKS['digits']['budget']})")
    ap.add_argument("--sample-ms", type=float,
                    help="emulated milliseconds per sample at speed 1 (the profiles' per-step extras scale with it; "
                         f"default: mnist1d {TASKS['mnist1d']['sample_ms']:g}, digits "
                         f"{TASKS['digits']['sample_ms']:g})")
    ap.add_argument("--target", type=float, help="test accuracy for time to accuracy (default: mnist1d "
                    f"{TASKS['mnist1d']['target']:g}, digits {TASKS['digits']['target']:g})")
    ap.add_argument("--lr", type=float, help="per-rank learning rate; SGD gets lr x ranks (default: mnist1d "
                    f"{TASKS['mnist1d']['lr']:g}: plain Horovod at 0.05 x 4 ended at 0.905 in 1 of 3 "
                    f"seeds and lbbsp, synchronous too, collapsed to 0.10 in 2 runs; digits {TASKS['digits']['lr']:g})")
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, help="rank 0's local steps between snapshots (default: the task's)")
    ap.add_argument("--launcher", choices=["mpirun", "horovodrun"], default="mpirun")
    ap.add_argument("--hosts", type=lambda v: [h for h in v.split(",") if h], default=None,
                    help="one rank per host of this comma list (a cluster of ci/cluster.sh) instead of localhost")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per job")
    ap.add_argument("--out", default="bench-results", help="folder for results and plots")
    ap.add_argument("--docs", action="store_true", help="write docs/benchmarks.md and docs/bench/*.png")
    ap.add_argument("--update", action="store_true", help="re-run only the chosen jobs and merge them into the "
                    "results already in the output folder (same task, --global-steps and --sample-ms as those)")
    ap.add_argument("--from", dest="from_dir", metavar="DIR",
                    help="run nothing: write the tables, plots and target checks from DIR/results.json (a finished "
                         "run's --out folder) to --out, or with --docs to docs/ (its task, budget and speed are kept)")
    ap.add_argument("--sitting", metavar="NAME",
                    help="task mnist1d: run the chosen jobs (horovod among them) as a sitting of their own, kept in "
                         "docs/bench/sitting-NAME.json; README.md's policy table gains its policies, against that "
                         "sitting's plain Horovod runs (docs/benchmarks.md's tables stay as they are)")
    ap.add_argument("--quick", action="store_true", help="smoke run: task digits, 1 seed, a small budget (digits "
                    f"{TASKS['digits']['quick_budget']}, mnist1d {TASKS['mnist1d']['quick_budget']} global steps); "
                    "unless given: profile static, policies horovod, bsp, asp, frontend torch")
    opts = ap.parse_args(argv)
    quick = opts.quick   # smaller defaults; explicit choices are kept
    opts.task = opts.task or ("digits" if quick else "mnist1d")
    task = TASKS[opts.task]
    opts.batch = task["batch"]
    opts.global_steps = opts.global_steps or (task["quick_budget"] if quick else task["budget"])
    opts.sample_ms = task["sample_ms"] if opts.sample_ms is None else opts.sample_ms
    opts.target = task["target"] if opts.target is None else opts.target
    opts.eval_every = opts.eval_every or task["eval_every"]
    opts.lr = task["lr"] if opts.lr is None else opts.lr
    opts.seeds = opts.seeds or (1 if quick else 3)
    opts.profiles = opts.profiles or ("static" if quick else task["profiles"])
    opts.policies = opts.policies or ("horovod,bsp,asp" if quick else task["policies"])
    opts.frontends = opts.frontends or ("torch" if quick else task["frontends"])
    for name, values, known in (("--profiles", opts.profiles, PROFILES), ("--policies", opts.policies, POLICIES),
                                ("--frontends", opts.frontends, WORKERS)):
        bad = [v for v in values.split(",") if v not in known]
        if bad:
            ap.error(f"{name}: unknown {bad}; accepted: {','.join(known)}")
    if opts.task != "digits" and "keras" in opts.frontends.split(","):
        ap.error("--frontends keras: only with --task digits (the Keras worker has the digits MLP only)")
    if opts.seeds < 1 or opts.global_steps < 1 or opts.eval_every < 1:
        ap.error("--seeds, --global-steps and --eval-every must be >= 1")
    if opts.first_seed < 0:
        ap.error("--first-seed must be >= 0")
    if opts.sitting is not None:
        if not re.fullmatch(r"[a-z0-9-]+", opts.sitting):
            ap.error(f"--sitting: a name of a-z, 0-9 and -, got {opts.sitting!r}")
        if opts.from_dir or opts.update or opts.docs:
            ap.error("--sitting: not with --from, --update or --docs (a sitting is kept apart from docs/bench's run)")
        if opts.task != "mnist1d" or "horovod" not in opts.policies.split(",") or opts.frontends != "torch":
            ap.error("--sitting: task mnist1d, frontend torch, and horovod among --policies (its reference)")
    if opts.from_dir and opts.update:
        ap.error("--from and --update: choose one (--from runs nothing)")
    if opts.from_dir and not os.path.exists(os.path.join(opts.from_dir, "results.json")):
        ap.error(f"--from: no results.json in {opts.from_dir}")
    return opts


def run_key(r: Dict) -> tuple:
    return r["frontend"], r["profile"], r["name"], r.get("seed", 0)


def merge_runs(old: List[Dict], new: List[Dict]) -> List[Dict]:
    """--update: the previous runs with the re-run jobs replaced in place (new jobs appended)."""
    fresh = {run_key(r): r for r in new}
    merged = [fresh.pop(run_key(r), r) for r in old]
    return merged + [r for r in new if run_key(r) in fresh]


class Eta:
    """Seconds left for the jobs not run yet: each job estimated by the mean time of the finished jobs of the same
    (frontend, profile, policy), else of the same (frontend, profile), else of all finished jobs."""

    def __init__(self):
        self.done: List[Tuple[tuple, float]] = []

    def add(self, job: tuple, seconds: float):
        self.done.append((job, seconds))

    def left(self, jobs: Sequence[tuple]) -> Optional[float]:
        if not self.done:
            return None
        total = 0.0
        for job in jobs:
            for n in (3, 2, 0):
                same = [s for j, s in self.done if j[:n] == job[:n]]
                if same:
                    total += sum(same) / len(same)
                    break
        return total


def main(argv=None):
    opts = parse_args(argv)
    jobs = []
    # seeds outermost: the first pass gives every cell once (and the estimates)
    for seed in range(opts.first_seed, opts.first_seed + opts.seeds):
        for fe in opts.frontends.split(","):
            for prof in opts.profiles.split(","):
                for pol in opts.policies.split(","):
                    if fe == "keras" and (pol not in KERAS_POLICIES or prof != "static"):
                        continue
                    jobs.append((fe, prof, pol, seed))
    outdir = os.path.join(ROOT, "docs", "bench") if opts.docs else opts.out
    if not opts.sitting:
        os.makedirs(outdir, exist_ok=True)
    if opts.from_dir:
        return render(opts, outdir, json.load(open(os.path.join(opts.from_dir, "results.json"))))
    print(f"task {opts.task}: {len(jobs)} jobs ({opts.seeds} seed{'s' if opts.seeds > 1 else ''}), "
          f"{opts.global_steps} global steps of {opts.batch} samples, {opts.sample_ms:g} ms per sample, "
          f"target {opts.target:g}", flush=True)
    results, rows, eta = [], [], Eta()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        write_task_data(opts.task, os.path.join(work, f"{opts.task}.npz"))
        for i, job in enumerate(jobs, 1):
            fe, prof, pol, seed = job
            print(f"[{i}/{len(jobs)}] {fe:5s} {prof:12s} {pol:13s} seed {seed} ...", end="", flush=True)
            res = run_one(fe, prof, pol, seed, opts, work)
            row = summarize(res, opts.target)
            results.append(res)
            rows.append(row)
            eta.add(job[:3], res["job_s"])
            left = eta.left([j[:3] for j in jobs[i:]])
            print(f" {row['wall_s']:6.2f} s, to {opts.target:g}: {_fmt(row['time_to_target_s'])} s "
                  f"({_fmt(row['time_to_target_steps'], 'd')} gradients), final acc {row['final_accuracy']:.3f}, "
                  f"fast compute {100 * row['fast_compute_share']:.0f}%, staleness mean "
                  f"{_fmt((row['staleness'] or {}).get('mean'), '.1f')}"
                  f"{', DIVERGED (non-finite weights)' if row['diverged'] else ''} (job {res['job_s']:.0f} s, "
                  f"{time.perf_counter() - t_start:.0f} s so far, {len(jobs) - i} jobs left: "
                  f"~{left or 0:.0f} s)", flush=True)
    if opts.sitting:
        return write_sitting(opts, rows, t_start)
    if opts.update and os.path.exists(os.path.join(outdir, "results.json")):
        old = json.load(open(os.path.join(outdir, "results.json")))
        if old.get("task", "digits") != opts.task:
            raise SystemExit(f"--update: {outdir} holds task {old.get('task', 'digits')}, not {opts.task}")
        results = merge_runs(old["runs"], results)
        rows = [summarize(r, opts.target) for r in results]
    return write_outputs(opts, outdir, results, rows, t_start)


RUN_SETTINGS = ("lr", "momentum", "batch", "launcher")   # kept in results.json for --from


def render(opts, outdir: str, saved: Dict) -> int:
    """--from: the outputs of a finished run, from its results.json (the run's task, budget and speed win)."""
    opts.task = saved.get("task", "digits")
    for k in ("target", "global_steps", "sample_ms") + RUN_SETTINGS:   # (older files lack the RUN_SETTINGS)
        setattr(opts, k, saved.get(k, getattr(opts, k)))
    results = saved["runs"]
    print(f"{len(results)} runs from {opts.from_dir}: task {opts.task}, target {opts.target:g}", flush=True)
    return write_outputs(opts, outdir, results, [summarize(r, opts.target) for r in results], time.perf_counter())


def write_outputs(opts, outdir: str, results: List[Dict], rows: List[Dict], t_start: float) -> int:
    """results.json / results.csv / cells.csv, the plots, the markdown tables and the target checks."""
    cells = aggregate(rows)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump({"task": opts.task, "target": opts.target, "global_steps": opts.global_steps,
                   "sample_ms": opts.sample_ms, **{k: getattr(opts, k) for k in RUN_SETTINGS},
                   "cells": cells, "rows": rows, "runs": results}, f, indent=1)
    with open(os.path.join(outdir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv(v) for k, v in r.items()})
    with open(os.path.join(outdir, "cells.csv"), "w", newline="") as f:
        flat = [_flatten(c) for c in cells]
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for c in flat for k in c)))
        w.writeheader()
        w.writerows(flat)
    images = plot(results, rows, cells, outdir, opts.target)
    md = markdown(cells, opts.target, opts, images, "bench/" if opts.docs else "")
    md_path = os.path.join(ROOT, "docs", "benchmarks.md") if opts.docs else os.path.join(outdir, "benchmarks.md")
    write_keeping_notes(md_path, md)
    if opts.docs and opts.task == "mnist1d":
        write_between(os.path.join(ROOT, "README.md"), WHICH_BEGIN, WHICH_END,
                      which_policy_table(cells, opts.target, saved_sittings()))
    print("\n".join(check_targets(cells, opts.target, opts.task)))
    print(f"wrote {md_path}, {len(images)} plots and results.json / results.csv / cells.csv in {outdir} "
          f"({time.perf_counter() - t_start:.0f} s)")
    return 0


def write_sitting(opts, rows: List[Dict], t_start: float) -> int:
    """--sitting: the run's rows in docs/bench/sitting-NAME.json, and README.md's policy table again (docs/bench's
    cells and every sitting)."""
    with open(sitting_path(opts.sitting), "w") as f:
        json.dump({"task": opts.task, "target": opts.target, "global_steps": opts.global_steps,
                   "sample_ms": opts.sample_ms, **{k: getattr(opts, k) for k in RUN_SETTINGS}, "rows": rows}, f,
                  indent=1)
    main_cells = json.load(open(os.path.join(ROOT, "docs", "bench", "results.json")))["cells"]
    write_between(os.path.join(ROOT, "README.md"), WHICH_BEGIN, WHICH_END,
                  which_policy_table(main_cells, opts.target, saved_sittings()))
    print("\n".join(check_targets(aggregate(rows), opts.target, opts.task)))
    print(f"wrote {sitting_path(opts.sitting)} and README.md's policy table ({time.perf_counter() - t_start:.0f} s)")
    return 0


def _csv(v):
    if isinstance(v, list):
        return " ".join(map(str, v))
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items())
    return v


def _flatten(c: Dict) -> Dict:
    out = {}
    for k, v in c.items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                out[f"{k}_{kk}"] = vv
        elif v is None and k in ("staleness", "speedup", "paired_speedup"):
            continue
        else:
            out[k] = _csv(v)
    return out
