"""The benchmark matrix: policies x heterogeneity profiles on real multi-rank jobs, side by side with plain Horovod.

``python -m hvd_elastic.bench`` (see ``--help``) launches one 4-rank job per (frontend, profile, policy) with
mpirun (or horovodrun), an MLP on scikit-learn's digits (hvd_elastic/bench/torch_worker.py, keras_worker.py), and
writes into --out: results.json, results.csv, one PNG per profile (test accuracy vs wall time per policy) and one
of each rank's compute / wait / communication share (stacked bars), and benchmarks.md (the tables and the targets
of issue 7 checked against the figures). ``--docs`` writes them where the repository keeps them (docs/benchmarks.md
and docs/bench/).

Speeds are emulated by sleeps (hvd_elastic.emulation), the same for every policy, so 4 ranks on 2 cores behave
like workers of different speeds. A worker's step is `base` seconds per sample times its speed factor.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository
BASE = 0.0005                     # emulated seconds per sample at speed 1 (16 samples: an 8 ms step)
BATCH = 16                        # per-rank batch; lbbsp's global batch is BATCH x ranks

# name -> (description, per-rank time factors (x BASE per sample), per-rank extra seconds per step at BASE (scaled
#          with --sample-ms), jitter, non-dedicated period s, non-dedicated max factor)
PROFILES: Dict[str, tuple] = {
    "homogeneous": ("every rank at speed 1", [1, 1, 1, 1], [0, 0, 0, 0], 0.0, 0.0, 1.0),
    "static": ("speeds 1 : 1 : 1 : 1/3 (rank 3 three times slower)", [1, 1, 1, 3], [0, 0, 0, 0], 0.0, 0.0, 1.0),
    "mixed": ("per-sample times 1 : 1.3 : 1.7 : 2.5, jitter +-20% per step", [1, 1.3, 1.7, 2.5], [0, 0, 0, 0],
              0.2, 0.0, 1.0),
    "nondedicated": ("every rank's speed redrawn in [1/3, 1] every 2 s", [1, 1, 1, 1], [0, 0, 0, 0], 0.0, 2.0, 3.0),
    # WBSP paper: +0.5/1.0/1.5 s per iteration on half of the workers; scaled to this job's 8 ms step
    "H1": ("+half a step per step on ranks 2, 3 (WBSP H1 scaled; 4 ms at 0.5 ms/sample)",
           [1, 1, 1, 1], [0, 0, 0.004, 0.004], 0.0, 0.0, 1.0),
    "H2": ("+one step per step on ranks 2, 3 (WBSP H2 scaled; 8 ms at 0.5 ms/sample)",
           [1, 1, 1, 1], [0, 0, 0.008, 0.008], 0.0, 0.0, 1.0),
    "H3": ("+1.5 steps per step on ranks 2, 3 (WBSP H3 scaled; 12 ms at 0.5 ms/sample)",
           [1, 1, 1, 1], [0, 0, 0.012, 0.012], 0.0, 0.0, 1.0),
}

# name -> environment of the job (None: plain horovod.torch.DistributedOptimizer)
POLICIES: Dict[str, Optional[Dict[str, str]]] = {
    "horovod": None,
    "bsp": {"HVD_ELASTIC_POLICY": "bsp"},
    "asp": {"HVD_ELASTIC_POLICY": "asp"},
    "ssp-s3": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "3"},
    "ssp-s10": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "10"},
    "dssp": {"HVD_ELASTIC_POLICY": "dssp"},
    "zipline-R15": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15"},
    "zipline-R60": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "60"},
    "lbbsp": {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_PREDICTOR": "ewma"},
    "wbsp": {"HVD_ELASTIC_POLICY": "wbsp"},
    "wbsp-overlap": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"},
}
KERAS_POLICIES = ("bsp", "asp", "ssp-s3", "zipline-R15", "lbbsp", "wbsp")
WORKERS = {"torch": "hvd_elastic.bench.torch_worker", "keras": "hvd_elastic.bench.keras_worker"}


def launch_command(launcher: str, np_: int, module: str, args: List[str]) -> List[str]:
    py = sys.executable
    if launcher == "horovodrun":
        return [os.path.join(os.path.dirname(py), "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
                py, "-m", module, *args]
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np_),
            py, "-m", module, *args]


def per_rank_floats(text: str, n: int) -> List[float]:
    """'a,b,c,d' (or one value for every rank) -> n floats."""
    vals = [float(v) for v in text.split(",")] if text else [0.0]
    return (vals * n)[:n] if len(vals) == 1 else vals


def worker_arguments(description: str) -> argparse.ArgumentParser:
    """The options every benchmark worker takes from run_one (the job, its data and the profile's emulation)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True, help="digits .npz written by the driver")
    ap.add_argument("--global-steps", type=int, default=720, help="budget in steps of --batch-size samples")
    ap.add_argument("--batch-size", type=int, default=16, help="per-rank batch (lbbsp: B = this x ranks)")
    ap.add_argument("--lr", type=float, default=0.05, help="per-rank learning rate (scaled by the ranks)")
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--sample-delay", default="", help="per-rank seconds per sample, comma separated")
    ap.add_argument("--step-delay", default="", help="per-rank seconds per step, comma separated")
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--vary-period", type=float, default=0.0)
    ap.add_argument("--vary-factor", type=float, default=1.0)
    return ap


def worker_straggler(args, rank: int, size: int):
    """This rank's emulated slowness for the profile in the worker's arguments."""
    from ..emulation import Straggler
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


def run_one(frontend: str, profile: str, policy: str, opts, workdir: str) -> Dict:
    desc, factors, step_delay, jitter, period, vary = PROFILES[profile]
    out = os.path.join(workdir, f"{frontend}-{profile}-{policy}.json")
    args = ["--out", out, "--data", os.path.join(workdir, "digits.npz"), "--global-steps", str(opts.global_steps),
            "--batch-size", str(BATCH),
            "--sample-delay", ",".join(f"{opts.sample_ms / 1000 * f:g}" for f in factors),
            "--step-delay", ",".join(f"{d * opts.sample_ms / 1000 / BASE:g}" for d in step_delay),
            "--jitter", str(jitter),
            "--vary-period", str(period), "--vary-factor", str(vary)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"HVD_ELASTIC_REPORT": "0", "PYTHONUNBUFFERED": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "PYTHONPATH": os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p),
                "TF_CPP_MIN_LOG_LEVEL": "3"})
    if POLICIES[policy] is None:
        args += ["--impl", "horovod"]
    else:
        env.update(POLICIES[policy])
    cmd = launch_command(opts.launcher, 4, WORKERS[frontend], args)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=opts.timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{frontend}/{profile}/{policy} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    res = json.load(open(out))
    res.update({"frontend": frontend, "profile": profile, "name": policy, "job_s": time.perf_counter() - t0})
    return res


