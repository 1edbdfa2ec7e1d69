"""ElasticRun.plan_resume's choice at the state's sync (in-process, two ranks as threads; real elastic jobs:
tests/test_elastic.py): every rank takes the most advanced survivor's replica, and loads and broadcasts it only where
Horovod's sync has not just given every rank that same state -- it has where the replica is rank 0's and still its
model (a change of the rank set without a restore, a gradient policy) and the sync covered this optimizer; and which
parts of a TorchState that sync leaves out where the replica's broadcast replaces them (a Horovod process of size 1)."""
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from hvd_elastic.elastic import ElasticRun, Replica


class World:
    """Two ranks' collectives: allgather and broadcast of the replicas' (weights, optimizer state)."""

    def __init__(self, n):
        self.barrier, self.slots = threading.Barrier(n, timeout=10), [None] * n

    def allgather(self, rank, obj):
        self.barrier.wait()
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class FakeReplica(Replica):
    def __init__(self, world, rank, weights):
        self.world, self.rank = world, rank
        self.weights, self.momentum = np.array(weights, dtype=float), np.full(len(weights), 0.5 + rank)
        self.loads = self.broadcasts = 0

    def allgather(self, obj, name):
        return self.world.allgather(self.rank, obj)

    def capture(self, global_model):
        return self.weights.copy(), self.momentum.copy()

    def load(self, weights, optimizer_state):
        self.loads += 1
        self.weights[...], self.momentum[...] = weights, optimizer_state

    def broadcast(self, root_rank):
        self.broadcasts += 1
        mine = (self.weights.copy(), self.momentum.copy())
        root = self.world.allgather(self.rank, mine)[root_rank]
        self.weights[...], self.momentum[...] = root


def _run(world, rank, applied, wbsp):
    updates = SimpleNamespace(global_model=object() if wbsp else None)   # wbsp: the replica's weights are W
    engine = SimpleNamespace(abandoned=False, finished=False, applied_contributions=applied, rank=rank, pushed=3,
                             view=SimpleNamespace(clocks=[3, 3]), updates=updates,
                             ticker=SimpleNamespace(handoff=SimpleNamespace(hosts_announced=lambda: 0)))
    engine.abandon = lambda drain: setattr(engine, "abandoned", True)
    session = SimpleNamespace(engine=engine, rank=rank, report=None, last_step_end=0.0, follow_ranks=lambda: None)
    return ElasticRun(FakeReplica(world, rank, [1.0 + rank, 2.0]), session, start_engine=None)


def _threads(target, runs):
    threads = [threading.Thread(target=target, args=(rank, run)) for rank, run in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def _reset(failure, synced, wbsp=False, applied=(10, 10)):
    """Both ranks through a reset (keep_replica first after a failure, then stop), then the state's sync: the plan
    (collective), Horovod's sync of rank 0's model and optimizer state (the other rank given rank 0's weights) unless
    the plan loads a replica that the sync covers, then resume."""
    world = World(2)
    runs = [_run(world, r, applied[r], wbsp) for r in range(2)]
    for run in runs:
        if failure:
            run.keep_replica()
            run.replica.weights[...] = -7.0     # the restored commit
        run.stop()
    plans = [None, None]
    _threads(lambda rank, run: plans.__setitem__(rank, run.plan_resume(synced)), runs)
    assert plans[0] == plans[1]
    if not (synced and plans[0].load):
        for run in runs:
            run.replica.weights[...], run.replica.momentum[...] = runs[0].replica.weights, runs[0].replica.momentum
    _threads(lambda rank, run: run.resume(plans[rank]), runs)
    for run in runs:
        run.session.report = {}                  # finished: no longer live
    return runs


def test_a_change_of_the_rank_set_under_a_gradient_policy_loads_and_broadcasts_nothing_again():
    runs = _reset(failure=False, synced=True)
    assert [(r.replica.loads, r.replica.broadcasts, r.replica_loads) for r in runs] == [(0, 0, 0), (0, 0, 0)]
    assert all(r.preloaded == (0, 10) for r in runs)
    assert all(np.array_equal(r.replica.weights, [1.0, 2.0]) for r in runs)   # rank 0's replica, synced


@pytest.mark.parametrize("case", ["failure", "wbsp", "not_synced", "rank_1_ahead"])
def test_the_replica_is_loaded_and_broadcast_where_the_sync_did_not_give_it(case):
    runs = _reset(failure=case == "failure", synced=case != "not_synced", wbsp=case == "wbsp",
                  applied=(10, 11) if case == "rank_1_ahead" else (10, 10))
    best = 1 if case == "rank_1_ahead" else 0
    assert [r.replica.broadcasts for r in runs] == [1, 1] and [r.replica_loads for r in runs] == [1, 1]
    assert [r.replica.loads for r in runs] == [int(rank == best) for rank in range(2)]
    # every rank holds the best survivor's snapshot (not the restored commit, not rank 0's synced model)
    assert all(np.array_equal(r.replica.weights, [1.0 + best, 2.0]) for r in runs), [r.replica.weights for r in runs]
    assert all(r.preloaded == (best, 10 + best) for r in runs)


# One process (Horovod of size 1, in a child: the test process never initialises Horovod): which parts of a TorchState
# hvd_elastic/torch/elastic.py's _sync_but syncs when the replicas of `replaced` optimizers will be broadcast after it.
SYNC_BUT = r"""
import json, sys
import torch
import horovod.torch as hvd
from hvd_elastic.torch import elastic
hvd.init()
net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))   # the optimizer's parameters, and buffers
other = torch.nn.Linear(2, 2)                                                # parameters the optimizer does not hold
opt = torch.optim.SGD(net.parameters(), lr=0.1)
state = hvd.elastic.TorchState(model=net, optimizer=opt, other=other, batch=0)
synced, sent = [], []
for name, handler in state._handlers.items():
    handler.sync = lambda name=name: synced.append(name)
hvd.broadcast_parameters = lambda params, root_rank: sent.append(sorted(params))
elastic._sync_but(state, [opt] if sys.argv[1] == "replaced" else [])
print(json.dumps({"synced": sorted(synced), "sent": sent}))
"""


@pytest.mark.parametrize("case", ["replaced", "none"])
def test_a_torch_state_sync_leaves_out_only_what_the_replicas_broadcast_replaces(case):
    """The optimizer's state and its model's parameters are left out (the model's buffers still broadcast from rank
    0); a model with parameters the optimizer does not hold, and everything where no replica replaces it, as
    Horovod syncs them."""
    res = subprocess.run([sys.executable, "-c", SYNC_BUT, case], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if case == "replaced":
        assert out == {"synced": ["other"], "sent": [["1.num_batches_tracked", "1.running_mean", "1.running_var"]]}
    else:
        assert out == {"synced": ["model", "optimizer", "other"], "sent": []}
