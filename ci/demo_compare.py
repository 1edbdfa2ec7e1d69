"""The demo's comparison (ci/demo.sh): two runs of the same job, their wall time, test accuracy and each rank's share of
time spent waiting, and the speed-up of the second over the first. Usage: python ci/demo_compare.py DIR BASE OTHER"""
import json
import os
import sys


def load(folder: str, policy: str) -> dict:
    summary = json.load(open(os.path.join(folder, f"{policy}.summary.json")))
    report = json.load(open(os.path.join(folder, f"{policy}.report.json")))
    return {**summary, "wait": [r["wait_share"] for r in report["ranks"]],
            "steps": [r["steps"] for r in report["ranks"]]}


def line(name: str, run: dict) -> str:
    waits = " ".join(f"{100 * w:.0f}%" for w in run["wait"])
    steps = " ".join(str(s) for s in run["steps"])
    return (f"{name:<14} wall {run['wall_s']:6.1f} s   test accuracy {run['accuracy']:.3f}   "
            f"wait share per rank {waits}   steps per rank {steps}")


def main():
    folder, base, other = sys.argv[1:4]
    a, b = load(folder, base), load(folder, other)
    print(line(base, a))
    print(line(other, b))
    print(f"[demo] {other} finished the same budget of steps {a['wall_s'] / b['wall_s']:.2f}x sooner than {base} "
          f"(test accuracy {b['accuracy']:.3f} vs {a['accuracy']:.3f})")


if __name__ == "__main__":
    main()
