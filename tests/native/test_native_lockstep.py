"""The lock-step fallback's rule (native/include/hvd_elastic/lockstep.h) on hand-made tick streams."""
import pytest

from hvd_elastic import _native as N

MS = 1_000_000
SETTLE = SAMPLE = RELAXED_SAMPLE = 2     # pushes of every live rank


class Stream:
    """Feeds a LockstepRule one round at a time: every live rank pushes once per observation, `period_ms` after its
    previous push."""

    def __init__(self, n=4, min_gain=1.25):
        self.rule = N.LockstepRule(n, min_gain, SETTLE, SAMPLE, RELAXED_SAMPLE)
        self.clocks = [0] * n
        self.times = [0] * n      # each rank's latest push, ns
        self.finished = [False] * n

    def observe(self, compute_ms):
        return self.rule.observe(self.clocks, [int(c * MS) for c in compute_ms], self.times, self.finished)

    def rounds(self, k, compute_ms, period_ms):
        modes = []
        for _ in range(k):
            self.clocks = [c + (not f) for c, f in zip(self.clocks, self.finished)]
            self.times = [t + (0 if f else int(p * MS)) for t, p, f in zip(self.times, period_ms, self.finished)]
            modes.append(self.observe(compute_ms))
        return modes

    def push(self, rank, after_ms, compute_ms):
        """One push of `rank` alone, `after_ms` after its previous one, in a tick of its own."""
        self.clocks[rank] += 1
        self.times[rank] += int(after_ms * MS)
        return self.observe(compute_ms)


STRAGGLER = [30, 30, 30, 90]                 # compute ms: one rank 3x slower
LOCKSTEP_STRAGGLER = [95, 95, 95, 95]         # every rank's period in lock-step: the slowest's compute + 5 ms
RELAXED_STRAGGLER = [40, 40, 40, 100]         # relaxed: each rank's own compute + 10 ms


def test_starts_in_lockstep_and_measures_each_mode_once_before_the_model_decides():
    # equal compute times, lock-step dear (20 ms a round beyond them): only lock-step's measured cost makes relaxing
    # worth measuring, so it is measured first
    s = Stream()
    assert s.rule.lockstep and s.rule.gain == 0
    modes = s.rounds(4, [30] * 4, [50] * 4)               # 4 pushes of every rank: settle + sample
    assert modes == [True, True, True, False]             # lock-step measured, then relaxed is tried
    assert s.rule.overhead_lockstep_ns == pytest.approx(20 * MS) and s.rule.overhead_relaxed_ns == -1
    s.rounds(4, [30] * 4, [36] * 4)
    assert s.rule.overhead_relaxed_ns == pytest.approx(6 * MS)
    assert s.rule.gain == pytest.approx(50 / 36, rel=1e-6)    # relaxed: 36 ms a push against lock-step's 50
    assert not s.rule.lockstep and s.rule.switches == 1 and s.rule.switch_pushes == [16]
    assert s.rule.lockstep_pushes == 16 and s.rule.pushes == 32


def test_a_straggler_whose_compute_alone_promises_the_gain_relaxes_once_settled():
    # compute times alone (lock-step and relaxed at no cost) predict (3 / 30 + 1 / 90) / (4 / 90) = 2.5: lock-step's
    # cost could only add to that, so relaxed is measured after `settle` pushes, not `settle` + `sample`; o_L is
    # what the rounds until then sampled (one: 5 ms)
    s = Stream()
    assert s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER) == [True, False]
    assert s.rule.switch_pushes == [8] and s.rule.overhead_lockstep_ns == pytest.approx(5 * MS)
    assert s.rule.gain == pytest.approx((3 / 30 + 1 / 90) / (4 / 95), rel=1e-6)
    s.rounds(4, STRAGGLER, RELAXED_STRAGGLER)
    assert s.rule.overhead_relaxed_ns == pytest.approx(10 * MS)
    assert s.rule.gain == pytest.approx((3 / 40 + 1 / 100) / (4 / 95), rel=1e-6)
    assert not s.rule.lockstep and s.rule.switches == 1 and s.rule.lockstep_pushes == 8


