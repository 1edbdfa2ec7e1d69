"""Relaxed policies converge on a task with headroom (issue: time to accuracy): MNIST-1D, a 1-D CNN at a Horovod
user's SGD settings (lr 0.025 x ranks, momentum 0.5: two thirds of the benchmark's 0.0375 x ranks, which sits at
plain Horovod's stability edge -- its own curves dip from 0.88 to 0.4-0.6 there -- so a run ending in such a dip
made this test fail about one time in seven under dssp; 0.45 vs 0.75-0.84 typical), 4 ranks with rank 3 three
times slower, a budget of 2000 gradients. With the old defaults (each rank two own updates in flight, no peer
alignment) gradients were about n updates stale and the benchmark's configuration diverged (asp final accuracy
0.64, zipline 0.29-0.44 on the full task). Each policy must now keep the measured staleness low (mean at most 2.5
updates; wbsp: its own bound, below) and end above an accuracy floor, with the invariants (identical replicas,
nothing lost)."""
import json
import os

import pytest

from launch import launch

POLICIES = {"asp": {"HVD_ELASTIC_POLICY": "asp"},
            "ssp": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "3"},
            "dssp": {"HVD_ELASTIC_POLICY": "dssp"},
            "zipline": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "15"},
            "wbsp": {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"}}
# The accuracy judged is the median of the last three test evaluations (every EVAL_EVERY steps of rank 0, and the
# final model): the last points of every curve here oscillate, plain Horovod's too (seeds 5 and 6: 0.737 -> 0.687,
# 0.768 -> 0.700 in the last 50 steps), and under dssp one final point in about ten fell to 0.34 from 0.75 (CI, and
# 1 in 18 runs here) while the curve before it had learned; a diverged run stays low at every point.
EVAL_EVERY = 50
FLOOR = 0.45          # measured after 2000 gradients at lr 0.025 x 4: 0.70-0.78; a diverged run ends near 0.1-0.3
# Mean staleness, in updates. Gradient policies: 2.5 (measured 1.5; the old defaults gave about n = 4 and more, and
# the p90 is not a stable measure here: a tenth of the updates are the straggler's, each ~9 stale). wbsp: a delta is
# computed on the global model downloaded after the slowest rank's previous upload, so it may miss what every rank
# pushed during up to two of the slowest rank's steps (measured mean 7, p90 13): 10.
BOUND = {"asp": 2.5, "ssp": 2.5, "dssp": 2.5, "zipline": 2.5, "wbsp": 10}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from benchmarks.mnist1d_task import write_data
    path = tmp_path_factory.mktemp("mnist1d") / "mnist1d.npz"
    write_data(str(path))
    return str(path)


def _run(env, tmp_path, data):
    res = launch("mpirun", 4, "tests/workers/headroom_train.py", [tmp_path, "--data", data, "--eval-every", EVAL_EVERY],
                 env=env, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(4)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_staleness_stays_bounded_and_the_model_learns(policy, tmp_path, data):
    ranks = _run(POLICIES[policy], tmp_path, data)
    report = ranks[0]["report"]
    pushed = sum(r["counters"]["pushed"] for r in report["ranks"])
    for r in ranks:
        assert r["report"]["ranks"][r["rank"]]["counters"]["applied_contributions"] == pushed   # nothing lost
    assert len({r["weights_sha256"] for r in ranks}) == 1                                      # one model
    st = report["staleness"]
    assert st["updates"] == pushed and st["mean"] <= BOUND[policy], st
    curve = ranks[0]["curve"] + [ranks[0]["accuracy"]]
    assert len(curve) >= 3 and sorted(curve[-3:])[1] >= FLOOR, (policy, curve, st)


def test_the_old_defaults_were_staler(tmp_path, data):
    """The same asp job with the previous defaults (two own updates in flight, no peer alignment, push at step()):
    the bound above is not met -- the test above would catch a return to them."""
    ranks = _run({"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "2", "HVD_ELASTIC_PEER_WAIT": "0",
                  "HVD_ELASTIC_PUSH_AT_BACKWARD": "0"},
                 tmp_path, data)
    assert ranks[0]["report"]["staleness"]["mean"] > BOUND["asp"], ranks[0]["report"]["staleness"]
