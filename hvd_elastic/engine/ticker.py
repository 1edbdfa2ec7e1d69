"""The data plane: ticks of partial allreduce, driven by a background thread (architecture.md, "The data plane").

A tick is a Sum-allreduce over all ranks of (a) the updates each rank pushed since its previous tick (zeros when
it has none) and (b) a metadata table in which each rank fills only its own row, so the Sum is an allgather of
every rank's clock, last push time and iteration time. Every rank receives the same ticks in the same order, which
is what lets every rank apply the same updates and take the same scheduling decisions.

Join pacing (HVD_ELASTIC_TICK_PACING=join; under auto, the mode once pushes are predictable), small payloads (under
SMALL_WORDS, 1 MB in float32): every tick is full, payload and metadata in one allreduce, and there are no probes
and no releases: a tick fires when the last rank's thread joins it, so each thread decides *when* to join, from the
last table and its own live state (join_wait_s): a rank due to push with the first group of peers waits for its own
push (bounded by the hold), every other rank joins early and waits inside the collective. One collective per round
of pushes, where probe -> release -> full tick took two or more: on a 2-core machine each Horovod collective costs
milliseconds, and a probe costs as much as a small payload. A tick in which nobody pushed then moves the small
payload; such ticks are rare (a rank overdue, all ranks held). The joins need not agree across ranks: every tick has
the same shape.

Auto pacing (HVD_ELASTIC_TICK_PACING=auto, the default), small payloads: probe pacing until a table shows every live
rank's push period and last push (predictable) and nothing pending, join pacing from then on (zipline, whose policy
says joins_stragglers = False: join pacing only while every rank is a peer of every other, probes otherwise). With
equal speeds a round of pushes then costs one collective instead of a probe, a hold and a full tick; under a
straggler too: its push joins a tick of the fast group's (join_wait_s: due first, it waits for its push until
theirs; due after them, its thread joins their tick early and its push goes into their next), so one collective per
fast round (docs/benchmarks.md, twenty-ninth session: asp and dssp reached the target sooner joined; zipline not). While
every rank is a peer of every other (still_peers: step compute times within PEER_SPEED to enter, AUTO_EXIT_SPEED to
stay), join_wait_s's window widens (AUTO_JOIN_HOLD x the release hold: one period), so that a round whose pushes all
come late (a slow tick delays every rank's next step alike) still lands in one tick, and groups the peers by
AUTO_EXIT_SPEED (a rank's latest step time is noisy: at PEER_SPEED a peer left out of the group joined early and its
push missed the tick). Both are functions of the sequence of tables, which every rank holds identically, so every
rank issues the same collectives.

By default (and for larger payloads) -- metadata first: a tick in which nobody pushed moves no model-sized buffer. A
tick is normally a *probe*: a metadata-only allreduce (a few hundred words) that delivers nothing and tells every
rank what each rank has pending. When the table shows pending pushes, every rank decides -- from the table alone, so
identically -- to release them: the next tick is then a *full* tick, payload and metadata in one allreduce, issued
at once. The release waits (at most HVD_ELASTIC_PEER_WAIT, default HOLD_FRACTION, of the pushing ranks' step period,
counted from the first pending push) for ranks that are due to push within that window (last push + measured push
period), so that equally fast ranks land in the same payload instead of one payload each; ranks not due (a
straggler) are never waited for. While most recent ticks carried pushes or released them at once (BUSY of the last
BUSY_WINDOW: pushes arrive faster than ticks), ticks are full without probes (one collective per tick; an empty full
tick moves a zero payload) -- for payloads under CHUNK_WORDS only: beyond, a probe costs little beside the payload
and an empty full tick a lot. A probe that holds pending pushes for a peer does not count: counting it made every
hold switch to full ticks, which release without waiting, so equally fast ranks drifted apart (see docs/design.md).
Every choice depends only on past tables, which every rank holds identically, so every rank issues the same
collectives in the same order.

Buffers: the update buffers are the frontend's own tensors (engine/buffers.py), preallocated and reused: pushes
accumulate in place into the pending buffer; a full tick swaps it for a zeroed spare, or, when none is free, leaves
none and the next push takes one (_pending_buffer); the training thread gives each applied tick's buffer back
(recycle), and the tick thread zeroes it for reuse. No model-sized allocation per tick: a rank makes at most as many
buffers as it holds at once (`buffers_allocated`, `held_ticks_max` in the report), and keeps up to POOL_LIMIT.

Pacing: the thread issues a tick at most every `tick_s` seconds, and backs off (doubling, up to `max_idle_s`) while
ticks come back empty; once every rank's push period is measured it sleeps instead until shortly before the next
event the table predicts (next_probe_s: a rank due to push or stream, a hold ending): on a CPU machine probes in
between only take cycles from the computation. A push wakes its own rank's thread at once. A tick carries one model-
sized buffer however many pushes it sums, so communication is bounded by model size / tick interval, whatever the
ranks' speeds. A tick completes when every rank's thread has joined it: ticks wait for the slowest *thread*, never
for a rank's computation.

Inline ticks: while ticks are joined (join pacing, or auto once pushes are predictable) and a rank waits for its own
push's tick (HVD_ELASTIC_MAX_INFLIGHT=0: the engine pushes with inline=True), the training thread runs that tick
itself when it is about to wait (take(block=True) -> run_inline), and waits for the collective as Horovod's
synchronize does; the tick thread is not woken for it. Each hand-over between the two threads cost about a
millisecond on a machine whose cores are all busy (2 cores, 4 ranks: push -> send 0.8-0.9 ms, delivered -> applied
0.9-1.1 ms, against a 31 ms step). One tick runs at a time (_ticking), the loop's state lives on the object
(_tick), and every tick is the same collective whichever thread issues it, so ranks need not agree on who runs it.

Shutdown: a rank that has finished raises FINISHED in its row; the thread stops after the first tick in which every
rank is finished and nobody pushed anything, which every rank sees at the same tick (so no collective is left
dangling and every pushed update has been delivered).
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, List, Optional

import numpy as np

from ..config import TICK_PACINGS
from ..errors import HvdElasticError
from .buffers import NumpyBuffers

# Metadata columns, one row per rank (int64). COUNT: pushes this tick delivers; CLOCK: own pushes delivered up to
# and including this tick; PENDING / PENDING_SINCE_NS: pushes waiting (probes only) and when the first of them came;
# NOW_NS: the row's snapshot time; PERIOD_NS: measured time between the rank's pushes (moving average).
# STREAM: a streamed push is under way (probes only); LEAD_NS: the rank's measured stream begin -> end time.
# GATED: the rank's training thread is held by its policy's rule (a barrier, a staleness bound, peer alignment) or
# waits in a collective of the script's own, so it pushes nothing before a later tick opens its gate: a release
# never waits for it (nor, for its own row, a join). OUTSIDE: the second case alone (a gate may let the others
# reach that collective: zipline's barrier).
COUNT, CLOCK, LAST_PUSH_NS, INTERVAL_NS, FINISHED, SEQ, PENDING, PENDING_SINCE_NS, NOW_NS, PERIOD_NS, STREAM, \
    LEAD_NS, GATED, OUTSIDE = range(14)
META_COLUMNS = 14
# The metadata travels in a buffer of the update's dtype (with the payload in busy phases: one allreduce, one
# dtype, since Horovod only fuses tensors of one dtype and on Gloo every extra collective costs milliseconds). Each
# int64 (all values are >= -1) is stored as value + 1 in four 16-bit pieces, which float32 and float64 hold
# exactly; one rank fills each row and the others add zeros, so the Sum returns every piece exactly.
META_PIECES = 4   # 16-bit pieces per int64
_BASE = 1 << 16
POOL_LIMIT = 8    # applied ticks' buffers kept for reuse (beyond it, given back to the allocator). Keeping them
                  # never raises the peak (a buffer is only made when none is free), and a rank that applies
                  # several ticks per step (a straggler k times slower: about k) then makes none per step
BUSY_WINDOW, BUSY = 8, 6   # full ticks without probes while BUSY of the last BUSY_WINDOW ticks had pushes
# Pacing (next_probe_s): probe QUIET_MARGIN of a period before a rank's predicted push; never sleep longer than
# QUIET_MAX_S between ticks; look for a rank past its predicted push every OVERDUE_POLL of its period.
QUIET_MARGIN, QUIET_MAX_S, OVERDUE_POLL = 0.25, 0.25, 0.05
CHUNK_WORDS, MAX_CHUNKS = 1 << 20, 4   # a streamed tick's payload: chunks of at least CHUNK_WORDS, at most MAX
SMALL_WORDS = 1 << 18      # payloads under this: every tick full, paced by join_wait_s (no probes)
PEER_SPEED = 1.25          # a rank whose step compute time is within this factor of another's is its peer (peer
                           # alignment in policies.py, join groups in join_wait_s)
STREAM_SPEED = 1.5        # a rank streams only while its push period is within this factor of the fastest rank's
AUTO_EXIT_SPEED = 1.5      # auto pacing leaves the peers' join window when a live rank is this much slower than another
AUTO_JOIN_HOLD = 2         # auto pacing, joined ticks: join_wait_s's hold (the window of the first group, how
                           # late a peer may push and still be waited for) is this times the release hold (0.5 of
                           # a period by default: one period), so that a round whose pushes all come late (a slow
                           # tick delays every rank's next step alike) still lands in one tick
HOLD_FRACTION = 0.5        # default release hold, a fraction of the pushers' step period (HVD_ELASTIC_PEER_WAIT)


def _pending_rows(meta: np.ndarray) -> np.ndarray:
    """Rows with pushes waiting or a streamed push announced."""
    return (meta[:, PENDING] > 0) | (meta[:, STREAM] > 0)


def _next_start_ns(meta: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Predicted start of each row's next push (for a rank that streams, of its stream: LEAD_NS earlier), in the
    row's own clock: what release() waits for and what next_probe_s() wakes up for."""
    return meta[rows, LAST_PUSH_NS] + meta[rows, PERIOD_NS] - np.maximum(meta[rows, LEAD_NS], 0)