def test_before_lockstep_is_sampled_its_cost_counts_as_zero():
    # settle = 1: the first observation with compute times switches (compute alone: 2.5) before any lock-step round
    # is sampled; the relaxed gain is then priced against lock-step at the slowest compute alone -- understated
    s = Stream()
    s.rule = N.LockstepRule(4, 1.25, 1, SAMPLE, RELAXED_SAMPLE)
    assert s.rounds(1, STRAGGLER, LOCKSTEP_STRAGGLER) == [False] and s.rule.overhead_lockstep_ns == -1
    s.rounds(4, STRAGGLER, RELAXED_STRAGGLER)
    assert s.rule.overhead_relaxed_ns == pytest.approx(10 * MS) and s.rule.overhead_lockstep_ns == -1
    assert s.rule.gain == pytest.approx((3 / 40 + 1 / 100) / (4 / 90), rel=1e-6) and not s.rule.lockstep


def test_a_straggler_whose_relaxed_rule_costs_too_much_goes_back_and_lockstep_is_measured_then():
    # relaxed right after settle (compute alone: 2.5), but relaxing costs 100 ms a push: gain (3 / 130 + 1 / 190) /
    # (4 / 90) = 0.64 with o_L at 0; back in lock-step o_L is measured (5 ms) and the model decides with both
    s = Stream()
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)
    s.rounds(4, STRAGGLER, [130, 130, 130, 190])
    assert s.rule.lockstep and s.rule.switch_pushes == [8, 24]
    assert all(s.rounds(10, STRAGGLER, LOCKSTEP_STRAGGLER))
    assert s.rule.overhead_lockstep_ns == pytest.approx(5 * MS)
    assert s.rule.gain == pytest.approx((3 / 130 + 1 / 190) / (4 / 95), rel=1e-6)


def test_equal_speeds_never_measure_relaxed_where_even_a_free_relaxed_rule_cannot_pay():
    s = Stream()
    # lock-step: 5 ms a round beyond the compute; relaxed at no cost at all would deliver 35 / 30 = 1.17x the pushes
    assert all(s.rounds(40, [30] * 4, [35] * 4))
    assert s.rule.switches == 0 and s.rule.overhead_relaxed_ns == -1 and s.rule.lockstep_pushes == 160
    assert s.rule.gain == pytest.approx(35 / 30, rel=1e-6)   # the ceiling (o_R = 0), below 1.25 x 1.05


def test_equal_speeds_go_back_to_lockstep_when_relaxing_costs_more_than_it_saves():
    s = Stream()
    s.rounds(4, [30] * 4, [50] * 4)                       # lock-step: 20 ms a round; ceiling 50 / 30: measure relaxed
    assert not s.rule.lockstep and s.rule.switch_pushes == [16]
    s.rounds(4, [30] * 4, [45] * 4)                       # relaxed: 15 ms a step
    assert s.rule.lockstep and s.rule.switch_pushes == [16, 32]   # gain 50 / 45 < 1.25 x 0.95
    assert s.rule.gain == pytest.approx(50 / 45, rel=1e-6)
    assert all(s.rounds(20, [30] * 4, [50] * 4))          # and stays there while speeds stay equal


def test_speeds_that_spread_out_later_make_the_ranks_measure_relaxed_and_relax():
    s = Stream()
    assert all(s.rounds(8, [30] * 4, [35] * 4))           # equal speeds: lock-step, relaxed not worth measuring
    # rank 3 slows to 3x: its compute time (the median of its last 7) moves at its fourth slow push, where the ceiling
    # passes the switch; relaxed is measured, and the gain (2.0) keeps the ranks there. Each round's periods are the
    # current mode's
    modes = []
    for _ in range(40):
        modes += s.rounds(1, STRAGGLER, LOCKSTEP_STRAGGLER if s.rule.lockstep else RELAXED_STRAGGLER)
    assert modes[:4] == [True, True, True, False]
    assert not s.rule.lockstep and s.rule.switches == 1 and s.rule.gain > 1.25 * 1.05
    assert s.rule.overhead_relaxed_ns == pytest.approx(10 * MS)


