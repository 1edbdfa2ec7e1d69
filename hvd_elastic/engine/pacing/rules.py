"""The pacing rules: pure functions of a tick's table (engine/table.py) that every rank evaluates alike -- whether a
probe releases the pending pushes (release), when the thread looks again (next_probe_s), when a thread joins the
next tick (join_wait_s, lockstep_join_wait_s), whether the pushes are predictable and the ranks peers, and the
lock-step rule's feed (observe_lockstep). The pacing modes (engine/pacing/__init__.py) decide from them; the tick
loop (engine/loop.py) waits as they say.

Words: a rank's *push* adds an update to its next tick; *pending* pushes wait for a full tick; a *probe* carries the
table alone; a *release* is the decision, after a probe, to send the pending pushes in a full tick now; the *hold* is
how long a release waits for ranks due to push (a fraction of a period); a rank's *peers* are the ranks whose step
compute time is within PEER_SPEED of its own; a thread *joins* a tick when it enters the tick's collective
(engine/ticker.py has the full glossary).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..table import (CLOCK, FINISHED, GATED, INTERVAL_NS, LAST_PUSH_NS, LEAD_NS, NOW_NS, OUTSIDE, PENDING,
                     PENDING_SINCE_NS, PERIOD_NS, STREAM)

# next_probe_s, join_wait_s: probe QUIET_MARGIN of a period before a rank's predicted push; never sleep longer than
# QUIET_MAX_S between ticks; look for a rank past its predicted push every OVERDUE_POLL of its period.
QUIET_MARGIN, QUIET_MAX_S, OVERDUE_POLL = 0.25, 0.25, 0.05
LOCKSTEP_RECHECK_S = 0.5   # lockstep_join_wait_s: how long a thread waits for its rank's push or gate before it
                           # decides again (every push, gate change, finish or outside wakes it before that)
PEER_SPEED = 1.25          # a rank whose step compute time is within this factor of another's is its peer (peer
                           # alignment in policies/base.py, the release's hold, join groups in join_wait_s)
AUTO_EXIT_SPEED = 1.5      # still_peers: the ranks stay peers until a live rank is this much slower than another
HOLD_FRACTION = 0.5        # default release hold, a fraction of the pushers' step period (HVD_ELASTIC_PEER_WAIT)


def _pending_rows(meta: np.ndarray) -> np.ndarray:
    """Rows with pushes waiting or a streamed push announced."""
    return (meta[:, PENDING] > 0) | (meta[:, STREAM] > 0)


def nothing_pending(meta: np.ndarray) -> bool:
    """No row has pushes waiting or a streamed push announced (auto pacing joins ticks only from such a table: a
    probe's pending pushes go out in its release's full tick)."""
    return not _pending_rows(meta).any()


def _next_start_ns(meta: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Predicted start of each row's next push (for a rank that streams, of its stream: LEAD_NS earlier), in the
    row's own clock: what release() waits for and what next_probe_s() wakes up for."""
    return meta[rows, LAST_PUSH_NS] + meta[rows, PERIOD_NS] - np.maximum(meta[rows, LEAD_NS], 0)


def _step_ns(meta: np.ndarray) -> np.ndarray:
    """Per row, how fast the rank is: its step compute time (INTERVAL_NS), or its push period while that is not
    measured. (The period includes waiting, which converges the ranks' periods where they wait for each other.)"""
    return np.where(meta[:, INTERVAL_NS] > 0, meta[:, INTERVAL_NS], meta[:, PERIOD_NS])


def _measured(meta: np.ndarray, rows: np.ndarray) -> bool:
    """These rows' push period and last push are known: their next push can be predicted."""
    return bool((meta[rows, PERIOD_NS] > 0).all() and (meta[rows, LAST_PUSH_NS] >= 0).all())


def predictable(meta: np.ndarray) -> bool:
    """Every live rank's push period and last push are known, so join_wait_s can predict the next pushes (before,
    joins would pace by tick_s, and a lone first push could go out in a tick of its own). Auto pacing joins ticks
    from the first table after this in which nothing is pending."""
    live = meta[:, FINISHED] == 0
    return bool(live.any() and _measured(meta, live))