def _step_ns(meta: np.ndarray) -> np.ndarray:
    """Per row, how fast the rank is: its step compute time (INTERVAL_NS), or its push period while that is not
    measured. (The period includes waiting, which converges the ranks' periods where they wait for each other.)"""
    return np.where(meta[:, INTERVAL_NS] > 0, meta[:, INTERVAL_NS], meta[:, PERIOD_NS])


def predictable(meta: np.ndarray) -> bool:
    """Every live rank's push period and last push are known, so join_wait_s can predict the next pushes (before,
    joins would pace by tick_s, and a lone first push could go out in a tick of its own). Auto pacing joins ticks
    from the first table after this in which nothing is pending. A function of the table only."""
    live = meta[:, FINISHED] == 0
    return bool(live.any() and _measured(meta, live))


def _measured(meta: np.ndarray, rows: np.ndarray) -> bool:
    """These rows' push period and last push are known: their next push can be predicted."""
    return bool((meta[rows, PERIOD_NS] > 0).all() and (meta[rows, LAST_PUSH_NS] >= 0).all())


def all_peers(meta: np.ndarray, factor: float = PEER_SPEED) -> bool:
    """Every live rank's push period and step compute time (_step_ns) are measured (predictable), and the step times
    are within `factor` of each other: nobody is a straggler. Auto pacing's joins use the peers' wider window
    (AUTO_JOIN_HOLD, AUTO_EXIT_SPEED) while this holds -- from PEER_SPEED on, until it fails at AUTO_EXIT_SPEED
    (hysteresis: one step's noise does not flip it). A function of the table only: every rank decides the same."""
    if not predictable(meta):
        return False
    live = meta[:, FINISHED] == 0
    step = _step_ns(meta)[live]
    return bool((step > 0).all() and step.max() <= factor * step.min())


