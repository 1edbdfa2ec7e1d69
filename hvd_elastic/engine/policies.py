"""Policy glue: each relaxed policy maps the engine's events to its native decision rule.

A policy object sees the tick stream (identical on every rank) and this rank's own clock, and answers one
question: may this rank start its next step? The rules themselves live in the native scheduler
(``hvd_elastic._native``); this file only feeds them state and keeps the counters the report shows.

Events, in order: attach(engine) once; per step on_push(clock), then on_tick(tick, view) for each tick applied,
interleaved with may_proceed(clock) (asked before the first tick and after each one, until it says yes),
on_proceed(clock); finish() at the end.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Dict, Optional, Type

import numpy as np

from .. import _native
from ..predictors import predict_interval
from .table import COUNT, PEER_SPEED, PERIOD_NS, still_peers
from .updates import DeltaUpdates, GradientUpdates


class Policy:
    """Base: ASP-like (never waits). Subclasses override the gate."""

    name = "base"
    updates = GradientUpdates   # the update kind (engine/updates.py): gradients applied on a shared replica
    # Held only by its own update in flight, a rank applies every completed tick (freshest weights) if True; if
    # False it resumes on the state of the tick that delivered its update, as when the rule holds it (engine.py):
    # a rule with s = 0 must never let a rank see another rank's *next* update, which, with the push at the end of
    # backward, is often already in a completed tick when the rank reaches step().
    fresh_reads = False
    # Auto tick pacing (engine/pacing.py) joins ticks under a straggler too if True; if False only while every rank
    # is a peer of every other (probes otherwise)
    joins_stragglers = True

    def __init__(self, cfg):
        self.cfg = cfg
        self.engine = None
        self.gaps: Dict[int, int] = {}    # clock gap (own clock - slowest clock) at each step start -> count
        self._peer_clock, self._peer_deadline = -1, 0.0

    def attach(self, engine):
        self.engine = engine
        self._no_origin = np.zeros(engine.size, np.int64)

    @property
    def rank(self):
        return self.engine.rank

    def own_gap(self, clock: int) -> int:
        """Staleness of the step this rank starts: its own clock minus the slowest delivered clock."""
        view = self.engine.view
        return int(_native.ssp_staleness(server_clocks(view, self.rank, clock), view.size))

    def on_push(self, clock: int):
        pass

    def on_tick(self, tick, view):
        pass

    def may_proceed(self, clock: int) -> bool:
        """The policy's rule: may this rank start its next step, as far as the other ranks are concerned?"""
        return True

    AUTO_MAX_INFLIGHT = 4

    @property
    def compensation(self) -> str:
        return self.cfg.staleness_compensation

    @property
    def max_inflight(self) -> int:
        """HVD_ELASTIC_MAX_INFLIGHT, or under "auto" the fewest own pushes in flight that let this rank start its
        next step without waiting for its own updates: ceil(push-to-delivery time / step time), measured on this
        rank (1 until measured, at most AUTO_MAX_INFLIGHT). A local choice: it changes when this rank may start a
        step, never what any rank applies, so ranks need not agree on it."""
        k = self.cfg.max_inflight
        if k != "auto":
            return k
        t = self.engine.ticker
        if t.interval_ns <= 0 or t.push_latency_s <= 0:
            return 1
        return max(1, min(self.AUTO_MAX_INFLIGHT, math.ceil(1.25 * t.push_latency_s * 1e9 / t.interval_ns)))

    def blocked_by(self, clock: int) -> Optional[str]:
        """Why this rank may not start its next step: "comm" while more than max_inflight of its own pushes have
        not come back in a tick (a parameter-server worker reads weights that include its own updates; without
        this bound a fast rank would pile up gradients computed on the same stale weights), "wait" while the
        policy's rule holds it back for other ranks, None when it may go."""
        inflight = self.max_inflight   # once: under "auto" it follows the tick thread's measurements
        if clock - int(self.engine.view.clocks[self.rank]) > inflight:
            return "comm"
        if not self.may_proceed(clock):
            return "wait"
        return "wait" if self.updates.align_peers and self.waits_for_peers(clock, inflight) else None

    def waits_for_peers(self, clock: int, inflight: int) -> bool:
        """Peer alignment (HVD_ELASTIC_PEER_WAIT): after its update is in, a rank waits -- at most that fraction
        of its own step time -- for the updates of its peers (ranks about as fast as it is: step time within
        PEER_SPEED of its own) whose clocks are behind its own. Equally fast ranks then push into the same ticks
        and compute on the same weights, as under BSP; without it they drift into groups one tick apart and every
        gradient arrives one update late (measured: asp at Horovod's lr diverged with 4 equally fast ranks; see
        docs/design.md). Slower ranks are never waited for: that is the policy's rule's business. With own pushes
        allowed in flight (``inflight`` = max_inflight k > 0) the peers' pushes of the last k rounds are in flight beside this
        rank's own: a peer is behind only if its delivered clock is behind this rank's clock less k (counted from
        the clock itself, every gradient waited for its round's tick here, which made k > 0 the same as k = 0)."""
        limit = self.cfg.peer_wait
        view, mine = self.engine.view, self.engine.ticker.interval_ns
        if limit <= 0 or mine <= 0:
            return False
        now = time.monotonic()
        if self._peer_clock != clock:
            self._peer_clock, self._peer_deadline = clock, now + limit * mine / 1e9
        if now >= self._peer_deadline:
            return False
        origin = self.clock_origin()
        mine_ran = clock - inflight - int(origin[self.rank])
        for q in range(view.size):
            if q != self.rank and not view.finished[q] and int(view.clocks[q] - origin[q]) < mine_ran \
                    and 0 < view.interval_ns[q] <= PEER_SPEED * mine:
                return True
        return False

    def clock_origin(self):
        """Per rank, the clock from which peer alignment counts its steps: 0 (clocks compared as they are), or
        where the policy's rule last lined the ranks up in time (zipline's barrier, at which ranks may stand at
        different clocks: there a peer "behind" is one that has run fewer steps since)."""
        return self._no_origin

    def on_proceed(self, clock: int):
        gap = self.own_gap(clock)
        self.gaps[gap] = self.gaps.get(gap, 0) + 1

    def finish(self):
        t = self.engine.telemetry
        if self.gaps:
            t.counters["max_clock_gap"] = max(self.gaps)
            t.counters["clock_gap_histogram"] = {str(k): v for k, v in sorted(self.gaps.items())}