def time_to(curve: List[List[float]], target: float) -> Optional[float]:
    for t, _, acc in curve:
        if acc >= target:
            return t
    return None


def summarize(res: Dict, target: float) -> Dict:
    ranks = res["report"]["ranks"]
    fast = [r for r in ranks if r["rank"] in (0, 1)]          # speed 1 in every profile
    reached = time_to(res["curve"], target)
    return {"frontend": res["frontend"], "profile": res["profile"], "policy": res["name"],
            "wall_s": round(res["wall_s"], 3), "time_to_target_s": None if reached is None else round(reached, 3),
            "final_accuracy": round(res["final_accuracy"], 4),
            "fast_compute_share": round(min(r["compute_share"] for r in fast), 3),
            "fast_wait_share": round(max(r["wait_share"] for r in fast), 3),
            "compute_share": [round(r["compute_share"], 3) for r in ranks],
            "wait_share": [round(r["wait_share"], 3) for r in ranks],
            "comm_share": [round(r["comm_share"], 3) for r in ranks],
            "local_steps": [r["steps"] for r in ranks]}


def plot(results: List[Dict], rows: List[Dict], outdir: str, target: float) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    for fe, prof in sorted({(r["frontend"], r["profile"]) for r in results}):
        sel = [r for r in results if (r["frontend"], r["profile"]) == (fe, prof)]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in sel:
            c = r["curve"]
            ax.plot([p[0] for p in c], [p[2] for p in c], label=r["name"], lw=1.2)
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set(xlabel="wall time (s)", ylabel="test accuracy", ylim=(0.5, 1.0),
               title=f"{fe}, {prof}: {PROFILES[prof][0]}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        name = f"{fe}-{prof}-accuracy.png"
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        files.append(name)
        srows = [r for r in rows if (r["frontend"], r["profile"]) == (fe, prof)]
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(srows) * 1.2), 4))
        x, labels = 0, []
        for r in srows:
            for k in range(len(r["compute_share"])):
                c, w, m = r["compute_share"][k], r["wait_share"][k], r["comm_share"][k]
                ax.bar(x, c, color="tab:green")
                ax.bar(x, w, bottom=c, color="tab:red")
                ax.bar(x, m, bottom=c + w, color="tab:blue")
                ax.bar(x, max(0.0, 1 - c - w - m), bottom=c + w + m, color="lightgrey")
                labels.append(f"{r['policy']} r{k}" if k == 0 else f"r{k}")
                x += 1
            x += 1
        ax.set_xticks([i for i in range(x) if i not in _gaps(srows)])
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set(ylabel="share of wall time", ylim=(0, 1), title=f"{fe}, {prof}: compute / wait / comm / other")
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:green", "tab:red", "tab:blue",
                                                                        "lightgrey")],
                  labels=["compute", "wait", "comm", "other"], fontsize=7, loc="lower right")
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


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def markdown(rows: List[Dict], target: float, opts, images: List[str], img_prefix: str) -> str:
    out = ["## Tables (generated by `python -m hvd_elastic.bench" + (" --docs" if opts.docs else "") + "`)", "",
           f"4 ranks on one machine ({os.cpu_count()} cores), launcher `{opts.launcher}`, MLP 64-256-256-10 on "
           f"scikit-learn's digits, per-rank batch {BATCH} (lbbsp: global batch {4 * BATCH}), "
           f"{opts.global_steps} global steps of {BATCH} samples per job, SGD lr 0.2 momentum 0.5. Emulated speed: "
           f"{opts.sample_ms:g} ms per sample x the rank's factor (sleep; the H profiles' extra per step scales "
           f"with it). Time to accuracy: first evaluation of rank 0's model at or above {target} "
           f"(every 4 local steps). Shares: of each rank's wall time; fast ranks are "
           f"ranks 0 and 1.", ""]
    for fe in sorted({r["frontend"] for r in rows}):
        for prof in [p for p in PROFILES if any(r["profile"] == p and r["frontend"] == fe for r in rows)]:
            sel = [r for r in rows if r["frontend"] == fe and r["profile"] == prof]
            ref = next((r for r in sel if r["policy"] == ("horovod" if fe == "torch" else "bsp")), None)
            out += [f"### {fe}, {prof}: {PROFILES[prof][0]}", "",
                    f"| policy | wall s | wall / {ref['policy'] if ref else '-'}'s | time to {target} s | speed-up to "
                    f"{target} | final accuracy | fast ranks' compute | fast ranks' wait |",
                    "|---|---|---|---|---|---|---|---|"]
            for r in sel:
                ratio = r["wall_s"] / ref["wall_s"] if ref else None
                sp = (ref["time_to_target_s"] / r["time_to_target_s"]
                      if ref and ref["time_to_target_s"] and r["time_to_target_s"] else None)
                out.append(f"| {r['policy']} | {r['wall_s']:.2f} | {_fmt(ratio)}x | {_fmt(r['time_to_target_s'])} | "
                           f"{_fmt(sp)}x | {r['final_accuracy']:.4f} | {100 * r['fast_compute_share']:.0f}% | "
                           f"{100 * r['fast_wait_share']:.0f}% |")
            out.append("")
            for img in images:
                if img.startswith(f"{fe}-{prof}-"):
                    out.append(f"![{img}]({img_prefix}{img})")
            out.append("")
    out += ["### Targets of issue 7 (checked on the figures above)", ""] + check_targets(rows, target)
    return "\n".join(out) + "\n"


