"""Tick metadata rides in the update buffer as 16-bit pieces: the Sum over ranks must return it exactly."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic.engine.table import FINISHED, META_COLUMNS, decode_meta, encode_meta


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 6), dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_sum_of_per_rank_encodings_decodes_to_every_rank_row(size, dtype, data):
    values = st.integers(-1, (1 << 62) - 2)
    meta = np.array([[data.draw(values) for _ in range(META_COLUMNS)] for _ in range(size)], np.int64)
    words = META_COLUMNS * 4 * size
    total = np.zeros(words, dtype)
    for rank in range(size):           # each rank fills only its row, as in a tick
        mine = np.full((size, META_COLUMNS), -1, np.int64)
        mine[rank] = meta[rank]
        buf = np.zeros(words, dtype)
        encode_meta(mine, buf)
        total += buf
    assert (decode_meta(total, size) == meta).all()


def _table(rows):
    """A tick table from {column: values} (one value per rank); other columns -1."""
    from hvd_elastic.engine import table as tk
    size = len(next(iter(rows.values())))
    meta = np.full((size, META_COLUMNS), -1, np.int64)
    meta[:, tk.FINISHED] = 0
    for col, vals in rows.items():
        meta[:, getattr(tk, col)] = vals
    return meta


def test_next_probe_is_the_earliest_predicted_event_in_each_rows_own_clock():
    from hvd_elastic.engine.pacing.rules import OVERDUE_POLL, QUIET_MARGIN, QUIET_MAX_S, next_probe_s
    ms = 1_000_000
    # rank 0: last push 10 ms before its snapshot, period 100 ms -> next push in 90 ms, probe 25 ms before it;
    # rank 1 (a clock 5 s off: only differences within its row count): next push in 40 ms -> the earliest
    meta = _table({"LAST_PUSH_NS": [990 * ms, 5960 * ms], "NOW_NS": [1000 * ms, 6000 * ms],
                   "PERIOD_NS": [100 * ms, 80 * ms]})
    assert abs(next_probe_s(meta) - (80 * (1 - QUIET_MARGIN) - 40) / 1000) < 1e-9
    # a rank that streams begins LEAD_NS before its push: rank 1 with a 15 ms lead -> 5 ms
    lead = _table({"LAST_PUSH_NS": [990 * ms, 5960 * ms], "NOW_NS": [1000 * ms, 6000 * ms],
                   "PERIOD_NS": [100 * ms, 80 * ms], "LEAD_NS": [-1, 15 * ms]})
    assert abs(next_probe_s(lead) - 0.005) < 1e-9
    assert next_probe_s(_table({"LAST_PUSH_NS": [0], "NOW_NS": [1], "PERIOD_NS": [10_000 * ms]})) == QUIET_MAX_S
    # a rank past its predicted push: looked for every OVERDUE_POLL of its period
    late = _table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [90 * ms, 10], "PERIOD_NS": [100 * ms, 100 * ms]})
    assert abs(next_probe_s(late) - OVERDUE_POLL * 0.1) < 1e-9
    # an unmeasured period: no prediction at all
    assert next_probe_s(_table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [1, 1], "PERIOD_NS": [100 * ms, -1]})) is None
    # a finished rank is ignored
    fin = _table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [0, 0], "PERIOD_NS": [100 * ms, -1]})
    fin[1, FINISHED] = 1
    assert abs(next_probe_s(fin) - 0.075) < 1e-9
    # a pending push held for a peer: the hold's end (50 ms period x 0.5 = 25 ms after 100 ms) is the next event
    held = _table({"PENDING": [1, 0], "PENDING_SINCE_NS": [100 * ms, -1], "NOW_NS": [105 * ms, 105 * ms],
                   "PERIOD_NS": [50 * ms, 200 * ms], "LAST_PUSH_NS": [50 * ms, 60 * ms]})
    assert abs(next_probe_s(held, hold_fraction=0.5) - 0.020) < 1e-9


def test_release_holds_for_a_peer_due_within_the_window_and_never_for_a_slower_rank():
    from hvd_elastic.engine.pacing.rules import release
    ms = 1_000_000
    # rank 0 pending since t=100 ms (period 50 ms: hold 25 ms); rank 1 pushed at 60 ms, period 50 -> due at 110
    base = {"PENDING": [1, 0], "PENDING_SINCE_NS": [100 * ms, -1], "NOW_NS": [105 * ms, 105 * ms],
            "PERIOD_NS": [50 * ms, 50 * ms], "LAST_PUSH_NS": [50 * ms, 60 * ms]}
    assert not release(_table(base))
    late = dict(base, NOW_NS=[126 * ms, 126 * ms])          # the oldest pending push waited past the hold
    assert release(_table(late))
    straggler = dict(base, PERIOD_NS=[50 * ms, 300 * ms])    # rank 1 due at 360 ms: not within the window
    assert release(_table(straggler))
    assert not release(_table(dict(base, PENDING=[0, 0])))   # nothing pending: nothing to release
    assert release(_table(base), hold_fraction=0)           # no hold configured
    # a rank that has begun streaming counts as pending
    assert not release(_table(dict(base, PENDING=[0, 0], STREAM=[1, 0])))
    # a rank that streams is due when its stream begins, LEAD_NS before its push: rank 1's push is due at 160 ms,
    # after the window (130 ms); with a 40 ms stream it begins at 120 ms, inside it (rank 1 is a peer by its step
    # compute time, 45 ms vs 40: its longer period is waiting)
    slower = dict(base, PERIOD_NS=[50 * ms, 100 * ms], INTERVAL_NS=[40 * ms, 45 * ms])
    assert release(_table(slower))
    assert not release(_table(dict(slower, LEAD_NS=[0, 40 * ms])))
    # a rank more than PEER_SPEED slower than the fastest pusher is never held for, even when it is due within the
    # window: here rank 1 (step compute 150 ms vs 40, due at 110 ms) -- by compute time, or by period while no
    # compute time is measured
    assert release(_table(dict(base, INTERVAL_NS=[40 * ms, 150 * ms])))
    assert not release(_table(dict(base, INTERVAL_NS=[40 * ms, 50 * ms])))      # 1.25x: a peer, held for
    assert release(_table(dict(base, PERIOD_NS=[50 * ms, 70 * ms], LAST_PUSH_NS=[50 * ms, 40 * ms])))
    # a faster rank due within the window is held for: a slow rank's push waits for it (one tick for both)
    assert not release(_table(dict(base, INTERVAL_NS=[120 * ms, 40 * ms])))
    # a rank held at its gate (a barrier, a staleness bound) pushes only after a tick opens it: never waited for
    assert release(_table(dict(base, GATED=[0, 1])))
    assert not release(_table(dict(base, GATED=[0, 0])))
    # the first pushes: periods not measured yet. A pusher's hold is half its step compute time (40 ms: 20 ms), and
    # a live, ungated rank without a period is expected within it, unless its step time says it is slower
    first = dict(base, PERIOD_NS=[-1, -1], LAST_PUSH_NS=[-1, -1], INTERVAL_NS=[40 * ms, -1])
    assert not release(_table(first))                                            # waited 5 ms of 20
    assert release(_table(dict(first, NOW_NS=[121 * ms, 121 * ms])))             # 21 ms
    assert release(_table(dict(first, INTERVAL_NS=[40 * ms, 150 * ms])))         # rank 1 is slower
    assert release(_table(dict(first, GATED=[0, 1])))
    assert release(_table(dict(first, INTERVAL_NS=[-1, -1])))                    # nothing to hold by


def test_small_payload_join_waits_for_the_own_push_in_the_first_group_and_sits_otherwise():
    """join_wait_s (small payloads: every tick full): worked out by hand on a 3-rank table, common clock in ms."""
    from hvd_elastic.engine.pacing.rules import OVERDUE_POLL, QUIET_MARGIN, QUIET_MAX_S, join_wait_s
    from hvd_elastic.engine.table import GATED, INTERVAL_NS, LAST_PUSH_NS
    ms = 1_000_000
    # ranks 0, 1 fast (period 40 ms, next pushes at 140 and 145), rank 2 slow (computes 100 ms, period 120 ms, next
    # push at 150); the fast ranks compute 30 ms of their 40 ms period
    meta = _table({"LAST_PUSH_NS": [100 * ms, 105 * ms, 30 * ms], "PERIOD_NS": [40 * ms, 40 * ms, 120 * ms],
                   "INTERVAL_NS": [30 * ms, 30 * ms, 100 * ms], "NOW_NS": [110 * ms] * 3})
    now = 120 * ms
    # rank 0 is in the first group (earliest at 140; rank 1 is its peer, due within the 20 ms hold): it waits for
    # its own push, at most a hold past its prediction: 140 + 20 - 120 = 40 ms
    assert abs(join_wait_s(meta, 0, now) - 0.040) < 1e-9
    assert abs(join_wait_s(meta, 1, now) - 0.045) < 1e-9
    # rank 2 is not a peer of the fast ranks (it computes 3.3x longer), although due within the hold: it joins
    # QUIET_MARGIN of a period before their first push and waits inside the collective (its own push would make it
    # join at once)
    assert abs(join_wait_s(meta, 2, now) - (140 - QUIET_MARGIN * 40 - 120) / 1000) < 1e-9
    # peers by compute time, not push period: with a 30 ms compute time rank 2 is a peer and waits for its push, at
    # most a hold of the group's shortest period (20 ms) past its prediction: 150 + 20 - 120
    assert abs(join_wait_s(_with(meta, 2, INTERVAL_NS, 30 * ms), 2, now) - 0.050) < 1e-9
    # the slow rank due first (its push at 130): the faster ranks due within its window (half its period: 140, 145)
    # are in its group. It waits for its push at most until their first predicted push (140), not a whole hold of
    # its period (60 ms): a straggler's late push must not hold the fast ranks' pushes back ...
    early = _with(meta, 2, LAST_PUSH_NS, 10 * ms)
    assert abs(join_wait_s(early, 2, now) - 0.020) < 1e-9
    # ... and the fast ranks wait for their own pushes (a hold past each: 140 + 20 - 120, 145 + 20 - 120), which
    # join its tick, rather than sit in it early and send theirs in a tick of their own after it
    assert abs(join_wait_s(early, 0, now) - 0.040) < 1e-9 and abs(join_wait_s(early, 1, now) - 0.045) < 1e-9
    # a fast rank due past the slow one's window (at 200 > 130 + 60) is not in its group: it joins early
    late = _with(early, 1, LAST_PUSH_NS, 160 * ms)
    assert join_wait_s(late, 1, now) == 0.0
    # held at its gate, rank 0 is not due: it sits like rank 2, before rank 1's push at 145
    assert abs(join_wait_s(_with(meta, 0, GATED, 1), 0, now) - (145 - QUIET_MARGIN * 40 - 120) / 1000) < 1e-9
    # two ranks; rank 1 overdue (at 170 ms: 25 ms past its push at 145, more than its 20 ms hold): rank 0, held at
    # its gate, looks again OVERDUE_POLL of rank 1's period after the table's tick (its snapshot at 169 ms) -- counted
    # from the tick, so that a thread re-evaluating its wait does not push the poll back every time
    pair = _table({"LAST_PUSH_NS": [100 * ms, 105 * ms], "PERIOD_NS": [40 * ms, 40 * ms],
                   "NOW_NS": [168 * ms, 169 * ms], "GATED": [1, 0]})
    assert abs(join_wait_s(pair, 0, 170 * ms) - (169 + OVERDUE_POLL * 40 - 170) / 1000) < 1e-9
    assert join_wait_s(pair, 0, 172 * ms) == 0.0
    # nobody due soon: capped at QUIET_MAX_S
    far = _table({"LAST_PUSH_NS": [0, 0, 0], "PERIOD_NS": [10_000 * ms] * 3, "NOW_NS": [0] * 3})
    assert join_wait_s(far, 0, 0) == QUIET_MAX_S
    # a due rank's period not measured yet: no prediction (tick_s pacing) ...
    assert join_wait_s(_table({"LAST_PUSH_NS": [0, -1], "PERIOD_NS": [40 * ms, -1], "NOW_NS": [0, 0]}), 0, 0) is None
    # ... unless that rank has finished; another rank's GATED does not count (it was held before the tick, which
    # may have let it go), this rank's own does (its row is its live state)
    unmeasured = _table({"LAST_PUSH_NS": [0, -1], "PERIOD_NS": [40 * ms, -1], "NOW_NS": [0, 0], "GATED": [0, 1]})
    assert join_wait_s(unmeasured, 0, 0) is None
    assert abs(join_wait_s(_with(unmeasured, 1, FINISHED, 1), 0, 0) - 0.060) < 1e-9


def test_lockstep_join_waits_for_the_own_push_however_late_and_never_on_a_prediction():
    """lockstep_join_wait_s (the ranks go in lock-step): a thread not held at its gate waits for its rank's push
    (re-decided on every change, at the latest after LOCKSTEP_RECHECK_S), where join_wait_s would join without it;
    held at its gate (or outside), it joins at once."""
    from hvd_elastic.engine.pacing.rules import LOCKSTEP_RECHECK_S, join_wait_s, lockstep_join_wait_s
    from hvd_elastic.engine.table import GATED
    ms = 1_000_000
    # rank 0 predicted to push at 140 ms; at 200 ms it is 60 ms late: the relaxed join goes in without the push
    meta = _table({"LAST_PUSH_NS": [100 * ms, 105 * ms], "PERIOD_NS": [40 * ms, 40 * ms],
                   "INTERVAL_NS": [30 * ms, 30 * ms], "NOW_NS": [110 * ms] * 2})
    assert join_wait_s(meta, 0, 200 * ms) == 0.0
    assert lockstep_join_wait_s(meta, 0) == LOCKSTEP_RECHECK_S
    assert lockstep_join_wait_s(_with(meta, 0, GATED, 1), 0) == 0.0
    # another rank's gate decides nothing for this one
    assert lockstep_join_wait_s(_with(meta, 1, GATED, 1), 0) == LOCKSTEP_RECHECK_S


def _with(meta, rank, column, value):
    out = meta.copy()
    out[rank, column] = value
    return out


def test_all_peers_when_every_live_rank_is_a_measured_peer():
    """all_peers (auto pacing's wide join window): step compute times (INTERVAL_NS, else the push period) within the
    factor of each other, every live push period and last sent push known (predictable: auto pacing joins from the
    first such table with nothing pending, peers or not); finished ranks do not count."""
    from hvd_elastic.engine.pacing.rules import AUTO_EXIT_SPEED, PEER_SPEED, all_peers, predictable
    from hvd_elastic.engine.table import INTERVAL_NS, LAST_PUSH_NS, PERIOD_NS
    ms = 1_000_000
    equal = _table({"INTERVAL_NS": [30 * ms, 36 * ms, 32 * ms], "PERIOD_NS": [40 * ms, 41 * ms, 40 * ms],
                    "LAST_PUSH_NS": [0, 2 * ms, 1 * ms]})
    assert all_peers(equal) and all_peers(equal, AUTO_EXIT_SPEED)
    noisy = _with(equal, 1, INTERVAL_NS, 40 * ms)        # 1.33x the fastest: not to enter, not enough to leave
    assert not all_peers(noisy, PEER_SPEED) and all_peers(noisy, AUTO_EXIT_SPEED)
    straggler = _with(equal, 2, INTERVAL_NS, 90 * ms)    # 3x
    assert not all_peers(straggler, AUTO_EXIT_SPEED) and predictable(straggler)
    assert all_peers(_with(straggler, 2, FINISHED, 1))   # the straggler finished: the others are peers
    for unknown in (_with(equal, 0, PERIOD_NS, -1), _with(equal, 2, LAST_PUSH_NS, -1)):
        # a period not measured, or no push sent yet: no prediction to join by ...
        assert not all_peers(unknown) and not predictable(unknown)
        assert predictable(_with(unknown, 0 if unknown[0, PERIOD_NS] < 0 else 2, FINISHED, 1))   # ... unless finished
    unmeasured = _with(_with(equal, 0, INTERVAL_NS, -1), 0, PERIOD_NS, 38 * ms)   # the period stands in
    assert all_peers(unmeasured)
    none_live = _table({"FINISHED": [1, 1], "PERIOD_NS": [40 * ms] * 2, "LAST_PUSH_NS": [0, 0]})
    assert not all_peers(none_live) and not predictable(none_live)


def test_still_peers_enters_at_peer_speed_and_leaves_past_the_exit_speed():
    """still_peers (auto pacing's joins, zipline's barriers at the bound): hysteresis over a sequence of tables."""
    from hvd_elastic.engine.pacing.rules import still_peers
    from hvd_elastic.engine.table import INTERVAL_NS
    ms = 1_000_000
    equal = _table({"INTERVAL_NS": [30 * ms, 36 * ms, 32 * ms], "PERIOD_NS": [40 * ms, 41 * ms, 40 * ms],
                    "LAST_PUSH_NS": [0, 2 * ms, 1 * ms]})
    noisy = _with(equal, 1, INTERVAL_NS, 40 * ms)        # 1.33x the fastest
    slow = _with(equal, 1, INTERVAL_NS, 50 * ms)         # 1.67x
    peers, seen = False, []
    for table in (noisy, equal, noisy, slow, noisy, equal):
        peers = still_peers(table, peers)
        seen.append(peers)
    assert seen == [False, True, True, False, False, True]


def _zipline_after(meta, barriers=0):
    """A zipline policy (R = 15) that has seen one tick with table `meta` (every rank two pushes in); `barriers`:
    barriers already behind it."""
    from types import SimpleNamespace

    from hvd_elastic.config import Config
    from hvd_elastic.engine.policies.zipline import Zipline
    from hvd_elastic.engine.view import GlobalView
    pol = Zipline(Config(policy="zipline", lookahead=15, relax_min_gain=0), rank=0, size=len(meta))   # its own rule
    pol.barriers = barriers
    view = GlobalView(len(meta))
    view.update(meta)
    pol.observe(SimpleNamespace(meta=meta, index=1), view)
    return pol


def test_zipline_first_barrier_of_ranks_within_the_exit_speed_goes_to_the_bound():
    """zipline's first barrier (engine/policies/zipline.py Zipline.observe): warm-up step times 1.33x apart (within
    AUTO_EXIT_SPEED, not PEER_SPEED) still count as peers before the first barrier, so its targets are the bound at
    one clock for every rank -- ZipLine's windows gave equally fast ranks targets a clock apart there (a split round).
    After a first barrier the entry test applies again; a 3x straggler goes to ZipLine's windows either way."""
    from hvd_elastic.engine.table import INTERVAL_NS
    ms = 1_000_000
    noisy = _table({"COUNT": [1, 1, 1, 1], "CLOCK": [2, 2, 2, 2], "LAST_PUSH_NS": [80 * ms, 81 * ms, 80 * ms, 80 * ms],
                    "INTERVAL_NS": [30 * ms, 40 * ms, 30 * ms, 30 * ms],
                    "PERIOD_NS": [40 * ms, 41 * ms, 40 * ms, 40 * ms]})
    first = _zipline_after(noisy)
    assert first.at_bound == 1 and first.targets.tolist() == [15, 15, 15, 15] and not first.spreads_ns
    later = _zipline_after(noisy, barriers=1)
    assert later.at_bound == 0 and len(later.spreads_ns) == 1      # ZipLine's windows placed it
    straggler = _with(noisy, 3, INTERVAL_NS, 90 * ms)
    for pol in (_zipline_after(straggler), _zipline_after(straggler, barriers=1)):
        assert pol.at_bound == 0 and len(pol.spreads_ns) == 1 and pol.targets is not None


