"""How the sync engine paces ranks and ticks, in one process (tests/harness.py: n ranks as threads, an in-memory
allreduce, scripted step times): the staleness bounds reached and kept under a straggler, zipline's barriers at the
bound while every rank is a peer, join and auto tick pacing, own pushes in flight, wbsp's measured slowest rank, and
asp's waits and staleness under a straggler.

Runs with a global budget (run_job(..., target=...)) train every rank for about the same time, as the workers'
--target does: fast ranks take more steps than a straggler. Step times are 5-50 ms, long beside a tick of the
in-memory allreduce (well under a millisecond), so each property holds with a wide margin on a loaded machine; every
threshold below is a property of the rules (engine/pacing/, engine/policies/), not of this machine's speed."""
import numpy as np
import pytest

from harness import run_job as _run_job


def run_job(policy, schedule, **knobs):
    """The policies' own rules, as published: the lock-step fallback off (HVD_ELASTIC_RELAX_MIN_GAIN=0; its own
    tests are in test_lockstep.py)."""
    return _run_job(policy, schedule, relax_min_gain=0, **knobs)

FAST, SLOW = 0.005, 0.05          # seconds per step: a 10x straggler
STRAGGLER = [[FAST]] * 3 + [[SLOW]]
EQUAL = [[FAST]] * 4


def _nothing_lost(run):
    """Invariants 3 and 4 (docs/design.md, "Invariants"): every rank applied every push exactly once; finish left
    identical replicas."""
    pushed = run.pushed()
    assert pushed == sum(run.steps), (pushed, run.steps)
    assert all(c["applied_contributions"] == pushed for c in run.counters), run.counters
    w = run.weights()
    assert all(np.array_equal(w[0], x) for x in w[1:]), w
    return run.counters


def test_ssp_reaches_the_staleness_bound_under_a_straggler_and_never_exceeds_it():
    counters = _nothing_lost(run_job("ssp", [[0.004] * 30] * 3 + [[0.04] * 30], staleness=2))
    gaps = [c["max_clock_gap"] for c in counters]
    assert max(gaps) == 2, gaps     # reached (the straggler is 10x slower), never exceeded


def test_dssp_runs_past_the_lower_bound_on_credits_and_never_past_the_upper():
    counters = _nothing_lost(run_job("dssp", [[0.004] * 30] * 3 + [[0.04] * 30], dssp_lower=1, dssp_upper=4))
    gaps = [c["max_clock_gap"] for c in counters]
    assert 1 < max(gaps) <= 4, gaps
    assert sum(c["dssp_grants"] for c in counters) > 0, counters


def test_zipline_with_equal_speeds_places_nearly_every_barrier_at_the_bound():
    """While every rank is a peer of every other (engine/pacing/rules.py still_peers), ZipLine's windows all predict the
    same wait; such barriers go to the bound, at one clock for every rank (R steps after the least superstep start), so
    no barrier splits a round of pushes. The same barriers, and the same weights at each of them, on every rank."""
    counters = _nothing_lost(run_job("zipline", [[0.01]] * 4, lookahead=6, target=240))
    assert len({(c["barriers"], c["barriers_at_bound"], c["barrier_digest"]) for c in counters}) == 1, counters
    barriers, at_bound = counters[0]["barriers"], counters[0]["barriers_at_bound"]
    assert barriers >= 5 and at_bound >= 0.8 * barriers, (barriers, at_bound)
    assert all(c["max_iterations_between_barriers"] == 6 for c in counters), counters


def test_zipline_under_a_straggler_places_every_barrier_by_its_windows():
    """With a 10x straggler no two ranks' speeds make every rank a peer, so each barrier is ZipLine's choice (the
    window of least predicted wait), none at the bound; the same barriers and weights at each of them on every
    rank, never more than R iterations apart."""
    counters = _nothing_lost(run_job("zipline", STRAGGLER, lookahead=6, predictor="last", target=400))
    assert len({(c["barriers"], c["barriers_at_bound"], c["barrier_digest"]) for c in counters}) == 1, counters
    assert counters[0]["barriers"] >= 5 and counters[0]["barriers_at_bound"] == 0, counters[0]
    assert all(c["max_iterations_between_barriers"] <= 6 for c in counters), counters


@pytest.mark.parametrize("policy", ["asp", "zipline"])
def test_join_pacing_makes_every_tick_full_and_the_same_on_every_rank(policy):
    """tick_pacing=join (engine/pacing/): no probes, every tick carries the payload, and each rank's tick thread
    decides when to join; every rank issues the same ticks, and zipline's barriers (each one a poll counted from
    the tick) are the same on every rank."""
    counters = _nothing_lost(run_job(policy, STRAGGLER, tick_pacing="join", lookahead=6, target=400))
    assert all(c["payload_collectives"] == c["ticks"] for c in counters), counters
    assert len({c["ticks"] for c in counters}) == 1, counters
    if policy == "zipline":
        assert counters[0]["barriers"] >= 5 and len({c["barrier_digest"] for c in counters}) == 1, counters
        assert all(c["max_iterations_between_barriers"] <= 6 for c in counters), counters