def check_targets(rows: List[Dict], target: float) -> List[str]:
    lines = []

    def get(fe, prof, pol):
        return next((r for r in rows if (r["frontend"], r["profile"], r["policy"]) == (fe, prof, pol)), None)

    ref = get("torch", "static", "horovod")
    if ref and ref["time_to_target_s"]:
        sps = {}
        for r in rows:
            if r["frontend"] == "torch" and r["profile"] == "static" and r["policy"] not in ("horovod", "bsp"):
                sps[r["policy"]] = (ref["time_to_target_s"] / r["time_to_target_s"]) if r["time_to_target_s"] else 0
        if sps:
            slow = {k: round(v, 2) for k, v in sps.items() if v < 1.5}
            best = max(sps, key=sps.get)
            lines.append(f"- static skew, time to {target} vs plain Horovod: every relaxed policy and lbbsp >= 1.5x: "
                         f"{'met' if not slow else 'MISSED by ' + str(slow)}; best >= 2x: {best} "
                         f"{sps[best]:.2f}x ({'met' if sps[best] >= 2 else 'MISSED'})")
    for pol in ("wbsp", "asp"):
        shares = [r["fast_compute_share"] for r in rows
                  if r["frontend"] == "torch" and r["policy"] == pol and r["profile"] != "homogeneous"]
        if shares:
            lines.append(f"- fast ranks' compute share under {pol} >= 90% (heterogeneous profiles): min "
                         f"{100 * min(shares):.1f}% ({'met' if min(shares) >= 0.9 else 'MISSED'})")
    misses = []
    for r in rows:
        ref = get(r["frontend"], r["profile"], "horovod" if r["frontend"] == "torch" else "bsp")
        if ref and ref["final_accuracy"] - r["final_accuracy"] > 0.01:
            misses.append(f"{r['frontend']}/{r['profile']}/{r['policy']} "
                          f"{r['final_accuracy']:.4f} vs {ref['final_accuracy']:.4f}")
    lines.append("- final accuracy within 1 point of the reference: " + ("met everywhere" if not misses else
                                                                          "MISSED for " + "; ".join(misses)))
    ref = get("torch", "homogeneous", "horovod")
    if ref:
        over = {r["policy"]: r["wall_s"] / ref["wall_s"] - 1 for r in rows
                if r["frontend"] == "torch" and r["profile"] == "homogeneous" and r["policy"] != "horovod"}
        if "bsp" in over:
            lines.append(f"- homogeneous overhead of bsp vs plain Horovod <= 3%: {100 * over['bsp']:+.1f}% "
                         f"({'met' if over['bsp'] <= 0.03 else 'MISSED'})")
        rel = {k: v for k, v in over.items() if k not in ("bsp", "lbbsp")}
        if rel:
            worst = max(rel, key=rel.get)
            lines.append(f"- homogeneous overhead of the relaxed policies <= 10%: worst {worst} "
                         f"{100 * rel[worst]:+.1f}% ({'met' if rel[worst] <= 0.10 else 'MISSED'}); all: "
                         + ", ".join(f"{k} {100 * v:+.1f}%" for k, v in over.items()))
    return lines