def test_lbbsp_rows_in_float32_sum_to_every_rank_row():
    """The PyTorch lbbsp step submits its table in the gradients' dtype (float32 here) so Horovod fuses it with
    them: the Sum of the ranks' rows still decodes exactly, step times of minutes in ns included."""
    from hvd_elastic.config import Config
    from hvd_elastic.engine.table import META_PIECES
    from hvd_elastic.lbbsp import LbbspController
    from hvd_elastic.telemetry import Telemetry

    size = 4
    cfg = Config.from_env({}, policy="lbbsp", global_batch=128)
    ctls = [LbbspController(cfg, rank, size, Telemetry(rank, size, "lbbsp")) for rank in range(size)]
    for r, ctl in enumerate(ctls):
        ctl.drawn, ctl.pass_start = 30 + r, bool(r % 2)
    compute_s = [183.0 + 7e-9 * r for r in range(size)]
    rows = [ctl.row(s, np.float32) for ctl, s in zip(ctls, compute_s)]
    assert all(r.dtype == np.float32 and len(r) == size * 3 * META_PIECES for r in rows)
    table = decode_meta(np.sum(rows, axis=0), size, 3)
    assert table.tolist() == [[int(compute_s[r] * 1e9), 30 + r, r % 2] for r in range(size)]
