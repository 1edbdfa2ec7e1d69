"""Streamed pushes: a full tick reads this rank's gradient chunk by chunk while backward still produces it.

The frontend announces a streamed push when backward starts (Ticker.stream_begin), reports the words of the update
that are final as backward produces them (stream_ready), and ends it when the whole update exists (stream_end). The
next full tick takes an announced stream: its thread reads each chunk with `accumulate` straight from the
frontend's tensors once the chunk is final and reduces it at once, so the payload travels while backward still runs
(as Horovod's per-tensor allreduces do). Announcing it makes peers' probes hold the release for this rank
(rules.release), so equally fast ranks' streams share one tick. A stream no tick took by its end is an ordinary
push. Until stream_wait() returns, the frontend must not change the gradients.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import numpy as np

from .table import FINISHED, PERIOD_NS, chunk_bounds

STREAM_SPEED = 1.5        # a rank streams only while its push period is within this factor of the fastest rank's


class Stream:
    """This rank's push in progress: the gradient is read chunk by chunk, by the tick thread, straight from the
    frontend's tensors, as backward finishes each chunk."""

    ANNOUNCED, TAKEN = "announced", "taken"
    __slots__ = ("accumulate", "ready", "state", "since_ns", "begin", "complete", "end_ns")

    def __init__(self, accumulate, chunks: int, since_ns: int):
        self.accumulate, self.ready, self.since_ns = accumulate, [0] * chunks, since_ns
        self.state, self.begin, self.complete, self.end_ns = Stream.ANNOUNCED, time.perf_counter(), False, -1


class Streams:
    """This rank's streamed pushes: the chunks a full tick's payload is cut into (`bounds`, the same on every rank),
    the stream under way (`current`), and what the table reports of them. `lock` is the ticker's: methods marked
    "(under the lock)" expect the caller to hold it, the others take it."""

    def __init__(self, numel: int, enabled: bool, lock: threading.Condition, reader_wake: threading.Condition):
        # enabled: the frontend can hand a gradient over as backward produces it, and every rank's frontend says so
        self.bounds = chunk_bounds(numel) if enabled else [0, numel]
        self.chunked = len(self.bounds) > 2   # full ticks go in chunks, last parameters first
        self._lock = lock
        self._reader_wake = reader_wake   # what the tick thread waits on for a chunk (a condition over `lock`)
        self.current: Optional[Stream] = None
        self.lead_ns = -1              # stream begin -> end (moving average): LEAD_NS in the row
        self.fence = None              # the tick thread's last read of a streamed gradient
        self.taken = 0                 # own pushes a tick took as streams (streamed_pushes)

    @staticmethod
    def may_begin(period_ns: int, meta: Optional[np.ndarray]) -> bool:
        """This rank's push period is measured and at most STREAM_SPEED times the fastest rank's in the last table:
        a tick that took a slow rank's stream would make every rank wait for that rank's backward."""
        if period_ns <= 0 or meta is None:
            return False
        live = (meta[:, FINISHED] == 0) & (meta[:, PERIOD_NS] > 0)
        return not (live.any() and period_ns > STREAM_SPEED * float(meta[live, PERIOD_NS].min()))

    def begin(self, accumulate: Callable, since_ns: int):
        """(Under the lock.) Announce a stream."""
        self.current = Stream(accumulate, len(self.bounds) - 1, since_ns)

    def ready(self, start: int, stop: int) -> bool:
        """(Under the lock.) Words [start, stop) of the stream are final; False when no stream is under way."""
        st = self.current
        if st is None:
            return False
        b = self.bounds
        for k in range(len(b) - 1):
            lo, hi = max(start, b[k]), min(stop, b[k + 1])
            if lo < hi:
                st.ready[k] += hi - lo
        return True

    def end(self, st: Stream, now_ns: int) -> bool:
        """(Under the lock.) The stream's update is complete. True when no tick took it: the caller pushes it as an
        ordinary push."""
        lead = int((time.perf_counter() - st.begin) * 1e9)
        self.lead_ns = lead if self.lead_ns < 0 else int(self.lead_ns + 0.2 * (lead - self.lead_ns))
        if st.state == Stream.ANNOUNCED:
            self.current = None
            return True
        st.complete, st.end_ns = True, now_ns
        return False

    def announced(self) -> Optional[Stream]:
        """(Under the lock.) The stream a tick may take: announced and not taken yet."""
        st = self.current
        return st if st is not None and st.state == Stream.ANNOUNCED else None

    @staticmethod
    def take(st: Stream):
        """(Under the lock.) A full tick takes the announced stream: its thread reads the gradient from now on."""
        st.state = Stream.TAKEN

    @property
    def streaming(self) -> bool:
        """A stream is announced and not ended."""
        st = self.current
        return st is not None and not st.complete

    def read_chunk(self, st: Stream, k: int, chunk):
        """The tick thread: wait until backward has made chunk k final (the stream's end makes every chunk final;
        chunk 0, the first parameters, is read after the end), then read it into `chunk`."""
        start, stop = self.bounds[k], self.bounds[k + 1]
        with self._lock:
            while not (st.complete or (k > 0 and st.ready[k] >= stop - start)):
                self._reader_wake.wait(1.0)
        st.accumulate(chunk, start, stop)

    def finish_reading(self, fence):
        """(Under the lock.) The tick thread has read the whole stream: stream_wait may return (after `fence`, its
        reads on the device)."""
        self.current = None
        self.fence = fence
        self.taken += 1
        self._lock.notify_all()
