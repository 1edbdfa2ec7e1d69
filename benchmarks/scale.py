"""Model-size scale benchmark: per-step time, peak RSS and bytes reduced per rank, for plain
Horovod and every policy, homogeneous ranks, side by side in one run.

    python benchmarks/scale.py --sizes 1,10,30 --ranks 2,4 --repeats 2 [--json docs/bench/scale.json]
    python benchmarks/scale.py --device cuda --launcher horovodrun --sizes 10,100 --ranks 2 [--slowdown 3]

Each cell is one `mpirun` job of benchmarks/scale_worker.py (a stack of Linear layers, SGD momentum 0.9). Jobs of
one (size, ranks) pair run back to back, plain Horovod first, and --repeats rounds interleave them so that the
machine's noise falls on every policy alike; a cell's figure is the median over rounds of the slowest rank's step
time (the job's pace), the largest peak RSS over ranks, and rank 0's bytes reduced per step. Ratios are to plain
Horovod of the same round-set. --device cuda puts each rank's model on its GPU (two ranks may share one) and adds
peak GPU memory. --slowdown F: rank 1 sleeps (F - 1) x plain Horovod's step time of the first round each step (its
compute F times as long), every job trains for a global step budget, and the figure is the job's throughput (samples
per second, all ranks) beside the step time. A development tool: not part of the installed package.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from cluster import launch_command, link_bytes   # benchmarks/cluster.py (this script runs as a file)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvd_elastic import registry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "benchmarks", "scale_worker.py")
BATCH = 16   # samples per rank per step
POLICIES = {"horovod": None, "bsp": {"HVD_ELASTIC_POLICY": "bsp"}, "lbbsp": {"HVD_ELASTIC_POLICY": "lbbsp"},
            "asp": {"HVD_ELASTIC_POLICY": "asp"}, "ssp": {"HVD_ELASTIC_POLICY": "ssp"},
            "dssp": {"HVD_ELASTIC_POLICY": "dssp"}, "zipline": {"HVD_ELASTIC_POLICY": "zipline"},
            "wbsp-overlap": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"},
            # variants (not in the default set): one own push in flight (the tick overlaps the next step's
            # compute), tick interval 5 ms, push at step(), the allocator left alone, probe pacing
            "asp-inflight1": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "1"},
            "asp-tick5": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_TICK_MS": "5"},
            "asp-pushatstep": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_PUSH_AT_BACKWARD": "0"},
            "asp-noheap": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_KEEP_HEAP": "0"},
            # probe pacing throughout (with --fallback: lock-step through probes and releases, not joined ticks)
            "asp-probe": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_TICK_PACING": "probe"},
            "zipline-probe": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_TICK_PACING": "probe"}}
DEFAULT_POLICIES = "horovod,bsp,lbbsp,asp,ssp,dssp,zipline,wbsp-overlap"


def run_cell(policy, params_m, ranks, steps, timeout, device="cpu", launcher="mpirun", delay="", hosts=None,
             fallback=False, warmup=3):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "HOROVOD_LOG_LEVEL": "warning",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "HVD_ELASTIC_REPORT": "0"})
    env.update(POLICIES[policy] or {})
    spec = registry.policy(env["HVD_ELASTIC_POLICY"]) if "HVD_ELASTIC_POLICY" in env else None
    if spec is not None and spec.reads("relax_min_gain") and not fallback:
        # each policy's own machinery: runs this short would otherwise be the lock-step fallback's first
        # measurement throughout (at equal speeds: lock-step, which --fallback measures)
        env["HVD_ELASTIC_RELAX_MIN_GAIN"] = "0"
    if spec is not None and spec.balances_batches:
        # the global batch it re-divides: the same samples per step as every other policy
        env["HVD_ELASTIC_GLOBAL_BATCH"] = str(BATCH * ranks)
    program = [sys.executable, WORKER, "--params", str(params_m), "--steps", str(steps), "--warmup", str(warmup),
               "--batch", str(BATCH), "--impl", "horovod" if policy == "horovod" else "hvd_elastic", "--device", device]
    if delay:
        program += ["--delay", delay]
    cmd = launch_command(launcher, ranks, program, hosts, exports=sorted(k for k in env if k.startswith("HVD_")))
    before = link_bytes(hosts) if hosts else {}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    after = link_bytes(hosts) if hosts else {}
    lines = [line for line in out.stdout.splitlines() if line.startswith("SCALE ")]
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {(out.stdout + out.stderr)[-600:]}"}
    res = json.loads(lines[-1][len("SCALE "):])
    ranks_ = res["ranks"]
    return {"numel": res["numel"], "step_s": max(r["step_s"] for r in ranks_),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks_), "bytes_per_step": ranks_[0]["bytes_per_step"],
            "payload_collectives": ranks_[0]["payload_collectives"], "ticks": ranks_[0]["ticks"],
            "buffers": max((r.get("buffers") or 0) for r in ranks_),
            "held_max": max((r.get("held_max") or 0) for r in ranks_),
            "samples_per_s": sum(r["samples_per_s"] for r in ranks_),
            # what crossed each host's link per step, both directions (a cluster of ci/cluster.sh)
            "link_mb_per_step": {h: (after[h] - before[h]) / 1e6 / ranks_[0]["steps_total"] for h in after},
            "peak_gpu_mb": max((r.get("peak_gpu_mb") or 0) for r in ranks_) or None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,30", help="millions of parameters, comma-separated")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None, help="write every cell and round here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--launcher", choices=["mpirun", "horovodrun"], default="mpirun")
    ap.add_argument("--slowdown", type=float, default=1.0, help="rank 1's compute this many times as long")
    ap.add_argument("--hosts", type=lambda v: [h for h in v.split(",") if h], default=None,
                    help="one rank per host of this comma list (a cluster of ci/cluster.sh) instead of localhost")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones (with --fallback, "
                    "enough for the fallback's first measurements, about 40, times its steady state)")
    ap.add_argument("--fallback", action="store_true",
                    help="asp, ssp, dssp, zipline with their default lock-step fallback (HVD_ELASTIC_RELAX_MIN_GAIN "
                         "unset) instead of their own rules")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or "horovod" not in policies:
        sys.exit(f"--policies: unknown {unknown} (accepted: {','.join(POLICIES)}; horovod, the reference, is needed)")
    results = []
    for params_m in (int(s) for s in args.sizes.split(",")):
        for ranks in (int(r) for r in args.ranks.split(",")):
            rounds = {p: [] for p in policies}
            delay = ""
            for k in range(args.repeats):
                for p in policies:
                    cell = run_cell(p, params_m, ranks, args.steps, args.timeout, args.device, args.launcher, delay,
                                    args.hosts, args.fallback, args.warmup)
                    rounds[p].append(cell)
                    if p == "horovod" and args.slowdown > 1 and not delay and "error" not in cell:
                        # the homogeneous Horovod step sets the straggler's extra; this round's reference re-runs
                        delay = f"1:{(args.slowdown - 1) * cell['step_s']:.4f}"
                        print(f"[scale] rank 1 sleeps {delay.split(':')[1]} s a step (slowdown {args.slowdown:g})")
                        cell = run_cell(p, params_m, ranks, args.steps, args.timeout, args.device, args.launcher,
                                        delay, args.hosts, args.fallback, args.warmup)
                        rounds[p][-1] = cell
                    print(f"[scale] {params_m}M x{ranks} round {k + 1}/{args.repeats} {p}: "
                          + (cell["error"] if "error" in cell else
                             f"{1000 * cell['step_s']:.1f} ms/step, {cell['samples_per_s']:.0f} samples/s, "
                             + (f"GPU {cell['peak_gpu_mb']:.0f} MB, " if cell.get("peak_gpu_mb") else "")
                             + f"{cell['peak_rss_mb']:.0f} MB, "
                             f"{cell['bytes_per_step'] / 1e6:.1f} MB reduced/step"
                             + (f", update buffers {cell['buffers']} (held at once {cell['held_max']})"
                                if cell.get("buffers") else "")), flush=True)
            ok = {p: [c for c in cs if "error" not in c] for p, cs in rounds.items()}
            ref = ok["horovod"]
            print(f"\n{params_m}M parameters, {ranks} ranks (median of {args.repeats}; ratio to plain Horovod)")
            print(f"{'policy':<14}{'ms/step':>10}{'x time':>9}{'x thru':>8}{'peak RSS MB':>13}{'+copies':>9}"
                  f"{'GPU MB':>9}{'+copies':>9}{'MB/step':>10}{'x bytes':>9}")
            model_mb = ref[0]["numel"] * 4 / 1e6 if ref else float("nan")
            for p in policies:
                if not ok[p]:
                    print(f"{p:<14} failed: {rounds[p][-1]['error'][:200]}")
                    continue
                def med(key, cells):
                    vals = [c[key] for c in cells if c.get(key) is not None]
                    return statistics.median(vals) if vals else float("nan")
                t, rss, b = med("step_s", ok[p]), med("peak_rss_mb", ok[p]), med("bytes_per_step", ok[p])
                thru, gpu = med("samples_per_s", ok[p]), med("peak_gpu_mb", ok[p])
                row = {"params_m": params_m, "ranks": ranks, "policy": p, "device": args.device,
                       "slowdown": args.slowdown, "fallback": args.fallback, "warmup": args.warmup, "step_s": t,
                       "peak_rss_mb": rss, "peak_gpu_mb": gpu, "samples_per_s": thru, "bytes_per_step": b,
                       "rounds": rounds[p]}
                if ref:
                    t0, r0, b0 = med("step_s", ref), med("peak_rss_mb", ref), med("bytes_per_step", ref)
                    thru0, g0 = med("samples_per_s", ref), med("peak_gpu_mb", ref)
                    row.update(time_ratio=t / t0, extra_copies=(rss - r0) / model_mb, bytes_ratio=b / b0,
                               throughput_ratio=thru / thru0, extra_gpu_copies=(gpu - g0) / model_mb)
                    print(f"{p:<14}{1000 * t:>10.1f}{t / t0:>9.2f}{thru / thru0:>8.2f}{rss:>13.0f}"
                          f"{(rss - r0) / model_mb:>9.1f}{gpu:>9.0f}{(gpu - g0) / model_mb:>9.1f}"
                          f"{b / 1e6:>10.1f}{b / b0:>9.2f}")
                results.append(row)
            print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
