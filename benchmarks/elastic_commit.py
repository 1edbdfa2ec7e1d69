"""The cost of ``state.commit()`` under elastic Horovod, side by side: for each arm, one ``horovodrun --elastic``
job per commit period (never, every step, every 10 steps) at about --params million parameters on --ranks ranks of
this host; prints each arm's step time, the time inside commit() per step, and the ratio to the same arm without
commits.

    python benchmarks/elastic_commit.py --ranks 2 --params 10 --policies horovod,asp,zipline,wbsp
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "benchmarks", "elastic_commit_worker.py")
BIN = os.path.dirname(sys.executable)


def run(policy: str, ranks: int, params: float, commit_every: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="hvde-commit-") as folder:
        return _run(folder, policy, ranks, params, commit_every, steps)


def _run(folder: str, policy: str, ranks: int, params: float, commit_every: int, steps: int) -> dict:
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\necho localhost:{ranks}\n")
    os.chmod(discover, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    env.update({"PYTHONPATH": ROOT, "HVD_ELASTIC_REPORT": "0", "HOROVOD_LOG_LEVEL": "warning"})
    impl = "horovod" if policy == "horovod" else "hvd_elastic"
    if impl == "hvd_elastic":
        env["HVD_ELASTIC_POLICY"] = policy
    cmd = [os.path.join(BIN, "horovodrun"), "-np", str(ranks), "--min-np", str(ranks), "--max-np", str(ranks),
           "--host-discovery-script", discover, "--gloo", "--network-interface", "lo",
           sys.executable, WORKER, "--params", str(params), "--commit-every", str(commit_every),
           "--steps", str(steps), "--impl", impl]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900).stdout
    lines = [ln.split("ELASTIC_COMMIT ", 1)[1] for ln in out.splitlines() if "ELASTIC_COMMIT " in ln]
    if not lines:
        sys.exit(f"{policy} (commit every {commit_every}): no result\n{out[-3000:]}")
    return json.loads(lines[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--params", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--policies", default="horovod,asp,wbsp")
    ap.add_argument("--periods", default="0,1,10", help="commit every k steps (0: never)")
    args = ap.parse_args()
    print(f"{'arm':<10} {'commit every':>12} {'step ms':>9} {'commit ms/step':>15} {'vs no commit':>13}")
    for policy in args.policies.split(","):
        base = None
        for k in map(int, args.periods.split(",")):
            r = run(policy, args.ranks, args.params, k, args.steps)
            base = r["step_s"] if k == 0 else base
            ratio = f"{r['step_s'] / base:.3f}x" if base else "-"
            print(f"{policy:<10} {k if k else 'never':>12} {1e3 * r['step_s']:>9.1f} {1e3 * r['commit_s']:>15.1f} "
                  f"{ratio:>13}  ({r['params_m']}M parameters, {r['ranks']} ranks)", flush=True)


if __name__ == "__main__":
    main()
