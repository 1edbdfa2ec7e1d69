"""The global state every rank holds identically: built only from the tick stream, in tick order."""
from __future__ import annotations

import numpy as np

from .table import CLOCK, COUNT, FINISHED, INTERVAL_NS, LAST_PUSH_NS, OUTSIDE, PERIOD_NS


class GlobalView:
    """Per-rank clocks (updates delivered in ticks), last push times (the job's common clock), push periods and
    latest iteration times, finished flags, and which ranks' training threads wait in a collective of the script's
    own (outside)."""

    def __init__(self, size: int):
        self.size = size
        self.ticks = 0
        self.clocks = np.zeros(size, np.int64)
        self.last_push_ns = np.full(size, -1, np.int64)
        self.interval_ns = np.full(size, -1, np.int64)
        self.period_ns = np.full(size, -1, np.int64)
        self.finished = np.zeros(size, bool)
        self.outside = np.zeros(size, bool)
        self.pushed_total = 0

    def update(self, meta: np.ndarray):
        self.ticks += 1
        self.clocks = meta[:, CLOCK].copy()
        self.last_push_ns = meta[:, LAST_PUSH_NS].copy()
        self.interval_ns = meta[:, INTERVAL_NS].copy()
        self.period_ns = meta[:, PERIOD_NS].copy()
        self.finished = meta[:, FINISHED].astype(bool)
        self.outside = meta[:, OUTSIDE] > 0
        self.pushed_total += int(meta[:, COUNT].sum())