class Asp(Policy):
    """Asynchronous parallel: push every step, apply every tick, never wait (staleness unbounded)."""

    name = "asp"
    fresh_reads = True


def server_clocks(view, rank: int, own_clock: int):
    """The clocks a staleness rule compares, as a parameter server would hold them: every rank's clock as delivered
    by the ticks (rank included), plus one extra entry (index n) for this rank's own clock, which counts the pushes
    the ticks have not delivered yet. Staleness of entry n = own clock - min over delivered clocks, so a rank never
    runs ahead of updates it has not seen applied -- its own included (that is what makes s = 0 exactly BSP).
    A rank that has finished training pushes nothing more, so it no longer holds anyone back: its entry reads as
    the largest clock present."""
    clocks = [int(c) for c in view.clocks] + [int(own_clock)]
    if view.finished.any():
        top = max(clocks)
        clocks = [top if q < view.size and view.finished[q] else c for q, c in enumerate(clocks)]
    return clocks


def observed_clocks(view, rank: int, own_clock: int, own_last_ns: int, intervals, own_interval_ns: int):
    """A native WorkerClocks of n + 1 entries built from the tick stream, laid out as server_clocks(), with each
    rank's predicted interval (``intervals``; this rank's own entry ``own_interval_ns``)."""
    n = view.size
    clocks = server_clocks(view, rank, own_clock)
    wc = _native.WorkerClocks(n + 1)
    for q in range(n):
        wc.observe(q, clocks[q], int(view.last_push_ns[q]), int(intervals[q]))
    wc.observe(n, clocks[n], int(own_last_ns), int(own_interval_ns))
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

    def observe(self, view):
        for q in range(view.size):
            self.clocks.observe(q, int(view.clocks[q]), int(view.last_push_ns[q]), int(view.interval_ns[q]))

    def predict(self, q: int) -> int:
        if self.predictor is None:
            raise ValueError("Intervals built without a predictor")
        h = self.clocks.intervals(q)
        return predict_interval(self.predictor, h) if h else -1

    def predicted(self):
        return [self.predict(q) for q in range(self.clocks.size)]


