"""Tick pacing: when the tick thread issues the next tick, and whether it is full, a probe or joined.

One object per pacing mode (HVD_ELASTIC_TICK_PACING), each answering three questions from the tables of the ticks
so far (and its own few fields, updated from each completed tick's table by observe()): is the next tick full or a
probe (full()), are ticks joined now (joined), and until when the thread waits before the next tick (deadline();
for joined ticks, join_wait_s()). Every field is a function of the sequence of tables, which every rank holds
identically, so every rank issues the same collectives in the same order.

Probe pacing (probe; for payloads of SMALL_WORDS and more, the pacing outside lock-step): a tick is normally a
probe, the table alone (a few hundred words), which delivers nothing and tells every rank what each rank has
pending. When the table shows pending pushes, every rank decides to release them (rules.release): the next tick is
full, payload and table in one allreduce, issued at once. The release holds (at most the peer wait, HOLD_FRACTION of
the pushers' step period by default) for ranks due to push within that window, so that equally fast ranks land in
one payload instead of one payload each; a straggler is never held for. While most recent ticks carried pushes or
released them at once (BUSY of the last BUSY_WINDOW: pushes arrive faster than ticks), ticks are full without probes
(one collective per tick; an empty full tick moves a zero payload) -- for payloads under CHUNK_WORDS only: beyond, a
probe costs little beside the payload and an empty full tick a lot. A probe that holds pending pushes for a peer
does not count as busy: counting it makes every hold switch to full ticks, which release without waiting, so equally
fast ranks drift apart (docs/design.md).

Join pacing (join; payloads under SMALL_WORDS, 1 MB in float32): every tick is full and joined, and there are no
probes and no releases: a tick fires when the last rank's thread joins it, so each thread decides *when* to join,
from the last table and its own live state (rules.join_wait_s): a rank due to push with the first group of peers
waits for its own push (bounded by the hold), every other rank joins early and waits inside the collective. One
collective per round of pushes, where probe -> release -> full tick take two or more: on a 2-core machine each
Horovod collective costs milliseconds, and a probe costs as much as a small payload. A tick in which nobody pushed
moves the small payload; such ticks are rare (a rank overdue, all ranks held). The joins need not agree across
ranks: every tick has the same shape.

Auto pacing (auto, the default): probe pacing until a table shows every live rank's push period and last push
(predictable) and nothing pending, join pacing from then on -- for a policy that does not join stragglers (zipline:
relaxed_joins = "peers") only while every rank is a peer of every other (still_peers), probes otherwise, and for
a policy that joins no relaxed tick (wbsp: relaxed_joins = "never", its uploads travel while its next step computes)
probes throughout, joined in lock-step only. Under a
straggler, its push joins a tick of the fast group's (due first, it waits for its push until theirs; due after them,
its thread joins their tick early and its push goes into their next): one collective per fast round. While the
policy's lock-step fallback holds the ranks in lock-step (policies/base.py Lockstep; the pacing keeps its own copy
of the rule, fed the same tables), ticks are joined for every policy, zipline too, and a thread joins with its own
push or once its rank is held at its gate (rules.lockstep_join_wait_s): every rank pushes once a round, and the
round's one tick carries every push, as BSP's allreduce does. While every rank is a peer of every other, the join
window widens (AUTO_JOIN_HOLD x the release hold: one period), so that a round whose pushes all come late (a slow
tick delays every rank's next step alike) still lands in one tick, and groups the peers by AUTO_EXIT_SPEED (a rank's
latest step time is noisy: at PEER_SPEED a peer left out of the group joins early and its push misses the tick).
Payloads of SMALL_WORDS and more are joined in lock-step only (probe pacing otherwise, where an empty joined tick
would move the whole payload for nothing), and there a tick is full only after a table that announced pushes
(pending, or a stream begun), a probe otherwise (AutoPacing.full): each round is a joined probe that the ranks'
pushes (or streams) join, then the full tick that carries them, both run by the training thread where it waits for
its own push (run_inline; a streamed round's full tick by the tick thread, which reads the stream). Two collectives
a round, the first of a few hundred words, and a payload never moves empty: not after the last round, not while the
ranks wait in a collective of the script's own (their threads join every tick at once then), whatever a script calls
between its steps. Measurements: docs/benchmarks.md.

All modes share the tick_s back-off (Backoff): the thread looks at most every tick_s, doubling up to max_idle_s
while ticks come back empty; probe pacing sleeps instead until shortly before the next event the table predicts
(rules.next_probe_s), since on a CPU machine probes in between only take cycles from the computation.
"""
from __future__ import annotations

import collections
from typing import Deque, Optional

import numpy as np

