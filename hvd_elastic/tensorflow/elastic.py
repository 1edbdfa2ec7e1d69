"""Elastic Horovod under the tick policies, the TensorFlow side of hvd_elastic/elastic.py: :class:`TfReplica` copies,
loads and broadcasts a wrapped Keras 3 optimizer's trained variables and its own variables. Horovod's elastic loop
(hvd_elastic.keras.elastic: KerasState, run) routes its reset, restore and commit through hvd_elastic.elastic (under
lbbsp too: hvd_elastic.elastic.LbbspResets)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np

from ..elastic import ElasticRun, Replica
from ._core import broadcast_variables

class TfReplica(Replica):
    """A wrapped optimizer's (hvd_elastic.tensorflow._core.ElasticState) flat trained variables and optimizer
    variables (slots, iterations), as numpy copies."""

    def __init__(self, state):
        self.state = state

    def allgather(self, obj, name):
        return hvd.allgather_object(obj, name=name)

    def capture(self, global_model):
        weights = self.state.flat.weights().numpy() if global_model is None else global_model.numpy()
        return np.array(weights, copy=True), [np.array(v.numpy(), copy=True) for v in self.state.optimizer.variables]

    def load(self, weights, optimizer_state):
        """The snapshot's weights and optimizer variables (slots, iterations); the learning rate (a variable of a
        Keras 3 optimizer) stays as it is -- after a reset the script's reset callbacks and Horovod's sync have set
        it for the new ranks, as under Horovod."""
        self.state.flat.set_weights(weights)
        optimizer = self.state.optimizer
        learning_rate = getattr(optimizer, "learning_rate", None)
        for v, value in zip(optimizer.variables, optimizer_state):
            if v is not learning_rate:
                v.assign(value)

    def variables(self) -> list:
        """The variables :meth:`broadcast` sets: the trained ones, then the optimizer's."""
        return list(self.state.flat.variables) + list(self.state.optimizer.variables)

    def broadcast(self, root_rank):
        broadcast_variables(self.variables(), root_rank, name="hvd_elastic.elastic.replica")


def elastic_run(state) -> ElasticRun:
    """The wrapped optimizer's side of elastic Horovod (its resets counted in its report)."""
    run = ElasticRun(TfReplica(state), state.session, state.start_engine)
    state.session.counter_sources.append(run.counters)
    return run