def still_peers(meta: np.ndarray, were_peers: bool) -> bool:
    """all_peers with hysteresis over a sequence of tables: becomes true at PEER_SPEED, stays true within
    AUTO_EXIT_SPEED (one step's noise does not flip it). Auto pacing's join window and zipline's barriers at the
    bound."""
    return all_peers(meta, AUTO_EXIT_SPEED if were_peers else PEER_SPEED)


def release(meta: np.ndarray, hold_fraction: float = HOLD_FRACTION) -> bool:
    """After a probe with this table: send the pending pushes in a full tick now (True) or probe again (False).
    Now, unless some rank with nothing pending is due to push within the hold window and the oldest pending push
    has waited less than that window. Only a rank at most PEER_SPEED slower than the fastest pusher is held for
    (a peer, or a faster rank): a push is never held for a slower rank, as peer alignment never waits for one
    (policies.py) -- under asp with a straggler due within a fast rank's window, that hold was on the fast ranks'
    critical path (they wait for their own push). A rank held at its gate (GATED) is never due: it pushes only after
    a tick opens its gate, so holding for it only delays that tick (under zipline, every barrier by the hold:
    measured 21 ms median from the last push of a barrier to its delivery, 0.9 of a step). A function of the table
    only: every rank decides the same."""
    pending = _pending_rows(meta)
    if not pending.any():
        return False
    step = _step_ns(meta)
    periods = np.where(meta[pending, PERIOD_NS] > 0, meta[pending, PERIOD_NS], step[pending])
    if hold_fraction <= 0 or (periods <= 0).any():
        return True                              # nothing measured yet about a pusher
    hold = hold_fraction * float(periods.min())
    now = float(meta[:, NOW_NS].max())
    if now - float(meta[pending, PENDING_SINCE_NS].min()) >= hold:
        return True
    idle = ~pending & (meta[:, FINISHED] == 0) & (meta[:, GATED] <= 0) \
        & (step <= PEER_SPEED * float(step[pending].min()))
    measured = idle & (meta[:, PERIOD_NS] > 0) & (meta[:, LAST_PUSH_NS] >= 0)
    due = _next_start_ns(meta, measured) <= now + hold   # its next push (or stream) starts within the window
    # A rank whose period is not measured yet (its first two pushes: the ranks start together) is expected within
    # the window unless its step time already says it is slower: without this a lone first push went out in a
    # tick of its own and split the round (one run in three, trajectories off Horovod's from the first step).
    return not due.any() and not (idle & (meta[:, PERIOD_NS] <= 0)).any()


def next_probe_s(meta: np.ndarray, hold_fraction: float = HOLD_FRACTION) -> Optional[float]:
    """How long the tick thread may sleep after a tick with this table before it probes again: until the earliest
    moment the table gives a reason to look -- a rank with nothing pending due to push (or, if it streams, to begin
    its stream: LEAD_NS earlier), less QUIET_MARGIN of its period for jitter, or the end of the hold of a pending
    push (release()) -- at most QUIET_MAX_S. None when a live rank's period is not measured yet (no prediction).
    Each row's prediction is taken relative to the row's own NOW_NS, so hosts' clocks need not agree. On a CPU
    machine, probes at tick pace in these gaps only take cycles from the computation; a rank's own push or stream
    wakes its thread at once, and a probe issued by a rank that woke early completes when the others wake."""
    live = meta[:, FINISHED] == 0
    if not live.any():
        return 0.0
    if not _measured(meta, live):
        return None
    period = meta[:, PERIOD_NS].astype(np.float64)
    pending = live & _pending_rows(meta)
    idle = live & ~pending
    due = _next_start_ns(meta, idle) - QUIET_MARGIN * period[idle] - meta[idle, NOW_NS]
    events = list(np.maximum(due, OVERDUE_POLL * period[idle]))   # an overdue rank: look again now and then
    if pending.any():
        hold = hold_fraction * float(period[pending].min())
        events += list(meta[pending, PENDING_SINCE_NS] + hold - meta[pending, NOW_NS])
    return float(min(max(min(events), 0.0) / 1e9, QUIET_MAX_S))


