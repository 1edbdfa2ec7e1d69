"""WBSP: worker-busy synchronous parallel (docs/algorithms.md, "WBSP")."""
from __future__ import annotations

import dataclasses

import numpy as np

from ... import _native
from ..table import COUNT
from .base import Gate, Intervals, Policy


@dataclasses.dataclass
class Download:
    """The engine is to replace this rank's weights by the global model W before its next step. keep_latest: its
    latest upload is still on its way into W (overlap), so the weights keep it (updates.DeltaUpdates.download)."""
    keep_latest: bool


class Wbsp(Policy):
    """Every rank trains its own copy and uploads each step's model delta; every rank keeps the global model W
    (W += delta / n per tick), and a rank downloads W at its next step boundary once W holds an upload of the slowest
    rank newer than its last download (native WbspState) -- as a parameter server answers a pull with its current
    model. The slowest rank is measured (longest median of its last SLOWEST_HISTORY iteration times: one descheduled
    iteration of a fast rank does not make it the slowest), so it may change during a run; gating each download on
    "the current slowest's upload is in W" keeps every download fresh even then. Fast ranks never wait for slow ones:
    with overlap a rank has at most one upload in flight, without it none (it waits for its own upload to land:
    communication)."""

    fresh_reads = True      # unchanged by the push point: wbsp has no backward push, and no s = 0 case
    relaxed_joins = "never"   # relaxed, an upload travels while the next step computes: probes, joined in lock-step
    SLOWEST_HISTORY = 8   # iteration times per rank the slowest-rank estimate takes the median of

    def __init__(self, cfg, rank: int, size: int):
        super().__init__(cfg, rank, size)
        if not cfg.wbsp_lockstep:   # the lock-step fallback is HVD_ELASTIC_WBSP_LOCKSTEP's choice
            self.lockstep = None
        self.state = _native.WbspState(size)
        self.intervals = Intervals(size, None, history=self.SLOWEST_HISTORY)   # fed from the tick stream
        self.slowest = -1
        self.downloaded_clocks = np.zeros(size, np.int64)   # uploads of each rank inside the W last downloaded
        # downloads that brought no new upload of the slowest: must stay 0 (docs/design.md, "Invariants", 7)
        self.stale_downloads = 0

    def max_inflight(self, interval_ns: int, push_latency_s: float) -> int:
        """Overlap: the upload of step k travels while step k+1 computes. In lock-step a rank waits for its round's
        tick, its own upload in it, whatever the overlap: it blocks on that upload (and runs the tick itself)."""
        return 1 if self.cfg.wbsp_overlap and not self.in_lockstep else 0

    def observe(self, tick, view) -> bool:
        for q in range(view.size):
            if tick.meta[q, COUNT] > 0:
                self.state.on_upload(q)
        self.intervals.observe(view)
        # While any rank's iteration time is unmeasured nobody can be named slowest: -1 makes the gate wait for
        # every rank's upload (a safe, BSP-like start).
        self.slowest = self.intervals.clocks.slowest_by_median_interval() if (view.interval_ns >= 0).all() else -1
        return False

    def proceeded(self, gate: Gate):
        super().proceeded(gate)
        if not self.state.may_download(self.rank, self.slowest):
            return None
        in_w = gate.view.clocks
        if self.slowest >= 0 and in_w[self.slowest] <= self.downloaded_clocks[self.slowest]:
            self.stale_downloads += 1
        self.downloaded_clocks = in_w.copy()
        self.state.on_download(self.rank)
        # with overlap the upload just made may still be on its way into W (at most one: max_inflight)
        return Download(keep_latest=gate.clock - int(in_w[self.rank]) == 1)

    def counters(self):
        return {**super().counters(), "wbsp_slowest_rank": self.slowest, "wbsp_stale_downloads": self.stale_downloads}