GENERATED_BEGIN = "<!-- generated by python -m hvd_elastic.bench: begin -->"
GENERATED_END = "<!-- generated by python -m hvd_elastic.bench: end -->"


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
    ap = argparse.ArgumentParser(prog="python -m hvd_elastic.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", help=f"comma list of {', '.join(PROFILES)} (default: all)")
    ap.add_argument("--policies", help=f"comma list of {', '.join(POLICIES)} (default: all)")
    ap.add_argument("--frontends", help="torch, keras (default: both; keras runs profile static with policies "
                    f"{', '.join(KERAS_POLICIES)})")
    ap.add_argument("--global-steps", type=int, default=720)
    ap.add_argument("--sample-ms", type=float, default=BASE * 1000,
                    help="emulated milliseconds per sample at speed 1 (the profiles' per-step extras scale with it)")
    ap.add_argument("--target", type=float, default=0.93, help="test accuracy for time-to-accuracy")
    ap.add_argument("--launcher", choices=["mpirun", "horovodrun"], default="mpirun")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per job")
    ap.add_argument("--out", default="bench-results", help="folder for results and plots")
    ap.add_argument("--docs", action="store_true", help="write docs/benchmarks.md and docs/bench/*.png")
    ap.add_argument("--update", action="store_true", help="re-run only the chosen jobs and merge them into the "
                    "results already in the output folder (same --global-steps and --sample-ms as those)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 steps; unless given: profile static, "
                    "policies horovod, bsp, asp, frontend torch")
    opts = ap.parse_args(argv)
    quick = opts.quick   # smaller defaults; explicit choices are kept
    opts.global_steps = 64 if quick else opts.global_steps
    opts.profiles = opts.profiles or ("static" if quick else ",".join(PROFILES))
    opts.policies = opts.policies or ("horovod,bsp,asp" if quick else ",".join(POLICIES))
    opts.frontends = opts.frontends or ("torch" if quick else "torch,keras")
    for name, values, known in (("--profiles", opts.profiles, PROFILES), ("--policies", opts.policies, POLICIES),
                                ("--frontends", opts.frontends, WORKERS)):
        bad = [v for v in values.split(",") if v not in known]
        if bad:
            ap.error(f"{name}: unknown {bad}; accepted: {','.join(known)}")
    return opts