def all_peers(meta: np.ndarray, factor: float = PEER_SPEED) -> bool:
    """Every live rank's push period and step compute time (_step_ns) are measured (predictable), and the step times
    are within `factor` of each other: nobody is a straggler."""
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
    has waited less than that window; a rank more than QUIET_MARGIN of its period past its predicted push is not due.
    Only a rank at most PEER_SPEED slower than the fastest pusher is held for
    (a peer, or a faster rank): a push is never held for a slower rank, as peer alignment never waits for one
    (policies/base.py) -- under asp a hold for a straggler due within a fast rank's window would sit on the fast
    ranks' critical path (they wait for their own push). A rank held at its gate (GATED) is never due: it pushes only
    after a tick opens its gate, so holding for it only delays that tick (under zipline, every barrier by the hold:
    close to a step)."""
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
    start = _next_start_ns(meta, measured)
    # its next push (or stream) starts within the window, and is not overdue by more than QUIET_MARGIN of its period
    # (a rank that slowed down since its last push: holding for it keeps the pushers' tick back for nothing)
    due = (start <= now + hold) & (start >= now - QUIET_MARGIN * meta[measured, PERIOD_NS])
    # A rank whose period is not measured yet (its first two pushes: the ranks start together) is expected within
    # the window unless its step time already says it is slower: without this a lone first push goes out in a tick
    # of its own and splits the round (the trajectories then leave Horovod's from the first step).
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
                peer_speed: float = PEER_SPEED, own_due_ns: Optional[int] = None) -> Optional[float]:
    """Joined ticks (every tick full; it fires when the last rank's thread joins it, so *when* each thread joins
    decides what a tick carries): how long this rank's thread waits before it joins the next tick, from the last
    tick's table with this rank's own row as it stands now (a push of its own makes it join at once; 0: join now
    and wait inside the collective for the others). No rank needs to agree with another on it: every tick has the
    same shape.

    The due ranks are the live ones whose next push the table predicts (last push + period), this rank only if it is
    not held at its gate (another rank's GATED is from before the tick, which may have let it go). The first group
    is the earliest due rank and the ranks no slower than its peers (step compute time, INTERVAL_NS, at most
    `peer_speed` times its own: the push period would not do, it includes the time a rank waits) predicted within a
    hold (`hold_fraction` of the first's period) after it: the pushes the next tick waits for. A member waits for its
    own push, at most a hold (of the group's shortest period) past its prediction and never past the predicted push
    of a rank more than `peer_speed` faster than itself (a straggler's late push must not hold the fast ranks'
    pushes back); then it joins empty-handed and its push goes into the next tick. A straggler due first thus
    waits for its own push until the fast ranks' pushes, which join its tick: had they joined early instead, their
    pushes made while waiting inside the straggler's tick would go into a tick of their own after it, which makes
    the fast ranks' gradients one update stale and can sit on their critical path (docs/design.md, "Pacing"). Every
    other rank joins QUIET_MARGIN of a period before the first predicted push and waits inside the collective, so
    the tick fires as soon as the group has pushed. A rank more than a hold past its predicted push (overdue) is no
    longer waited for: ranks outside the group look for it OVERDUE_POLL of its period after the table's tick. Times
    are compared on the job's common clock (now_ns, LAST_PUSH_NS: ns since the shared epoch), as ZipLine's barriers
    compare them. None when no rank is due or a due rank's period is not measured yet (no prediction: pace by
    tick_s).

    `own_due_ns`: this rank's next push as its current step predicts it (OwnRow.own_due_ns: the step's start plus
    its compute time), which replaces the table's prediction for this rank. Its own push is then waited for only
    QUIET_MARGIN of its step time past that prediction: a push later than that comes from a step that is slower
    than the last one (a transient slowdown), and waiting a hold for it keeps every other rank of the group waiting
    inside the collective for nothing."""
    live = meta[:, FINISHED] == 0
    live[rank] &= meta[rank, GATED] <= 0
    if not live.any() or not _measured(meta, live):
        return None
    period = meta[:, PERIOD_NS].astype(np.float64)
    speed = _step_ns(meta).astype(np.float64)
    rel = (meta[:, LAST_PUSH_NS] + meta[:, PERIOD_NS]).astype(np.float64) - now_ns
    own_hold = hold_fraction * period
    if own_due_ns is not None:
        rel[rank] = float(own_due_ns - now_ns)
        own_hold = own_hold.copy()
        own_hold[rank] = QUIET_MARGIN * float(speed[rank])
    overdue = live & (rel < -own_hold)
    on_time = live & ~overdue
    # the poll counts from the table's tick (its last row's snapshot), not from now: re-evaluated, it still comes
    events = [float(meta[:, NOW_NS].max()) + OVERDUE_POLL * float(period[overdue].min()) - now_ns] \
        if overdue.any() else []
    if on_time.any():
        first = int(np.flatnonzero(on_time)[np.argmin(rel[on_time])])
        group = on_time & (speed <= peer_speed * speed[first]) \
            & (rel <= rel[first] + hold_fraction * period[first])
        if group[rank]:       # wait for the own push (an overdue rank's poll would only make it miss the tick)
            deadline = rel[rank] + (own_hold[rank] if own_due_ns is not None else
                                    hold_fraction * float(period[group].min()))
            faster = on_time & (speed * peer_speed < speed[rank])
            events = [min(deadline, float(rel[faster].min())) if faster.any() else deadline]
        else:
            events.append(rel[first] - QUIET_MARGIN * period[first])
    return float(min(max(min(events), 0.0) / 1e9, QUIET_MAX_S))


def lockstep_join_wait_s(meta: np.ndarray, rank: int) -> float:
    """Joined ticks while the ranks go in lock-step (every rank pushes once a round, and the round's tick must carry
    every push, as BSP's allreduce does): this rank's thread joins with its own push (a pending push joins at once)
    or, while its training thread is held at its gate or waits outside (GATED in the table with this rank's row as
    it stands now: it pushes nothing before the tick that releases it), at once; otherwise it waits for either,
    however late the push comes -- no prediction, so a step slower than the last one cannot split the round over
    two ticks (the others would wait for the second tick's collective too)."""
    return 0.0 if meta[rank, GATED] > 0 else LOCKSTEP_RECHECK_S


def observe_lockstep(rule, meta: np.ndarray) -> bool:
    """Feed a lock-step rule (hvd_elastic._native.LockstepRule) one tick's table: each rank's clock, its latest
    push's step compute time and time, finished flag and whether it waits in a collective of the script's own.
    Returns whether the ranks go in lock-step after it."""
    return rule.observe(meta[:, CLOCK].tolist(), meta[:, INTERVAL_NS].tolist(), meta[:, LAST_PUSH_NS].tolist(),
                        (meta[:, FINISHED] > 0).tolist(), (meta[:, OUTSIDE] > 0).tolist())