def test_spread_only_measures_relaxed_for_a_spread_of_speeds_not_for_lockstep_cost():
    # the delta policies' rule: equal compute times with lock-step dear (20 ms a round: a ceiling of 50 / 30, which
    # makes the gradient policies' rule measure relaxed, as in the first test) stay in lock-step; a straggler relaxes
    # after settle, as without spread_only
    s = Stream()
    s.rule = N.LockstepRule(4, 1.25, SETTLE, SAMPLE, RELAXED_SAMPLE, spread_only=True)
    assert all(s.rounds(40, [30] * 4, [50] * 4))
    assert s.rule.switches == 0 and s.rule.overhead_relaxed_ns == -1
    assert s.rule.overhead_lockstep_ns == pytest.approx(20 * MS) and s.rule.gain == pytest.approx(1.0)
    s = Stream()
    s.rule = N.LockstepRule(4, 1.25, SETTLE, SAMPLE, RELAXED_SAMPLE, spread_only=True)
    assert s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER) == [True, False]
    s.rounds(4, STRAGGLER, RELAXED_STRAGGLER)
    assert not s.rule.lockstep and s.rule.gain == pytest.approx((3 / 40 + 1 / 100) / (4 / 95), rel=1e-6)


@pytest.mark.parametrize("slow_steps", [1, 3])
def test_a_few_slow_steps_of_one_rank_at_equal_speeds_leave_the_ranks_in_lockstep(slow_steps):
    # one rank's step takes 4x for one to three pushes (a preempted core, a collector's pause): a rank's compute time
    # is the median of its last 7, so the ceiling stays at 35 / 30 -- a moving average would have read rank 3 as
    # slower for several pushes (after one 120 ms step, 30 + 0.2 x 90 = 48 ms: a ceiling of 1.6) and relaxed
    s = Stream()
    assert all(s.rounds(8, [30] * 4, [35] * 4))
    assert all(s.rounds(slow_steps, [30, 30, 30, 120], [125] * 4))   # in lock-step every rank waits for the slow step
    assert all(s.rounds(20, [30] * 4, [35] * 4))
    assert s.rule.switches == 0 and s.rule.overhead_relaxed_ns == -1
    assert s.rule.gain == pytest.approx(35 / 30, rel=0.05)


def test_the_first_relaxed_measurement_spans_relaxed_sample_pushes_unless_relaxing_loses_outright():
    s = Stream()
    s.rule = N.LockstepRule(4, 1.25, SETTLE, SAMPLE, 6)
    s.rounds(4, [30] * 4, [50] * 4)                       # lock-step measured in settle + sample = 4 rounds
    assert s.rule.switch_pushes == [16]
    # relaxed at 43 ms a step: gain 50 / 43 = 1.16, under the switch back (1.25 x 0.95) but above 1: decided after
    # settle + 6 rounds
    assert not any(s.rounds(7, [30] * 4, [43] * 4))
    assert s.rounds(1, [30] * 4, [43] * 4) == [True] and s.rule.switch_pushes == [16, 48]
    # relaxing that loses outright (gain 50 / 55 < 1) is decided after settle + sample rounds
    s = Stream()
    s.rule = N.LockstepRule(4, 1.25, SETTLE, SAMPLE, 6)
    s.rounds(4, [30] * 4, [50] * 4)
    assert s.rounds(4, [30] * 4, [55] * 4) == [False, False, False, True] and s.rule.switch_pushes == [16, 32]


