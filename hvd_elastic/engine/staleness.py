"""Staleness: measured on every applied update, and compensated when the policy asks for it.

The staleness of an update is the number of updates (pushes of any rank) applied to the model between the weights
the update was computed on and its own application. Updates applied in the same tick do not count: under BSP every
gradient of a step is computed on the same weights and applied in one tick, so BSP's staleness is 0. Under the
gradient policies a rank's weights are fixed during its step (it pulls only at step boundaries), so a push computed
after the rank had applied A updates and delivered in a tick applied after B updates has staleness B - A. Under wbsp
a delta is computed on the last downloaded global model plus the rank's own earlier local steps since then (which
its weights already hold), so those do not count either.

This is not the clock gap (``max_clock_gap``: how far a rank's clock leads the slowest one, which the SSP/DSSP
bounds are about): a rank can lead by 700 clocks under zipline while each of its gradients is only a few updates
stale, and under asp the clock gap says nothing about how many updates raced past a gradient.

Compensation (``HVD_ELASTIC_STALENESS_COMPENSATION``) scales a gradient before it is pushed, by a weight from its
predicted staleness (:func:`compensation_weight`). The prediction is made at push time from the ticks this rank has
already received and whether a tick is in flight, so it is close to the staleness measured at application.
"""
from __future__ import annotations

import collections
from typing import Deque, Dict, Tuple

from ..telemetry import summarize

COMPENSATIONS = ("none", "inverse", "damped")


def compensation_weight(mode: str, staleness: float, size: int) -> float:
    """The factor a gradient of (predicted) `staleness` is scaled by before it is pushed, in a job of `size` ranks.

    - "none": 1.
    - "inverse" (Zhang, Gupta, Lian, Liu, IJCAI 2016, staleness-aware async SGD: learning rate / staleness):
      min(1, n / staleness). In a tick every gradient is applied with weight 1/n (BSP's average), and asynchronous
      SGD with n equally fast workers has staleness about n - 1, so gradients up to n updates stale keep BSP's
      weight and staler ones (a straggler's, computed while the fast ranks pushed many) are scaled by n/staleness:
      the model moves at most about one BSP step's worth on any gradient's account, however stale it is.
    """
    if mode not in COMPENSATIONS:
        raise ValueError(f"unknown staleness compensation {mode!r}; accepted: {'|'.join(COMPENSATIONS)}")
    if mode == "damped":
        return size / float(size + max(staleness, 0))
    if mode == "none" or staleness <= size:
        return 1.0
    return size / float(staleness)


class StalenessLog:
    """Histogram of the staleness of this rank's updates (staleness -> count), the weights applied, and the
    staleness of each of its first TRACE_LIMIT updates by clock (the report's ``staleness_trace``, for checks)."""

    TRACE_LIMIT = 1000

    def __init__(self):
        self.histogram: Dict[int, int] = {}
        self.trace: Dict[str, int] = {}
        self.weight_sum = 0.0
        self.weighted = 0      # updates scaled by a weight below 1

    def add(self, staleness: int, clock: int):
        self.histogram[staleness] = self.histogram.get(staleness, 0) + 1
        if len(self.trace) < self.TRACE_LIMIT:
            self.trace[str(clock)] = staleness

    def add_weight(self, w: float):
        self.weight_sum += w
        if w < 1.0:
            self.weighted += 1

    def counters(self) -> Dict:
        out = summarize(self.histogram)
        out = {f"staleness_{k}": v for k, v in out.items() if k != "updates"}
        out["staleness_histogram"] = {str(k): v for k, v in sorted(self.histogram.items())}
        out["staleness_trace"] = dict(self.trace)
        n = sum(self.histogram.values())
        if n and self.weighted:
            out["compensated_updates"] = self.weighted
            out["mean_compensation_weight"] = round(self.weight_sum / n, 3)
        return out



class Staleness:
    """This rank's staleness bookkeeping: ``read``, the updates held by the weights it computes its next update on,
    and for each own push not applied yet the clock and that count; a push's staleness is measured when the tick that
    delivers it is applied (the engine calls :meth:`delivered` with its running count of applied updates)."""

    def __init__(self):
        self.log = StalenessLog()
        self.read = 0
        self._unapplied: Deque[Tuple[int, int]] = collections.deque()

    def pushed(self, clock: int, weight: float, holds_own: bool):
        """An own push at `clock`, scaled by `weight`. holds_own: the rank's own copy holds it at once (delta
        policies), so the weights its next update is computed on count it."""
        self.log.add_weight(weight)
        self._unapplied.append((clock, self.read))
        if holds_own:
            self.read += 1

    def delivered(self, own_clock: int, applied: int):
        """A tick delivered this rank's pushes up to `own_clock`; `applied` updates had been applied before it."""
        while self._unapplied and self._unapplied[0][0] <= own_clock:
            clock, read = self._unapplied.popleft()
            self.log.add(applied - read, clock)

    def counters(self) -> Dict:
        return self.log.counters()
