"""Per-rank telemetry: where each worker's time went (computing, waiting, communicating) and what the policy did.

Every rank keeps a :class:`Telemetry`; at the end of a run the ranks exchange them (one allgather) and rank 0
prints a table and optionally writes JSON. Framework-free: the frontend passes its ``allgather_object``.

Waiting vs communicating inside a blocking collective: a collective cannot finish before its last member arrives,
so at step k the rank that arrived last blocked only for the transfer itself. comm_k = min over ranks of the time
blocked, and each rank's wait_k = blocked_k - comm_k (used when every rank ran the same collectives, as in bsp).
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np


class Telemetry:
    """Time accounting of one rank. Times are seconds from time.perf_counter()."""

    def __init__(self, rank: int, size: int, policy: str):
        self.rank, self.size, self.policy = rank, size, policy
        self.start = time.perf_counter()
        self.end: Optional[float] = None
        self.steps = 0
        self.compute_s = 0.0
        self.wait_s = 0.0          # measured directly (relaxed policies' gates)
        self.comm_s = 0.0          # measured directly (relaxed policies' ticks)
        self.blocked: List[float] = []   # per-step time blocked in a lock-step collective (bsp); split at report
        self.emulated_s = 0.0      # injected straggler delay (included in compute_s)
        self.counters: Dict[str, Any] = {}
        self.on_step: Optional[Callable[[], None]] = None   # called after every step (the watchdog's progress)
        self._nested: List[float] = []   # open spans: time of the spans nested in each (span)

    @contextlib.contextmanager
    def span(self, kind: str):
        """Time spent inside counts as `kind` ("compute", "wait" or "comm"), less the time of the spans nested inside
        it, which count as their own kinds (applying a tick while waiting at a gate is computation). The one place
        where a relaxed step's time is accounted (engine.py, session.py)."""
        t0 = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            inner = self._nested.pop()
            dt = time.perf_counter() - t0
            attr = self._SPAN_KINDS[kind]
            setattr(self, attr, getattr(self, attr) + dt - inner)
            if self._nested:
                self._nested[-1] += dt

    _SPAN_KINDS = {"compute": "compute_s", "wait": "wait_s", "comm": "comm_s"}

    def restart(self, t0: float):
        """Measure from `t0` on: time accounted before it (set-up: broadcasts, a replica sync) is dropped."""
        self.start = t0
        self.compute_s = self.wait_s = self.comm_s = self.emulated_s = 0.0
        self.blocked.clear()

    def add_step(self, compute_s: float, blocked_s: Optional[float] = None):
        self.steps += 1
        self.compute_s += compute_s
        if blocked_s is not None:
            self.blocked.append(blocked_s)
        if self.on_step is not None:
            self.on_step()

    def count(self, name: str, inc: int = 1):
        self.counters[name] = self.counters.get(name, 0) + inc

    def record_max(self, name: str, value):
        if name not in self.counters or value > self.counters[name]:
            self.counters[name] = value

    def stop(self):
        if self.end is None:
            self.end = time.perf_counter()

    def snapshot(self) -> Dict[str, Any]:
        end = self.end if self.end is not None else time.perf_counter()
        return {"rank": self.rank, "steps": self.steps, "wall_s": end - self.start, "compute_s": self.compute_s,
                "wait_s": self.wait_s, "comm_s": self.comm_s, "emulated_s": self.emulated_s,
                "blocked": list(self.blocked), "counters": dict(self.counters)}


def build_report(snapshots: List[Dict[str, Any]], policy: str, config: Dict[str, Any]) -> Dict[str, Any]:
    """Combine every rank's snapshot into the end-of-run report (pure function; used on every rank)."""
    ranks = []
    blocked = [np.asarray(s["blocked"], dtype=np.float64) for s in snapshots]
    common = min((len(b) for b in blocked), default=0)
    comm_k = np.min(np.stack([b[:common] for b in blocked]), axis=0) if common and blocked else np.zeros(0)
    for s, b in zip(snapshots, blocked):
        wait, comm = s["wait_s"], s["comm_s"]
        if len(b):
            split_comm = float(comm_k.sum()) + float(b[common:].sum())
            comm += split_comm
            wait += float(b.sum()) - split_comm
        wall = s["wall_s"]
        other = max(wall - s["compute_s"] - wait - comm, 0.0)
        ranks.append({"rank": s["rank"], "steps": s["steps"], "wall_s": wall, "compute_s": s["compute_s"],
                      "wait_s": wait, "comm_s": comm, "other_s": other, "emulated_s": s["emulated_s"],
                      "compute_share": s["compute_s"] / wall if wall > 0 else 0.0,
                      "wait_share": wait / wall if wall > 0 else 0.0,
                      "comm_share": comm / wall if wall > 0 else 0.0,
                      "counters": s["counters"]})
    report = {"policy": policy, "size": len(snapshots), "config": config, "ranks": ranks}
    merged: Dict[str, int] = {}
    for s in snapshots:
        for k, v in s["counters"].get("staleness_histogram", {}).items():
            merged[k] = merged.get(k, 0) + int(v)
    if merged:
        # Every rank's updates together: gradients (or deltas) applied between the weights an update was computed
        # on and its application (hvd_elastic/engine/staleness.py). Not the clock gap.
        histogram = dict(sorted(merged.items(), key=lambda kv: int(kv[0])))
        report["staleness"] = {**summarize(merged), "histogram": histogram}
    return report


