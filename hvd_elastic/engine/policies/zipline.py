"""ElasticBSP with ZipLine barriers (docs/algorithms.md, "ElasticBSP and ZipLine")."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ... import _native
from ..pacing.rules import still_peers
from ..table import PERIOD_NS
from .base import Gate, Intervals, Policy


class Zipline(Policy):
    """Supersteps of free running, each ended by a full barrier placed where the predicted wait is least, at most R
    (lookahead) iterations after the previous one.

    Superstep: starts at clocks B (identical on every rank: taken from the barrier tick). Once every rank has pushed
    in it (and, while there is room, every rank's push period is measured), the first tick that shows so fixes the
    barrier: ZipLine over each rank's predicted next pushes e_q[i] = last_q + i * I_q, i = 1..L, L = R - (iterations
    already run by the most advanced rank), gives j_q and targets T_q = clock_q + j_q. The barrier completes at the
    first tick where every clock_q >= T_q. A rank never runs more than R iterations in a superstep: without a
    decision it stops at B_q + R (then, L = 0, every rank stops where it is: a forced barrier). All of it is a
    function of the tick stream, so every rank agrees."""

    # Under a straggler joined ticks reach the target no sooner and end less accurate (docs/design.md, "Pacing")
    relaxed_joins = "peers"
    has_barriers = True

    def __init__(self, cfg, rank: int, size: int):
        super().__init__(cfg, rank, size)
        self.R = cfg.lookahead
        self.targets: Optional[np.ndarray] = None
        self.barriers = self.forced = self.at_bound = self.max_superstep = 0
        self.peers = False   # every rank a peer of every other (rules.still_peers on the tick stream)
        self.spreads_ns = []
        self.intervals = Intervals(size, cfg.predictor)

    @property
    def fresh_reads(self) -> bool:
        """Between barriers a rank held only by its own update in flight applies every completed tick, as under asp:
        where a round was split (one rank's push a tick late), its peers then compute on weights that hold it instead
        of a gradient one update stale. Not with R = 1, which is BSP and must never show a rank another rank's next
        update."""
        return self.R > 1

    def observe(self, tick, view) -> bool:
        self.intervals.observe(view)
        # Until the first barrier the test is the exit one (AUTO_EXIT_SPEED): warm-up steps are noisy, and a first
        # barrier sent to ZipLine's windows because equally fast ranks were not yet within PEER_SPEED gives them
        # targets one clock apart (a round split there, and at later barriers).
        self.peers = still_peers(tick.meta, self.peers or self.barriers == 0)
        if view.finished.any():
            # A rank that finished pushes nothing more: no barrier can include it; the final barrier (finish) ends
            # the last superstep instead.
            return False
        if self.in_lockstep:
            return self._lockstep_superstep(view)
        if view.outside.any():
            self._yield_to_outside(view)
        if self.targets is None:
            self.targets = self._place_barrier(tick, view)
        if self.targets is not None and (view.clocks >= self.targets).all():
            self._end_superstep(view)
            self.barriers += 1
            return True
        return False

    def _end_superstep(self, view):
        """A superstep ends at the clocks as they stand: the next one starts there (B_q)."""
        self.max_superstep = max(self.max_superstep, int((view.clocks - self.origin).max()))
        self.origin = view.clocks.copy()
        self.targets = None

    def _lockstep_superstep(self, view) -> bool:
        """While the ranks go in lock-step (the fallback, base.Lockstep), ZipLine places no barrier: every round
        ends with the ranks lined up, and a superstep ends there (a lock-step point: every rank has run as many steps
        since the switch into lock-step; no replica check). A rank still finishing its first round after the switch
        stops at R iterations (bounds_lockstep); where a rank behind in that round, which the others wait for, has
        stopped so, a barrier ends the superstep at the clocks as they stand."""
        self.targets = None
        lined = view.clocks - self.lockstep.origin
        if (lined == lined[0]).all():
            self._end_superstep(view)
            return False
        ran = view.clocks - self.origin
        if int(ran[lined == lined.min()].max()) < self.R:
            return False
        self.forced += 1
        self._end_superstep(view)
        self.barriers += 1
        return True

    def bounds_lockstep(self, gate: Gate) -> bool:
        return not gate.view.finished.any() and gate.clock - int(self.origin[self.rank]) >= self.R

    def _yield_to_outside(self, view):
        """Ranks wait in a collective of the script's own (OUTSIDE): they cannot move until the others reach the same
        call, so their targets are where they stand; and a rank held at the bound (R iterations run) gets its barrier
        at once, at the current clocks, so that it can go on to that call. Otherwise a barrier that asked more of a
        rank than the steps before its call would hold the others, and the call would never complete."""
        if self.targets is not None:
            self.targets = np.where(view.outside, np.minimum(self.targets, view.clocks), self.targets)
        elif int((view.clocks - self.origin).max()) >= self.R:
            self.forced += 1
            self.targets = view.clocks.copy()

    def _place_barrier(self, tick, view) -> Optional[np.ndarray]:
        ran = view.clocks - self.origin
        intervals = self.intervals.predicted() if (ran >= 1).all() else [-1]
        lookahead = int(self.R - ran.max())
        # While there is room, decide only once every rank's push period is measured (its second push): before it
        # still_peers cannot hold, so the first barrier would go to ZipLine's windows even with equal speeds.
        if min(intervals) < 0 or (lookahead >= 1 and not (tick.meta[:, PERIOD_NS] > 0).all()):
            return None
        if lookahead >= 1 and self.peers:
            # Nobody is a straggler: every window predicts the same (near-zero) wait, and ZipLine's tie goes to the
            # earliest -- a barrier every few iterations, each a wait for nothing. The bound instead, at one clock
            # for all: R steps after the least B_q (a rank ahead by a step runs one fewer).
            self.at_bound += 1
            return np.maximum(view.clocks, int(self.origin.min()) + self.R)
        if lookahead >= 1:   # a straggler: ZipLine places the barrier where the predicted wait is least
            b = _native.zipline_barrier_from_intervals(view.last_push_ns.tolist(), intervals, lookahead)
            self.spreads_ns.append(int(b.spread_ns))
            return view.clocks + np.asarray(b.iterations, np.int64)
        self.forced += 1     # no room left for a prediction (always so with R = 1, which is BSP): stop here
        return view.clocks.copy()

    def clock_origin(self):
        return self.origin   # B_q: steps since the last barrier (every rank left it at the same moment)

    def holds(self, gate: Gate) -> bool:
        view = gate.view
        if view.finished.any():   # the job is ending: run free, the final barrier will follow
            return False
        ran = gate.clock - int(self.origin[self.rank])
        # A rank waits in a collective of the script's own: the barrier yields (within R, and observe() ends a
        # superstep at R: _yield_to_outside), so that this rank can reach the same call.
        if self.targets is not None and not view.outside.any():
            return not (gate.clock < int(self.targets[self.rank]) and ran < self.R)
        return not ran < self.R

    def counters(self):
        spreads = self.spreads_ns
        return {**super().counters(), "barriers": self.barriers, "barriers_without_prediction": self.forced,
                "barriers_at_bound": self.at_bound, "max_iterations_between_barriers": self.max_superstep,
                "mean_predicted_wait_ms": round(float(np.mean(spreads)) / 1e6, 3) if spreads else 0.0}
