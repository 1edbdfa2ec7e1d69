"""In-process harness for the sync engine: n ranks as threads of one process, an in-memory allreduce with the
engine's ``allreduce_sum`` contract, numpy buffers, and a scripted schedule of how long each rank computes at each
step. For unit tests of the engine's logic (the invariants of docs/design.md) under schedules that are rare on real
machines; what is distributed (launchers, Horovod, faults) is tested with real jobs.

    run = run_job("ssp", schedule=[[0.002] * 40, [0.01] * 40], staleness=1)
    run.weights()      # every rank's final weights; run.counters[r]: rank r's end-of-run counters
    run = run_job("asp", schedule=[[0.005]] * 3 + [[0.05]], target=400)   # a global budget: schedules repeat
    run.steps          # steps each rank took (the fast ranks run ahead)

The model is a linear least-squares problem per rank (gradient A_r w - b_r), so a BSP reference is exact arithmetic
(:func:`bsp_reference`).
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from hvd_elastic.config import Config
from hvd_elastic.engine.buffers import NumpyBuffers
from hvd_elastic.engine.engine import Frontend, SyncEngine
from hvd_elastic.engine.policies import make_policy
from hvd_elastic.telemetry import Telemetry, build_report

DIM = 6
LR = 0.05


class InMemoryAllreduce:
    """Sum allreduce among n threads: the k-th call of a name on every rank forms one collective (as Horovod matches
    collectives by name); every rank's buffers receive the sum. A call no other rank matches within `timeout_s`
    raises, naming it (a mismatch would hang Horovod)."""

    def __init__(self, n: int, timeout_s: float = 30.0):
        self.n, self.timeout_s = n, timeout_s
        self._cond = threading.Condition()
        self._calls: Dict = {}        # (name, k) -> {rank: buffers}
        self._results: Dict = {}      # (name, k) -> (sums, ranks yet to read them)
        self._count = [dict() for _ in range(n)]   # per rank: name -> calls so far
        self.collectives = 0

    def for_rank(self, rank: int):
        def allreduce_sum(buffers, name):
            self.reduce(rank, buffers, name)
        return allreduce_sum

    def reduce(self, rank: int, buffers: List[np.ndarray], name: str):
        with self._cond:
            k = self._count[rank].get(name, 0)
            self._count[rank][name] = k + 1
            key = (name, k)
            self._calls.setdefault(key, {})[rank] = [np.array(b, copy=True) for b in buffers]
            if len(self._calls[key]) == self.n:
                parts = self._calls.pop(key)
                self._results[key] = [[sum(parts[r][i] for r in range(self.n)) for i in range(len(buffers))], self.n]
                self.collectives += 1
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: key in self._results, timeout=self.timeout_s):
                raise RuntimeError(f"in-memory allreduce: rank {rank}'s call {name!r} #{k} was not matched by every "
                                   f"rank within {self.timeout_s} s")
            sums, left = self._results[key]
            for b, s in zip(buffers, sums):
                b[...] = s
            self._results[key][1] = left - 1
            if left == 1:
                del self._results[key]


def problem(rank: int):
    """Rank r's least-squares data (A_r, b_r): its gradient at w is A_r w - b_r."""
    rng = np.random.default_rng(100 + rank)
    m = rng.normal(size=(DIM, DIM))
    return m @ m.T / DIM + np.eye(DIM) * 0.5, rng.normal(size=DIM)


def bsp_reference(n: int, steps: int, w0: np.ndarray) -> np.ndarray:
    """Plain BSP: every step, w -= LR x the average of the n gradients at the same w."""
    probs = [problem(r) for r in range(n)]
    w = w0.copy()
    for _ in range(steps):
        w = w - LR * np.mean([a @ w - b for a, b in probs], axis=0)
    return w


@dataclasses.dataclass
class Run:
    engines: List[SyncEngine]
    models: List[np.ndarray]
    counters: List[dict]
    collectives: int
    errors: List[BaseException]
    steps: List[int]
    wait_shares: List[float]     # each rank's share of its wall clock held by its policy's rule (the report's)

    def pushed(self) -> int:
        return sum(c["pushed"] for c in self.counters)

    def weights(self) -> List[np.ndarray]:
        return self.models