def merge_runs(old: List[Dict], new: List[Dict]) -> List[Dict]:
    """--update: the previous runs with the re-run jobs replaced in place (new jobs appended)."""
    key = lambda r: (r["frontend"], r["profile"], r["name"])  # noqa: E731
    fresh = {key(r): r for r in new}
    merged = [fresh.pop(key(r), r) for r in old]
    return merged + [r for r in new if key(r) in fresh]


def main(argv=None):
    opts = parse_args(argv)
    jobs = []
    for fe in opts.frontends.split(","):
        for prof in opts.profiles.split(","):
            for pol in opts.policies.split(","):
                if fe == "keras" and (pol not in KERAS_POLICIES or prof != "static"):
                    continue
                jobs.append((fe, prof, pol))
    outdir = os.path.join(ROOT, "docs", "bench") if opts.docs else opts.out
    os.makedirs(outdir, exist_ok=True)
    results, rows = [], []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        write_data(os.path.join(work, "digits.npz"))
        for i, (fe, prof, pol) in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {fe:5s} {prof:12s} {pol:13s} ...", end="", flush=True)
            res = run_one(fe, prof, pol, opts, work)
            row = summarize(res, opts.target)
            results.append(res)
            rows.append(row)
            print(f" {row['wall_s']:6.2f} s, to {opts.target}: {_fmt(row['time_to_target_s'])} s, final acc "
                  f"{row['final_accuracy']:.3f}, fast compute {100 * row['fast_compute_share']:.0f}% "
                  f"(job {res['job_s']:.0f} s, {time.perf_counter() - t_start:.0f} s so far)", flush=True)
    if opts.update and os.path.exists(os.path.join(outdir, "results.json")):
        results = merge_runs(json.load(open(os.path.join(outdir, "results.json")))["runs"], results)
        rows = [summarize(r, opts.target) for r in results]
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump({"rows": rows, "runs": results, "target": opts.target}, f, indent=1)
    with open(os.path.join(outdir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})
    images = plot(results, rows, outdir, opts.target)
    md = markdown(rows, opts.target, opts, images, "bench/" if opts.docs else "")
    md_path = os.path.join(ROOT, "docs", "benchmarks.md") if opts.docs else os.path.join(outdir, "benchmarks.md")
    write_keeping_notes(md_path, md)
    print("\n".join(check_targets(rows, opts.target)))
    print(f"wrote {md_path}, {len(images)} plots and results.json / results.csv in {outdir}")
    return 0
