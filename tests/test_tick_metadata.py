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


def test_quiet_time_is_the_earliest_predicted_push_less_the_margin_per_row_clock():
    from hvd_elastic.engine.ticker import QUIET_MARGIN, QUIET_MAX_S, quiet_s
    ms = 1_000_000
    # rank 0: last push 10 ms before its snapshot, period 100 ms -> next push in 90 ms, probe 25 ms before it;
    # rank 1 (a clock 5 s off: only differences within its row count): next push in 40 ms -> the earliest
    meta = _table({"LAST_PUSH_NS": [990 * ms, 5960 * ms], "NOW_NS": [1000 * ms, 6000 * ms],
                   "PERIOD_NS": [100 * ms, 80 * ms]})
    assert abs(quiet_s(meta) - (80 * (1 - QUIET_MARGIN) - 40) / 1000) < 1e-9
    assert quiet_s(_table({"LAST_PUSH_NS": [0], "NOW_NS": [1], "PERIOD_NS": [10_000 * ms]})) == QUIET_MAX_S
    # a rank overdue: no quiet time; an unmeasured period: none either (no prediction)
    assert quiet_s(_table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [90 * ms, 10], "PERIOD_NS": [100 * ms, 100 * ms]})) == 0
    assert quiet_s(_table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [1, 1], "PERIOD_NS": [100 * ms, -1]})) == 0
    # a finished rank is ignored
    fin = _table({"LAST_PUSH_NS": [0, 0], "NOW_NS": [0, 0], "PERIOD_NS": [100 * ms, -1]})
    fin[1, FINISHED] = 1
    assert abs(quiet_s(fin) - 0.075) < 1e-9


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
