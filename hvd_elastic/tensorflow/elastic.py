"""Elastic Horovod, the TensorFlow side: under the tick policies (hvd_elastic/elastic.py) :class:`TfReplica` copies,
loads and broadcasts a wrapped Keras 3 optimizer's trained variables and its own variables; under lbbsp
:class:`LbbspResets` rebuilds the batch plan's controller for the ranks of the moment. Horovod's elastic loop
(hvd_elastic.keras.elastic: KerasState, run) routes its reset, restore and commit through here and
hvd_elastic.elastic, and counts its resets here (:func:`note_reset`)."""
from __future__ import annotations

import time
from typing import Optional

import horovod.tensorflow as hvd
import numpy as np

from ..elastic import ElasticRun, Replica
from ..lbbsp import LbbspController
from ._core import broadcast_variables

_resets = 0                          # resets of the rank set in this process (hvd_elastic.keras.elastic.run)
_reset_began: Optional[float] = None  # perf_counter() when the latest began


def note_reset():
    """hvd_elastic.keras.elastic.run's reset begins (before Horovod's shutdown)."""
    global _resets, _reset_began
    _resets += 1
    _reset_began = time.perf_counter()


def resets() -> int:
    return _resets


class LbbspResets:
    """lbbsp under elastic Horovod on Keras 3: the steps are synchronous, so a reset is Horovod's (the last commit
    after a failure, rank 0's state at the sync); at the first fit after it the controller is rebuilt for the ranks
    of the moment (B kept, split evenly until the new ranks' speeds are measured), and the batch plan, in the
    KerasState, resumes the epoch at its first global batch not stepped (hvd_elastic.lbbsp.BatchPlan)."""

    def __init__(self):
        self.seen = _resets
        self.resets = 0
        self.reset_s = 0.0      # from each reset's start to the controller's rebuild for the new ranks

    def follow(self, session):
        """Rebuild `session`'s controller if Horovod has reset the rank set since it was built."""
        if _resets == self.seen:
            return
        self.seen = _resets
        session.follow_ranks()
        session.lbbsp = LbbspController(session.cfg, session.rank, session.size, session.telemetry)
        self.resets += 1
        if _reset_began is not None:
            self.reset_s += time.perf_counter() - _reset_began

    def counters(self) -> dict:
        return {"elastic_resets": self.resets, "elastic_reset_s": round(self.reset_s, 3)}


class TfReplica(Replica):
    """A wrapped optimizer's (hvd_elastic.tensorflow._core.ElasticState) flat trained variables and optimizer
    variables (slots, iterations), as numpy copies."""

    def __init__(self, state):
        self.state = state

    def allgather(self, obj, name):
        return hvd.allgather_object(obj, name=name)

    def capture(self, engine):
        weights = engine.buffers.numpy(engine.updates.global_model) if engine.updates.local_step \
            else self.state.flat.weights().numpy()
        return np.array(weights, copy=True), [np.array(v.numpy(), copy=True) for v in self.state.optimizer.variables]

    def load(self, weights, optimizer_state):
        self.state.flat.set_weights(weights)
        for v, value in zip(self.state.optimizer.variables, optimizer_state):
            v.assign(value)

    def broadcast(self, root_rank):
        broadcast_variables(list(self.state.flat.variables) + list(self.state.optimizer.variables), root_rank,
                            name="hvd_elastic.elastic.replica")


def elastic_run(state) -> ElasticRun:
    """The wrapped optimizer's side of elastic Horovod (its resets counted in its report)."""
    run = ElasticRun(TfReplica(state), state.session, state.start_engine)
    state.session.counter_sources.append(run.counters)
    return run