class Ssp(Policy):
    """Stale synchronous parallel (Ho et al. 2013): start a step only while own clock - slowest clock <= s."""

    name = "ssp"

    def may_proceed(self, clock: int) -> bool:
        view = self.engine.view
        return _native.ssp_may_proceed(server_clocks(view, self.rank, clock), view.size, self.cfg.staleness)


class Dssp(Policy):
    """Dynamic SSP (Zhao et al. 2019): within s_L like SSP; beyond it the fastest rank earns credits from the
    SyncController so it keeps going when waiting would not pay; never beyond s_U."""

    name = "dssp"

    def attach(self, engine):
        super().attach(engine)
        # One state of n + 1 entries (see server_clocks); only this rank's entry (n) is ever asked about.
        self.state = _native.DsspState(engine.size + 1, self.cfg.dssp_lower, self.cfg.dssp_upper)
        self.admitted: Optional[bool] = None
        self.intervals = Intervals(engine.size, self.cfg.predictor)
        self.peers_predicted = [-1] * engine.size   # intervals.predicted(), refreshed once per tick
        self.own_history = collections.deque(maxlen=Intervals.HISTORY)   # this rank's, ahead of the ticks
        self.own_predicted = -1                     # its prediction, refreshed once per push

    def _clocks(self, clock):
        t = self.engine.ticker
        own = self.own_predicted if self.own_history else t.interval_ns
        return observed_clocks(self.engine.view, self.rank, clock, t.last_push_ns, self.peers_predicted, own)

    def on_tick(self, tick, view):
        self.intervals.observe(view)
        self.peers_predicted = self.intervals.predicted()

    def on_push(self, clock: int):
        if self.engine.ticker.interval_ns >= 0:
            self.own_history.append(self.engine.ticker.interval_ns)
            self.own_predicted = predict_interval(self.cfg.predictor, list(self.own_history))
        self.admitted = None    # decided at the first gate check after this push (the engine's, before it pulls)

    def may_proceed(self, clock: int) -> bool:
        n = self.engine.size
        if self.admitted is None:
            self.admitted = self.state.on_push(self._clocks(clock), n)
            return self.admitted
        return self.admitted or self.state.may_resume(self._clocks(clock), n)

    def finish(self):
        super().finish()
        self.engine.telemetry.counters.update({"dssp_grants": self.state.grants, "dssp_refusals": self.state.refusals})


