"""Elastic Horovod for Keras 3 ``model.fit`` (``horovodrun --elastic``), built on ``horovod.tensorflow`` only:
Horovod's own Keras elastic state (``horovod.tensorflow.elastic.TensorFlowKerasState``) calls ``optimizer.variables()``,
a list in Keras 3, and fails at its first save. Under every policy (lbbsp: fit reads ``lbbsp_dataset``, made once,
before the first fit; the state keeps its batch plan)::

    import horovod.tensorflow as hvd
    import hvd_elastic.keras as hvdk

    hvd.init()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss="mse")
    state = hvdk.elastic.KerasState(model)            # epoch, batch: where fit stands

    @hvdk.elastic.run
    def train(state):
        hvdk.elastic.fit(model, state, x, y, epochs=epochs, steps_per_epoch=steps, batches_per_commit=10,
                         callbacks=[hvdk.SyncCallback()])

    train(state)

- :class:`KerasState` keeps the model's variables and the optimizer's (built first, so a worker that joins has the
  same slots to receive) at each commit, restores them after a failure and broadcasts rank 0's at each sync, with the
  script's own attributes (``epoch``, ``batch``, ...) as Horovod's ObjectState does; under lbbsp, with them, the
  place in the data of the optimizer's ``lbbsp_dataset`` (its batch plan), so an epoch resumes at its first global
  batch not stepped, dealt over the ranks of the moment (hvd_elastic.elastic.LbbspResets rebuilds its controller).
- :func:`run` is Horovod's elastic loop (its resets counted in hvd_elastic/elastic.py); a failed Horovod op inside
  the compiled train step surfaces in TensorFlow as an op error naming the op, which becomes the
  HorovodInternalError that loop recovers from (any other error is raised as it is).
- :func:`fit` runs model.fit from where the state stands (``state.epoch``, ``state.batch``) and commits as it goes:
  an epoch cut short by a reset runs only the batches it still had (Keras 3's fit cannot start an epoch mid-way, so
  that part is a fit of its own), so each rank takes ``epochs x steps_per_epoch`` steps whatever the resets.
- Under a tick policy a reset goes through hvd_elastic/elastic.py: the engine stops before Horovod shuts down
  (:func:`run`'s reset), the most advanced replica is kept before the commit comes back (:meth:`KerasState.restore`),
  a commit is local and the ranks agree on a change of the rank set through the ticks
  (:meth:`KerasState.check_host_updates`), and right after the state's sync every rank takes the best survivor's
  replica (:meth:`KerasState.sync`), from which the next fit's (or apply's) engine starts.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from .. import elastic as _elastic
from ..engine.ticker import TickerError
from ..errors import ConfigError
from ..tensorflow._core import broadcast_variables, state_of


_DATASET_FIRST = ("policy lbbsp under elastic Horovod: make the dataset once, before the function of "
                  "hvd_elastic.keras.elastic.run (data = hvd_elastic.keras.lbbsp_dataset(optimizer, ...)), on every "
                  "rank, so that the KerasState keeps its place in the data over the resets")


class KerasState(ObjectState):
    """The state of a Keras 3 model and its optimizer (default: the model's compiled one) under elastic Horovod;
    keyword arguments are the script's own attributes (``epoch=0, batch=0``), kept and synced with it."""

    def __init__(self, model, optimizer=None, **kwargs):
        kwargs.setdefault("epoch", 0)     # fit(): the next epoch to run
        kwargs.setdefault("batch", 0)     # fit(): the batches of that epoch done
        self.model = model
        if not model.built:
            raise ValueError("KerasState: build the model first (model.build(input_shape), or call it once)")
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        if self.optimizer is None:
            raise ValueError("KerasState: compile the model with its optimizer first, or pass optimizer=")
        if not self.optimizer.built:
            # a worker that joins must hold the same slots as the others before it receives theirs
            self.optimizer.build(model.trainable_variables)
        self._saved = self._values()
        self._saved_plan = None    # lbbsp: the batch plan's place in the data at the last commit
        super().__init__(bcast_object=lambda obj: hvd.broadcast_object(obj, root_rank=0,
                                                                       name="hvd_elastic.keras.state"),
                         get_rank=hvd.rank, **kwargs)

    def _variables(self):
        return list(self.model.variables) + list(self.optimizer.variables)

    def _plan(self):
        """lbbsp: the batch plan of the optimizer's lbbsp_dataset (its place in the data), or None."""
        wrapped = state_of(self.optimizer)
        return wrapped.plan if wrapped is not None else None

    def _values(self):
        return [np.array(v.numpy(), copy=True) for v in self._variables()]

    def save(self):
        self._saved = self._values()
        plan = self._plan()
        self._saved_plan = plan.state_dict() if plan is not None else None
        super().save()

    def restore(self):
        _elastic.keep_replicas()    # a tick policy's most advanced replica, before the commit comes back
        for v, saved in zip(self._variables(), self._saved):
            v.assign(saved)
        plan = self._plan()
        if plan is not None and self._saved_plan is not None:
            plan.load_state_dict(self._saved_plan)
        super().restore()

    def check_host_updates(self):
        """Horovod's check at every commit; under a tick policy through the ticks (hvd_elastic.elastic)."""
        _elastic.check_host_updates(self, super().check_host_updates)

    def sync(self):
        # a tick policy: every rank learns which survivor's replica it takes (this state's optimizer: every rank has
        # its ElasticRun now; another optimizer's loads at its engine's start); where that replica is broadcast, it
        # brings the trained and the optimizer's variables, and rank 0's are not broadcast before it
        wrapped = state_of(self.optimizer)
        run = wrapped.ensure_elastic(self.model.trainable_variables) if wrapped is not None else None
        resume = run.plan_resume(synced=True) if run is not None else None
        replaced = set()
        if resume is not None and resume.load:
            replaced = {id(v) for v in run.replica.variables()}
            run.sync_replaced += 1
        broadcast_variables([v for v in self._variables() if id(v) not in replaced], root_rank=0,
                            name="hvd_elastic.keras.state.vars")
        plan = self._plan()
        # lbbsp: rank 0's place in the data; every rank takes part (a joiner made its dataset before the first fit)
        root = hvd.broadcast_object(plan.state_dict() if plan is not None else None, root_rank=0,
                                    name="hvd_elastic.keras.state.plan")
        if plan is not None:
            if root is None:
                raise ConfigError(_DATASET_FIRST)
            self._saved_plan = root
            plan.load_state_dict(root)
        super().sync()
        if resume is not None:    # every rank moves to that replica before its first step computes
            run.resume(resume)
        self._saved = self._values()   # what every rank holds now: a failure before the next commit comes back here


def _horovod_op_failed(error: tf.errors.OpError) -> bool:
    return "Horovod" in (error.message or "")


def run(func):
    """Horovod's elastic loop (``hvd.elastic.run``) for a Keras 3 script: `func(state, ...)` runs again after each
    reset, on every rank, after the state's sync."""
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if _horovod_op_failed(e):
                raise HorovodInternalError(e) from e
            raise
        except TickerError as e:    # a tick policy's tick thread met Horovod's failure
            raise _elastic.ElasticRun.failed(e) from e

    def reset():
        stopped = _elastic.stop_engines()    # a tick policy's engine stops before Horovod shuts down
        hvd.shutdown()
        _elastic.join_stopped(stopped)
        hvd.init()

    return run_fn(wrapper, reset)


class _Count(keras.callbacks.Callback):
    """:func:`fit`'s bookkeeping, first in the callbacks: ``state.batch`` (batches of the epoch done), ``state.epoch``
    (the next epoch)."""

    def __init__(self, state: KerasState, first_batch: int):
        super().__init__()
        self.state, self.first = state, first_batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self.first + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch, self.state.batch, self.first = epoch + 1, 0, 0


class _Commit(keras.callbacks.Callback):
    """:func:`fit`'s commits, last in the callbacks (a commit holds what the others did with the batch): every
    `every` batches and at each epoch's end; collective under bsp (Horovod's check for new or removed hosts)."""

    def __init__(self, state: KerasState, every: int):
        super().__init__()
        self.state, self.every, self._left = state, every, every

    def on_train_batch_end(self, batch, logs=None):
        self._left -= 1
        if self._left == 0:
            self._left = self.every
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


def fit(model, state: KerasState, x=None, y=None, *, epochs: int, steps_per_epoch: int, batches_per_commit: int = 1,
        callbacks=(), **kwargs):
    """``model.fit`` under elastic Horovod, from where `state` stands: an epoch cut short by a reset first runs the
    batches it still had (a fit of its own), then the epochs left; `state` is committed every `batches_per_commit`
    batches and at each epoch's end. Call it inside :func:`run`'s function; other arguments are fit's. Returns the
    last fit's History (None when nothing was left to run)."""
    if int(batches_per_commit) < 1:
        raise ValueError(f"hvd_elastic.keras.elastic.fit: batches_per_commit={batches_per_commit}; accepted: "
                         f"integer >= 1")
    if int(steps_per_epoch) < 1:
        raise ValueError(f"hvd_elastic.keras.elastic.fit: steps_per_epoch={steps_per_epoch}; accepted: integer >= 1")
    history = None
    if state.batch >= steps_per_epoch:
        # a reset came after the epoch's last batch, before its end was counted: the epoch is done
        state.epoch, state.batch = state.epoch + 1, 0
    if 0 < state.batch < steps_per_epoch and state.epoch < epochs:
        # the epoch a reset cut short: its remaining batches; where more epochs follow, the run (its engine, its
        # report) goes on in the next fit
        model._hvd_elastic_partial_fit = state.epoch + 1 < epochs
        try:
            model.fit(x, y, epochs=state.epoch + 1, initial_epoch=state.epoch,
                      steps_per_epoch=steps_per_epoch - state.batch,
                      callbacks=[_Count(state, state.batch), *callbacks, _Commit(state, int(batches_per_commit))],
                      **kwargs)
        finally:
            model._hvd_elastic_partial_fit = False
        if model.stop_training:     # SyncCallback's global_steps budget: the run has ended
            return None
    if state.epoch < epochs:
        history = model.fit(x, y, epochs=epochs, initial_epoch=state.epoch, steps_per_epoch=steps_per_epoch,
                            callbacks=[_Count(state, 0), *callbacks, _Commit(state, int(batches_per_commit))],
                            **kwargs)
    return history