from ..table import CHUNK_WORDS
from .rules import (AUTO_EXIT_SPEED, PEER_SPEED, join_wait_s, lockstep_join_wait_s, next_probe_s, nothing_pending,
                    observe_lockstep, predictable, release, still_peers)

BUSY_WINDOW, BUSY = 8, 6   # probe pacing: full ticks without probes while BUSY of the last BUSY_WINDOW ticks had pushes
TICK_PACINGS = ("probe", "join", "auto")   # HVD_ELASTIC_TICK_PACING: the modes below
# auto pacing, while the ranks go relaxed (a policy's relaxed_joins): ticks joined once predictable, under a straggler
# too; joined only while every rank is a peer of every other; never joined (probes; joined in lock-step only)
RELAXED_JOINS = ("always", "peers", "never")
SMALL_WORDS = 1 << 18      # payloads under this may be joined (join, auto); larger ones are probe-paced
AUTO_JOIN_HOLD = 2         # auto pacing, joined ticks while all ranks are peers: join_wait_s's hold (the window of
                           # the first group, how late a peer may push and still be waited for) is this times the
                           # release hold (0.5 of a period by default: one period), so that a round whose pushes all
                           # come late (a slow tick delays every rank's next step alike) still lands in one tick


class Backoff:
    """The tick_s pacing every mode falls back on: how long after a tick the thread looks again (idle_s) -- tick_s
    after a tick that carried or announced pushes, doubling up to max_idle_s while ticks come back empty, or what
    the table predicts (probe pacing's next_probe_s, never under tick_s)."""

    __slots__ = ("tick_s", "max_idle_s", "idle_s")

    def __init__(self, tick_s: float, max_idle_s: float):
        self.tick_s, self.max_idle_s, self.idle_s = tick_s, max(max_idle_s, tick_s), tick_s

    def after(self, active: bool, predicted: Optional[float] = None):
        """After a tick: `active` when it carried or announced pushes; `predicted`: the table's next event."""
        if predicted is not None:
            self.idle_s = max(self.tick_s, predicted)
        else:
            self.idle_s = self.tick_s if active else min(self.idle_s * 2, self.max_idle_s)


class ProbePacing:
    """Probes, releases, and full ticks without probes while busy (payloads under CHUNK_WORDS)."""

    joined = False   # ticks are not joined: the thread issues each one when its deadline comes
    may_join = False
    in_lockstep = False   # (only auto pacing follows the lock-step fallback)

    def __init__(self, numel: int, backoff: Backoff, hold_fraction: float):
        self.backoff, self.hold_fraction = backoff, hold_fraction
        self.busy_pays = numel < CHUNK_WORDS   # an empty full tick costs little beside a probe
        self.release_now = False   # the last probe released the pending pushes: a full tick follows at once
        self.recent: Deque[bool] = collections.deque(maxlen=BUSY_WINDOW)   # busy flags of the last ticks

    def full(self) -> bool:
        """The next tick is full (released, or busy), else a probe."""
        return self.release_now or (self.busy_pays and sum(self.recent) >= BUSY)

    def deadline(self, last: float) -> float:
        """Monotonic time of the next tick after one at `last`: at once after a release."""
        return last if self.release_now else last + self.backoff.idle_s

    def record(self, meta: np.ndarray, full: bool, total: int):
        """A tick completed (full or not, joined or not): the release it decides and its busy flag (a probe that
        holds pending pushes for a peer is not busy: it waits)."""
        self.release_now = not full and release(meta, self.hold_fraction)
        self.recent.append(total > 0 or self.release_now)

    def pace(self, meta: np.ndarray, active: bool):
        self.backoff.after(active, next_probe_s(meta, self.hold_fraction))

    def observe(self, meta: np.ndarray, full: bool, total: int, active: bool):
        self.record(meta, full, total)
        self.pace(meta, active)


class JoinPacing:
    """Every tick full and joined: each thread joins the next tick when join_wait_s says."""

    joined = True
    may_join = True   # a change of the training thread's gate makes the waiting thread decide again
    in_lockstep = False

    def __init__(self, backoff: Backoff, hold_fraction: float):
        self.backoff, self.hold_fraction = backoff, hold_fraction
        self.wide = False   # the peers' wide window (auto pacing, while every rank is a peer)

    def full(self) -> bool:
        return True

    def deadline(self, last: float) -> float:
        """Without a prediction (join_wait_s None), the thread joins tick_s pacing's next tick."""
        return last + self.backoff.idle_s

    def join_wait_s(self, meta: np.ndarray, rank: int, now_ns: int, own_due_ns: Optional[int] = None
                    ) -> Optional[float]:
        """How long this rank's thread waits before it joins the next tick (rules.join_wait_s), from the last table
        with this rank's own row as it stands now, and its own next push as its current step predicts it."""
        hold, speed = (self.hold_fraction * AUTO_JOIN_HOLD, AUTO_EXIT_SPEED) if self.wide \
            else (self.hold_fraction, PEER_SPEED)
        return join_wait_s(meta, rank, now_ns, hold, speed, own_due_ns)

    def pace(self, meta: np.ndarray, active: bool):
        self.backoff.after(active)

    def observe(self, meta: np.ndarray, full: bool, total: int, active: bool):
        self.pace(meta, active)