class Zipline(Policy):
    """ElasticBSP with ZipLine barriers (Zhao et al. 2019): supersteps of free running, each ended by a full
    barrier placed where the predicted wait is least, at most R (lookahead) iterations after the previous one.

    Superstep: starts at clocks B (identical on every rank: taken from the barrier tick). Once every rank has
    pushed in it (and, while there is room, every rank's push period is measured), the first tick that shows so
    fixes the barrier: ZipLine over each rank's predicted next pushes
    e_q[i] = last_q + i * I_q, i = 1..L, L = R - (iterations already run by the most advanced rank), gives j_q and
    targets T_q = clock_q + j_q. The barrier completes at the first tick where every clock_q >= T_q. A rank never
    runs more than R iterations in a superstep: without a decision it stops at B_q + R (then, L = 0, every rank
    stops where it is: a forced barrier). All of it is a function of the tick stream, so every rank agrees."""

    name = "zipline"
    # Under a straggler joined ticks measured no sooner to the target and a lower final accuracy (twenty-ninth
    # session, static skew: 1.37x and 0.938 over 5 seeds against 1.51x and 0.952 probe-paced; docs/benchmarks.md)
    joins_stragglers = False
    DIGEST_WORDS = 1 << 20   # weights hashed per barrier for the replica check (barrier_digest)

    @property
    def fresh_reads(self) -> bool:
        """Between barriers a rank held only by its own update in flight applies every completed tick, as under
        asp: where a round was split (one rank's push a tick late), its peers then compute on weights that hold it
        instead of a gradient one update stale (measured: homogeneous runs with 1-7 split rounds in their first
        supersteps drew stale gradients and trajectories off Horovod's, where asp, reading fresh, drew none). Not
        with R = 1, which is BSP and must never show a rank another rank's next update."""
        return self.cfg.lookahead > 1

    def attach(self, engine):
        super().attach(engine)
        n = engine.size
        self.R = self.cfg.lookahead
        self.start = np.zeros(n, np.int64)     # B_q
        self.targets: Optional[np.ndarray] = None
        self.barriers = 0
        self.forced = 0
        self.at_bound = 0
        self.peers = False   # every rank a peer of every other (table.still_peers on the tick stream)
        self.max_superstep = 0
        self.spreads_ns = []
        self.digest = None   # Buffers.fold_digest's running checksum (read at finish)
        self.intervals = Intervals(n, self.cfg.predictor)

    def on_tick(self, tick, view):
        self.intervals.observe(view)
        # Until the first barrier the test is the exit one (AUTO_EXIT_SPEED): warm-up steps are noisy, and a first
        # barrier sent to ZipLine's windows because equally fast ranks were not yet within PEER_SPEED gave them
        # targets one clock apart -- a round split there, and rounds split at later barriers (measured: the 3 of 6
        # homogeneous runs with split rounds each had one such barrier; the 3 without had none).
        self.peers = still_peers(tick.meta, self.peers or self.barriers == 0)
        if view.finished.any():
            # A rank that finished pushes nothing more: no barrier can include it; the final barrier (finish) ends
            # the last superstep instead.
            return
        if self.targets is None:
            ran = view.clocks - self.start
            intervals = self.intervals.predicted() if (ran >= 1).all() else [-1]
            lookahead = int(self.R - ran.max())
            # While there is room, decide only once every rank's push period is measured (its second push): before
            # it still_peers cannot hold, so the first barrier of a run went to ZipLine's windows even with equal
            # speeds, where near-tied windows give the ranks targets one apart (a round split in two, early in the
            # run, measured in the matrix's homogeneous zipline runs).
            if min(intervals) >= 0 and (lookahead < 1 or (tick.meta[:, PERIOD_NS] > 0).all()):
                if lookahead >= 1 and self.peers:
                    # Nobody is a straggler: every window predicts the same (near-zero) wait, and ZipLine's tie
                    # goes to the earliest -- a barrier every ~2.7 iterations, each one a wait for nothing.
                    # The bound instead, at one clock for all: R steps after the least B_q (a rank ahead by a step
                    # runs one fewer, so the barrier lines the clocks up again and no rank runs more than R).
                    self.targets = np.maximum(view.clocks, int(self.start.min()) + self.R)
                    self.at_bound += 1
                elif lookahead >= 1:   # a straggler: ZipLine places the barrier where the predicted wait is least
                    b = _native.zipline_barrier_from_intervals(view.last_push_ns.tolist(), intervals, lookahead)
                    self.targets = view.clocks + np.asarray(b.iterations, np.int64)
                    self.spreads_ns.append(int(b.spread_ns))
                else:   # no room left for a prediction (always so with R = 1, which is BSP): stop here
                    self.targets = view.clocks.copy()
                    self.forced += 1
        if self.targets is not None and (view.clocks >= self.targets).all():
            self.max_superstep = max(self.max_superstep, int((view.clocks - self.start).max()))
            self.start = view.clocks.copy()
            self.targets = None
            self.barriers += 1
            # Replica check: every rank's weights right after the barrier tick (identical by construction). A
            # checksum of every k-th weight, k = ceil(size / DIGEST_WORDS) (all of a small model's): a barrier of
            # a 30M model then hashes 4 MB, where the weights live (no host copy on a GPU, nothing read back).
            k = max(1, -(-self.engine.numel // self.DIGEST_WORDS))
            self.digest = self.engine.buffers.fold_digest(self.digest, self.engine.sample_params(k))

    def clock_origin(self):
        return self.start   # steps since the last barrier: every rank left it at the same moment

    def may_proceed(self, clock: int) -> bool:
        view = self.engine.view
        if view.finished.any():   # the job is ending: run free, the final barrier will follow
            return True
        own_start = int(self.start[self.rank])
        # A rank waits in a collective of the script's own: the barrier yields (within R), so that this rank can reach
        # the same call; the barrier completes once every rank has passed its target.
        if self.targets is not None and not view.outside.any():
            return clock < int(self.targets[self.rank]) and clock - own_start < self.R
        return clock - own_start < self.R

    def finish(self):
        super().finish()
        spreads = self.spreads_ns
        self.engine.telemetry.counters.update({
            "barriers": self.barriers, "barriers_without_prediction": self.forced,
            "barriers_at_bound": self.at_bound, "max_iterations_between_barriers":
            self.max_superstep, "barrier_digest": self.engine.buffers.digest_value(self.digest),
            "mean_predicted_wait_ms": round(float(np.mean(spreads)) / 1e6, 3) if spreads else 0.0})


class Wbsp(Policy):
    """Worker-busy synchronous parallel (Yang et al. 2024): every rank trains its own copy and uploads each step's
    model delta; every rank keeps the global model W (W += delta / n per tick), and a rank downloads W at its next
    step boundary once W holds an upload of the slowest rank newer than its last download (native WbspState) -- as
    a parameter server answers a pull with its current model. The slowest rank is measured (longest median of its
    last SLOWEST_HISTORY iteration times: one descheduled iteration of a fast rank does not make it the slowest), so
    it may change during a run; gating each download on "the current slowest's upload is in W" keeps every download
    fresh even then. Fast ranks never wait for slow ones: with overlap a rank has at most one upload in flight,
    without it none (it waits for its own upload to land: communication)."""

    name = "wbsp"
    fresh_reads = True      # unchanged by the push point: wbsp has no backward push, and no s = 0 case
    updates = DeltaUpdates
    SLOWEST_HISTORY = 8   # iteration times per rank the slowest-rank estimate takes the median of

    @property
    def max_inflight(self) -> int:
        return 1 if self.cfg.wbsp_overlap else 0   # overlap: the upload of step k travels while step k+1 computes

    def attach(self, engine):
        super().attach(engine)
        n = engine.size
        self.state = _native.WbspState(n)
        self.intervals = Intervals(n, None, history=self.SLOWEST_HISTORY)   # fed from the tick stream
        self.slowest = -1
        self.downloaded_clocks = np.zeros(n, np.int64)   # uploads of each rank inside the W this rank downloaded last
        self.stale_downloads = 0   # downloads that brought no new upload of the slowest: must stay 0 (invariant 7)

    def on_tick(self, tick, view):
        uploaded = [q for q in range(view.size) if tick.meta[q, COUNT] > 0]
        for q in uploaded:
            self.state.on_upload(q)
        self.intervals.observe(view)
        # While any rank's iteration time is unmeasured nobody can be named slowest: -1 makes the gate wait for
        # every rank's upload (a safe, BSP-like start).
        self.slowest = self.intervals.clocks.slowest_by_median_interval() if (view.interval_ns >= 0).all() else -1

    def on_proceed(self, clock: int):
        super().on_proceed(clock)
        if self.state.may_download(self.rank, self.slowest):
            in_w = self.engine.view.clocks
            if self.slowest >= 0 and in_w[self.slowest] <= self.downloaded_clocks[self.slowest]:
                self.stale_downloads += 1
            self.downloaded_clocks = in_w.copy()
            # with overlap the upload just made may still be on its way into W (at most one: max_inflight)
            self.engine.updates.download(keep_latest=self.engine.pushed - int(in_w[self.rank]) == 1)
            self.state.on_download(self.rank)

    def finish(self):
        super().finish()
        self.engine.telemetry.counters.update({"wbsp_slowest_rank": self.slowest,
                                               "wbsp_stale_downloads": self.stale_downloads})


RELAXED_POLICIES: Dict[str, Type[Policy]] = {cls.name: cls for cls in (Asp, Ssp, Dssp, Zipline, Wbsp)}


def make_policy(cfg) -> Policy:
    return RELAXED_POLICIES[cfg.policy](cfg)
