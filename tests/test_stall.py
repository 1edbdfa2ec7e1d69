"""The stall rule (hvd_elastic/stall.py) in one process: from a table of ranks and the time, whether the job stops
and the line that names why. The real-launcher fault tests (tests/test_faults.py) check that the watchdog applies
it on real jobs; these check each case of the rule, including ones a real run hits rarely."""
from hvd_elastic.stall import COLLECTIVE, ERROR_GRACE_S, USER, RankState, StallRule, collective

T = 10.0   # the timeout of these tables


def _table(n=3, where="the asp gate", steps=5, progress=0.0, now=100.0):
    ranks = []
    for q in range(n):
        r = RankState(now)
        r.armed, r.where, r.steps, r.progress, r.heard = True, where, steps, progress, now
        ranks.append(r)
    return ranks


def test_a_lost_rank_is_named_at_once():
    ranks = _table(progress=99.0)
    ranks[2].state = "lost"
    v = StallRule(0, T, "asp").verdict(ranks, 100.0)
    assert v is not None and v.text.startswith("rank 2 lost") and "rank 0 is in the asp gate" in v.text


def test_a_rank_that_raised_is_named_after_the_grace_time_only():
    ranks = _table(progress=99.0)
    ranks[1].state, ranks[1].error = "exited", "ValueError"
    rule = StallRule(0, T, "asp")
    assert rule.verdict(ranks, 100.0) is None           # this rank may still print its own error first
    assert rule.verdict(ranks, 100.0 + ERROR_GRACE_S - 0.1) is None
    v = rule.verdict(ranks, 100.0 + ERROR_GRACE_S + 0.1)
    assert v is not None and "rank 1 exited with ValueError" in v.text


def test_no_verdict_while_any_rank_progresses_or_this_rank_runs_the_scripts_own_code():
    ranks = _table(progress=0.0)
    ranks[2].progress = 95.0                            # rank 2 made progress 5 s ago
    assert StallRule(0, T, "asp").verdict(ranks, 100.0) is None
    ranks = _table(progress=0.0)
    ranks[0].where = USER
    assert StallRule(0, T, "asp").verdict(ranks, 100.0) is None


def test_a_silent_rank_is_named_and_woken_when_nobody_progresses():
    ranks = _table(progress=0.0)
    ranks[1].heard = 90.0                               # no heartbeat for 10 s: a stopped process
    v = StallRule(0, T, "bsp").verdict(ranks, 100.0)
    assert v is not None and v.text.startswith("rank 1 stopped making progress (no heartbeat for 10 s")
    assert list(v.wake) == [1] and "HVD_ELASTIC_STALL_TIMEOUT=10 s" in v.text


def test_ranks_blocked_in_their_own_collectives_are_named_with_the_calls():
    ranks = _table(progress=0.0)
    ranks[0].where = collective("allreduce.noname.3")
    ranks[1].where = collective("allreduce.noname.5")
    v = StallRule(0, T, "asp").verdict(ranks, 100.0)
    assert v is not None and v.text.startswith("ranks 0, 1 blocked in a Horovod collective of the script's own")
    assert "'allreduce.noname.3'" in v.text and "'allreduce.noname.5'" in v.text
    assert "rank 2 in the asp gate" in v.text and "the asp policy holds a rank" in v.text


def test_a_rank_in_its_own_collective_waits_for_a_rank_still_in_its_own_code():
    ranks = _table(progress=0.0)
    ranks[0].where = COLLECTIVE + "allreduce.metrics"
    ranks[1].where = USER                               # evaluating, say: it will reach the call
    assert StallRule(0, T, "bsp").verdict(ranks, 100.0) is None


def test_a_rank_blocked_in_its_own_code_is_named_with_the_knob_to_raise():
    ranks = _table(progress=0.0)
    ranks[2].where = USER
    for policy in ("zipline", "bsp"):
        text = StallRule(0, T, policy).verdict(ranks, 100.0).text
        assert text.startswith("rank 2 stopped making progress: blocked in the script's own code"), text
        assert "raise HVD_ELASTIC_STALL_TIMEOUT" in text and "rank 0 waits in the asp gate" in text, text


def test_otherwise_the_ranks_with_the_fewest_steps_are_named():
    ranks = _table(progress=0.0)
    ranks[1].steps = 2
    v = StallRule(0, T, "ssp").verdict(ranks, 100.0)
    assert v is not None and v.text.startswith("rank 1 stopped making progress (heartbeat alive")
