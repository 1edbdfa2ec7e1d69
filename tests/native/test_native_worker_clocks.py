"""WorkerClocks: per-worker push counts and iteration-interval history, the state every rule reads."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N


def test_clocks_count_pushes_and_intervals_follow_push_times():
    c = N.WorkerClocks(3, history=2)
    for t in (0, 10, 25, 45):
        c.record_push(0, t)
    c.record_push(1, 5)
    assert c.clocks == [4, 1, 0] and c.clock(0) == 4
    assert c.intervals(0) == [15, 20]  # only the latest `history`
    assert c.last_interval_ns(0) == 20 and c.last_interval_ns(1) == -1
    assert c.last_push_ns(0) == 45 and c.last_push_ns(2) == -1
    assert c.last_push_times == [45, 5, -1] and c.last_intervals == [20, -1, -1]
    assert (c.min_clock, c.max_clock, c.gap) == (0, 4, 4)
    assert c.slowest_by_clock() == 2 and c.fastest_by_clock() == 0
    assert c.slowest_by_interval() == 0
    assert c.size == 3 and c.history == 2


def test_reset_timing_keeps_clocks_and_forgets_intervals():
    c = N.WorkerClocks(2)
    for t in (0, 10, 20):
        c.record_push(0, t)
    c.reset_timing()
    assert c.clocks == [3, 0] and c.last_interval_ns(0) == -1 and c.slowest_by_interval() == -1
    c.record_push(0, 100)  # the time across the barrier is not an iteration
    assert c.last_interval_ns(0) == -1
    c.record_push(0, 130)
    assert c.last_interval_ns(0) == 30


def test_slowest_by_interval_ties_go_to_the_lowest_rank():
    c = N.WorkerClocks(3)
    for p in (2, 1):
        c.record_push(p, 0)
        c.record_push(p, 50)
    assert c.slowest_by_interval() == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1000)), max_size=100))
def test_clocks_match_a_reference_model(n, pushes):
    c = N.WorkerClocks(n, history=4)
    last = [-1] * n
    hist = [[] for _ in range(n)]
    counts = [0] * n
    for p, dt in pushes:
        p %= n
        t = (last[p] if last[p] >= 0 else 0) + dt
        c.record_push(p, t)
        if last[p] >= 0:
            hist[p] = (hist[p] + [t - last[p]])[-4:]
        last[p] = t
        counts[p] += 1
    assert c.clocks == counts
    assert [c.intervals(p) for p in range(n)] == hist
    assert c.gap == max(counts) - min(counts)
    medians = [sorted(h)[(len(h) - 1) // 2] if h else -1 for h in hist]
    assert [c.median_interval_ns(p) for p in range(n)] == medians
    slowest = -1 if max(medians) < 0 else medians.index(max(medians))
    assert c.slowest_by_median_interval() == slowest


def test_slowest_by_median_ignores_one_descheduled_iteration():
    # Worker 1 is steadily 3x slower; worker 0 had one 100 ms hiccup in its last iteration.
    c = N.WorkerClocks(2, history=8)
    for p, times in ((0, [0, 10, 20, 30, 40, 140]), (1, [0, 30, 60, 90, 120, 150])):
        for t in times:
            c.record_push(p, t)
    assert c.slowest_by_interval() == 0             # the latest interval alone is fooled
    assert c.slowest_by_median_interval() == 1      # the median is not
    assert c.median_interval_ns(0) == 10 and c.median_interval_ns(1) == 30


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: N.WorkerClocks(0), "n must be"),
        (lambda: N.WorkerClocks(2, history=0), "history must be >= 1"),
        (lambda: N.WorkerClocks(2).record_push(2, 0), "out of range"),
        (lambda: N.WorkerClocks(2).record_push(0, -5), ">= 0"),
        (lambda: N.WorkerClocks(2).clock(-1), "out of range"),
    ],
)
def test_bad_clock_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_push_times_must_not_decrease():
    c = N.WorkerClocks(1)
    c.record_push(0, 100)
    with pytest.raises(ValueError, match="must not decrease"):
        c.record_push(0, 99)
    assert c.clock(0) == 1


def test_observe_sets_state_from_a_summary_without_duplicating_history():
    from hvd_elastic import _native
    w = _native.WorkerClocks(3)
    w.observe(1, 5, 1_000, 200)
    w.observe(1, 5, 1_000, 200)          # the same tick metadata seen again
    assert w.clocks == [0, 5, 0] and w.last_push_ns(1) == 1_000 and w.intervals(1) == [200]
    w.observe(1, 6, 1_300, 300)
    assert w.intervals(1) == [200, 300] and w.slowest_by_interval() == 1
    for bad in [(1, 4, 1_300, 300), (1, 6, 900, 300), (1, 6, 1_300, -2), (3, 1, 0, 0)]:
        with pytest.raises(ValueError):
            w.observe(*bad)
