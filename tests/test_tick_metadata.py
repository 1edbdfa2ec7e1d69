"""Tick metadata rides in the update buffer as 16-bit pieces: the Sum over ranks must return it exactly."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic.engine.ticker import FINISHED, META_COLUMNS, decode_meta, encode_meta


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
    from hvd_elastic.engine import ticker as tk
    size = len(next(iter(rows.values())))
    meta = np.full((size, META_COLUMNS), -1, np.int64)
    meta[:, tk.FINISHED] = 0
    for col, vals in rows.items():
        meta[:, getattr(tk, col)] = vals
    return meta


def test_next_probe_is_the_earliest_predicted_event_in_each_rows_own_clock():
    from hvd_elastic.engine.ticker import OVERDUE_POLL, QUIET_MARGIN, QUIET_MAX_S, next_probe_s
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


def test_release_holds_for_a_peer_due_within_the_window_and_never_for_a_straggler():
    from hvd_elastic.engine.ticker import release
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
    # after the window (130 ms); with a 40 ms stream it begins at 120 ms, inside it
    slower = dict(base, PERIOD_NS=[50 * ms, 100 * ms])
    assert release(_table(slower))
    assert not release(_table(dict(slower, LEAD_NS=[0, 40 * ms])))
    # a rank held at its gate (a barrier, a staleness bound) pushes only after a tick opens it: never waited for
    assert release(_table(dict(base, GATED=[0, 1])))
    assert not release(_table(dict(base, GATED=[0, 0])))