def test_the_relaxed_cost_is_a_mean_over_pushes_not_over_ticks():
    # relaxed under a straggler: three ticks that each carry one push of every fast rank (5 ms beyond its compute),
    # then one that carries rank 3's push alone (35 ms beyond). Per push: (9 x 5 + 35) / 10 = 8 ms (what the pushes
    # per second follow); a mean over ticks would read (3 x 5 + 35) / 4 = 12.5 ms
    s = Stream()
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)            # settled: relaxed (compute alone promises the gain)
    for _ in range(200):
        for _ in range(3):
            s.clocks[:3] = [c + 1 for c in s.clocks[:3]]
            s.times[:3] = [t + 35 * MS for t in s.times[:3]]
            s.observe(STRAGGLER)
        s.push(3, 125, STRAGGLER)
    assert not s.rule.lockstep
    assert s.rule.overhead_relaxed_ns == pytest.approx(8 * MS, rel=0.02), s.rule.overhead_relaxed_ns / MS


def test_one_stall_of_every_rank_is_counted_but_does_not_send_relaxed_ranks_back_to_lockstep():
    s = Stream()
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)            # settled: relaxed (compute alone promises the gain)
    s.rounds(300, STRAGGLER, RELAXED_STRAGGLER)           # o_R = 10 ms, gain 2.0
    assert not s.rule.lockstep
    # every rank stalls for a second once (the network, a neighbour): the relaxed rule's cost rises by its share of
    # the pushes the rule remembers, and the ranks stay relaxed (gain >= 1.25 x 0.95)
    s.rounds(1, STRAGGLER, [p + 1000 for p in RELAXED_STRAGGLER])
    assert 20 * MS < s.rule.overhead_relaxed_ns < 40 * MS, s.rule.overhead_relaxed_ns / MS
    assert not any(s.rounds(50, STRAGGLER, RELAXED_STRAGGLER)) and s.rule.switches == 1
    assert s.rule.overhead_relaxed_ns < 30 * MS


def test_a_wait_for_a_rank_catching_up_after_a_switch_is_not_counted_as_lockstep_cost():
    s = Stream()
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)            # settled: relaxed (compute alone promises the gain)
    s.rounds(4, STRAGGLER, RELAXED_STRAGGLER)
    for _ in range(30):                                   # relaxed: the fast ranks run ahead of rank 3
        for q in range(3):
            s.push(q, 40, STRAGGLER)
        if s.clocks[0] % 5 == 0:
            s.push(3, 100, STRAGGLER)
    while not s.rule.lockstep:                            # speeds even out: back to lock-step
        s.rounds(1, [30] * 4, [45] * 4)
    switches, ahead = s.rule.switches, max(s.clocks) - s.clocks[3]
    assert ahead > 10
    s.rounds(1, [30] * 4, [35] * 4)                       # every rank ends the step it was in
    for _ in range(ahead):                                # the fast ranks are held; rank 3 catches up alone
        s.push(3, 35, [30] * 4)
    # the held ranks' next gap holds the whole catch-up (their second push since the switch: past SETTLE)
    s.rounds(1, [30] * 4, [35 * ahead + 35] * 3 + [35])
    s.rounds(12, [30] * 4, [35] * 4)                      # then lock-step rounds: 5 ms beyond the compute
    assert s.rule.switches == switches and s.rule.lockstep
    assert s.rule.overhead_lockstep_ns == pytest.approx(5 * MS, rel=0.01), s.rule.overhead_lockstep_ns / MS


def test_hysteresis_keeps_the_mode_near_the_threshold():
    # relaxed at gain 1.25 x 0.97: inside the 5% band, it stays relaxed; at 1.25 x 0.9 it goes back
    for factor, expect_lockstep in ((0.97, False), (0.90, True)):
        s = Stream()
        s.rounds(4, [30, 30, 30, 30], [50] * 4)           # o_L = 20 ms
        # equal speeds, relaxed overhead chosen so that gain = 50 / (30 + o_R) = 1.25 x factor
        o_r = 50 / (1.25 * factor) - 30
        s.rounds(8, [30] * 4, [30 + o_r] * 4)
        assert s.rule.lockstep == expect_lockstep, (factor, s.rule.gain)


