"""Elastic Horovod's announced change of the rank set, in the in-process harness (real elastic jobs:
tests/test_elastic.py): once a tick's table carries a change later than the engine's baseline, every rank's tick
thread stops after that same tick -- none starts a later tick that would wait on a rank gone to the reset -- and the
training thread gets RankSetChanged (Horovod's loop: HostsUpdatedInterrupt) once it has taken the ticks completed
before it, so that after the drain every rank holds the same updates."""
import threading
import time

import numpy as np
import pytest
from horovod.common.exceptions import HostsUpdatedInterrupt

from harness import DIM, LR, InMemoryAllreduce, problem
from hvd_elastic.config import Config
from hvd_elastic.elastic import ElasticRun
from hvd_elastic.engine.buffers import NumpyBuffers
from hvd_elastic.engine.engine import Frontend, SyncEngine
from hvd_elastic.engine.loop import RankSetChanged
from hvd_elastic.engine.policies import make_policy
from hvd_elastic.telemetry import Telemetry

ANNOUNCED = 7 * 4 + 1      # a change announced at timestamp 7 (table.HOSTS: timestamp x 4 + kind)


def _train(policy, baseline, announce_at=10, steps=200, n=3, delays=(0.002, 0.002, 0.006)):
    """n ranks train `steps` steps each; rank 1 hears the driver's announcement at its step `announce_at`. Returns
    per rank (engine, weights, how its training ended: 'done' or the exception)."""
    cfg = Config.from_env({}, policy=policy, keep_heap=False)
    reduce = InMemoryAllreduce(n, timeout_s=10.0)
    out = [None] * n

    def body(r):
        w = np.zeros(DIM)
        a, b = problem(r)

        def apply(update, scale, share):
            w[...] -= LR * scale * update

        def write(v):
            w[...] = v
        frontend = Frontend(DIM, NumpyBuffers(np.float64), reduce.for_rank(r), tick_name="t", epoch_ns=0,
                            apply_gradient=apply, read_params=lambda: w.copy(), write_params=write)
        engine = SyncEngine(make_policy(cfg, r, n), r, n, frontend, Telemetry(r, n, policy), cfg,
                            rank_set_baseline=baseline)
        ended = "done"
        try:
            for k in range(steps):
                time.sleep(delays[r])
                if r == 1 and k == announce_at:
                    engine.ticker.announce_hosts(ANNOUNCED)
                g = a @ w - b
                engine.step(lambda dst, alpha, g=g: np.add(dst, alpha * g, out=dst), delays[r])
            engine.finish()
        except RankSetChanged as e:
            ended = e
            engine.abandon(drain=True)    # what ElasticRun.stop does at the reset: the ticks completed, applied
        out[r] = (engine, w, ended)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


@pytest.mark.parametrize("policy", ["asp", "ssp", "wbsp"])
def test_every_rank_stops_after_the_tick_that_announces_the_change_and_holds_the_same_updates(policy):
    ranks = _train(policy, baseline=0)
    assert all(isinstance(ended, RankSetChanged) for _, _, ended in ranks), [e for _, _, e in ranks]
    assert len({engine.ticker.ticks for engine, _, _ in ranks}) == 1, [e.ticker.ticks for e, _, _ in ranks]
    assert len({engine.applied_contributions for engine, _, _ in ranks}) == 1, \
        [e.applied_contributions for e, _, _ in ranks]
    if policy != "wbsp":     # the gradient policies: every rank applied the same ticks in the same order
        assert all(np.array_equal(w, ranks[0][1]) for _, w, _ in ranks)
    assert all(e.pushed < 200 for e, _, _ in ranks)   # stopped mid-run
    assert isinstance(ElasticRun.failed(ranks[0][2]), HostsUpdatedInterrupt)


@pytest.mark.parametrize("baseline", [None, 7])
def test_no_stop_outside_elastic_horovod_or_for_a_change_already_reset_for(baseline):
    ranks = _train("asp", baseline=baseline)
    assert all(ended == "done" for _, _, ended in ranks), [e for _, _, e in ranks]
    assert sum(e.pushed for e, _, _ in ranks) == 600 and all(e.applied_contributions == 600 for e, _, _ in ranks)
