"""The tick thread, and one tick at a time on whichever thread holds the token (engine/ticker.py has the glossary).

A tick, in named steps (TickLoop.tick): take what is pending (a full tick takes the pending buffer and pushes; a
probe announces them), send it (full or probe), read the table and check SEQ, deliver the Tick to the training
thread, account for it, and let the pacing decide the next wait. The tick thread waits between ticks as the pacing
says (a probe's deadline, or a join's wait, decided again whenever the training thread changes what it will do
next); the training thread runs a joined tick itself when it is about to wait for its own push's (run_inline).
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Deque, Optional

import numpy as np

from ..errors import HvdElasticError
from .pool import BufferPool
from .row import OwnRow
from .stream import Stream, Streams
from .table import CLOCK, COUNT, FINISHED, HOSTS, PENDING, SEQ, STREAM, Tick
from .wire import Wire


class TickerError(HvdElasticError):
    """The tick thread failed (e.g. Horovod shut down because a peer died); raised on the training thread."""


class RankSetChanged(TickerError):
    """Elastic Horovod: a tick's table announced a change of the rank set, and every rank's tick thread stopped
    after that tick (the same one on every rank, so that none waits in a later tick for a rank that has reset).
    Raised on the training thread once it has taken the ticks completed before it."""


class Handoff:
    """What the two threads share, under one lock (`lock`, which the ticker's parts share too): the completed ticks
    on their way to the training thread and the last table, the tick token, the wake-ups, and how the tick thread
    ended. Each thread waits on a condition of its own over that lock, so that a notification reaches only the
    thread it is for: the training thread on `lock` (completed ticks, the end of a stream's reads), the tick thread
    on `thread_wake` (what it does next, the token, a stream's chunks). Every wake-up of a thread costs the other
    threads of the machine a slice of a core, and the rank its interpreter lock, right when a tick completes."""

    def __init__(self):
        mutex = threading.RLock()
        self.lock = threading.Condition(mutex)
        self.thread_wake = threading.Condition(mutex)
        self.awaiting_token = False    # the tick thread waits for the training thread's tick (run_inline) to end
        self.completed: Deque[Tick] = collections.deque()   # completed ticks the training thread has not taken
        self.last_meta: Optional[np.ndarray] = None   # the table of the last completed tick
        self.delivered = 0             # ticks completed so far ...
        self.taken = 0                 # ... and taken by the training thread
        self.ticking = False           # a thread is running a tick (the token: one tick at a time)
        self.wake = False              # a push (or a change of what the training thread does) since the tick
                                       # thread last looked: it skips its wait
        self.inline_due = False        # a push the training thread is to send itself (push(inline=True))
        self.stopped = False
        self.error: Optional[BaseException] = None
        # elastic Horovod: the latest change of the rank set (timestamp, s) the ranks had reset for when this engine
        # started; the first tick whose table announces a later one is the last (RankSetChanged). None: never
        self.rank_set_baseline: Optional[int] = None

    def wake_thread(self):
        """(Under the lock.) The tick thread skips its wait."""
        self.wake = True
        self.decide_again()

    def decide_again(self):
        """(Under the lock.) A waiting tick thread decides again what to do next (how long to wait)."""
        self.thread_wake.notify_all()

    def abandon(self):
        """Stop the tick thread (Ticker.abandon); every later call of the training thread raises TickerError."""
        with self.lock:
            self.stopped = True
            if self.error is None:
                self.error = TickerError("the rank set changed (elastic Horovod reset)")
            self.lock.notify_all()
            self.decide_again()

    def hosts_announced(self) -> int:
        """The latest change of the rank set any rank has announced (table.HOSTS), as of the last completed tick --
        whether or not the training thread has applied it: the same on every rank once it completed that tick."""
        with self.lock:
            return 0 if self.last_meta is None else int(self.last_meta[:, HOSTS].max())

    def check(self):
        if isinstance(self.error, RankSetChanged):
            raise self.error
        if self.error is not None:
            raise TickerError(f"tick thread failed: {self.error}") from self.error

    def stop_for_rank_set(self, meta: np.ndarray) -> bool:
        """(Under the lock; the thread that ran the tick.) The tick of table `meta` announced a change of the rank set
        the ranks have not reset for: stop the ticks after it (every rank reads the same table) and say so."""
        announced = int(meta[:, HOSTS].max()) // 4
        if self.rank_set_baseline is None or announced <= self.rank_set_baseline:
            return False
        self.stopped = True
        if self.error is None:
            self.error = RankSetChanged(f"elastic Horovod: the ranks agreed on a change of the rank set (announced at "
                                        f"{announced}); the ticks stopped after the tick that carried it")
        self.lock.notify_all()
        self.decide_again()
        return True


@dataclasses.dataclass(frozen=True)
class TickParts:
    """The parts of one rank's data plane, built by the Ticker and shared with its TickLoop: the model size, the
    buffers' kind, this rank, the handoff (its lock guards every part), this rank's row, the buffer pool, the
    streams, the wire and the pacing."""
    numel: int
    buffers: Any
    rank: int
    handoff: Handoff
    row: OwnRow
    pool: BufferPool
    streams: Streams
    wire: Wire
    pacing: Any


class TickLoop:
    """The tick thread of one rank and the ticks it (or the training thread: run_inline) runs, over the parts of
    the data plane (TickParts). The Ticker reads what the loop knows only through its methods (counters,
    ticks_completed, expected_before_next_push)."""

    def __init__(self, parts: TickParts):
        self.numel, self.buffers, self.rank = parts.numel, parts.buffers, parts.rank
        self.handoff, self._lock = parts.handoff, parts.handoff.lock
        self.row, self.pool, self.streams = parts.row, parts.pool, parts.streams
        self.wire, self.pacing = parts.wire, parts.pacing
        self.index = 0                 # the next tick's index (SEQ)
        self.last = 0.0                # monotonic time of the last tick
        self.delivered_total = 0       # pushes of all ranks inside completed ticks
        self.in_flight = False         # a tick has been sent and has not completed yet
        self.mean_count = 0.0          # pushes per full tick (all ranks), moving average
        self.ticks = self.nonempty_ticks = 0
        self.payload_collectives = 0   # model-sized allreduces (probes move none)
        self.join_ticks = 0            # joined ticks
        self.inline_ticks = 0          # joined ticks the training thread ran itself (run_inline)
        self.wakeups = 0               # times the tick thread woke from a wait (notified or timed out)
        self.comm_s = 0.0
        self.thread = threading.Thread(target=self._run, name=f"hvd_elastic-ticker-{self.rank}", daemon=True)

    # ---- what the Ticker asks of the loop ---------------------------------------------------------------------
    def start(self):
        self.thread.start()

    def join(self, timeout: Optional[float]) -> bool:
        """Wait for the tick thread to end; True if it did."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def ticks_completed(self) -> int:
        return self.ticks

    def expected_before_next_push(self, applied_at_read: int) -> float:
        """(Under the lock.) The updates delivered since the weights held `applied_at_read`, plus the expected count
        of a tick in flight (a push now goes into the tick after it)."""
        return self.delivered_total - applied_at_read + (self.mean_count if self.in_flight else 0.0)

    def counters(self) -> dict:
        """The loop's end-of-run counters, under their report names."""
        return {"ticks": self.ticks, "nonempty_ticks": self.nonempty_ticks,
                "payload_collectives": self.payload_collectives, "join_ticks": self.join_ticks,
                "inline_ticks": self.inline_ticks, "tick_comm_s": round(self.comm_s, 3),
                "tick_thread_wakeups": self.wakeups}

    # ---- the tick thread -------------------------------------------------------------------------------------
    def _run(self):
        try:
            with self.buffers.collective_scope():   # the buffers' device and stream, for every tick this thread runs
                self._loop()
        except BaseException as e:  # surfaced on the training thread at its next call
            with self._lock:
                self.handoff.error = e
                self.handoff.stopped = True
                self._lock.notify_all()
                self.handoff.decide_again()

    def _loop(self):
        h = self.handoff
        while True:
            self.pool.refill()
            seen, join = self.ticks, self.pacing.joined
            deadline = self.pacing.deadline(self.last)
            if join:
                self._await_join(deadline)
            else:
                self._await_probe(deadline)
            with self._lock:
                while h.ticking and not h.stopped:   # the training thread runs a tick (run_inline)
                    h.awaiting_token = True
                    h.thread_wake.wait(1.0)
                    self.wakeups += 1
                h.awaiting_token = False
                if h.stopped:
                    return
                if self.ticks != seen:      # it ran one: decide again from its table
                    continue
                h.ticking = True
                h.inline_due = False        # this tick sends the push: the training thread just waits
            try:
                done = self.tick(join)
            finally:
                with self._lock:
                    h.ticking = False
                    self._lock.notify_all()
            if done:
                return

    def _await_probe(self, deadline: float):
        """Until `deadline` (monotonic); a push or a finish() wakes the thread early: probes react at once."""
        wait = deadline - time.monotonic()
        if wait > 0:
            with self._lock:
                if not self.row.finished and not self.handoff.wake:
                    self.handoff.thread_wake.wait(wait)
                    self.wakeups += 1

    def _await_join(self, deadline: float):
        """Until this rank should join the next tick (the pacing's join_wait_s, decided again whenever the training
        thread changes what it will do next: a push, a stream announced (a large payload's, in lock-step) or a finish
        joins at once, a gate decides again); without a prediction until `deadline` (monotonic; tick_s pacing)."""
        h = self.handoff
        with self._lock:
            while not (h.wake or self.row.finished or self.row.pending_count or h.stopped
                       or self.streams.announced() is not None):
                meta = h.last_meta
                wait = None
                if meta is not None:
                    live = self.row.live(meta, gate_seen=self.row.gated_at == h.delivered)
                    wait = self.pacing.join_wait_s(live, self.rank, self.row.now_ns(), self.row.own_due_ns())
                left = (deadline - time.monotonic()) if wait is None else wait
                if left <= 0:
                    return
                h.thread_wake.wait(left)
                self.wakeups += 1

    # ---- the training thread -----------------------------------------------------------------------------------
    def run_inline(self) -> bool:
        """Training thread, about to wait for its own push (push(inline=True)): while ticks are joined and no tick
        is under way, run the next tick here -- the push's tick, which the tick thread would otherwise run after a
        wake-up, handing the result back with another hand-over. Every tick is the same collective whichever thread
        issues it, so ranks need not agree on who runs theirs. True when it ran one; otherwise the tick thread is
        woken."""
        h = self.handoff
        with self._lock:
            if not h.inline_due:
                return False
            h.inline_due = False
            if h.ticking or h.stopped or h.error is not None or self.streams.current is not None \
                    or not self.row.pending_count or not self.pacing.joined:
                h.wake_thread()
                return False
            h.ticking = True
        try:
            with self.buffers.collective_scope():
                for _ in range(2):   # a large payload's probe first (AutoPacing.full), then the push's full tick
                    self.tick(True)
                    self.inline_ticks += 1
                    with self._lock:
                        if not self.row.pending_count or h.stopped or not self.pacing.joined:
                            break
        except BaseException as e:   # as on the tick thread: every later call raises it
            with self._lock:
                h.error = e
                h.stopped = True
        finally:
            with self._lock:
                h.ticking = False
                # the tick thread: waiting for the token, or (joined ticks outside lock-step, where its join waits on
                # the table) to decide again from the new table; a lock-step join reads only this rank's own row
                if h.awaiting_token or h.stopped or not self.pacing.in_lockstep:
                    h.decide_again()
        return True

    # ---- one tick --------------------------------------------------------------------------------------------
    def tick(self, join: bool) -> bool:
        """One tick (the caller holds the token): full when the pacing says, else a probe. True when it was the
        last."""
        index = self.index
        with self._lock:
            self.handoff.wake = False
        self.last = time.monotonic()
        full = self.pacing.full()
        if full:
            self.pool.ensure_pending()
        send, member, count, clock = self._take(index, full)
        t0 = time.perf_counter()
        meta = self._send(full, send, member, index, count, clock)
        if not (meta[:, SEQ] == index).all():
            raise TickerError(f"ranks are out of step at tick {index}: {meta[:, SEQ].tolist()}")
        total = int(meta[:, COUNT].sum())
        if full:                        # a model-sized allreduce, even when nobody pushed into it
            self.payload_collectives += 1
        if not total and send is not None:   # an empty full tick's buffer sums zeros: it stays a zeroed spare
            self.pool.keep(send)
            send = None
        tick = Tick(index, self.buffers.head(send, self.numel) if total else None, meta, time.perf_counter() - t0,
                    send if total else None)
        if self._deliver(tick, total, full, join):
            return True
        with self._lock:
            if self.handoff.stop_for_rank_set(meta):
                return True
        active = total or int(meta[:, PENDING].sum()) + int(meta[:, STREAM].sum())
        self.pacing.observe(meta, full, total, bool(active))
        self.index += 1
        return False

    def _take(self, index: int, full: bool):
        """Take what is pending, and write this rank's row of the tick's table: a full tick takes the pending buffer
        and pushes (and an announced stream, whose row is written once it has ended); a probe announces them.
        Returns (payload buffer or None, stream taken or None, pushes taken, clock)."""
        with self._lock:
            self.in_flight = True
            stream = self.streams.announced()
            lead_ns = self.streams.lead_ns
            if not full:
                since = stream.since_ns if stream is not None else None
                self.wire.encode(self.row.probe_table(index, since, lead_ns))
                return None, None, 0, 0
            send = self.pool.take_pending()
            count, clock = self.row.take_pending()
            if stream is not None:
                self.streams.take(stream)
            else:
                self.wire.encode(self.row.table(index, count, clock, 0, -1, 0, lead_ns))
            return send, stream, count, clock

    def _send(self, full: bool, send, member: Optional[Stream], index: int, count: int, clock: int) -> np.ndarray:
        """The tick's collectives: a probe, a full tick, or a full tick in chunks. Returns the reduced table."""
        if not full:
            self.wire.probe()
            return self.wire.read_table(None)
        if self.streams.chunked:
            return self._send_chunks(send, member, index, count, clock)
        self.pool.received(send)
        self.wire.full(send)
        self.pool.handed(send)
        return self.wire.read_table(send)

    def _send_chunks(self, send, member: Optional[Stream], index: int, count: int, clock: int) -> np.ndarray:
        """A full tick in chunks, last words first (backward's order); the table rides with the last chunk. With a
        stream taken (`member`), each chunk waits until backward has made it final and is read from the frontend's
        tensors into `send` just before it is reduced; the rank's row is written once the stream has ended."""
        b = self.streams.bounds
        self.pool.received(send)
        for k in reversed(range(len(b) - 1)):
            chunk = self.buffers.view(send, b[k], b[k + 1])
            if member is not None:
                self.streams.read_chunk(member, k, chunk)
                if k == 0:
                    self._stream_sent(member, index, count + 1, clock + 1)
            self.wire.chunk(send, chunk, k, last=k == 0)
        self.pool.handed(send)
        self.wire.chunks_sent(send)
        return self.wire.read_table(send)

    def _stream_sent(self, member: Stream, index: int, count: int, clock: int):
        """The taken stream is read whole: its gradients are no longer read (stream_wait returns), and this rank's
        row, with the stream counted as one more push, goes with the last chunk."""
        with self._lock:
            self.streams.finish_reading(self.buffers.fence())
            self.row.sent_push_ns = member.end_ns
        self.wire.encode(self.row.table(index, count, clock, 0, -1, 0, self.streams.lead_ns))

    def _deliver(self, tick: Tick, total: int, full: bool, join: bool) -> bool:
        """Account for the completed tick and hand it to the training thread. True when it is the last: every rank
        has finished, and nobody pushed anything or has anything pending."""
        meta, h = tick.meta, self.handoff
        with self._lock:
            self._account(tick, total, full, join)
            h.last_meta = meta
            h.completed.append(tick)
            h.delivered += 1
            done = bool(meta[:, FINISHED].all()) and total == 0 and int(meta[:, PENDING].sum()) == 0
            if done:
                h.stopped = True
            self._lock.notify_all()
        return done

    def _account(self, tick: Tick, total: int, full: bool, join: bool):
        """(Under the lock.) The counters, and the delivery of this rank's own pushes."""
        self.ticks += 1
        self.join_ticks += int(join)
        self.comm_s += tick.comm_s
        if total:
            self.nonempty_ticks += 1
            self.pool.delivered()
        self.delivered_total += total
        if full:
            self.mean_count += 0.2 * (total - self.mean_count)
        self.in_flight = False
        self.row.delivered(int(tick.meta[self.rank, CLOCK]))