def summarize(histogram: Mapping) -> Dict:
    """Staleness figures (hvd_elastic/engine/staleness.py) of a histogram {staleness: count} (keys may be strings):
    mean, p50, p90, max and the number of updates."""
    items = sorted((int(k), int(v)) for k, v in histogram.items() if int(v) > 0)
    n = sum(v for _, v in items)
    if not n:
        return {"updates": 0, "mean": 0.0, "p50": 0, "p90": 0, "max": 0}

    def quantile(q):
        need, seen = q * n, 0
        for s, v in items:
            seen += v
            if seen >= need:
                return s
        return items[-1][0]

    return {"updates": n, "mean": round(sum(s * v for s, v in items) / n, 3), "p50": quantile(0.5),
            "p90": quantile(0.9), "max": items[-1][0]}


def format_report(report: Dict[str, Any]) -> str:
    """The table rank 0 prints at the end of a run."""
    lines = [f"hvd_elastic report: policy={report['policy']}, {report['size']} ranks",
             f"{'rank':>4} {'steps':>6} {'wall s':>8} {'compute s':>10} {'wait s':>8} {'comm s':>8} {'other s':>8}"
             f" {'compute%':>9} {'wait%':>6} {'comm%':>6}"]
    for r in report["ranks"]:
        lines.append(f"{r['rank']:>4} {r['steps']:>6} {r['wall_s']:>8.2f} {r['compute_s']:>10.2f} {r['wait_s']:>8.2f}"
                     f" {r['comm_s']:>8.2f} {r['other_s']:>8.2f} {100 * r['compute_share']:>9.1f}"
                     f" {100 * r['wait_share']:>6.1f} {100 * r['comm_share']:>6.1f}")
    st = report.get("staleness")
    if st:
        lines.append(f"staleness (updates applied between the weights an update was computed on and its "
                     f"application, all ranks): mean {st['mean']:.2f}, p90 {st['p90']}, max {st['max']} over "
                     f"{st['updates']} updates")
    resets = [r["counters"] for r in report["ranks"] if "elastic_resets" in r["counters"]]
    if resets:
        worst = max(resets, key=lambda c: c["elastic_reset_s"])
        resumed = worst.get("elastic_resumed_from_updates")
        before = max((s for c in resets for s in c.get("elastic_before_reset_s", [])), default=0.0)
        lines.append(f"elastic Horovod: {max(c['elastic_resets'] for c in resets)} reset(s) of the rank set; the "
                     f"longest rank took {worst['elastic_reset_s']:.2f} s from a reset to its next step, and up to "
                     f"{before:.2f} s passed from a rank's last step to a reset (a lost worker shows when a "
                     f"collective fails: under Gloo, after HOROVOD_GLOO_TIMEOUT_SECONDS); "
                     + (f"each resumed from a state holding {resumed} updates (-1: the last commit)"
                        if resumed is not None else "each resumed from Horovod's state (the last commit, rank 0's)")
                     + (f"; the survivors' updates lost per reset {worst['elastic_lost_updates']} (in flight "
                        f"{worst['elastic_in_flight_updates']}), kept beyond the last commit "
                        f"{worst['elastic_beyond_commit_updates']}" if worst.get("elastic_lost_updates") else ""))
    for r in report["ranks"]:
        if r["counters"]:
            lines.append(f"rank {r['rank']}: " + ", ".join(f"{k}={v}" for k, v in sorted(r["counters"].items())
                                                           if not isinstance(v, dict)))
    return "\n".join(lines)


def finish_report(telemetry: Telemetry, allgather_object: Callable[[Any], list], config: Dict[str, Any],
                  print_on_rank0: bool = True, json_path: str = "") -> Dict[str, Any]:
    """Collective: every rank calls it. Returns the report on every rank; rank 0 prints it / writes JSON."""
    telemetry.stop()
    report = build_report(allgather_object(telemetry.snapshot()), telemetry.policy, config)
    if telemetry.rank == 0:
        if print_on_rank0:
            print(format_report(report), flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
    return report
