"""The data plane: ticks of partial allreduce, driven by a background thread (architecture.md, "The data plane").

A tick is a Sum-allreduce over all ranks of (a) the updates each rank pushed since its previous tick (zeros when
it has none) and (b) a metadata table in which each rank fills only its own row, so the Sum is an allgather of
every rank's clock, last push time and iteration time. Every rank receives the same ticks in the same order, which
is what lets every rank apply the same updates and take the same scheduling decisions.

Metadata first: a tick in which nobody pushed moves no model-sized buffer. A tick is normally a *probe*: a metadata-
only allreduce (a few hundred words) that delivers nothing and tells every rank what each rank has pending. When the
table shows pending pushes, every rank decides -- from the table alone, so identically -- to release them: the next
tick is then a *full* tick, payload and metadata in one allreduce, issued at once. The release waits (at most
HVD_ELASTIC_PEER_WAIT, default HOLD_FRACTION, of the pushing ranks' step period, counted from the first pending
push) for ranks that are due to push within that window (last push + measured push period), so that equally fast
ranks land in the same payload instead of one payload each; ranks not due (a straggler) are never waited for. While
most recent ticks carried pushes or released them at once (BUSY of the last BUSY_WINDOW: pushes arrive faster than
ticks), ticks are full without probes (one collective per tick; an empty full tick moves a zero payload). A probe
that holds pending pushes for a peer does not count: counting it made every hold switch to full ticks, which
release without waiting, so equally fast ranks drifted apart (see docs/design.md). Every choice depends
only on past tables, which every rank holds identically, so every rank issues the same collectives in the same
order.

Buffers: the update buffers are the frontend's own tensors (engine/buffers.py), preallocated and reused: pushes
accumulate in place into the pending buffer; a tick swaps it for a zeroed spare; the training thread gives each
applied tick's buffer back (recycle), and the tick thread zeroes it for reuse. No model-sized allocation per tick.

Pacing: the thread issues a tick at most every `tick_s` seconds, and backs off (doubling, up to `max_idle_s`) while
ticks come back empty; after an empty tick it also sleeps until shortly before the next push the table predicts
(quiet_s): on a CPU machine the probes of a quiet period only take cycles from the computation. A push wakes its own
rank's thread at once. A tick carries one model-sized buffer however many pushes it sums, so communication is
bounded by model size / tick interval, whatever the ranks' speeds. A tick completes when every rank's thread has
joined it: ticks wait for the slowest *thread*, never for a rank's computation.

Shutdown: a rank that has finished raises FINISHED in its row; the thread stops after the first tick in which every
rank is finished and nobody pushed anything, which every rank sees at the same tick (so no collective is left
dangling and every pushed update has been delivered).
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, List, Optional

import numpy as np

from ..errors import HvdElasticError
from .buffers import NumpyBuffers

# Metadata columns, one row per rank (int64). COUNT: pushes this tick delivers; CLOCK: own pushes delivered up to
# and including this tick; PENDING / PENDING_SINCE_NS: pushes waiting (probes only) and when the first of them came;
# NOW_NS: the row's snapshot time; PERIOD_NS: measured time between the rank's pushes (moving average).
COUNT, CLOCK, LAST_PUSH_NS, INTERVAL_NS, FINISHED, SEQ, PENDING, PENDING_SINCE_NS, NOW_NS, PERIOD_NS = range(10)
META_COLUMNS = 10
# The metadata travels in a buffer of the update's dtype (with the payload in busy phases: one allreduce, one
# dtype, since Horovod only fuses tensors of one dtype and on Gloo every extra collective costs milliseconds). Each
# int64 (all values are >= -1) is stored as value + 1 in four 16-bit pieces, which float32 and float64 hold
# exactly; one rank fills each row and the others add zeros, so the Sum returns every piece exactly.
META_PIECES = 4   # 16-bit pieces per int64
_BASE = 1 << 16
POOL_LIMIT = 1    # recycled buffers kept for reuse (beyond it, given back to the allocator): pending + the
                  # tick in flight + this one is the steady state; more would only raise peak memory
BUSY_WINDOW, BUSY = 8, 6   # full ticks without probes while BUSY of the last BUSY_WINDOW ticks had pushes
QUIET_MARGIN, QUIET_MAX_S = 0.25, 0.25   # idle pacing: probe again this fraction of a period before the next
                                        # predicted push; never sleep longer than this (quiet_s)
HOLD_FRACTION = 0.5        # default release hold, a fraction of the pushers' step period (HVD_ELASTIC_PEER_WAIT)


def release(meta: np.ndarray, hold_fraction: float = HOLD_FRACTION) -> bool:
    """After a probe with this table: send the pending pushes in a full tick now (True) or probe again (False).
    Now, unless some rank with nothing pending is due to push within the hold window and the oldest pending push
    has waited less than that window. A function of the table only: every rank decides the same."""
    pending = meta[:, PENDING] > 0
    if not pending.any():
        return False
    periods = meta[pending, PERIOD_NS]
    if hold_fraction <= 0 or (periods <= 0).any():
        return True                              # a pusher's period is not measured yet
    hold = hold_fraction * float(periods.min())
    now = float(meta[:, NOW_NS].max())
    if now - float(meta[pending, PENDING_SINCE_NS].min()) >= hold:
        return True
    idle = ~pending & (meta[:, FINISHED] == 0) & (meta[:, PERIOD_NS] > 0) & (meta[:, LAST_PUSH_NS] >= 0)
    due = meta[idle, LAST_PUSH_NS] + meta[idle, PERIOD_NS] <= now + hold
    return not due.any()


def quiet_s(meta: np.ndarray) -> float:
    """After a tick in which nothing was pushed or pending: how long no rank is expected to push, from the table
    (each rank's last push + its measured push period, minus QUIET_MARGIN of that period for jitter), at most
    QUIET_MAX_S; 0 when some rank's period is not measured. Probes in that time would only take CPU from the
    computation. Each row's prediction is taken relative to the row's own NOW_NS, so clocks of different hosts need
    not agree. A rank's own push wakes its thread at once (push()), so a wrong prediction costs a probe's latency
    only when another rank pushes early -- at most QUIET_MARGIN of its period."""
    live = meta[:, FINISHED] == 0
    if not live.any() or (meta[live, PERIOD_NS] <= 0).any() or (meta[live, LAST_PUSH_NS] < 0).any():
        return 0.0
    period = meta[live, PERIOD_NS].astype(np.float64)
    due = meta[live, LAST_PUSH_NS] + (1.0 - QUIET_MARGIN) * period - meta[live, NOW_NS]
    return float(min(max(due.min(), 0.0) / 1e9, QUIET_MAX_S))


def encode_meta(meta: np.ndarray, out: np.ndarray):
    v = meta.astype(np.int64).ravel() + 1
    if (v < 0).any() or (v >= (1 << 62)).any():
        raise ValueError("tick metadata out of range")
    for k in range(META_PIECES):
        out[k::META_PIECES] = (v >> (16 * k)) & (_BASE - 1)


def decode_meta(words: np.ndarray, size: int, columns: int = META_COLUMNS) -> np.ndarray:
    """Inverse of encode_meta for a (size x columns) table (the tick's, or any other riding the same way)."""
    pieces = np.rint(words).astype(np.int64)
    v = np.zeros(size * columns, np.int64)
    for k in range(META_PIECES):
        v += pieces[k::META_PIECES] << (16 * k)
    return (v - 1).reshape(size, columns)


class Tick:
    """One completed tick: `index`, the summed `update` (a view of `buffer`; None when nobody pushed), the
    metadata table, the time spent in its collectives. Hand `buffer` back with Ticker.recycle once applied."""

    __slots__ = ("index", "update", "meta", "comm_s", "buffer")

    def __init__(self, index: int, update, meta: np.ndarray, comm_s: float, buffer=None):
        self.index, self.update, self.meta, self.comm_s, self.buffer = index, update, meta, comm_s, buffer

    @property
    def total_count(self) -> int:
        return int(self.meta[:, COUNT].sum())


class TickerError(HvdElasticError):
    """The tick thread failed (e.g. Horovod shut down because a peer died); raised on the training thread."""


class Ticker:
    """Background tick thread of one rank. The training thread calls push()/finish()/take()/recycle(); nothing
    else. `allreduce_sum(buffers, name)` is an in-place Sum allreduce over all ranks of buffers of the kind
    `buffers` makes (NumpyBuffers by default)."""

    def __init__(self, numel: int, buffers, rank: int, size: int,
                 allreduce_sum: Callable[[list, str], None],
                 tick_s: float = 0.005, max_idle_s: float = 0.01, epoch_ns: int = 0,
                 name: str = "hvd_elastic.tick", hold_fraction: float = HOLD_FRACTION):
        if not hasattr(buffers, "zeros"):          # a dtype: numpy buffers
            buffers = NumpyBuffers(buffers)
        self.numel, self.buffers, self.rank, self.size = numel, buffers, rank, size
        # Horovod tensor name of the ticks: unique among the engines alive in this process, the same on every rank.
        self.name = name
        self._allreduce_sum = allreduce_sum
        self.tick_s, self.max_idle_s, self.epoch_ns = tick_s, max(max_idle_s, tick_s), epoch_ns
        self.hold_fraction = hold_fraction   # release hold (HVD_ELASTIC_PEER_WAIT; 0: release at once)
        self._lock = threading.Condition()
        self._meta_words = size * META_COLUMNS * META_PIECES
        self._length = numel + self._meta_words          # [update | encoded metadata]
        self._pending = buffers.zeros(self._length)      # this rank's pushes since its last tick
        self._spare = None                               # a zeroed buffer for the next swap (tick thread only)
        self._returned: List = []                        # applied ticks' buffers, given back (not zeroed yet)
        self._meta_buffer = buffers.zeros(self._meta_words)
        self._words = np.zeros(self._meta_words, np.float64)
        self._pending_count = 0
        self._wake = False             # a push since the tick thread last looked: skip its idle wait
        self._clock = 0
        self._last_push_ns = -1
        self._interval_ns = -1
        self._pending_since_ns = -1
        self._sent_push_ns = -1        # time of the last push inside a sent (full) tick
        self._period_ns = -1
        self._finished = False
        self._completed: Deque[Tick] = collections.deque()
        self._delivered_clock = 0      # own pushes that are inside a completed tick
        self.delivered_total = 0       # pushes of all ranks inside completed ticks
        self.in_flight = False         # a tick has been sent and has not completed yet
        self.mean_count = 0.0          # pushes per tick (all ranks), moving average
        self._push_times: Deque[float] = collections.deque()   # perf_counter of own pushes not delivered yet
        self.push_latency_s = 0.0      # push -> delivered in a completed tick, moving average (own pushes)
        self._error: Optional[BaseException] = None
        self._stopped = False
        self.ticks = 0
        self.nonempty_ticks = 0
        self.payload_collectives = 0   # model-sized allreduces (metadata-only ticks move none)
        self.bytes_reduced = 0
        self.comm_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"hvd_elastic-ticker-{rank}", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------------------
    def now_ns(self) -> int:
        return time.time_ns() - self.epoch_ns

    def push(self, accumulate: Callable, interval_ns: int) -> int:
        """Add one update to this rank's next tick: ``accumulate(dst)`` adds it in place into `dst`, the first
        `numel` words of the pending buffer (under the ticker's lock). Returns the rank's clock (pushes so far)."""
        with self._lock:
            self._check()
            if self._finished:
                raise TickerError("push after finish()")
            accumulate(self.buffers.head(self._pending, self.numel))
            now_ns = self.now_ns()
            if self._pending_count == 0:
                self._pending_since_ns = now_ns
            if self._last_push_ns >= 0:
                gap = now_ns - self._last_push_ns
                self._period_ns = gap if self._period_ns <= 0 else int(self._period_ns + 0.2 * (gap - self._period_ns))
            self._pending_count += 1
            self._clock += 1
            self._push_times.append(time.perf_counter())
            self._last_push_ns = now_ns
            self._interval_ns = int(interval_ns)
            self._wake = True         # wake the tick thread from its idle wait: a push is what the next probe is for
            self._lock.notify_all()
            return self._clock

    @property
    def clock(self) -> int:
        return self._clock

    @property
    def last_push_ns(self) -> int:
        return self._last_push_ns

    @property
    def interval_ns(self) -> int:
        return self._interval_ns

    def updates_before_next_push(self, applied_at_read: int) -> float:
        """Predicted staleness of an update pushed now, computed on weights that held `applied_at_read` updates:
        the updates already delivered since then, plus the expected count of a tick in flight (the push goes into
        the tick after it)."""
        with self._lock:
            return self.delivered_total - applied_at_read + (self.mean_count if self.in_flight else 0.0)

    def all_delivered(self) -> bool:
        """True when every update this rank pushed is inside a completed tick."""
        return self._delivered_clock == self._clock

    def finish(self):
        with self._lock:
            self._finished = True
            self._lock.notify_all()

    def take(self, block: bool = False, timeout: Optional[float] = None) -> List[Tick]:
        """Completed ticks not yet taken, in order. With block=True, wait until at least one is available."""
        with self._lock:
            if block:
                deadline = None if timeout is None else time.monotonic() + timeout
                while not self._completed and not self._stopped and self._error is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(left)
            self._check()
            out = list(self._completed)
            self._completed.clear()
            return out

    def recycle(self, tick: Tick):
        """Give an applied tick's buffer back for reuse (its update must not be read afterwards)."""
        if tick.buffer is not None:
            with self._lock:
                if len(self._returned) < POOL_LIMIT:
                    self._returned.append(tick.buffer)
            tick.buffer = tick.update = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def join(self, timeout: Optional[float] = None):
        self._thread.join(timeout)
        self._check()

    def _check(self):
        if self._error is not None:
            raise TickerError(f"tick thread failed: {self._error}") from self._error

    # ---- background thread -----------------------------------------------------------------------------------
    def _zeroed_buffer(self):
        """A zeroed model-sized buffer: a recycled one (zeroed here, outside the lock) or a new one."""
        with self._lock:
            buf = self._returned.pop() if self._returned else None
        if buf is None:
            return self.buffers.zeros(self._length)
        self.buffers.zero_(buf)
        return buf

    def _reduce(self, buf, name: str):
        self._allreduce_sum([buf], name)
        self.bytes_reduced += self.buffers.nbytes(buf)

    def _run(self):
        try:
            idle_s = self.tick_s
            index = 0
            last = 0.0
            release_now = False   # the last probe released the pending pushes: a full tick follows at once
            recent: Deque[bool] = collections.deque(maxlen=BUSY_WINDOW)   # non-empty flags of the last ticks
            buffers, numel = self.buffers, self.numel
            while True:
                if self._spare is None and self._returned:   # zero the next spare now, off the release's path
                    self._spare = self._zeroed_buffer()
                wait = last + idle_s - time.monotonic()
                if wait > 0 and not release_now:
                    with self._lock:   # a push or a finish() wakes us early: probes react at once
                        if not self._finished and not self._wake:
                            self._lock.wait(wait)
                with self._lock:
                    self._wake = False
                last = time.monotonic()
                full = release_now or sum(recent) >= BUSY
                release_now = False
                if full and self._spare is None:
                    self._spare = self._zeroed_buffer()
                send = None
                with self._lock:
                    self.in_flight = True
                    count = self._pending_count
                    meta = np.full((self.size, META_COLUMNS), -1, np.int64)   # encodes to zeros
                    if full:            # deliver everything pending
                        send, self._pending, self._spare = self._pending, self._spare, None
                        self._pending_count = 0
                        self._sent_push_ns = self._last_push_ns
                        row = (count, self._clock, 0, -1)
                    else:               # probe: deliver nothing, announce what is pending
                        row = (0, self._clock - count, count, self._pending_since_ns if count else -1)
                    # LAST_PUSH_NS: of the last push sent, so that it always goes with CLOCK (the policies predict
                    # a rank's next pushes from both).
                    meta[self.rank] = (row[0], row[1], self._sent_push_ns, self._interval_ns, int(self._finished),
                                       index, row[2], row[3], self.now_ns(), self._period_ns)
                encode_meta(meta, self._words)
                t0 = time.perf_counter()
                carrier = send if full else self._meta_buffer
                offset = numel if full else 0
                buffers.set_words(carrier, offset, self._words)
                self._reduce(carrier, self.name if full else f"{self.name}.meta")
                meta = decode_meta(buffers.get_words(carrier, offset, self._meta_words), self.size)
                if not (meta[:, SEQ] == index).all():
                    raise TickerError(f"ranks are out of step at tick {index}: {meta[:, SEQ].tolist()}")
                total = int(meta[:, COUNT].sum())
                pending = int(meta[:, PENDING].sum())
                if total:
                    self.payload_collectives += 1
                elif send is not None:          # an empty full tick's buffer sums zeros: it stays a zeroed spare
                    self._spare, send = send, None
                release_now = not full and release(meta, self.hold_fraction)
                dt = time.perf_counter() - t0
                tick = Tick(index, buffers.head(send, numel) if total else None, meta, dt, send if total else None)
                recent.append(total > 0 or release_now)   # a held probe is not busy: it waits for peers
                with self._lock:
                    self.ticks += 1
                    self.comm_s += dt
                    if total:
                        self.nonempty_ticks += 1
                    self.delivered_total += total
                    if full:
                        self.mean_count += 0.2 * (total - self.mean_count)
                    self.in_flight = False
                    delivered = int(meta[self.rank, CLOCK])
                    now = time.perf_counter()
                    for _ in range(delivered - self._delivered_clock):
                        latency = now - self._push_times.popleft()
                        self.push_latency_s = latency if self.push_latency_s == 0 else \
                            self.push_latency_s + 0.2 * (latency - self.push_latency_s)
                    self._delivered_clock = delivered
                    self._completed.append(tick)
                    done = bool(meta[:, FINISHED].all()) and total == 0 and pending == 0
                    if done:
                        self._stopped = True
                    self._lock.notify_all()
                if done:
                    return
                idle_s = self.tick_s if total or pending else max(min(idle_s * 2, self.max_idle_s),
                                                                  quiet_s(meta))
                index += 1
        except BaseException as e:  # surfaced on the training thread at its next call
            with self._lock:
                self._error = e
                self._stopped = True
                self._lock.notify_all()
