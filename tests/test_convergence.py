"""Relaxed policies converge on a task with headroom (time to accuracy): MNIST-1D, a 1-D CNN at a Horovod user's
SGD settings (lr 0.025 x ranks, momentum 0.5: two thirds of the benchmark's 0.0375 x ranks, which sits at plain
Horovod's stability edge, where its own curves dip from 0.88 to 0.4-0.6), 4 ranks with rank 3 three times slower, a
budget of 2000 gradients, on real mpirun jobs. With each rank's own updates in flight and no peer alignment,
gradients are about n updates stale and the benchmark's configuration diverges; the defaults must keep the staleness
low and the model learning, with the invariants (identical replicas, nothing lost). asp stands for the gradient
policies (their staleness bounds and pacing are tested in tests/test_engine_pacing.py), wbsp (with overlap) for the
delta policy; both in one job, one after the other."""
import json
import os

import pytest

from launch import launch

POLICIES = ("asp", "wbsp-overlap")
# The accuracy judged is the median of the last three test evaluations (every EVAL_EVERY steps of rank 0, and the
# final model): the last points of every curve here oscillate, plain Horovod's too (by up to 0.07 in the last 50
# steps), and a single final point may fall far below a curve that has learned; a diverged run stays low at every
# point.
EVAL_EVERY = 50
FLOOR = 0.45          # after 2000 gradients at lr 0.025 x 4: about 0.70-0.78; a diverged run ends near 0.1-0.3
# Mean staleness, in updates. asp: 2.5 (about 1.5 with the defaults, about n = 4 and more with own updates in flight
# and no peer alignment; the p90 is not a stable measure here: a tenth of the updates are the straggler's, each ~9
# stale). wbsp: a delta is computed on the global model downloaded after the slowest rank's previous upload, so it
# may miss what every rank pushed during up to two of the slowest rank's steps (mean about 7, p90 about 13): 10.
BOUND = {"asp": 2.5, "wbsp-overlap": 10}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from benchmarks.mnist1d_task import write_data
    path = tmp_path_factory.mktemp("mnist1d") / "mnist1d.npz"
    write_data(str(path))
    return str(path)


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("convergence")
    res = launch("mpirun", 4, "tests/workers/headroom_train.py",
                 [out, "--data", data, "--eval-every", EVAL_EVERY, "--policies", ",".join(POLICIES)], timeout=300)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return {p: [json.load(open(os.path.join(out, f"rank{r}.{p}.json"))) for r in range(4)] for p in POLICIES}


@pytest.mark.parametrize("policy", POLICIES)
def test_staleness_stays_bounded_and_the_model_learns(policy, runs):
    ranks = runs[policy]
    report = ranks[0]["report"]
    pushed = sum(r["counters"]["pushed"] for r in report["ranks"])
    for r in ranks:
        assert r["report"]["ranks"][r["rank"]]["counters"]["applied_contributions"] == pushed   # nothing lost
    assert len({r["weights_sha256"] for r in ranks}) == 1                                      # one model
    st = report["staleness"]
    assert st["updates"] == pushed and st["mean"] <= BOUND[policy], st
    curve = ranks[0]["curve"] + [ranks[0]["accuracy"]]
    assert len(curve) >= 3 and sorted(curve[-3:])[1] >= FLOOR, (policy, curve, st)
