"""SSP and DSSP: staleness-bounded rules (docs/algorithms.md, "SSP" and "DSSP")."""
from __future__ import annotations

import collections

from ... import _native
from ...predictors import predict_interval
from .base import Gate, Intervals, Policy, observed_clocks, server_clocks


class Ssp(Policy):
    """Stale synchronous parallel (Ho et al. 2013): start a step only while own clock - slowest clock <= s."""

    def holds(self, gate: Gate) -> bool:
        return not _native.ssp_may_proceed(server_clocks(gate.view, gate.clock), gate.view.size,
                                           self.cfg.staleness)

    def bounds_lockstep(self, gate: Gate) -> bool:
        """The bound s holds in lock-step too: lock-step counts each rank's steps from the clocks at the switch, so a
        rank that entered it s ahead with a push in flight would otherwise keep a gap of s + 1."""
        return self.holds(gate)


class Dssp(Policy):
    """Dynamic SSP (Zhao et al. 2019): within s_L like SSP; beyond it the fastest rank earns credits from the
    SyncController so it keeps going when waiting would not pay; never beyond s_U. The credit is decided once per
    step, when the rule is first consulted (rule_starts); later checks only ask whether the gap is back."""


    def __init__(self, cfg, rank: int, size: int):
        super().__init__(cfg, rank, size)
        # One state of n + 1 entries (see server_clocks); only this rank's entry (n) is ever asked about.
        self.state = _native.DsspState(size + 1, cfg.dssp_lower, cfg.dssp_upper)
        self.admitted = False
        self.intervals = Intervals(size, cfg.predictor)
        self.peers_predicted = [-1] * size            # intervals.predicted(), refreshed once per tick
        self.own_history = collections.deque(maxlen=Intervals.HISTORY)   # this rank's, ahead of the ticks
        self.own_predicted = -1                       # its prediction, refreshed once per push

    def pushed(self, clock: int, interval_ns: int):
        if interval_ns >= 0:
            self.own_history.append(interval_ns)
            self.own_predicted = predict_interval(self.cfg.predictor, list(self.own_history))

    def observe(self, tick, view) -> bool:
        self.intervals.observe(view)
        self.peers_predicted = self.intervals.predicted()
        return False

    def _clocks(self, gate: Gate):
        own = self.own_predicted if self.own_history else gate.interval_ns
        return observed_clocks(gate, self.peers_predicted, own)

    def rule_starts(self, gate: Gate):
        self.admitted = self.state.on_push(self._clocks(gate), gate.view.size)

    def holds(self, gate: Gate) -> bool:
        return not (self.admitted or self.state.may_resume(self._clocks(gate), gate.view.size))

    def counters(self):
        return {**super().counters(), "dssp_grants": self.state.grants, "dssp_refusals": self.state.refusals}