@pytest.mark.parametrize("policy,schedule,target", [("asp", EQUAL, 400), ("asp", STRAGGLER, 1600),
                                                    ("zipline", STRAGGLER, 400)],
                         ids=["asp-equal", "asp-straggler", "zipline-straggler"])
def test_auto_pacing_joins_ticks_once_pushes_are_predictable(policy, schedule, target):
    """tick_pacing=auto: probe pacing until a table shows every live rank's push period measured and nothing
    pending, join pacing from then on -- a decision every rank takes from the same tables, so both modes mix in one
    run with the same collectives on every rank. A rank that waits for its own push (max in flight 0) sends that
    tick itself (Ticker.run_inline) unless its tick thread got there first. zipline (relaxed_joins = "peers") joins
    only while every rank is a peer: under a straggler its ticks stay probe-paced. (The first ticks, before the
    straggler's period is measured, probe: about 60 of them, so the straggler case runs 1600 steps, about 570
    ticks.)"""
    run = run_job(policy, schedule, lookahead=6, tick_pacing="auto", target=target)
    counters = _nothing_lost(run)
    assert len({(c["ticks"], c["join_ticks"]) for c in counters}) == 1, counters
    ticks, joined = counters[0]["ticks"], counters[0]["join_ticks"]
    if policy == "zipline":
        assert joined < 0.2 * ticks, (joined, ticks)
        return
    assert joined > 0.8 * ticks, (joined, ticks)
    fast = counters if schedule is EQUAL else counters[:3]
    assert all(c["inline_ticks"] > 0.5 * c["pushed"] for c in fast), counters


def test_one_own_push_in_flight_lets_equal_ranks_compute_before_their_round_is_back():
    """max_inflight=1: a rank starts its next step with its own push still in flight, so with equal speeds it
    computes on weights missing its round (its own push and its peers' of the last step): staleness about n = 4.
    Peer alignment must not wait for that round: if it did, every rank would wait for its round's tick and every
    update would be 0 stale, as with 0 in flight. The job-wide mean is asserted: a rank descheduled while the others
    go on can end a step ahead of some peers, which peer alignment then waits for (reading their round), so one
    rank's mean varies between runs (1 to 4 on a loaded machine) while the job's stays well above 1.5."""
    counters = _nothing_lost(run_job("asp", [[0.01]] * 4, max_inflight=1, target=160))
    mean = sum(c["staleness_mean"] * c["pushed"] for c in counters) / sum(c["pushed"] for c in counters)
    assert mean >= 1.5, [c["staleness_mean"] for c in counters]


def test_wbsp_measures_the_slowest_rank_and_fast_ranks_download_less_often_than_they_step():
    """wbsp with overlap: the slowest rank is measured from the tick stream, not configured; a rank downloads the
    global model only once it holds a new upload of the slowest rank (no stale download: invariant 7), so the fast
    ranks, never waiting for the straggler, download far less often than they step."""
    run = run_job("wbsp", STRAGGLER, wbsp_overlap=True, target=400)
    counters = _nothing_lost(run)
    for c in counters:
        assert c["wbsp_slowest_rank"] == 3 and c["wbsp_stale_downloads"] == 0 and c["downloads"] > 0, c
    assert min(run.steps[:3]) > 2 * run.steps[3], run.steps
    assert all(c["downloads"] < steps / 2 for c, steps in zip(counters[:3], run.steps[:3])), (counters, run.steps)


def test_asp_never_holds_a_rank_for_the_straggler_whose_gradients_are_the_stale_ones():
    """asp's rule holds no rank; the only wait is peer alignment (HVD_ELASTIC_PEER_WAIT, at most 0.5 of the rank's
    own step, and only for ranks about as fast as it is), so at most 0.5 / 1.5 of the wall clock, where waiting for
    the 10x straggler would be about 90%. The fast ranks run ahead; the straggler computes on weights the fast ranks
    update about 3 x 10 times during its step, so its gradients are far staler than theirs."""
    run = run_job("asp", STRAGGLER, target=400)
    counters = _nothing_lost(run)
    assert all(share < 0.34 for share in run.wait_shares), run.wait_shares
    assert min(run.steps[:3]) > 3 * run.steps[3], run.steps
    stale = [c["staleness_mean"] for c in counters]
    assert stale[3] > 10 and stale[3] > 5 * max(stale[:3]), stale
