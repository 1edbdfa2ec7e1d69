"""Model-size scale benchmark (issue: engine v2): per-step time, peak RSS and bytes reduced per rank, for plain
Horovod and every policy, homogeneous ranks, side by side in one run.

    python benchmarks/scale.py --sizes 1,10,30 --ranks 2,4 --repeats 2 [--json docs/bench/scale.json]

Each cell is one `mpirun` job of benchmarks/scale_worker.py (a stack of Linear layers, SGD momentum 0.9). Jobs of
one (size, ranks) pair run back to back, plain Horovod first, and --repeats rounds interleave them so that the
machine's noise falls on every policy alike; a cell's figure is the median over rounds of the slowest rank's step
time (the job's pace), the largest peak RSS over ranks, and rank 0's bytes reduced per step. Ratios are to plain
Horovod of the same round-set. A development tool: not part of the installed package.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "benchmarks", "scale_worker.py")
BATCH = 16   # samples per rank per step
POLICIES = {"horovod": None, "bsp": {"HVD_ELASTIC_POLICY": "bsp"}, "lbbsp": {"HVD_ELASTIC_POLICY": "lbbsp"},
            "asp": {"HVD_ELASTIC_POLICY": "asp"}, "ssp": {"HVD_ELASTIC_POLICY": "ssp"},
            "dssp": {"HVD_ELASTIC_POLICY": "dssp"}, "zipline": {"HVD_ELASTIC_POLICY": "zipline"},
            "wbsp-overlap": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"},
            # variants (not in the default set): one own push in flight (the tick overlaps the next step's
            # compute), tick interval 5 ms, push at step(), the allocator left alone
            "asp-inflight1": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "1"},
            "asp-tick5": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_TICK_MS": "5"},
            "asp-pushatstep": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_PUSH_AT_BACKWARD": "0"},
            "asp-noheap": {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_KEEP_HEAP": "0"}}
DEFAULT_POLICIES = "horovod,bsp,lbbsp,asp,ssp,dssp,zipline,wbsp-overlap"


def run_cell(policy, params_m, ranks, steps, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "HOROVOD_LOG_LEVEL": "warning",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "HVD_ELASTIC_REPORT": "0"})
    env.update(POLICIES[policy] or {})
    if policy == "lbbsp":   # the global batch it re-divides: the same samples per step as every other policy
        env["HVD_ELASTIC_GLOBAL_BATCH"] = str(BATCH * ranks)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
           sys.executable, WORKER, "--params", str(params_m), "--steps", str(steps),
           "--batch", str(BATCH), "--impl", "horovod" if policy == "horovod" else "hvd_elastic"]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("SCALE ")]
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {(out.stdout + out.stderr)[-600:]}"}
    res = json.loads(lines[-1][len("SCALE "):])
    ranks_ = res["ranks"]
    return {"numel": res["numel"], "step_s": max(r["step_s"] for r in ranks_),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks_), "bytes_per_step": ranks_[0]["bytes_per_step"],
            "payload_collectives": ranks_[0]["payload_collectives"], "ticks": ranks_[0]["ticks"],
            "buffers": max((r.get("buffers") or 0) for r in ranks_),
            "held_max": max((r.get("held_max") or 0) for r in ranks_)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,30", help="millions of parameters, comma-separated")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None, help="write every cell and round here")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or "horovod" not in policies:
        sys.exit(f"--policies: unknown {unknown} (accepted: {','.join(POLICIES)}; horovod, the reference, is needed)")
    results = []
    for params_m in (int(s) for s in args.sizes.split(",")):
        for ranks in (int(r) for r in args.ranks.split(",")):
            rounds = {p: [] for p in policies}
            for k in range(args.repeats):
                for p in policies:
                    cell = run_cell(p, params_m, ranks, args.steps, args.timeout)
                    rounds[p].append(cell)
                    print(f"[scale] {params_m}M x{ranks} round {k + 1}/{args.repeats} {p}: "
                          + (cell["error"] if "error" in cell else
                             f"{1000 * cell['step_s']:.1f} ms/step, {cell['peak_rss_mb']:.0f} MB, "
                             f"{cell['bytes_per_step'] / 1e6:.1f} MB reduced/step"
                             + (f", update buffers {cell['buffers']} (held at once {cell['held_max']})"
                                if cell.get("buffers") else "")), flush=True)
            ok = {p: [c for c in cs if "error" not in c] for p, cs in rounds.items()}
            ref = ok["horovod"]
            print(f"\n{params_m}M parameters, {ranks} ranks (median of {args.repeats}; ratio to plain Horovod)")
            print(f"{'policy':<14}{'ms/step':>10}{'x time':>9}{'peak RSS MB':>13}{'+copies':>9}"
                  f"{'MB/step':>10}{'x bytes':>9}")
            model_mb = ref[0]["numel"] * 4 / 1e6 if ref else float("nan")
            for p in policies:
                if not ok[p]:
                    print(f"{p:<14} failed: {rounds[p][-1]['error'][:200]}")
                    continue
                t = statistics.median(c["step_s"] for c in ok[p])
                rss = statistics.median(c["peak_rss_mb"] for c in ok[p])
                b = statistics.median(c["bytes_per_step"] for c in ok[p])
                row = {"params_m": params_m, "ranks": ranks, "policy": p, "step_s": t, "peak_rss_mb": rss,
                       "bytes_per_step": b, "rounds": rounds[p]}
                if ref:
                    t0 = statistics.median(c["step_s"] for c in ref)
                    r0 = statistics.median(c["peak_rss_mb"] for c in ref)
                    b0 = statistics.median(c["bytes_per_step"] for c in ref)
                    row.update(time_ratio=t / t0, extra_copies=(rss - r0) / model_mb, bytes_ratio=b / b0)
                    print(f"{p:<14}{1000 * t:>10.1f}{t / t0:>9.2f}{rss:>13.0f}{(rss - r0) / model_mb:>9.1f}"
                          f"{b / 1e6:>10.1f}{b / b0:>9.2f}")
                results.append(row)
            print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