def join_wait_s(meta: np.ndarray, rank: int, now_ns: int, hold_fraction: float = HOLD_FRACTION,
                peer_speed: float = PEER_SPEED) -> Optional[float]:
    """Small payloads (under SMALL_WORDS): every tick is full, and a tick fires when the last rank's thread joins it,
    so *when* each thread joins decides what a tick carries. This is how long this rank's thread waits before it
    joins the next tick, from the last tick's table with this rank's own row as it stands now (a push of its own
    makes it join at once; 0: join now and wait inside the collective for the others). No rank needs to agree with
    another on it: every tick has the same shape.

    The due ranks are the live ones whose next push the table predicts (last push + period), this rank only if it is
    not held at its gate (another rank's GATED is from before the tick, which may have let it go). The first group
    is the earliest due rank and the ranks no slower than its peers (step compute time, INTERVAL_NS, at most
    `peer_speed` times its own: the push period would not do, it includes the time a rank waits) predicted within a
    hold (`hold_fraction` of the first's period) after it: the pushes the next tick waits for. A member waits for its
    own push, at most a hold (of the group's shortest period) past its prediction and never past the predicted push
    of a rank more than `peer_speed` faster than itself (a straggler's late push must not hold the fast ranks'
    pushes back); then it joins empty-handed and its push goes into the next tick. A straggler due first thus
    waits for its own push until the fast ranks' pushes, which join its tick: had they joined early instead, their
    pushes made while waiting inside the straggler's tick went into a tick of their own after it (twenty-ninth
    session: that tick made the fast ranks' gradients one update stale, and in one run of three it sat on their
    critical path, fast compute 76% against 86-88%). Every other rank joins QUIET_MARGIN of a period before the
    first predicted push and waits inside the collective, so the tick fires as soon as the group has pushed. A rank
    more than a hold past its predicted push (overdue) is no longer waited for: ranks outside the group look for it
    OVERDUE_POLL of its period after the table's tick. Times are compared on the job's common clock (now_ns,
    LAST_PUSH_NS: ns since the shared epoch), as ZipLine's barriers compare them. None when no rank is due or a due
    rank's period is not measured yet (no prediction: pace by tick_s)."""
    live = meta[:, FINISHED] == 0
    live[rank] &= meta[rank, GATED] <= 0
    if not live.any() or not _measured(meta, live):
        return None
    period = meta[:, PERIOD_NS].astype(np.float64)
    speed = _step_ns(meta).astype(np.float64)
    rel = (meta[:, LAST_PUSH_NS] + meta[:, PERIOD_NS]).astype(np.float64) - now_ns
    overdue = live & (rel < -hold_fraction * period)
    on_time = live & ~overdue
    # the poll counts from the table's tick (its last row's snapshot), not from now: re-evaluated, it still comes
    events = [float(meta[:, NOW_NS].max()) + OVERDUE_POLL * float(period[overdue].min()) - now_ns] \
        if overdue.any() else []
    if on_time.any():
        first = int(np.flatnonzero(on_time)[np.argmin(rel[on_time])])
        group = on_time & (speed <= peer_speed * speed[first]) \
            & (rel <= rel[first] + hold_fraction * period[first])
        if group[rank]:       # wait for the own push (an overdue rank's poll would only make it miss the tick)
            deadline = rel[rank] + hold_fraction * float(period[group].min())
            faster = on_time & (speed * peer_speed < speed[rank])
            events = [min(deadline, float(rel[faster].min())) if faster.any() else deadline]
        else:
            events.append(rel[first] - QUIET_MARGIN * period[first])
    return float(min(max(min(events), 0.0) / 1e9, QUIET_MAX_S))


