"""ElasticBSP barrier placement: ZipLine, GridScan and FullGridScan against an exact brute-force oracle.

The order on solutions (docs/native.md): smallest d_Z = max(Z) - min(Z), then the earliest barrier max(Z), then the
lexicographically smallest vector of iteration counts j. The oracle below enumerates all R^n choices.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N


def brute_force_barrier(rows):
    """O(R^n) oracle: (d_Z, max(Z), j) minimal over every choice of one point per worker (j 1-based)."""
    best = None
    for idx in itertools.product(*(range(len(r)) for r in rows)):
        z = [rows[p][i] for p, i in enumerate(idx)]
        key = (max(z) - min(z), max(z), tuple(i + 1 for i in idx))
        if best is None or key < best:
            best = key
    return best


def key_of(barrier):
    return (barrier.spread_ns, barrier.barrier_ns, tuple(barrier.iterations))


@st.composite
def grids(draw, max_n=5, max_r=6, max_step=6):
    """n sorted rows of R predicted push times; small steps make ties and equal points frequent."""
    n = draw(st.integers(1, max_n))
    r = draw(st.integers(1, max_r))
    rows = []
    for _ in range(n):
        start = draw(st.integers(0, 20))
        steps = draw(st.lists(st.integers(0, max_step), min_size=r - 1, max_size=r - 1))
        rows.append(list(itertools.accumulate([start] + steps)))
    return rows


def check_is_valid_barrier(rows, b):
    n, r = len(rows), len(rows[0])
    assert len(b.iterations) == n
    z = []
    for p in range(n):
        assert 1 <= b.iterations[p] <= r
        z.append(rows[p][b.iterations[p] - 1])
    assert max(z) == b.barrier_ns and min(z) == b.earliest_ns
    assert b.spread_ns == b.barrier_ns - b.earliest_ns


@settings(max_examples=400, deadline=None)
@given(grids())
def test_zipline_matches_brute_force_on_small_cases(rows):
    b = N.zipline_barrier(rows)
    check_is_valid_barrier(rows, b)
    assert key_of(b) == brute_force_barrier(rows)


def test_zipline_matches_brute_force_on_every_tiny_case():
    # Exhaustive: every pair and triple of sorted rows of length 2 with points in 0..3.
    rows_r2 = [list(r) for r in itertools.combinations_with_replacement(range(4), 2)]
    for n in (2, 3):
        for rows in itertools.product(rows_r2, repeat=n):
            rows = [list(r) for r in rows]
            assert key_of(N.zipline_barrier(rows)) == brute_force_barrier(rows), rows


@settings(max_examples=200, deadline=None)
@given(grids())
def test_fullgridscan_matches_brute_force_on_small_cases(rows):
    assert key_of(N.fullgridscan_barrier(rows)) == brute_force_barrier(rows)


@settings(max_examples=60, deadline=None)
@given(grids(max_n=40, max_r=30, max_step=50))
def test_zipline_matches_fullgridscan_on_medium_cases(rows):
    assert N.zipline_barrier(rows) == N.fullgridscan_barrier(rows)


@settings(max_examples=200, deadline=None)
@given(grids(max_n=12, max_r=10, max_step=20))
def test_gridscan_is_a_valid_barrier_never_better_than_zipline(rows):
    g, z = N.gridscan_barrier(rows), N.zipline_barrier(rows)
    check_is_valid_barrier(rows, g)
    assert (g.spread_ns, g.barrier_ns) >= (z.spread_ns, z.barrier_ns)


def test_gridscan_can_miss_the_optimum():
    # GridScan only tries the slowest row's points (row 1, whose last point is latest); the optimal window {10, 0}
    # has its max on row 0.
    rows = [[10, 100], [0, 200]]
    assert key_of(N.zipline_barrier(rows)) == (10, 10, (1, 1))
    assert key_of(N.gridscan_barrier(rows)) == (100, 200, (2, 2))


def test_ties_go_to_the_earliest_barrier_and_fewest_iterations():
    # Windows {0, 5} and {10, 15} both have d_Z = 5: the earliest barrier (5) wins.
    assert key_of(N.zipline_barrier([[0, 10], [5, 15]])) == (5, 5, (1, 1))
    # Equal points: worker 0 may take its 1st or 2nd point (both 7): it takes the first.
    b = N.zipline_barrier([[7, 7, 9], [7, 8, 9]])
    assert key_of(b) == (0, 7, (1, 1))


def test_lookahead_one_is_bsp():
    rows = [[100], [250], [180]]
    b = N.zipline_barrier(rows)
    assert b.iterations == [1, 1, 1] and b.barrier_ns == 250 and b.spread_ns == 150


def test_fast_worker_runs_more_iterations_before_the_barrier():
    # Worker 0 pushes every 10 ns, worker 1 every 30 ns: 3 fast iterations meet 1 slow one.
    b = N.zipline_barrier_from_intervals([0, 0], [10, 30], 6)
    assert b.spread_ns == 0 and b.iterations == [3, 1] and b.barrier_ns == 30


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**9)), min_size=1, max_size=30),
    st.integers(1, 40),
)
def test_zipline_from_intervals_equals_zipline_on_predicted_grid(workers, r):
    last = [w[0] for w in workers]
    interval = [w[1] for w in workers]
    grid = N.predict_push_times(last, interval, r)
    assert grid.shape == (len(workers), r) and grid.dtype == np.int64
    assert [list(row) for row in grid] == [[ln + i * d for i in range(1, r + 1)] for ln, d in workers]
    assert N.zipline_barrier_from_intervals(last, interval, r) == N.zipline_barrier(grid)


def test_zipline_from_clocks_uses_last_push_and_last_interval():
    c = N.WorkerClocks(2)
    for t in (0, 10, 20):
        c.record_push(0, t)
    for t in (0, 30):
        c.record_push(1, t)
    assert N.zipline_barrier_from_clocks(c, 6) == N.zipline_barrier_from_intervals([20, 30], [10, 30], 6)
    c.reset_timing()
    with pytest.raises(ValueError, match="interval"):
        N.zipline_barrier_from_clocks(c, 6)


def test_numpy_and_list_inputs_agree():
    rng = np.random.default_rng(3)
    grid = np.sort(rng.integers(0, 1000, size=(20, 15)), axis=1).astype(np.int64)
    expected = N.zipline_barrier(grid.tolist())
    assert N.zipline_barrier(grid) == expected  # C-contiguous int64: used in place
    assert N.zipline_barrier(np.asfortranarray(grid)) == expected  # other layouts go through the list path
    assert N.zipline_barrier(grid.astype(np.int32)) == expected
    for fn in (N.gridscan_barrier, N.fullgridscan_barrier):
        assert fn(grid) == fn(grid.tolist())


@pytest.mark.parametrize("fn", [N.zipline_barrier, N.gridscan_barrier, N.fullgridscan_barrier])
@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "n >= 1"),
        ([[]], "R >= 1"),
        ([[1, 2], [3]], "mismatched lengths"),
        ([[3, 2]], "non-decreasing"),
        ([[-1, 2]], ">= 0"),
        (np.zeros((0, 3), dtype=np.int64), "n >= 1"),
        (np.zeros((3, 0), dtype=np.int64), "R >= 1"),
        (np.zeros(3, dtype=np.int64), "2-D"),
    ],
)
def test_bad_grids_raise_value_error(fn, bad, message):
    with pytest.raises(ValueError, match=message):
        fn(bad)


def test_float_grids_are_rejected_with_type_error():
    with pytest.raises(TypeError):
        N.zipline_barrier([[1.5, 2.0]])
    with pytest.raises(TypeError):
        N.zipline_barrier(np.array([[np.nan, 1.0]]))


@pytest.mark.parametrize(
    "last, interval, r, message",
    [
        ([], [], 3, "must not be empty"),
        ([0, 1], [5], 3, "mismatched lengths"),
        ([0], [5], 0, "R must be >= 1"),
        ([-1], [5], 3, "last push time"),
        ([0], [-1], 3, "interval"),
        ([2**62], [2**62], 3, "overflow"),
    ],
)
def test_bad_prediction_inputs_raise_value_error(last, interval, r, message):
    with pytest.raises(ValueError, match=message):
        N.predict_push_times(last, interval, r)
    with pytest.raises(ValueError, match=message):
        N.zipline_barrier_from_intervals(last, interval, r)