def test_two_rules_fed_the_same_stream_agree_at_every_tick():
    a, b = Stream(), Stream()
    schedule = [([30] * 4, [50] * 4)] * 5 + [([30] * 4, [44] * 4)] * 5 + [(STRAGGLER, LOCKSTEP_STRAGGLER)] * 10
    for compute, period in schedule:
        assert a.rounds(1, compute, period) == b.rounds(1, compute, period)
    assert a.rule.switches == b.rule.switches and a.rule.gain == b.rule.gain


def test_finished_ranks_are_left_out_and_a_single_live_rank_keeps_the_mode():
    s = Stream()
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)            # settled: relaxed (compute alone promises the gain)
    s.rounds(4, STRAGGLER, RELAXED_STRAGGLER)
    assert not s.rule.lockstep
    s.finished = [False, True, True, True]                # only rank 0 trains on: nothing to choose between
    before = s.rule.switches
    s.rounds(10, [30, 30, 30, 30], [300] * 4)
    assert s.rule.switches == before and not s.rule.lockstep


@pytest.mark.parametrize("args,match", [((4, 0.0, 8, 8, 8), "min_gain"), ((4, float("nan"), 8, 8, 8), "min_gain"),
                                        ((0, 1.25, 8, 8, 8), "n must be"),
                                        ((4, 1.25, 0, 8, 8), "settle, sample and relaxed_sample"),
                                        ((4, 1.25, 8, 8, 0), "settle, sample and relaxed_sample")])
def test_bad_construction_is_named(args, match):
    with pytest.raises(ValueError, match=match):
        N.LockstepRule(*args)


def test_bad_observations_are_named():
    r = N.LockstepRule(2, 1.25, 8, 8, 8)
    with pytest.raises(ValueError, match="one entry per rank"):
        r.observe([1], [1, 1], [1, 1], [False, False])
    r.observe([3, 3], [MS, MS], [MS, MS], [False, False])
    with pytest.raises(ValueError, match="clock went back"):
        r.observe([2, 3], [MS, MS], [MS, MS], [False, False])


def test_lockstep_rounds_count_from_the_last_switch_or_the_scripts_own_collective():
    s = Stream()
    assert s.rule.origin == [0] * 4
    s.rounds(2, STRAGGLER, LOCKSTEP_STRAGGLER)            # settled, the straggler's gain clear: relaxed from clocks 2
    assert not s.rule.lockstep and s.rule.origin == [2] * 4
    for _ in range(10):                                   # relaxed: the fast ranks run three pushes a round ahead
        s.clocks[:3] = [c + 3 for c in s.clocks[:3]]
        s.clocks[3] += 1
        s.times = [t + p * MS for t, p in zip(s.times, [40, 40, 40, 100])]
        s.observe(STRAGGLER)
    assert s.rule.origin == [2] * 4
    assert not s.rule.observe(s.clocks, [30 * MS] * 4, s.times, s.finished, [False, True, False, False])
    assert s.rule.origin == [32, 32, 32, 12]              # rank 1 waits in a collective of the script's own
    with pytest.raises(ValueError, match="one entry per rank"):
        s.rule.observe(s.clocks, [30 * MS] * 4, s.times, s.finished, [False])


def test_a_round_that_holds_a_collective_of_the_scripts_own_is_not_lockstep_cost():
    s = Stream()
    assert all(s.rounds(6, [30] * 4, [35] * 4))            # equal speeds: lock-step, o_L = 5 ms
    # a round ends with rank 2 inside a collective of the script's own; the next round's gaps hold the call (1 s)
    s.clocks = [c + 1 for c in s.clocks]
    s.times = [t + 35 * MS for t in s.times]
    s.rule.observe(s.clocks, [30 * MS] * 4, s.times, s.finished, [False, False, True, False])
    s.rounds(1, [30] * 4, [1035] * 4)
    assert s.rule.overhead_lockstep_ns == pytest.approx(5 * MS)
    s.rounds(2, [30] * 4, [37] * 4)                       # the rounds after it are sampled again
    assert s.rule.overhead_lockstep_ns > 5 * MS
