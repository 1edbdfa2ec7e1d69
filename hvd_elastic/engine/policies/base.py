"""What every relaxed policy shares: the question a policy answers, and the rules around it.

A policy sees what the engine gives it and answers: may this rank start its next step? It holds no engine, and
its questions change nothing. The engine (engine.py) tells it what happened, in this order per step:
``pushed(clock, interval_ns)`` when this rank pushes; ``tick_applied(tick, view)`` for each tick applied (identical
on every rank); ``rule_starts(gate)`` once, at the first gate check of the step where this rank's own updates are
in; then ``waits(gate)`` and ``waits_for_peers(gate)`` as often as it asks; ``proceeded(gate)`` when the rank goes.
``counters()`` at the end. A subclass writes its rule as ``holds(gate)`` and its tick hook as ``observe(tick,
view)``; the base adds the lock-step fallback of the gradient policies around them (:class:`Lockstep`). The decision
rules themselves live in the native scheduler (``hvd_elastic._native``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Sequence

import numpy as np


from ... import _native
from ...predictors import predict_interval
from ..pacing.rules import PEER_SPEED, observe_lockstep
from ..updates import DeltaUpdates, GradientsThenDeltas, GradientUpdates
from ..view import GlobalView


PEER_OVERDUE = 0.25   # a peer this fraction of its push period past its predicted push is not waited for


@dataclasses.dataclass
class Gate:
    """What a policy decides from at a gate check (filled by the engine, read by the policy)."""

    view: GlobalView        # the global state as of the ticks this rank has applied
    rank: int
    clock: int              # this rank's pushes so far (ahead of view.clocks[rank] by those still in flight)
    interval_ns: int        # this rank's latest step compute time (-1 before it is measured)
    last_push_ns: int       # this rank's latest push, on the job's common clock
    inflight: int = 0       # own pushes allowed in flight (Policy.max_inflight, resolved by the engine)
    peer_waited_s: float = 0.0   # time this step has already waited for peers (peer alignment)
    now_ns: int = 0         # now, on the job's common clock


class Policy:
    """Base: never waits for other ranks (ASP's rule). Subclasses override :meth:`holds` and the events."""

    # Held only by its own update in flight, a rank applies every completed tick (freshest weights) if True; if False
    # it resumes on the state of the tick that delivered its update, as when the rule holds it (engine.py): a rule
    # with s = 0 must never let a rank see another rank's *next* update, which, with the push at the end of
    # backward, is often already in a completed tick when the rank reaches step().
    fresh_reads = False
    # While the ranks go relaxed, auto tick pacing (engine/pacing/__init__.py RELAXED_JOINS) joins ticks: "always"
    # (under a straggler too), "peers" (only while every rank is a peer of every other; probes otherwise) or "never"
    # (probes; joined in lock-step only)
    relaxed_joins = "always"
    has_barriers = False        # observe() reports barriers, where the engine checks the replicas
    AUTO_MAX_INFLIGHT = 4

    def __init__(self, cfg, rank: int, size: int):
        self.cfg, self.rank, self.size = cfg, rank, size
        self.name = cfg.policy
        # The update kind (engine/updates.py), as the registry declares it: deltas after a local step, gradients
        # applied on a shared replica, or gradients in lock-step from the start and deltas from the first relaxed
        # round on.
        spec = cfg.spec
        self.updates = (GradientsThenDeltas if spec.lockstep_gradients else DeltaUpdates) if spec.deltas \
            else GradientUpdates
        self.gaps: Dict[int, int] = {}    # clock gap (own clock - slowest clock) at each step start -> count
        self.origin = np.zeros(size, np.int64)   # see clock_origin
        self.lockstep = Lockstep.build(cfg, size, self.updates)

    # ---- what the engine calls (the rule and the fallback together) ------------------------------------------
    def tick_applied(self, tick, view: GlobalView) -> bool:
        """A tick was applied: the lock-step fallback observes it, then the rule (observe). True at a barrier."""
        if self.lockstep is not None:
            observe_lockstep(self.lockstep.rule, tick.meta)
        return self.observe(tick, view)

    def waits(self, gate: Gate) -> bool:
        """Must this rank wait for other ranks? While the ranks go in lock-step, BSP's rule decides alone (it is the
        strictest; the policy's own rule beside it could hold the rank at the slowest clock -- a zipline barrier --
        while the others wait for that rank in lock-step); otherwise the policy's own rule."""
        if self.in_lockstep:
            return self.lockstep.holds(gate) or self.bounds_lockstep(gate)
        return self.holds(gate)

    @property
    def in_lockstep(self) -> bool:
        """The lock-step fallback holds the ranks now (as of the ticks this rank has applied)."""
        return self.lockstep is not None and self.lockstep.rule.lockstep

    # ---- events ----------------------------------------------------------------------------------------------
    def pushed(self, clock: int, interval_ns: int):
        pass

    def observe(self, tick, view: GlobalView) -> bool:
        """A tick was applied. True when it completed a barrier (the engine checks the replicas there)."""
        return False

    def rule_starts(self, gate: Gate):
        """The first gate check of this step at which this rank's own updates are in."""

    def proceeded(self, gate: Gate):
        """The rank starts its next step; returns what the engine must do first (wbsp: a download), or None."""
        gap = int(_native.ssp_staleness(server_clocks(gate.view, gate.clock), gate.view.size))
        self.gaps[gap] = self.gaps.get(gap, 0) + 1
        return None

    # ---- questions (no state changes) ------------------------------------------------------------------------
    def holds(self, gate: Gate) -> bool:
        """The policy's rule: must this rank wait for other ranks before its next step?"""
        return False

    @property
    def reads_fresh(self) -> bool:
        """fresh_reads, except while the ranks go in lock-step: BSP never shows a rank another rank's next update."""
        return self.fresh_reads and not self.in_lockstep

    def bounds_lockstep(self, gate: Gate) -> bool:
        """The part of the policy's rule that still holds a rank while the ranks go in lock-step (zipline: its
        bound of R iterations, for a rank still finishing its first round after the switch; ssp: its bound s);
        none by default."""
        return False

    @property
    def compensation(self) -> str:
        return self.cfg.staleness_compensation

    def max_inflight(self, interval_ns: int, push_latency_s: float) -> int:
        """HVD_ELASTIC_MAX_INFLIGHT, or under "auto" the fewest own pushes in flight that let this rank start its next
        step without waiting for its own updates: ceil(push-to-delivery time / step time), measured on this rank
        (1 until measured, at most AUTO_MAX_INFLIGHT). A local choice: it changes when this rank may start a step,
        never what any rank applies, so ranks need not agree on it."""
        k = self.cfg.max_inflight
        if k != "auto":
            return k
        if interval_ns <= 0 or push_latency_s <= 0:
            return 1
        return max(1, min(self.AUTO_MAX_INFLIGHT, math.ceil(1.25 * push_latency_s * 1e9 / interval_ns)))

    def peer_wait_s(self, gate: Gate) -> float:
        """How long peer alignment may hold this step: HVD_ELASTIC_PEER_WAIT x this rank's step time."""
        return self.cfg.peer_wait * gate.interval_ns / 1e9 if gate.interval_ns > 0 else 0.0

    def waits_for_peers(self, gate: Gate) -> bool:
        """Peer alignment (HVD_ELASTIC_PEER_WAIT): after its update is in and the rule lets it go, a rank waits -- at
        most peer_wait_s -- for the updates of its peers (ranks about as fast as it is: step time within PEER_SPEED
        of its own) whose clocks are behind its own, where waiting can pay: a peer whose push period is measured is
        waited for only while its next push is predicted (last push + period) within the time left and is not
        overdue (PEER_OVERDUE of its period past that prediction). Equally fast ranks then push into the same ticks
        and compute on the same weights, as under BSP; without it they drift into groups one tick apart and every
        gradient arrives one update late (docs/design.md). A peer that fell behind in clock while it was slow is
        waited for only until its next push (it pushes once per period like this rank: the clocks do not catch up),
        and a peer slowed down since its last push only until it is overdue. Slower ranks are never waited for:
        that is the rule's business. With own pushes allowed in flight (gate.inflight = k > 0) the peers' pushes of
        the last k rounds are in flight beside this rank's own: a peer is behind only if its delivered clock is
        behind this rank's clock less k. Not in lock-step: its rounds line the ranks up already (and a peer behind
        in clock there is one that ran fewer steps while relaxed, which it never makes up)."""
        left_s = self.peer_wait_s(gate) - gate.peer_waited_s
        if not self.updates.align_peers or left_s <= 0 or self.in_lockstep:
            return False
        view, mine = gate.view, gate.interval_ns
        origin = self.clock_origin()
        mine_ran = gate.clock - gate.inflight - int(origin[self.rank])
        for q in range(view.size):
            if q == self.rank or view.finished[q] or not 0 < view.interval_ns[q] <= PEER_SPEED * mine \
                    or int(view.clocks[q] - origin[q]) >= mine_ran:
                continue
            period = int(view.period_ns[q])
            due = int(view.last_push_ns[q]) + period
            if period <= 0 or (due <= gate.now_ns + left_s * 1e9 and gate.now_ns <= due + PEER_OVERDUE * period):
                return True
        return False

    def clock_origin(self) -> np.ndarray:
        """Per rank, the clock from which peer alignment counts its steps: 0 (clocks compared as they are), or where
        the rule last lined the ranks up in time (zipline's barrier, at which ranks may stand at different clocks:
        there a peer "behind" is one that has run fewer steps since)."""
        return self.origin

    def counters(self) -> Dict:
        out = self.lockstep.counters() if self.lockstep is not None else {}
        if self.gaps:
            out.update({"max_clock_gap": max(self.gaps),
                        "clock_gap_histogram": {str(k): v for k, v in sorted(self.gaps.items())}})
        return out


class Lockstep:
    """The lock-step fallback of the gradient policies (HVD_ELASTIC_RELAX_MIN_GAIN; the rule:
    native/include/hvd_elastic/lockstep.h): while relaxing is predicted to deliver fewer than min_gain times the
    pushes per second of lock-step, every rank goes at BSP's pace -- it starts a step only once every rank has
    pushed as many updates as it has since the rule's origin (SSP with s = 0, which is BSP) -- whatever the
    policy's own rule would allow.
    The mode is a function of the tick stream, so every rank is in the same mode at the same tick."""

    SETTLE = 8   # pushes of every rank after a switch before the overheads are sampled (the first carry the old mode)
    SAMPLE = 8   # pushes of every rank in the first measurement of lock-step's cost (skipped where the ranks' compute
    # times alone promise the switch, as under a persistent straggler)
    RELAXED_SAMPLE = 32   # ... and of the relaxed rule's near the switch (SAMPLE where it loses outright): across
    # hosts the relaxed rule's cost moves with stalls every few seconds, and one must not decide

    def __init__(self, size: int, min_gain: float, spread_only: bool = False):
        self.size, self.min_gain, self.spread_only = size, min_gain, spread_only
        self.rule = self.new_rule()

    def new_rule(self):
        """A rule in its starting state: fed the same tick stream, every copy holds the same mode at the same tick
        (the tick pacing keeps one on the tick thread: engine/pacing/__init__.py AutoPacing)."""
        return _native.LockstepRule(self.size, self.min_gain, self.SETTLE, self.SAMPLE, self.RELAXED_SAMPLE,
                                    self.spread_only)

    @classmethod
    def build(cls, cfg, size: int, updates) -> Optional["Lockstep"]:
        """None where it does not apply: a single rank, or HVD_ELASTIC_RELAX_MIN_GAIN=0 (wbsp drops it unless
        HVD_ELASTIC_WBSP_LOCKSTEP=1). A delta policy (wbsp) in lock-step uploads once a round and downloads the
        global model W once every rank's upload of the round is in it (its own rule allows that download then), so
        that W moves by the mean of deltas taken from one W: with SGD (momentum included, each rank's buffer fed its
        own gradients) the mean of BSP's updates. Whether lock-step's own cost may start a measurement of relaxed, or
        only a spread of the ranks' compute times, is the update kind's (``relax_on_cost``, engine/updates.py)."""
        if size < 2 or cfg.relax_min_gain <= 0:
            return None
        return cls(size, cfg.relax_min_gain, spread_only=not updates.relax_on_cost)

    def holds(self, gate: Gate) -> bool:
        """SSP with s = 0 on the steps each rank has run since the rule's origin (the switch into lock-step, or the
        script's own latest collective): a rank that ran ahead while relaxed keeps its lead and waits only for its
        round, never for the others to catch up with it (the fast ranks would idle while a straggler alone works off
        the lead)."""
        return not _native.ssp_may_proceed(server_clocks(gate.view, gate.clock, self.rule.origin, gate.rank),
                                           gate.view.size, 0)

    @property
    def origin(self) -> np.ndarray:
        """Where lock-step rounds count from (LockstepRule.origin; the same on every rank)."""
        return np.asarray(self.rule.origin, np.int64)

    def counters(self) -> Dict:
        r = self.rule
        return {"lockstep_switches": r.switches, "lockstep_switch_pushes": list(r.switch_pushes),
                "lockstep_pushes": r.lockstep_pushes,
                "lockstep_share": round(r.lockstep_pushes / r.pushes, 3) if r.pushes else 0.0,
                "lockstep_gain": round(r.gain, 3), "lockstep_overhead_ms": _ms(r.overhead_lockstep_ns),
                "relaxed_overhead_ms": _ms(r.overhead_relaxed_ns)}


def _ms(ns: float) -> Optional[float]:
    """An overhead of the rule in ms, None while not measured (the rule's -1)."""
    return round(ns / 1e6, 2) if ns >= 0 else None


def server_clocks(view: GlobalView, own_clock: int, origin: Optional[Sequence[int]] = None,
                  rank: Optional[int] = None):
    """The clocks a staleness rule compares, as a parameter server would hold them: every rank's clock as delivered
    by the ticks (this rank included), plus one extra entry (index n) for this rank's own clock, which counts the
    pushes the ticks have not delivered yet. Staleness of entry n = own clock - min over delivered clocks, so a rank
    never runs ahead of updates it has not seen applied -- its own included (that is what makes s = 0 exactly BSP).
    A rank that has finished training pushes nothing more, so it no longer holds anyone back: its entry reads as the
    largest clock present. With `origin` (per rank), clocks count from it (this rank, `rank`, at origin[rank])."""
    clocks = [int(c) for c in view.clocks] + [int(own_clock)]
    if origin is not None:
        if rank is None:
            raise TypeError("server_clocks: an origin needs the rank whose own clock it offsets")
        clocks = [c - int(o) for c, o in zip(clocks, list(origin) + [origin[rank]])]
    if view.finished.any():
        top = max(clocks)
        clocks = [top if q < view.size and view.finished[q] else c for q, c in enumerate(clocks)]
    return clocks


def observed_clocks(gate: Gate, intervals, own_interval_ns: int):
    """A native WorkerClocks of n + 1 entries built from the tick stream, laid out as server_clocks(), with each
    rank's predicted interval (``intervals``; this rank's own entry ``own_interval_ns``)."""
    view, n = gate.view, gate.view.size
    clocks = server_clocks(view, gate.clock)
    wc = _native.WorkerClocks(n + 1)
    for q in range(n):
        wc.observe(q, clocks[q], int(view.last_push_ns[q]), int(intervals[q]))
    wc.observe(n, clocks[n], int(gate.last_push_ns), int(own_interval_ns))
    return wc


class Intervals:
    """Each rank's recent iteration times as the tick stream delivers them (identical on every rank), and their
    prediction by HVD_ELASTIC_PREDICTOR (predictors.py): the intervals the timing rules (zipline's barrier, dssp's
    credits) predict from. -1 for a rank not measured yet. predictor None: only the kept history is read (wbsp's
    slowest rank, by median)."""

    HISTORY = 16

    def __init__(self, n: int, predictor: Optional[str], history: int = HISTORY):
        self.predictor = predictor
        self.clocks = _native.WorkerClocks(n, history=history)

    def observe(self, view: GlobalView):
        for q in range(view.size):
            self.clocks.observe(q, int(view.clocks[q]), int(view.last_push_ns[q]), int(view.interval_ns[q]))

    def predict(self, q: int) -> int:
        if self.predictor is None:
            raise ValueError("Intervals built without a predictor")
        h = self.clocks.intervals(q)
        return predict_interval(self.predictor, h) if h else -1

    def predicted(self):
        return [self.predict(q) for q in range(self.clocks.size)]