def chunk_bounds(numel: int) -> List[int]:
    """Word offsets of a streamed tick's payload chunks: numel // CHUNK_WORDS equal chunks (1 to MAX_CHUNKS).
    A function of the model size only, so every rank cuts the same chunks."""
    k = max(1, min(MAX_CHUNKS, numel // CHUNK_WORDS))
    return [numel * i // k for i in range(k + 1)]


class _Stream:
    """This rank's push in progress (see Ticker.stream_begin): the gradient is read chunk by chunk, by the tick
    thread, straight from the frontend's tensors, as backward finishes each chunk."""

    ANNOUNCED, TAKEN = "announced", "taken"
    __slots__ = ("accumulate", "ready", "state", "since_ns", "begin", "complete", "end_ns")

    def __init__(self, accumulate, chunks: int, since_ns: int):
        self.accumulate, self.ready, self.since_ns = accumulate, [0] * chunks, since_ns
        self.state, self.begin, self.complete, self.end_ns = _Stream.ANNOUNCED, time.perf_counter(), False, -1


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
    else. `allreduce_sum(buffers, name, block)` is an in-place Sum allreduce over all ranks of buffers of the kind
    `buffers` makes (NumpyBuffers by default); block: the calling thread has nothing else to do meanwhile (a
    frontend may then wait as Horovod's synchronize does, else it should not keep a core busy while it waits)."""

    def __init__(self, numel: int, buffers, rank: int, size: int,
                 allreduce_sum: Callable[[list, str, bool], None],
                 tick_s: float = 0.005, max_idle_s: float = 0.01, epoch_ns: int = 0,
                 name: str = "hvd_elastic.tick", hold_fraction: float = HOLD_FRACTION, stream: bool = False,
                 pacing: str = "probe", join_stragglers: bool = True):
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
        # The table rides in the payload's tail where buffers live in host memory (one allreduce per full tick);
        # with device buffers it travels in a host buffer of its own, so reading it never waits for the device.
        self._meta_kind = buffers.host_twin()
        self._meta_in_payload = self._meta_kind is buffers
        self._length = numel + (self._meta_words if self._meta_in_payload else 0)   # [update | encoded table]
        self._fences = {}                                # id(buffer) -> its last hand-over (Buffers.fence)
        self._stream_fence = None                        # the tick thread's last read of a streamed gradient
        self._pending = buffers.zeros(self._length)      # this rank's pushes since its last tick
        self.buffers_allocated = 1                       # model-sized buffers made over the run
        self._held = 0                                   # delivered ticks whose buffer is not given back yet
        self.held_max = 0
        # Streamed pushes (stream=True: the frontend can hand a gradient over as backward produces it, and every
        # rank's frontend says the same): full ticks go in chunks, last parameters first (stream_begin).
        self._bounds = chunk_bounds(numel) if stream else [0, numel]
        self.streams = len(self._bounds) > 2
        self._stream: Optional[_Stream] = None
        self._lead_ns = -1             # stream begin -> end (moving average)
        self._last_meta: Optional[np.ndarray] = None   # the table of the last completed tick
        self._spare = None                               # a zeroed buffer for the next swap or push
        self._returned: List = []                        # applied ticks' buffers, given back (not zeroed yet)
        self._meta_buffer = self._meta_kind.zeros(self._meta_words)
        self._words = np.zeros(self._meta_words, np.float64)
        self._pending_count = 0
        self._wake = False             # a push since the tick thread last looked: skip its idle wait
        self._clock = 0
        self._last_push_ns = -1
        self._interval_ns = -1
        self._pending_since_ns = -1
        self._sent_push_ns = -1        # time of the last push inside a sent (full) tick
        self._gated = False            # the training thread is held at its gate (GATED; see the property)
        self._outside = False          # the training thread waits in a collective of the script's own (OUTSIDE)
        # Join pacing (HVD_ELASTIC_TICK_PACING=join), small payloads: every tick full, each thread joining when
        # join_wait_s says (no probes, no release).
        # Auto (HVD_ELASTIC_TICK_PACING=auto): probe pacing until the pushes are predictable, then join pacing
        # (the peers' wide window while still_peers holds). Both in effect for small payloads only.
        small = numel < SMALL_WORDS and len(self._bounds) <= 2
        if pacing not in TICK_PACINGS:
            raise ValueError(f"unknown tick pacing {pacing!r}; accepted: {'|'.join(TICK_PACINGS)}")
        self.join_pacing = small and pacing == "join"
        self.auto_pacing = small and pacing == "auto"
        self.join_stragglers = join_stragglers   # auto: join under a straggler too (else only while all are peers)
        self.join_ticks = 0            # ticks paced by joins (join pacing, or auto while all ranks were peers)
        self.inline_ticks = 0          # joined ticks the training thread ran itself (run_inline)
        # The tick loop's state (_tick), kept here because either thread may run a tick (one at a time: _ticking)
        self._index = 0                # the next tick's index (SEQ)
        self._last = 0.0               # monotonic time of the last tick
        self._idle_s = tick_s          # pacing: how long after the last tick the thread looks again
        self._release_now = False      # the last probe released the pending pushes: a full tick follows at once
        self._joining = False          # auto pacing: ticks are joined (from the first predictable, quiet table)
        self._peers = False            # auto pacing: every rank is a peer (still_peers): joins use the wide window
        self._recent: Deque[bool] = collections.deque(maxlen=BUSY_WINDOW)   # non-empty flags of the last ticks
        self._ticking = False          # a thread is running a tick
        self._inline_due = False       # a push the training thread is to send itself (push(inline=True))
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
        self.streamed = 0              # own pushes a tick took as streams (read during backward)
        self.bytes_reduced = 0
        self.comm_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"hvd_elastic-ticker-{rank}", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------------------
    def now_ns(self) -> int:
        return time.time_ns() - self.epoch_ns

    def push(self, accumulate: Callable, interval_ns: int, inline: bool = False) -> int:
        """Add one update to this rank's next tick: ``accumulate(dst)`` adds it in place into `dst`, the first
        `numel` words of the pending buffer (under the ticker's lock). Returns the rank's clock (pushes so far).
        inline: the training thread will wait for this push's tick (take(block=True)) before anything else, so
        while ticks are joined it may run the tick itself (run_inline) instead of waking the tick thread."""
        with self._lock:
            self._check_open("push()")
            self._add_into_pending(accumulate)
            now_ns = self.now_ns()
            self._add_pending(now_ns)
            self._inline_due = inline and self._joined and not self._ticking
            return self._count_push(now_ns, interval_ns, wake=not self._inline_due)

    def _check_open(self, what: str):
        """(Under the lock.) This rank may start a push: the thread is healthy, finish() has not been called and
        no streamed push is under way."""
        self._check()
        if self._finished:
            raise TickerError("push after finish()")
        if self._stream is not None:
            raise TickerError(f"{what} while a streamed push is under way")

    def _pending_buffer(self):
        """(Under the lock.) The pending buffer. A full tick takes it and leaves the spare in its place, or nothing
        when no spare is free (the last tick's buffer is not given back yet): the first push after that makes it --
        the spare if the tick thread has zeroed one since, else a given-back buffer (zeroed here), else a new one.
        Made lazily, a rank whose previous tick is still unapplied when the next one leaves holds two buffers (that
        tick, the one in flight), not three."""
        if self._pending is None:
            if self._spare is not None:
                self._pending, self._spare = self._spare, None
            else:
                self._pending = self._zeroed(self._take_free())
        return self._pending

    def _add_into_pending(self, accumulate: Callable):
        """(Under the lock.) accumulate(dst) into the pending buffer's update words, ordered after the buffer's last
        hand-over and fenced for the tick that sends it."""
        buf = self._pending_buffer()
        self._received(buf)
        accumulate(self.buffers.head(buf, self.numel))
        self._handed(buf)

    def _handed(self, buf):
        """The calling thread is done with `buf` for now: whichever thread uses it next first waits for this work
        (Buffers.fence: a CUDA event; nothing on the host, where every operation is complete when it returns)."""
        f = self.buffers.fence()
        if f is not None:
            self._fences[id(buf)] = f

    def _received(self, buf):
        """The calling thread is about to use `buf`: order its work after the last hand-over of it."""
        if self._fences:
            self.buffers.after(self._fences.pop(id(buf), None))

    def _add_pending(self, since_ns: int):
        if self._pending_count == 0:
            self._pending_since_ns = since_ns
        self._pending_count += 1

    def _count_push(self, now_ns: int, interval_ns: int, wake: bool = True) -> int:
        """A push of this rank is complete (under the lock): its clock, timing, and (wake) a wake-up of the tick
        thread -- not for a push the training thread sends itself (run_inline)."""
        if self._last_push_ns >= 0:
            gap = now_ns - self._last_push_ns
            self._period_ns = gap if self._period_ns <= 0 else int(self._period_ns + 0.2 * (gap - self._period_ns))
        self._clock += 1
        self._push_times.append(time.perf_counter())
        self._last_push_ns = now_ns
        self._interval_ns = int(interval_ns)
        if wake:                  # wake the tick thread from its idle wait: a push is what the next probe is for
            self._wake = True
            self._lock.notify_all()
        return self._clock

    # A streamed push: the frontend announces it when backward starts (stream_begin), reports the words of the
    # update that are final as backward produces them (stream_ready), and ends it when the whole update exists
    # (stream_end). The next full tick takes an announced stream: its thread reads each chunk with `accumulate`
    # straight from the frontend's tensors once the chunk is final and reduces it at once, so the payload travels
    # while backward still runs (as Horovod's per-tensor allreduces do). Announcing it makes peers' probes hold the
    # release for this rank (release()), so equally fast ranks' streams share one tick. A stream no tick took by
    # its end is an ordinary push. Until stream_wait() returns, the frontend must not change the gradients.
    def stream_begin(self, accumulate: Callable[[Any, int, int], None]) -> bool:
        """Announce a streamed push; ``accumulate(dst, start, stop)`` adds words [start, stop) of the update into dst
        (a view of that range). False (push normally) when the payload is one chunk, this rank's push period is not
        measured yet, or it is more than STREAM_SPEED times the fastest rank's: a tick that took a slow rank's stream
        would make every rank wait for that rank's backward."""
        if not self.streams:
            return False
        with self._lock:
            self._check_open("stream_begin()")
            meta = self._last_meta
            if self._period_ns <= 0 or meta is None:
                return False
            live = (meta[:, FINISHED] == 0) & (meta[:, PERIOD_NS] > 0)
            if live.any() and self._period_ns > STREAM_SPEED * float(meta[live, PERIOD_NS].min()):
                return False
            self._stream = _Stream(accumulate, len(self._bounds) - 1, self.now_ns())
            self._wake = True
            self._lock.notify_all()
            return True

    def stream_ready(self, start: int, stop: int):
        """Words [start, stop) of the streamed update are final."""
        with self._lock:
            st = self._stream
            if st is None:
                return
            b = self._bounds
            for k in range(len(b) - 1):
                lo, hi = max(start, b[k]), min(stop, b[k + 1])
                if lo < hi:
                    st.ready[k] += hi - lo
            self._lock.notify_all()

    def stream_end(self, interval_ns: int) -> int:
        """The streamed update is complete (words never reported ready are read now as they are). Returns the rank's
        clock (pushes so far), as push() does."""
        with self._lock:
            self._check()
            st = self._stream
            if st is None:
                raise TickerError("stream_end() without stream_begin()")
            now_ns = self.now_ns()
            lead = int((time.perf_counter() - st.begin) * 1e9)
            self._lead_ns = lead if self._lead_ns < 0 else int(self._lead_ns + 0.2 * (lead - self._lead_ns))
            if st.state == _Stream.ANNOUNCED:      # no tick took it: an ordinary push
                self._stream = None
                self._add_into_pending(lambda dst: st.accumulate(dst, 0, self.numel))
                self._add_pending(st.since_ns)
            else:
                st.complete, st.end_ns = True, now_ns
            return self._count_push(now_ns, interval_ns)

    def stream_wait(self):
        """Block until the tick thread no longer reads this rank's gradients (after stream_end)."""
        with self._lock:
            while self._stream is not None:
                self._check()
                if self._stream.state == _Stream.ANNOUNCED:   # stream_end() clears an announced stream
                    raise TickerError("stream_wait() before stream_end()")
                self._lock.wait(0.5)
            self._check()
            fence, self._stream_fence = self._stream_fence, None
        self.buffers.after(fence)    # the tick's reads of the gradients come before the caller's next writes

    @property
    def streaming(self) -> bool:
        """A streamed push is announced and not ended."""
        st = self._stream
        return st is not None and not st.complete

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
        """Completed ticks not yet taken, in order. With block=True, wait until at least one is available (a caller
        about to wait for its own push runs run_inline() first)."""
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
        for tick in out:
            if tick.buffer is not None:
                self._received(tick.buffer)
        return out

    @property
    def _joined(self) -> bool:
        """The next tick is joined: join pacing, or auto pacing once the pushes are predictable."""
        return self.join_pacing or self._joining

    def run_inline(self) -> bool:
        """Training thread, about to wait for its own push (push(inline=True)): while ticks are joined and no tick
        is under way, run the next tick here -- the push's tick, which the tick thread would otherwise run after a
        wake-up, handing the result back with another. On a machine whose cores are all busy each hand-over between
        the two threads costs about a millisecond (measured on 2 cores, 4 ranks: push -> send 0.8-0.9 ms, delivered
        -> applied 0.9-1.1 ms, against a 31 ms step). Every tick is the same collective whichever thread issues it,
        so ranks need not agree on who runs theirs. True when it ran one; otherwise the tick thread is woken."""
        with self._lock:
            if not self._inline_due:
                return False
            self._inline_due = False
            if self._ticking or self._stopped or self._error is not None or self._stream is not None \
                    or not self._pending_count or not self._joined:
                self._wake = True
                self._lock.notify_all()
                return False
            self._ticking = True
        try:
            with self.buffers.collective_scope():
                self._tick(True)
            self.inline_ticks += 1
        except BaseException as e:   # as on the tick thread: every later call raises it
            with self._lock:
                self._error = e
                self._stopped = True
        finally:
            with self._lock:
                self._ticking = False
                self._lock.notify_all()
        return True

    def recycle(self, tick: Tick):
        """Give an applied tick's buffer back for reuse (its update must not be read afterwards)."""
        if tick.buffer is not None:
            self._handed(tick.buffer)
            with self._lock:
                self._held -= 1
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
        """A zeroed model-sized buffer: a given-back one (zeroed here, outside the lock) or a new one."""
        with self._lock:
            buf = self._take_free()
        return self._zeroed(buf)

    def _take_free(self):
        """(Under the lock.) A given-back buffer, or None after counting the new one the caller is to make."""
        if self._returned:
            return self._returned.pop()
        self.buffers_allocated += 1
        return None

    def _zeroed(self, buf):
        """`buf` (from _take_free) zeroed, or a new zeroed buffer when it is None."""
        if buf is None:
            return self.buffers.zeros(self._length)
        self._received(buf)
        self.buffers.zero_(buf)
        self._handed(buf)
        return buf

    def _keep(self, buf):
        """A zeroed buffer, as the pending buffer if there is none (a full tick needs one), else as the spare, else
        back to the pool."""
        with self._lock:
            if self._pending is None:
                self._pending = buf
            elif self._spare is None:
                self._spare = buf
            else:
                self._returned.append(buf)

    def _encode_row(self, index: int, count: int, clock: int, pending: int, since_ns: int, streaming: int):
        """This rank's row of the next tick's table (the other rows stay -1: zeros once encoded), into _words.
        LAST_PUSH_NS is that of the last push sent, so that it always goes with CLOCK (the policies predict a rank's
        next pushes from both)."""
        meta = np.full((self.size, META_COLUMNS), -1, np.int64)
        meta[self.rank] = (count, clock, self._sent_push_ns, self._interval_ns, int(self._finished), index, pending,
                           since_ns, self.now_ns(), self._period_ns, streaming, self._lead_ns,
                           int(self._gated or self._outside), int(self._outside))
        encode_meta(meta, self._words)

    def _send_chunks(self, send, member: Optional[_Stream], index: int, count: int, clock: int) -> np.ndarray:
        """A full tick in chunks, last words first (backward's order); the table rides with the last chunk. With a
        stream taken (`member`), each chunk waits until backward has made it final and is read from the frontend's
        tensors into `send` just before it is reduced; the rank's row is written once the stream has ended."""
        b, buffers = self._bounds, self.buffers
        self._received(send)
        for k in reversed(range(len(b) - 1)):
            start, stop = b[k], b[k + 1]
            chunk = buffers.view(send, start, stop)
            if member is not None:
                with self._lock:
                    while not (member.complete or (k > 0 and member.ready[k] >= stop - start)):
                        self._lock.wait(1.0)
                member.accumulate(chunk, start, stop)
            parts = [chunk]
            if k == 0:
                if member is not None:
                    with self._lock:
                        self._stream = None     # its gradients are no longer read (stream_wait returns)
                        self._stream_fence = buffers.fence()
                        self._sent_push_ns = member.end_ns
                        self._lock.notify_all()
                    count, clock = count + 1, clock + 1
                    self.streamed += 1
                    self._encode_row(index, count, clock, 0, -1, 0)
                table = self._write_table(send)
                parts.append(buffers.view(send, self.numel, self._length) if table is None else table)
            self._allreduce_sum(parts, f"{self.name}.s{k}", self._blocking())
        self._handed(send)
        self.bytes_reduced += buffers.nbytes(send)
        return self._read_table(send)

    def _write_table(self, send):
        """Write the encoded row (_words) where this tick's table travels: the tail of the payload buffer `send`
        (host buffers: returns None), or the host table buffer (device buffers, and every probe: returns it)."""
        if self._meta_in_payload and send is not None:
            self.buffers.set_words(send, self.numel, self._words)
            return None
        self._meta_kind.set_words(self._meta_buffer, 0, self._words)
        return self._meta_buffer

    def _read_table(self, send) -> np.ndarray:
        """The reduced table of the tick whose payload was `send` (None: a probe)."""
        if self._meta_in_payload and send is not None:
            words = self.buffers.get_words(send, self.numel, self._meta_words)
        else:
            words = self._meta_kind.get_words(self._meta_buffer, 0, self._meta_words)
        return decode_meta(words, self.size)

    def _await_join(self, fallback: float):
        """Join pacing: wait until this rank should join the next tick (join_wait_s, re-evaluated whenever the
        training thread changes what it will do next: a push or a finish joins at once, a gate re-decides);
        without a prediction until `fallback` (monotonic; tick_s pacing)."""
        with self._lock:
            while not (self._wake or self._finished or self._pending_count or self._stopped):
                meta, wait = self._last_meta, None
                if meta is not None:
                    meta = meta.copy()      # this rank's own row as it stands now
                    meta[self.rank, [LAST_PUSH_NS, INTERVAL_NS, PERIOD_NS, GATED]] = \
                        (self._last_push_ns, self._interval_ns, self._period_ns, int(self._gated or self._outside))
                    wait = join_wait_s(meta, self.rank, self.now_ns(), *(
                        (self.hold_fraction * AUTO_JOIN_HOLD, AUTO_EXIT_SPEED) if self._peers else
                        (self.hold_fraction, PEER_SPEED)))
                left = (fallback - time.monotonic()) if wait is None else wait
                if left <= 0:
                    return
                self._lock.wait(left)

    @property
    def gated(self) -> bool:
        """Set by the engine while its policy holds the training thread: it pushes nothing before a tick opens its
        gate (GATED in its row)."""
        return self._gated

    @gated.setter
    def gated(self, value: bool):
        if value != self._gated:
            with self._lock:
                self._gated = value
                if self.join_pacing or self.auto_pacing:   # it re-decides when to join (probes wait as planned)
                    self._lock.notify_all()

    @property
    def outside(self) -> bool:
        """Set by the engine while the training thread waits in a collective of the script's own (OUTSIDE, and
        GATED: it pushes nothing until the call returns); the next tick carries it at once."""
        return self._outside

    @outside.setter
    def outside(self, value: bool):
        with self._lock:
            self._outside = value
            self._wake = True
            self._lock.notify_all()

    def _blocking(self) -> bool:
        """How this thread waits for a collective (allreduce_sum's `block`): the training thread running a tick
        (run_inline) has nothing else to do and waits as Horovod's own synchronize does; the tick thread must not
        take a core from its rank's forward and backward."""
        return threading.current_thread() is not self._thread

    def _reduce(self, parts: list, name: str):
        self._allreduce_sum(parts, name, self._blocking())
        self.bytes_reduced += sum(self.buffers.nbytes(p) for p in parts)

    def _run(self):
        try:
            with self.buffers.collective_scope():   # the buffers' device and stream, for every tick this thread runs
                self._loop()
        except BaseException as e:  # surfaced on the training thread at its next call
            with self._lock:
                self._error = e
                self._stopped = True
                self._lock.notify_all()

    def _loop(self):
        while True:
            if self._spare is None and self._returned:   # zero the next spare now, off the release's path
                self._keep(self._zeroed_buffer())
            seen = self.ticks
            join = self._joined
            if join:
                self._await_join(self._last + self._idle_s)
            else:
                wait = self._last + self._idle_s - time.monotonic()
                if wait > 0 and not self._release_now:
                    with self._lock:   # a push or a finish() wakes us early: probes react at once
                        if not self._finished and not self._wake:
                            self._lock.wait(wait)
            with self._lock:
                while self._ticking and not self._stopped:   # the training thread runs a tick (run_inline)
                    self._lock.wait(1.0)
                if self._stopped:
                    return
                if self.ticks != seen:      # it ran one: decide again from its table
                    continue
                self._ticking = True
                self._inline_due = False    # this tick sends the push: the training thread just waits
            try:
                done = self._tick(join)
            finally:
                with self._lock:
                    self._ticking = False
                    self._lock.notify_all()
            if done:
                return

    def _tick(self, join: bool) -> bool:
        """One tick (the caller holds the token, _ticking): a full tick when joined, released or busy, else a probe;
        delivers it to the training thread and decides how the next one is paced. True when it was the last."""
        index, buffers, numel = self._index, self.buffers, self.numel
        with self._lock:
            self._wake = False
        self._last = time.monotonic()
        full = join or self._release_now or (numel < CHUNK_WORDS and sum(self._recent) >= BUSY)
        self._release_now = False
        if full and self._pending is None:   # nothing pushed since the last full tick took it: a
            self._keep(self._zeroed_buffer())   # zeroed buffer to receive this tick's sum in
        send, member = None, None
        with self._lock:
            self.in_flight = True
            count = self._pending_count
            stream = self._stream if self._stream is not None and \
                self._stream.state == _Stream.ANNOUNCED else None
            if full:            # deliver everything pending (and take an announced stream)
                send, self._pending, self._spare = self._pending, self._spare, None
                self._pending_count = 0
                self._sent_push_ns = self._last_push_ns
                clock = self._clock
                if stream is not None:
                    member, stream.state = stream, _Stream.TAKEN
                else:
                    self._encode_row(index, count, clock, 0, -1, 0)
            else:               # probe: deliver nothing, announce what is pending
                since = [t for t in (self._pending_since_ns if count else -1,
                                     stream.since_ns if stream is not None else -1) if t >= 0]
                self._encode_row(index, 0, self._clock - count, count, min(since) if since else -1,
                                 int(stream is not None))
        t0 = time.perf_counter()
        if full and self.streams:
            meta = self._send_chunks(send, member, index, count, clock)
        elif full:
            self._received(send)
            table = self._write_table(send)
            self._reduce([send] if table is None else [buffers.head(send, numel), table], self.name)
            self._handed(send)
            meta = self._read_table(send)
        else:
            self._reduce([self._write_table(None)], f"{self.name}.meta")
            meta = self._read_table(None)
        if not (meta[:, SEQ] == index).all():
            raise TickerError(f"ranks are out of step at tick {index}: {meta[:, SEQ].tolist()}")
        total = int(meta[:, COUNT].sum())
        pending = int(meta[:, PENDING].sum())
        if full:                        # a model-sized allreduce, even when nobody pushed into it
            self.payload_collectives += 1
        if not total and send is not None:   # an empty full tick's buffer sums zeros: it stays a zeroed spare
            self._keep(send)
            send = None
        self._release_now = not full and release(meta, self.hold_fraction)
        dt = time.perf_counter() - t0
        tick = Tick(index, buffers.head(send, numel) if total else None, meta, dt, send if total else None)
        self._recent.append(total > 0 or self._release_now)   # a held probe is not busy: it waits for peers
        with self._lock:
            self.ticks += 1
            self.join_ticks += int(join)
            self.comm_s += dt
            if total:
                self.nonempty_ticks += 1
                self._held += 1
                self.held_max = max(self.held_max, self._held)
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
            self._last_meta = meta
            self._completed.append(tick)
            done = bool(meta[:, FINISHED].all()) and total == 0 and pending == 0
            if done:
                self._stopped = True
            self._lock.notify_all()
        if done:
            return True
        pending += int(meta[:, STREAM].sum())
        if self.auto_pacing:   # from the tables' sequence: the same on every rank. Joins start after a tick with
            # nothing pending (a probe's held pushes go out in its release's full tick)
            quiet = not _pending_rows(meta).any()
            if self.join_stragglers:   # ... and then stay
                self._peers = still_peers(meta, self._peers)
                self._joining = self._joining or (predictable(meta) and quiet)
            else:                      # ... and stop when a rank is no longer a peer (zipline)
                self._joining = self._peers = still_peers(meta, self._joining) and (self._joining or quiet)
        predicted = None if self._joined else next_probe_s(meta, self.hold_fraction)
        if predicted is not None:
            self._idle_s = max(self.tick_s, predicted)
        else:
            self._idle_s = self.tick_s if total or pending else min(self._idle_s * 2, self.max_idle_s)
        self._index += 1
        return False
