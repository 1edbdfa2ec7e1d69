"""Tick metadata rides in the update buffer as 16-bit pieces: the Sum over ranks must return it exactly."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic.engine.ticker import META_COLUMNS, decode_meta, encode_meta


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
