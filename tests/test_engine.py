"""The sync engine's invariants (docs/design.md, "Invariants", 2-5 and 7) in one process: n ranks as
threads with an in-memory allreduce (tests/harness.py), under scripted schedules, some of which are rare on real
machines (a rank stalled for many steps, bursts, ranks finishing far apart). Every property here must hold for any
interleaving of the threads, so a run either keeps it or the engine is wrong."""
import numpy as np
import pytest

from harness import bsp_reference, run_job

STEPS = 40
SCHEDULES = {
    "equal": [[0.002] * STEPS] * 4,
    "straggler": [[0.001] * STEPS] * 3 + [[0.01] * STEPS],
    # every rank slowed now and then, by a different amount (a non-dedicated cluster)
    "transient": [[0.001 + 0.008 * ((k // 5 + r) % 3 == 0) for k in range(STEPS)] for r in range(4)],
    # rank 1 stalls 60 ms once, mid-run, then runs fast again
    "stall": [[0.001] * STEPS, [0.001] * 15 + [0.06] + [0.001] * (STEPS - 16), [0.001] * STEPS],
    # two ranks, one of them with far fewer steps (it finishes long before the other)
    "uneven": [[0.001] * STEPS, [0.003] * 8],
}
GRADIENT_POLICIES = ("asp", "ssp", "dssp", "zipline")


def _common(run, schedule):
    """Nothing lost or doubled: every rank applied every push exactly once; finish left identical replicas."""
    pushed = sum(c["pushed"] for c in run.counters)
    assert pushed == sum(len(s) for s in schedule)
    assert all(c["applied_contributions"] == pushed for c in run.counters), run.counters
    w = run.weights()
    assert all(np.array_equal(w[0], x) for x in w[1:]), w
    assert np.isfinite(w[0]).all()


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("policy", GRADIENT_POLICIES + ("wbsp",))
def test_every_update_is_applied_once_and_replicas_end_identical(policy, schedule):
    run = run_job(policy, SCHEDULES[schedule])
    _common(run, SCHEDULES[schedule])
    if policy == "wbsp":
        assert all(c["wbsp_stale_downloads"] == 0 for c in run.counters), run.counters   # invariant 7


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_ssp_never_lets_the_clock_gap_exceed_s(schedule):
    run = run_job("ssp", SCHEDULES[schedule], staleness=2)
    _common(run, SCHEDULES[schedule])
    assert max(c["max_clock_gap"] for c in run.counters) <= 2, run.counters


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_dssp_never_lets_the_clock_gap_exceed_s_upper(schedule):
    run = run_job("dssp", SCHEDULES[schedule], dssp_lower=1, dssp_upper=3)
    _common(run, SCHEDULES[schedule])
    assert max(c["max_clock_gap"] for c in run.counters) <= 3, run.counters


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_zipline_never_runs_more_than_r_iterations_between_barriers(schedule):
    run = run_job("zipline", SCHEDULES[schedule], lookahead=4)
    _common(run, SCHEDULES[schedule])
    assert all(c["max_iterations_between_barriers"] <= 4 for c in run.counters), run.counters
    assert len({c["barrier_digest"] for c in run.counters}) == 1, run.counters   # identical at every barrier
    assert len({c["barriers"] for c in run.counters}) == 1


@pytest.mark.parametrize("every", [5, 10])
@pytest.mark.parametrize("policy,knobs", [("asp", {}), ("ssp", {"staleness": 2}), ("dssp", {}), ("wbsp", {}),
                                          ("zipline", {"lookahead": 4}), ("zipline", {"lookahead": 15})],
                         ids=["asp", "ssp", "dssp", "wbsp", "zipline-R4", "zipline-R15"])
def test_collectives_of_the_script_between_steps_complete_under_a_straggler(policy, knobs, every):
    """Every rank meets the others in a collective of the script's own after every `every` steps, marked OUTSIDE
    as hvd_elastic/torch/collectives.py marks Horovod's; rank 1 is 10x slower. No policy may hold the straggler
    short of a call the fast rank waits in (a barrier asking the fast rank for steps beyond its call held the
    straggler at the bound, and the call never completed)."""
    schedule = [[0.002] * STEPS, [0.02] * STEPS]
    run = run_job(policy, schedule, call_every=every, timeout_s=30, **knobs)
    _common(run, schedule)
    if policy == "zipline":
        assert len({(c["barriers"], c["barrier_digest"]) for c in run.counters}) == 1, run.counters
        assert all(c["max_iterations_between_barriers"] <= knobs["lookahead"] for c in run.counters), run.counters


@pytest.mark.parametrize("schedule", ["equal", "straggler", "stall"])
@pytest.mark.parametrize("policy,knobs", [("ssp", {"staleness": 0}), ("dssp", {"dssp_lower": 0, "dssp_upper": 0}),
                                          ("zipline", {"lookahead": 1})])
def test_degenerate_settings_are_bsp(policy, knobs, schedule):
    """s = 0, [s_L, s_U] = [0, 0] and R = 1 collapse to BSP: the weights of sequential SGD on each step's average
    gradient, up to the order of summation (a round split over two ticks is two half steps)."""
    sched = [s[:25] for s in SCHEDULES[schedule]]
    run = run_job(policy, sched, **knobs)
    _common(run, sched)
    ref = bsp_reference(len(sched), 25, np.zeros_like(run.weights()[0]))
    np.testing.assert_allclose(run.weights()[0], ref, rtol=0, atol=1e-12)
    assert max(c["max_clock_gap"] for c in run.counters) == 0


def test_asp_staleness_is_measured_for_every_update():
    run = run_job("asp", SCHEDULES["straggler"])
    _common(run, SCHEDULES["straggler"])
    for c, s in zip(run.counters, SCHEDULES["straggler"]):
        assert sum(c["staleness_histogram"].values()) == len(s), c


def test_a_collective_nobody_matches_is_named_not_hung():
    from harness import InMemoryAllreduce
    reduce = InMemoryAllreduce(2, timeout_s=0.2)
    with pytest.raises(RuntimeError, match="'x' #0 was not matched"):
        reduce.reduce(0, [np.zeros(1)], "x")
