"""The data plane: ticks of partial allreduce, driven by a background thread (docs/design.md, "The data plane").

A tick is a Sum-allreduce over all ranks of (a) the updates each rank pushed since its previous tick (zeros when
it has none) and (b) a table in which each rank fills only its own row, so the Sum is an allgather of every rank's
clock, last push time and step time. Every rank receives the same ticks in the same order, which is what lets every
rank apply the same updates and take the same scheduling decisions: every choice of what the next tick is depends
only on past tables, which every rank holds identically.

Glossary (one word per concept, here and in the modules of the tick machinery):
- tick: one round of the data plane, the same collective(s) with the same names and shapes on every rank.
- table: the tick's metadata, one row per rank (engine/table.py); this rank's row: engine/row.py.
- push: the training thread adds one update into this rank's pending buffer (engine/pool.py), or streams it
  (engine/stream.py); pending pushes wait for the next full tick.
- full tick: payload and table in one allreduce (in chunks when streamed); it delivers every rank's pending pushes.
- probe: a tick of the table alone; it delivers nothing and announces what is pending.
- release: the decision, from a probe's table, that the next tick is full, at once (rules.release; the hold is how
  long it waits for peers due to push).
- busy: most recent ticks carried pushes (BUSY of the last BUSY_WINDOW): probe pacing sends full ticks without
  probes.
- join: a thread joins a tick when it enters the tick's collective; a tick fires when the last rank's thread has
  joined it. A joined tick is a full tick each thread joins when the tables say (rules.join_wait_s), without a
  probe before it (join pacing; auto pacing once the pushes are predictable). `join_ticks` counts them.
- pacing: the rule for the next tick -- full or probe, joined or not, and how long the thread waits before it
  (engine/pacing/: probe, join, auto).
- inline tick: a joined tick the training thread runs itself (run_inline) instead of the tick thread.
- deliver: a completed tick goes to the training thread (take); a delivered push is inside a completed tick.
- gated, outside: the training thread is held at its gate, or waits in a collective of the script's own (the
  GATED and OUTSIDE columns).
(Ticker.join is Python's thread join: wait for the tick thread to end.)

The parts: Ticker (here) is what the training thread calls; TickLoop (engine/loop.py) is the tick thread and runs
one tick at a time; the pacing (engine/pacing/) decides the next tick; Wire (engine/wire.py) issues its
collectives; OwnRow (engine/row.py) is what this rank reports; BufferPool (engine/pool.py) keeps the update
buffers; Streams (engine/stream.py) keeps the streamed pushes; engine/table.py holds the table's columns and codec,
engine/pacing/rules.py the pure functions of tables that pace the ticks.

The tick thread issues a tick when its pacing says, and a push wakes its own rank's thread at once. A tick carries
one model-sized buffer however many pushes it sums, so communication is bounded by model size / tick interval,
whatever the ranks' speeds. A tick completes when every rank's thread has joined it: ticks wait for the slowest
*thread*, never for a rank's computation.

Inline ticks: while ticks are joined and a rank waits for its own push's tick (HVD_ELASTIC_MAX_INFLIGHT=0: the
engine pushes with inline=True), the training thread runs that tick itself when it is about to wait (take(block=
True) -> run_inline), and waits for the collective as Horovod's synchronize does; the tick thread is not woken for
it. Each hand-over between the two threads costs about a millisecond on a machine whose cores are all busy
(docs/design.md, "The data plane: ticks"). One tick runs at a time (Handoff.ticking), the tick's state lives on the
TickLoop, and every tick is the same collective whichever thread issues it, so ranks need not agree on who runs it.

Shutdown: a rank that has finished raises FINISHED in its row; the thread stops after the first tick in which every
rank is finished and nobody pushed or has anything pending, which every rank sees at the same tick (so no
collective is left dangling and every pushed update has been delivered).
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

from .buffers import NumpyBuffers
from .loop import Handoff, RankSetChanged, TickerError, TickLoop, TickParts
from .pacing import make_pacing
from .pool import BufferPool
from .row import OwnRow
from .stream import Streams
from .table import OUTSIDE, Tick
from .wire import Wire

__all__ = ["Ticker", "TickerError"]


class Ticker:
    """One rank's data plane, as the training thread sees it: push()/finish()/take()/recycle() (and the stream_*
    calls); nothing else. A tick thread (engine/loop.py) runs the ticks. `allreduce_sum(buffers, name)` is
    an in-place Sum allreduce over all ranks of buffers of the kind `buffers` makes (NumpyBuffers by default),
    called from the tick thread or from the training thread running its own tick; it should not keep a core busy
    while it waits. `name`: the Horovod tensor name of the ticks, unique
    among the engines alive in this process and the same on every rank. hold_fraction: the release hold
    (HVD_ELASTIC_PEER_WAIT; 0: release at once); stream: the frontend can hand a gradient over as backward produces
    it, and every rank's frontend says so; pacing: HVD_ELASTIC_TICK_PACING; relaxed_joins: when auto pacing joins ticks
    while the ranks go relaxed (pacing.RELAXED_JOINS: under a straggler too, only while every rank is a peer of
    every other, or never); they are joined while `lockstep`, a fresh lock-step rule of the policy's
    (policies/base.py Lockstep), fed the same tables, says the ranks go in lock-step. rank_set_baseline (elastic
    Horovod): the ticks stop after the first one that announces a later change of the rank set (loop.RankSetChanged)."""

    def __init__(self, numel: int, buffers, rank: int, size: int,
                 allreduce_sum: Callable[[list, str, bool], None], *, tick_s: float, pacing: str,
                 hold_fraction: float, max_idle_s: float = 0.01, epoch_ns: int = 0, name: str = "hvd_elastic.tick",
                 stream: bool = False, relaxed_joins: str = "always", lockstep=None,
                 rank_set_baseline: Optional[int] = None):
        if not hasattr(buffers, "zeros"):          # a dtype: numpy buffers
            buffers = NumpyBuffers(buffers)
        self.numel, self.buffers, self.rank, self.size, self.name = numel, buffers, rank, size, name
        self.handoff = Handoff()
        self.handoff.rank_set_baseline = rank_set_baseline   # before the tick thread starts: the same tick everywhere
        self._lock = self.handoff.lock
        self.row = OwnRow(rank, size, epoch_ns)
        self.wire = Wire(buffers, numel, size, allreduce_sum, name)
        self.pool = BufferPool(buffers, self.wire.length, self._lock)
        self.streams = Streams(numel, stream, self._lock, self.handoff.thread_wake)
        self.pacing = make_pacing(pacing, numel, self.streams.chunked, tick_s, max_idle_s, hold_fraction,
                                  relaxed_joins, lockstep)
        self._was_outside = False      # the training thread waited in a collective of the script's own since its
        self._left_outside_at = 0      # last push, and left it before the tick of this index (_meet_after_outside)
        self._loop = TickLoop(TickParts(numel, buffers, rank, self.handoff, self.row, self.pool, self.streams,
                                        self.wire, self.pacing))
        self._loop.start()

    # ---- pushes ------------------------------------------------------------------------------------------------
    def push(self, accumulate: Callable, interval_ns: int, inline: bool = False) -> int:
        """Add one update to this rank's next tick: ``accumulate(dst)`` adds it in place into `dst`, the first
        `numel` words of the pending buffer (under the ticker's lock). Returns the rank's clock (pushes so far).
        inline: the training thread will wait for this push's tick (take(block=True)) before anything else, so
        while ticks are joined it may run the tick itself (run_inline) instead of waking the tick thread."""
        h = self.handoff
        with self._lock:
            self._check_open("push()")
            self._meet_after_outside(interval_ns)
            self._add_into_pending(accumulate)
            now_ns = self.row.now_ns()
            self.row.add_pending(now_ns)
            h.inline_due = inline and self.pacing.joined and not h.ticking
            return self._count_push(now_ns, interval_ns, wake=not h.inline_due)

    def _check_open(self, what: str):
        """(Under the lock.) This rank may start a push: the thread is healthy, finish() has not been called and
        no streamed push is under way."""
        self.handoff.check()
        if self.row.finished:
            raise TickerError("push after finish()")
        if self.streams.current is not None:
            raise TickerError(f"{what} while a streamed push is under way")

    def _add_into_pending(self, accumulate: Callable):
        """(Under the lock.) accumulate(dst) into the pending buffer's update words, ordered after the buffer's last
        hand-over and fenced for the tick that sends it."""
        buf = self.pool.pending()
        self.pool.received(buf)
        accumulate(self.buffers.head(buf, self.numel))
        self.pool.handed(buf)

    MEET_STEPS, MEET_MIN_S = 4, 0.05   # _meet_after_outside gives up after this many own steps (at least MEET_MIN_S)

    def _meet_after_outside(self, interval_ns: int):
        """(Under the lock.) In lock-step, the first push after a collective of the script's own waits, held (GATED),
        for the first tick completed after this rank left it whose table shows no rank inside; every rank's push then
        goes into the tick after that one.

        While a rank waits in such a collective its thread joins every tick at once, without a push (the ranks that
        need a tick to reach the same call must not wait for it). The ranks leave it at slightly different moments:
        the thread of a rank that left before a tick completed waits for its push, while that of a rank still inside
        then joins the next tick at once -- so the next tick would carry the first rank's push and not the others',
        which come a tick later, and the round would be summed in two ticks (another order than BSP's one
        allreduce). Held, every rank lines up on the same tick: a tick completes only once every thread has joined
        it, a thread joins at once only while its rank is held or inside, and every rank sees the same first tick
        without anyone inside. A script whose ranks call their collectives after different numbers of steps (which
        Horovod's own allreduce would not survive) may keep a rank inside for good: the wait then ends after
        MEET_STEPS of this rank's steps and the push goes on alone. The held ticks stay for the engine to take."""
        if not self._was_outside:
            return
        self._was_outside = False
        h, row = self.handoff, self.row
        if not self.pacing.in_lockstep:
            return
        deadline = time.monotonic() + max(self.MEET_STEPS * interval_ns / 1e9, self.MEET_MIN_S)
        try:
            while not any(t.index >= self._left_outside_at and not t.meta[:, OUTSIDE].any() for t in h.completed):
                h.check()
                left = deadline - time.monotonic()
                if left <= 0 or h.stopped:
                    break
                # held, having seen every completed tick: the thread may join at once (OwnRow.gated_at)
                row.gated, row.gated_at = True, h.delivered
                h.decide_again()
                self._lock.wait(left)
        finally:
            row.gated = False

    def _count_push(self, now_ns: int, interval_ns: int, wake: bool = True) -> int:
        """(Under the lock.) A push of this rank is complete: its clock, timing, and (wake) a wake-up of the tick
        thread -- not for a push the training thread sends itself (run_inline)."""
        clock = self.row.count_push(now_ns, interval_ns)
        if wake:                  # a push is what the next tick is for
            self.handoff.wake_thread()
        return clock

    def stream_begin(self, accumulate: Callable[[Any, int, int], None]) -> bool:
        """Announce a streamed push (engine/stream.py); ``accumulate(dst, start, stop)`` adds words [start, stop) of
        the update into dst (a view of that range). False (push normally) when the payload is one chunk, or this
        rank's push period is not measured yet or too slow (Streams.may_begin)."""
        if not self.streams.chunked:
            return False
        with self._lock:
            self._check_open("stream_begin()")
            if not self.streams.may_begin(self.row.period_ns, self.handoff.last_meta):
                return False
            self._meet_after_outside(self.row.interval_ns)
            self.streams.begin(accumulate, self.row.now_ns())
            self.handoff.wake_thread()
            return True

    def stream_ready(self, start: int, stop: int):
        """Words [start, stop) of the streamed update are final."""
        with self._lock:
            if self.streams.ready(start, stop):
                self.handoff.decide_again()   # the tick thread reads the chunks (Streams.read_chunk)

    def stream_end(self, interval_ns: int) -> int:
        """The streamed update is complete (words never reported ready are read now as they are). Returns the rank's
        clock (pushes so far), as push() does."""
        with self._lock:
            self.handoff.check()
            st = self.streams.current
            if st is None:
                raise TickerError("stream_end() without stream_begin()")
            now_ns = self.row.now_ns()
            untaken = self.streams.end(st, now_ns)
            if untaken:      # no tick took it: an ordinary push
                self._add_into_pending(lambda dst: st.accumulate(dst, 0, self.numel))
                self.row.add_pending(st.since_ns)
            # a taken stream needs no tick of its own: a joined thread woken now would join the next tick at once
            return self._count_push(now_ns, interval_ns, wake=untaken or not self.pacing.joined)

    def stream_wait(self):
        """Block until the tick thread no longer reads this rank's gradients (after stream_end)."""
        with self._lock:
            while self.streams.current is not None:
                self.handoff.check()
                if self.streams.announced() is not None:   # stream_end() clears an announced stream
                    raise TickerError("stream_wait() before stream_end()")
                self._lock.wait(0.5)
            self.handoff.check()
            fence, self.streams.fence = self.streams.fence, None
        self.buffers.after(fence)    # the tick's reads of the gradients come before the caller's next writes

    def finish(self):
        with self._lock:
            self.row.finished = True
            self._lock.notify_all()
            self.handoff.decide_again()

    # ---- completed ticks ---------------------------------------------------------------------------------------
    def take(self, block: bool = False, timeout: Optional[float] = None) -> List[Tick]:
        """Completed ticks not yet taken, in order. With block=True, wait until at least one is available (a caller
        about to wait for its own push runs run_inline() first)."""
        h = self.handoff
        with self._lock:
            if block:
                deadline = None if timeout is None else time.monotonic() + timeout
                while not h.completed and not h.stopped and h.error is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(left)
            if not (h.completed and isinstance(h.error, RankSetChanged)):   # those ticks completed on every rank
                h.check()
            out = list(h.completed)
            h.completed.clear()
            h.taken += len(out)
        for tick in out:
            if tick.buffer is not None:
                self.pool.received(tick.buffer)
        return out

    def now_ns(self) -> int:
        """Now, on the job's common clock (ns since the shared epoch)."""
        return self.row.now_ns()

    def run_inline(self) -> bool:
        """Run the own push's joined tick on the training thread (TickLoop.run_inline); True when it ran one."""
        return self._loop.run_inline()

    def recycle(self, tick: Tick):
        """Give an applied tick's buffer back for reuse (its update must not be read afterwards)."""
        if tick.buffer is not None:
            self.pool.give_back(tick.buffer)
            tick.buffer = tick.update = None

    def updates_before_next_push(self, applied_at_read: int) -> float:
        """Predicted staleness of an update pushed now, computed on weights that held `applied_at_read` updates:
        the updates already delivered since then, plus the expected count of a tick in flight (the push goes into
        the tick after it)."""
        with self._lock:
            return self._loop.expected_before_next_push(applied_at_read)

    def all_delivered(self) -> bool:
        """True when every update this rank pushed is inside a completed tick."""
        return self.row.delivered_clock == self.row.clock

    def join(self, timeout: Optional[float] = None, check: bool = True) -> bool:
        """Wait for the tick thread to end (Python's thread join); True if it did. check: raise its error, if any."""
        ended = self._loop.join(timeout)
        if check:
            self.handoff.check()
        return ended

    def announce_hosts(self, hosts: int):
        """Elastic Horovod's driver announced a change of the rank set (table.HOSTS): the next ticks carry it. (It
        wakes no thread: when to tick is decided from the tables alike on every rank.)"""
        with self._lock:
            self.row.hosts = max(self.row.hosts, hosts)

    def abandon(self):
        """Stop the tick thread without a collective (elastic Horovod is about to shut down: the rank set changes).
        A tick under way ends when Horovod's shutdown fails its collective; no tick starts after this."""
        self.handoff.abandon()

    # ---- state read and set by the engine ----------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.handoff.stopped

    @property
    def streaming(self) -> bool:
        """A streamed push is announced and not ended."""
        return self.streams.streaming

    @property
    def clock(self) -> int:
        return self.row.clock

    @property
    def last_push_ns(self) -> int:
        return self.row.last_push_ns

    @property
    def interval_ns(self) -> int:
        return self.row.interval_ns

    @property
    def push_latency_s(self) -> float:
        """Push -> delivered in a completed tick, moving average (own pushes)."""
        return self.row.push_latency_s

    @property
    def ticks(self) -> int:
        """Ticks completed on this rank."""
        return self._loop.ticks_completed()

    @property
    def gated(self) -> bool:
        """Set by the engine while its policy holds the training thread: it pushes nothing before a tick opens its
        gate (GATED in its row)."""
        return self.row.gated

    @gated.setter
    def gated(self, value: bool):
        """Set on every gate check: the row also keeps how many ticks the training thread had taken (gated_at), so
        the tick thread trusts a held gate only once it has seen every completed tick (one that opens the gate may
        have completed since). The waiting thread decides again when to join (probes wait as planned) -- only when
        it may join sooner: a gate that opens can only make it wait longer, and the push the training thread is about
        to send itself (run_inline) needs no thread."""
        row, h = self.row, self.handoff
        if value == row.gated and (not value or row.gated_at == h.taken):
            return
        with self._lock:
            row.gated, row.gated_at = value, h.taken
            if self.pacing.may_join and value and not h.inline_due:
                h.decide_again()

    def resumed(self):
        """The training thread starts its next step (its gate opened): the own push's prediction counts from now
        (OwnRow.own_due_ns); a waiting tick thread decides again when to join."""
        with self._lock:
            self.row.resumed_ns = self.row.now_ns()
            if self.pacing.may_join and not self.pacing.in_lockstep:   # a lock-step join uses no prediction
                self.handoff.decide_again()

    @property
    def outside(self) -> bool:
        """Set by the engine while the training thread waits in a collective of the script's own (OUTSIDE, and
        GATED: it pushes nothing until the call returns); the next tick carries it at once."""
        return self.row.outside

    @outside.setter
    def outside(self, value: bool):
        with self._lock:
            self.row.outside = value
            if value:
                self._was_outside = True
            else:   # the ticks from this index on complete after the training thread has left the collective
                self._left_outside_at = self.handoff.delivered
            self.handoff.wake_thread()

    def counters(self) -> dict:
        """The end-of-run counters, under their report names."""
        return {**self._loop.counters(), "bytes_reduced": self.wire.bytes_reduced,
                "streamed_pushes": self.streams.taken, "buffers_allocated": self.pool.allocated,
                "held_ticks_max": self.pool.held_max}
