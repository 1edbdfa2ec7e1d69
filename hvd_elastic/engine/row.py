"""This rank's row of the tick table: its pushes and their timing, its gate, and the delivery of its pushes."""
from __future__ import annotations

import collections
import time
from typing import Deque, Optional

import numpy as np

from .table import GATED, INTERVAL_NS, LAST_PUSH_NS, META_COLUMNS, PERIOD_NS


class OwnRow:
    """What this rank reports in its row of the next tick's table, kept by the ticker under its lock: the clock
    (pushes so far), push timing (last push, measured step time and push period), the pushes pending for the next
    full tick, the training thread's state (finished, gated, outside), and how long its pushes take to come back
    in a completed tick (push_latency_s). Times in ns on the job's common clock (since `epoch_ns`)."""

    def __init__(self, rank: int, size: int, epoch_ns: int):
        self.rank, self.size, self.epoch_ns = rank, size, epoch_ns
        self.clock = 0                 # own pushes so far
        self.last_push_ns = -1
        self.interval_ns = -1          # the step compute time the last push reported
        self.period_ns = -1            # time between pushes (moving average)
        self.pending_count = 0         # pushes since the last full tick
        self.pending_since_ns = -1     # ... and when the first of them came
        self.sent_push_ns = -1         # time of the last push inside a sent (full) tick: LAST_PUSH_NS goes with CLOCK
        self.finished = False          # finish() was called
        self.gated = False             # the training thread is held at its gate (GATED) ...
        self.gated_at = -1             # ... as of this many ticks taken (Handoff.taken)
        self.outside = False           # the training thread waits in a collective of the script's own (OUTSIDE)
        self.hosts = 0                 # the latest change of the rank set announced to this rank (HOSTS)
        self.resumed_ns = -1           # when the training thread last started a step (after its gate opened)
        self._push_times: Deque[float] = collections.deque()   # perf_counter of own pushes not delivered yet
        self.delivered_clock = 0       # own pushes that are inside a completed tick
        self.push_latency_s = 0.0      # push -> delivered in a completed tick, moving average

    def now_ns(self) -> int:
        return time.time_ns() - self.epoch_ns

    def add_pending(self, since_ns: int):
        if self.pending_count == 0:
            self.pending_since_ns = since_ns
        self.pending_count += 1

    def count_push(self, now_ns: int, interval_ns: int) -> int:
        """A push of this rank is complete: its clock and timing. Returns the clock."""
        if self.last_push_ns >= 0:
            gap = now_ns - self.last_push_ns
            self.period_ns = gap if self.period_ns <= 0 else int(self.period_ns + 0.2 * (gap - self.period_ns))
        self.clock += 1
        self._push_times.append(time.perf_counter())
        self.last_push_ns = now_ns
        self.interval_ns = int(interval_ns)
        return self.clock

    def take_pending(self):
        """A full tick takes the pending pushes: returns (their count, the clock they bring it to)."""
        count, self.pending_count = self.pending_count, 0
        self.sent_push_ns = self.last_push_ns
        return count, self.clock

    def table(self, index: int, count: int, clock: int, pending: int, since_ns: int, streaming: int,
              lead_ns: int) -> np.ndarray:
        """The next tick's table with this row filled (the other rows stay -1: zeros once encoded). LAST_PUSH_NS is
        that of the last push sent, so that it always goes with CLOCK (the policies predict a rank's next pushes
        from both)."""
        meta = np.full((self.size, META_COLUMNS), -1, np.int64)
        meta[self.rank] = (count, clock, self.sent_push_ns, self.interval_ns, int(self.finished), index, pending,
                           since_ns, self.now_ns(), self.period_ns, streaming, lead_ns,
                           int(self.gated or self.outside), int(self.outside), self.hosts)
        return meta

    def probe_table(self, index: int, stream_since_ns: Optional[int], lead_ns: int) -> np.ndarray:
        """A probe's table: it delivers nothing and announces what is pending (pushes; a stream announced since
        `stream_since_ns`, None when none) and since when."""
        count = self.pending_count
        since = [t for t in (self.pending_since_ns if count else -1,
                             stream_since_ns if stream_since_ns is not None else -1) if t >= 0]
        return self.table(index, 0, self.clock - count, count, min(since) if since else -1,
                          int(stream_since_ns is not None), lead_ns)

    def live(self, meta: np.ndarray, gate_seen: bool = True) -> np.ndarray:
        """The last tick's table with this row as it stands now (what a join decides from). gate_seen: the training
        thread decided its gate after taking every completed tick; otherwise a held gate may be about to open (a
        tick that opens it completed since) and GATED reads 0 until it decides again."""
        meta = meta.copy()
        meta[self.rank, [LAST_PUSH_NS, INTERVAL_NS, PERIOD_NS, GATED]] = \
            (self.last_push_ns, self.interval_ns, self.period_ns, int((self.gated and gate_seen) or self.outside))
        return meta

    def own_due_ns(self) -> Optional[int]:
        """This rank's next push as its current step predicts it: the step's start plus the step compute time the
        last push reported. None before a step started after the last push (the table's last push + period, which
        also counts waiting, is then the prediction). Unlike the period it follows a step that started late (a slow
        tick delays the whole round) and is wrong by the step's own jitter only."""
        if self.resumed_ns <= self.last_push_ns or self.interval_ns <= 0:
            return None
        return self.resumed_ns + self.interval_ns

    def delivered(self, clock: int):
        """A completed tick's CLOCK for this row: own pushes up to `clock` are delivered."""
        now = time.perf_counter()
        for _ in range(clock - self.delivered_clock):
            latency = now - self._push_times.popleft()
            self.push_latency_s = latency if self.push_latency_s == 0 else \
                self.push_latency_s + 0.2 * (latency - self.push_latency_s)
        self.delivered_clock = clock
