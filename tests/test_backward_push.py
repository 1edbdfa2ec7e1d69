"""Push at the end of backward (HVD_ELASTIC_PUSH_AT_BACKWARD, hvd_elastic/torch/backward_push.py), 2 ranks under
mpirun: a plain loop pushes from the backward hooks from its second step on with every invariant kept; a script
that clips its gradients (Horovod's synchronize() protocol, or clipping straight after backward) is recognised in
its first step and pushes at step(), so the clipped gradient is the one applied (the weights move at most
lr x max_norm / n per push); clipping that starts after the gradients were pushed at backward is a one-line error
on every rank, never a silently dropped change. The cases that end normally share one job, one after the other
(the knob turned off as the optimizer's keyword); the error case has its own."""
import json
import os

import pytest

from launch import launch

STEPS, LR, MAX_NORM = 30, 0.5, 1e-3
CASES = ("none", "off", "protocol", "always")    # one job, one case after the other (the worker's --clip list)


def _run(tmp_path, policy, clip, timeout=120):
    res = launch("mpirun", 2, "tests/workers/backward_push.py",
                 [tmp_path, "--steps", STEPS, "--lr", LR, "--max-norm", MAX_NORM, "--clip", clip],
                 env={"HVD_ELASTIC_POLICY": policy}, timeout=timeout)
    assert not res.timed_out, res.output[-3000:]
    return res


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """The cases that end normally, in one asp job: {case: [rank 0's output, rank 1's]}."""
    out = tmp_path_factory.mktemp("backward_push")
    res = _run(out, "asp", ",".join(CASES), timeout=180)
    assert res.returncode == 0, res.output[-3000:]
    return {c: [json.load(open(os.path.join(out, f"rank{r}.{c}.json"))) for r in range(2)] for c in CASES}


def _counters(rank):
    return rank["report"]["ranks"][rank["rank"]]["counters"]


def _invariants(ranks):
    pushed = sum(_counters(r)["pushed"] for r in ranks)
    assert pushed == 2 * STEPS
    assert all(_counters(r)["applied_contributions"] == pushed for r in ranks)
    assert len({r["weights_sha256"] for r in ranks}) == 1


def test_a_plain_loop_pushes_at_backward_from_its_second_step(cases):
    ranks = cases["none"]
    _invariants(ranks)
    assert [_counters(r).get("backward_pushes", 0) for r in ranks] == [STEPS - 1] * 2


def test_the_knob_turns_it_off(cases):
    ranks = cases["off"]
    _invariants(ranks)
    assert [_counters(r).get("backward_pushes", 0) for r in ranks] == [0, 0]


@pytest.mark.parametrize("clip", ["protocol", "always"])
def test_clipped_gradients_are_pushed_at_step_and_applied_clipped(clip, cases):
    ranks = cases[clip]
    _invariants(ranks)
    assert [_counters(r).get("backward_pushes", 0) for r in ranks] == [0, 0]
    # Each push is a gradient of norm <= MAX_NORM applied with weight 1/n: the weights travel at most this far.
    # Unclipped gradients here have norms near 1, i.e. hundreds of times more.
    bound = LR * MAX_NORM * 2 * STEPS / 2
    assert all(r["distance"] <= bound * 1.001 for r in ranks), ([r["distance"] for r in ranks], bound)


def test_clipping_after_a_push_at_backward_is_an_error_on_every_rank(tmp_path):
    res = _run(tmp_path, "asp", "late", timeout=90)
    assert res.returncode != 0
    lines = res.lines_with("changed after backward after this step's gradient was pushed")
    assert lines, res.output[-3000:]
    assert all("'0.weight'" in line and "HVD_ELASTIC_PUSH_AT_BACKWARD=0" in line for line in lines), lines
    # Every rank stops on a line of the plugin. Usually each rank reaches the same step and raises the error itself;
    # a rank still inside an earlier step when the first one exits stops instead on its tick thread's error (Horovod
    # shut down under it). Both are the plugin's, neither hangs.
    shutdown = res.lines_with("hvd_elastic: error: tick thread failed: Horovod has been shut down")
    assert len({line.split("]")[0] for line in lines + shutdown}) == 2, res.output[-3000:]