class AutoPacing:
    """Probe pacing until the pushes are predictable and nothing is pending, join pacing from then on (while every
    rank is a peer of every other only, when stragglers are not joined). The two share one Backoff, and probe
    pacing's release and busy flags follow every tick, joined ones included."""

    may_join = True

    def __init__(self, numel: int, backoff: Backoff, hold_fraction: float, relaxed_joins: str, lockstep=None,
                 large: bool = False):
        self.probe_pacing = ProbePacing(numel, backoff, hold_fraction)
        self.join_pacing = JoinPacing(backoff, hold_fraction)
        self.relaxed_joins = relaxed_joins   # RELAXED_JOINS: when ticks are joined while the ranks go relaxed
        self.lockstep = lockstep   # the policy's lock-step rule (a copy fed the same tables), or None
        self.large = large    # a payload of SMALL_WORDS or more: joined in lock-step only, full after a probe only
        self.announced = False   # the last table announced pushes (pending, or a stream begun)
        self.joined = False   # from the first predictable table with nothing pending, or the first in lock-step

    @property
    def _current(self):
        return self.join_pacing if self.joined else self.probe_pacing

    def full(self) -> bool:
        if self.joined and self.large:
            return self.announced
        return self._current.full()

    def deadline(self, last: float) -> float:
        return self._current.deadline(last)

    @property
    def in_lockstep(self) -> bool:
        return self.lockstep is not None and self.lockstep.lockstep

    def join_wait_s(self, meta: np.ndarray, rank: int, now_ns: int, own_due_ns: Optional[int] = None
                    ) -> Optional[float]:
        if self.in_lockstep:
            return lockstep_join_wait_s(meta, rank)
        return self.join_pacing.join_wait_s(meta, rank, now_ns, own_due_ns)

    def observe(self, meta: np.ndarray, full: bool, total: int, active: bool):
        self.probe_pacing.record(meta, full, total)
        peers = self.join_pacing
        if self.lockstep is not None:
            observe_lockstep(self.lockstep, meta)
        self.announced = self.large and not nothing_pending(meta)   # read by full() for a large payload only
        # In lock-step every rank pushes once a round, as under BSP: joined at once (the lock-step join needs no
        # prediction, nor the peers' window), one collective per round, for any policy
        if self.in_lockstep:
            self.joined = True
        elif self.large or self.relaxed_joins == "never":
            self.joined = False
        elif self.relaxed_joins == "always":
            # joined from the first predictable table with nothing pending (or in lock-step), and for good
            peers.wide = still_peers(meta, peers.wide)
            self.joined = self.joined or (predictable(meta) and nothing_pending(meta))
        else:                      # ... and only while every rank is a peer of every other (zipline)
            self.joined = peers.wide = still_peers(meta, self.joined) and (self.joined or nothing_pending(meta))
        self._current.pace(meta, active)


def make_pacing(mode: str, numel: int, streamed: bool, tick_s: float, max_idle_s: float, hold_fraction: float,
                relaxed_joins: str = "always", lockstep=None):
    """The pacing object of HVD_ELASTIC_TICK_PACING `mode`: join for small payloads only (under SMALL_WORDS, not
    streamed), auto for small payloads and, with a lock-step rule, for large ones (joined in lock-step only), probe
    pacing otherwise; auto for a policy that joins no relaxed tick (relaxed_joins "never") only with a lock-step
    rule."""
    if mode not in TICK_PACINGS:
        raise ValueError(f"unknown tick pacing {mode!r}; accepted: {'|'.join(TICK_PACINGS)}")
    if relaxed_joins not in RELAXED_JOINS:
        raise ValueError(f"relaxed_joins must be one of {RELAXED_JOINS}, got {relaxed_joins!r}")
    backoff = Backoff(tick_s, max_idle_s)
    small = numel < SMALL_WORDS and not streamed
    if small and mode == "join":
        return JoinPacing(backoff, hold_fraction)
    if mode == "auto" and (lockstep is not None or (small and relaxed_joins != "never")):
        return AutoPacing(numel, backoff, hold_fraction, relaxed_joins, lockstep, large=not small)
    return ProbePacing(numel, backoff, hold_fraction)