class _Rank:
    """One rank: its weights, its engine, its training loop."""

    def __init__(self, rank: int, n: int, cfg: Config, allreduce, w0: np.ndarray):
        self.rank, self.w = rank, w0.copy()
        self.a, self.b = problem(rank)
        self.telemetry = Telemetry(rank, n, cfg.policy)
        buffers = NumpyBuffers(np.float64)
        frontend = Frontend(DIM, buffers, allreduce, tick_name="harness.tick", epoch_ns=0,
                            apply_gradient=self._apply, read_params=lambda: self.w.copy(),
                            write_params=self._write)
        self.engine = SyncEngine(make_policy(cfg, rank, n), rank, n, frontend, self.telemetry, cfg)
        self.engine.stall_timeout_s = 30.0
        self.steps = 0

    def _apply(self, update, scale, share):
        self.w -= LR * scale * update

    def _write(self, w):
        self.w[:] = w

    def train(self, delays: Sequence[float], stop: threading.Event, target: Optional[int] = None,
              call: Optional[threading.Barrier] = None, call_every: int = 0, call_exit_s: float = 0.0):
        """One step per entry of `delays`; with a target, `delays` repeats until the global steps this rank knows of
        (its own and the others' delivered clocks, SyncEngine.global_steps) reach it. With `call_every`, after every
        call_every-th step the rank meets every other rank in a collective of the script's own (`call`, a barrier
        of all ranks), marked as such to the engine as hvd_elastic/torch/collectives.py marks Horovod's; the call
        returns `call_exit_s` after the ranks meet (a rank whose collective completes later than the others')."""
        for d in (itertools.cycle(delays) if target is not None else delays):
            if stop.is_set():
                return
            if target is not None and self.engine.global_steps() >= target:
                break
            if d > 0:
                time.sleep(d)
            g = self.a @ self.w - self.b
            if self.engine.updates.local_step:   # deltas: a local SGD step, then the engine uploads the delta
                self.w -= LR * g
                self.engine.step(None, d)
            else:
                self.engine.step(lambda dst, alpha, g=g: np.add(dst, alpha * g, out=dst), d)
            self.steps += 1
            if call_every and self.steps % call_every == 0:
                self.engine.waiting_outside(True)
                call.wait()          # threading.BrokenBarrierError after its timeout: the ranks never met
                if call_exit_s > 0:
                    time.sleep(call_exit_s)
                self.engine.waiting_outside(False)
        self.engine.finish()
        self.telemetry.stop()


def run_job(policy: str, schedule: Sequence[Sequence[float]], w0: Optional[np.ndarray] = None,
            timeout_s: float = 60.0, target: Optional[int] = None, call_every: int = 0,
            call_exit_s: Sequence[float] = (), **knobs) -> Run:
    """Train every rank through `schedule` (schedule[r][k]: rank r's compute time at its step k, seconds) under
    `policy` with the given knobs (Config names), and finish. With `target`, each rank's schedule repeats until the
    job has taken `target` steps as far as that rank knows, so every rank trains for about the same time and fast
    ranks take more steps (a global budget, as the workers' --target). With `call_every`, every rank meets the others
    in a collective of the script's own after each call_every-th of its steps (with a schedule, not a target: every
    rank makes the same calls); call_exit_s[r]: how much later than the meeting rank r's call returns. Raises the first
    error any rank raised."""
    n = len(schedule)
    cfg = Config.from_env({}, policy=policy, keep_heap=False, **knobs)
    reduce = InMemoryAllreduce(n, timeout_s=timeout_s / 2)
    w0 = np.zeros(DIM) if w0 is None else w0
    ranks = [_Rank(r, n, cfg, reduce.for_rank(r), w0) for r in range(n)]
    errors: List[BaseException] = []
    stop = threading.Event()
    call = threading.Barrier(n, timeout=timeout_s / 4)

    def body(r):
        try:
            ranks[r].train(schedule[r], stop, target, call, call_every, call_exit_s[r] if call_exit_s else 0.0)
        except BaseException as e:   # surfaced below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=body, args=(r,), name=f"harness-rank-{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"harness: {policy} did not finish within {timeout_s} s")
    if errors:
        raise errors[0]
    report = build_report([r.telemetry.snapshot() for r in ranks], policy, {})
    return Run([r.engine for r in ranks], [r.w for r in ranks], [r.telemetry.counters for r in ranks],
               reduce.collectives, errors, [r.steps for r in ranks], [rep["wait_share"] for rep in report["ranks"]])
