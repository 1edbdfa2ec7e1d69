"""SSP gate and DSSP credit rule, checked on simulated schedules of heterogeneous workers.

Staleness of an iteration = t_p - min_q t_q when worker p starts it (clocks count completed pushes). SSP(s) admits
only staleness <= s; DSSP([s_L, s_U]) only staleness <= s_U; s = 0 and s_L = s_U = 0 are BSP.
"""
import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N


def make_durations(n, iters, seed, max_ratio=4.0, jitter=0.3):
    """Per-worker iteration durations in ns: a base speed per worker (up to max_ratio apart) with jitter."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.0, max_ratio, n) * 1e6
    return (base[:, None] * rng.uniform(1 - jitter, 1 + jitter, (n, iters))).astype(np.int64)


def simulate(durations, policy):
    """Event-driven run. policy(clocks, worker, kind) -> bool, kind 'push' (just pushed) or 'retry' (waiting).

    Returns (starts, max_gap): starts[p][k] = (start time, staleness) of p's iteration k+1; max_gap = the largest
    completed-push gap max_q t_q - min_q t_q ever observed. Fails on deadlock.
    """
    n, iters = durations.shape
    clocks = N.WorkerClocks(n)
    starts = [[] for _ in range(n)]
    events, waiting, max_gap = [], set(), 0

    def start(p, t):
        starts[p].append((t, N.ssp_staleness(clocks, p)))
        heapq.heappush(events, (t + int(durations[p][len(starts[p]) - 1]), p))

    for p in range(n):
        start(p, 0)
    while events:
        t, p = heapq.heappop(events)
        clocks.record_push(p, t)
        max_gap = max(max_gap, clocks.gap)
        if clocks.clock(p) < iters:
            if policy(clocks, p, "push"):
                start(p, t)
            else:
                waiting.add(p)
        for q in sorted(waiting):
            if policy(clocks, q, "retry"):
                waiting.discard(q)
                start(q, t)
    assert not waiting, f"deadlock: workers {sorted(waiting)} never resumed"
    assert clocks.clocks == [iters] * n
    return starts, max_gap


def ssp_policy(s):
    return lambda clocks, p, kind: N.ssp_may_proceed(clocks, p, s)


def dssp_policy(state):
    return lambda clocks, p, kind: state.on_push(clocks, p) if kind == "push" else state.may_resume(clocks, p)


def bsp_start_times(durations):
    """BSP: iteration k starts when the last worker finished iteration k-1."""
    n, iters = durations.shape
    starts, t = np.zeros((n, iters), dtype=np.int64), 0
    for k in range(iters):
        starts[:, k] = t
        t = int(max(t + durations[p][k] for p in range(n)))
    return starts


schedules = st.tuples(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None)
@given(schedules, st.integers(0, 8))
def test_ssp_gap_never_exceeds_staleness(schedule, s):
    n, iters, seed = schedule
    starts, max_gap = simulate(make_durations(n, iters, seed), ssp_policy(s))
    assert max(st_ for w in starts for _, st_ in w) <= s
    assert max_gap <= s + 1  # an admitted worker's push may land before the slowest's, then it waits


@settings(max_examples=30, deadline=None)
@given(schedules)
def test_ssp_with_zero_staleness_is_bsp(schedule):
    n, iters, seed = schedule
    d = make_durations(n, iters, seed)
    starts, _ = simulate(d, ssp_policy(0))
    assert np.array_equal(np.array([[t for t, _ in w] for w in starts]), bsp_start_times(d))


def test_ssp_lets_the_fast_worker_run_exactly_s_ahead():
    d = np.array([[1_000_000] * 30, [3_000_000] * 30], dtype=np.int64)
    starts, _ = simulate(d, ssp_policy(3))
    assert max(st_ for _, st_ in starts[0]) == 3 and max(st_ for _, st_ in starts[1]) == 0


@settings(max_examples=60, deadline=None)
@given(schedules, st.integers(0, 5), st.integers(0, 12))
def test_dssp_gap_never_exceeds_upper_bound(schedule, s_lower, r_max):
    n, iters, seed = schedule
    state = N.DsspState(n, s_lower, s_lower + r_max)
    starts, max_gap = simulate(make_durations(n, iters, seed, max_ratio=6.0), dssp_policy(state))
    s_upper = s_lower + r_max
    assert max(st_ for w in starts for _, st_ in w) <= s_upper
    assert state.max_staleness_admitted <= s_upper
    assert max_gap <= s_upper + 1
    assert all(0 <= c <= r_max for c in state.credits)


@settings(max_examples=30, deadline=None)
@given(schedules)
def test_dssp_with_zero_range_is_bsp(schedule):
    n, iters, seed = schedule
    d = make_durations(n, iters, seed)
    starts, _ = simulate(d, dssp_policy(N.DsspState(n, 0, 0)))
    assert np.array_equal(np.array([[t for t, _ in w] for w in starts]), bsp_start_times(d))


def test_dssp_grants_extra_iterations_beyond_s_lower_to_a_fast_worker():
    # 2 workers at 2:1 speed with the paper's defaults s_L = 3, r_max = 12.
    d = np.array([[1_000_000] * 200, [2_000_000] * 200], dtype=np.int64)
    state = N.DsspState(2, 3, 15)
    starts, _ = simulate(d, dssp_policy(state))
    assert state.grants > 0
    assert 3 < state.max_staleness_admitted <= 15
    # The fast worker finishes well before it would under SSP(s_L).
    ssp_starts, _ = simulate(d, ssp_policy(3))
    assert starts[0][-1][0] < ssp_starts[0][-1][0]


def sync_controller_oracle(last_p, i_p, last_s, i_s, r_max):
    """O(r_max^2) as written in the paper: argmin over (i, k) of |Sim_s[k] - Sim_p[i]|, ties to the smallest i."""
    best = None
    for i in range(r_max + 1):
        for k in range(r_max + 1):
            d = abs((last_s + (k + 1) * i_s) - (last_p + i * i_p))
            if best is None or (d, i) < best:
                best = (d, i)
    return best[1]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 10**7), st.integers(0, 10**9), st.integers(0, 10**7), st.integers(0, 20))
def test_sync_controller_two_pointer_matches_quadratic_definition(last_p, i_p, last_s, i_s, r_max):
    assert N.dssp_sync_controller(last_p, i_p, last_s, i_s, r_max) == sync_controller_oracle(
        last_p, i_p, last_s, i_s, r_max
    )


def test_sync_controller_picks_the_push_closest_to_the_slow_workers_next_push():
    # p pushes every 10 from 100; s pushed at 95 and pushes every 30: Sim_s = 125, 155, ...; Sim_p[3] = 130 is
    # 5 away from 125, Sim_p[2] = 120 is 5 away too: ties go to fewer extra iterations.
    assert N.dssp_sync_controller(100, 10, 95, 30, 12) == 2
    assert N.dssp_sync_controller(100, 10, 95, 30, 0) == 0


def test_dssp_credit_rule_steps():
    c = N.WorkerClocks(2)
    c.record_push(1, 0)
    c.record_push(1, 40)  # slow worker: t = 2, I_s = 40
    for t in range(0, 60, 10):
        c.record_push(0, t)  # fast worker: t = 6, I_p = 10, last at 50
    # Gap 4 > s_L = 3, fast worker: SyncController runs. Sim_s = 80, 120, ...; Sim_p[3] = 80.
    assert N.dssp_credit(c, 0, 0, 3, 15) == (True, 2, 3)
    # A credit is spent without consulting anything.
    assert N.dssp_credit(c, 0, 2, 3, 15) == (True, 1, -1)
    # The slow worker is within s_L.
    assert N.dssp_credit(c, 1, 0, 3, 15) == (True, 0, -1)
    # The grant is capped so staleness stays <= s_U: gap 4, s_U = 5 -> at most 2 extra iterations.
    assert N.dssp_credit(c, 0, 0, 3, 5) == (True, 1, 2)
    # s_U = s_L: no credit at all, wait.
    assert N.dssp_credit(c, 0, 0, 3, 3) == (False, 0, 0)
    assert not N.dssp_may_resume(c, 0, 3)


def test_dssp_waits_when_the_intervals_are_not_measured_yet():
    c = N.WorkerClocks(2)
    for t in range(5):
        c.record_push(0, t * 10)
    assert N.dssp_credit(c, 0, 0, 3, 15) == (False, 0, 0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: N.ssp_may_proceed([], 0, 1), "must not be empty"),
        (lambda: N.ssp_may_proceed([1, 2], 2, 1), "out of range"),
        (lambda: N.ssp_may_proceed([1, 2], -1, 1), "out of range"),
        (lambda: N.ssp_may_proceed([1, -2], 0, 1), ">= 0"),
        (lambda: N.ssp_may_proceed([1, 2], 0, -1), "s must be >= 0"),
        (lambda: N.ssp_may_proceed(N.WorkerClocks(2), 5, 1), "out of range"),
        (lambda: N.ssp_staleness([], 0), "must not be empty"),
        (lambda: N.DsspState(0, 1, 2), "n must be"),
        (lambda: N.DsspState(2, -1, 2), "s_lower"),
        (lambda: N.DsspState(2, 3, 2), "s_upper"),
        (lambda: N.DsspState(2, 1, 2).on_push(N.WorkerClocks(3), 0), "mismatched lengths"),
        (lambda: N.DsspState(2, 1, 2).on_push(N.WorkerClocks(2), 2), "out of range"),
        (lambda: N.dssp_credit(N.WorkerClocks(2), 0, 5, 1, 3), "credit"),
        (lambda: N.dssp_sync_controller(0, 1, 0, 1, -1), "r_max"),
        (lambda: N.dssp_sync_controller(-1, 1, 0, 1, 3), ">= 0"),
        (lambda: N.dssp_sync_controller(0, -1, 0, 1, 3), ">= 0"),
        (lambda: N.dssp_sync_controller(2**62, 2**62, 0, 1, 3), "overflow"),
    ],
)
def test_bad_gate_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
