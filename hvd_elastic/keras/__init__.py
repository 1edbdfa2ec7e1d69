"""hvd-elastic for Keras 3 ``model.fit`` (TensorFlow backend): the policy in ``HVD_ELASTIC_POLICY`` for a model
compiled normally (graph mode). Built on ``horovod.tensorflow`` ops only (Horovod's own Keras layer is broken on
Keras 3)::

    import horovod.tensorflow as hvd
    import hvd_elastic.keras as hvde

    hvd.init()
    opt = hvde.DistributedOptimizer(keras.optimizers.SGD(hvde.scale_lr(0.05)))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    sync = hvde.SyncCallback()            # broadcast from rank 0, per-step sync, final sync + report
    model.fit(x, y, batch_size=16, epochs=5, callbacks=[sync, hvde.MetricAverageCallback()])
    # every rank holds the same weights; rank 0 has printed where the time went; sync.report is the report

Under lbbsp (``HVD_ELASTIC_POLICY=lbbsp``, ``HVD_ELASTIC_GLOBAL_BATCH=B``) feed ``model.fit`` with
:func:`lbbsp_dataset`: each step every rank takes its share of B samples, re-sized so all ranks finish together::

    model.fit(hvde.lbbsp_dataset(opt, (x, y), seed=0), epochs=5, callbacks=[hvde.SyncCallback()])

See docs/keras.md for what each policy means with Keras optimizers, docs/lbbsp.md for LB-BSP.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from .. import horovod_env
from .. import stall as _stall
from ..elastic import resets as _elastic_resets
from ..errors import ConfigError
from ..lbbsp import BatchPlan
from ..tensorflow._core import broadcast_variables, state_of, wrap_optimizer



def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=hvd.Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=hvd.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=hvd.global_process_set, scale_local_gradients=True, **policy_kwargs):
    """Wrap a Keras 3 optimizer instance for ``model.compile`` (same object, same state). Under bsp its ``apply``
    averages the gradients exactly with one grouped allreduce inside the compiled train step; under the relaxed
    policies :class:`SyncCallback` hands each step's gradient (wbsp: model delta) to the sync engine. Knobs may be
    keywords (``policy="zipline"``, ``lookahead=6``, ...), which win over ``HVD_ELASTIC_*``. Collective.

    Horovod's keyword arguments (horovod.tensorflow.keras.DistributedOptimizer) are accepted: under bsp with
    Horovod's meaning (compression, op Average/Sum, gradient_predivide_factor, devices; see
    hvd_elastic.tensorflow._core.check_horovod_arguments), under the other policies at their defaults only (else one
    line names the argument and policy bsp); docs/horovod-compat.md."""
    horovod_args = dict(name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
                        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
                        backward_passes_per_step=backward_passes_per_step,
                        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
                        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    return wrap_optimizer(optimizer, policy_kwargs, "Keras", horovod_args=horovod_args)


def _fit_goes_on(model) -> bool:
    """This model.fit is the rest of an epoch a reset cut short (hvd_elastic.keras.elastic.fit) and the run goes on in
    the next fit: no final synchronization, report or end-of-run collective at its end."""
    return bool(getattr(model, "_hvd_elastic_partial_fit", False)) and not model.stop_training


def scale_lr(lr: float) -> float:
    """The usual Horovod scaling: the learning rate of one rank times the number of ranks."""
    return lr * hvd.size()


class SyncCallback(keras.callbacks.Callback):
    """Runs ``model.fit`` under the optimizer's policy. Put it first in ``callbacks``.

    - on_train_begin: broadcasts the model's variables and the optimizer state from `root_rank` (collective) and
      starts the sync engine (relaxed policies);
    - every batch: bsp -- accounts the step (the allreduce ran in the graph); lbbsp -- the synchronous exchange of
      the step's gradient weighted by the rank's batch size, the optimizer's apply, the next batch sizes; relaxed
      -- pushes the step's gradient (wbsp: delta) to the engine, applies delivered ticks and waits while the
      policy's gate is closed;
    - on_train_end: final synchronization (every update delivered, identical weights on every rank) and the
      end-of-run report, printed by rank 0 and kept in ``self.report``.

    global_steps: optional budget of steps taken by all ranks together; a rank stops (``model.stop_training``)
    once it is reached, so under relaxed policies fast ranks take more of them. Use it with a single epoch (or an
    epoch count every rank reaches) when MetricAverageCallback is used: its epoch-end average is a collective.
    Under elastic Horovod it is refused for bsp and lbbsp (each rank would count from its own start); the tick
    policies count the job's steps over every reset.
    """

    def __init__(self, root_rank: int = 0, global_steps: Optional[int] = None):
        super().__init__()
        self.root_rank, self.budget = root_rank, global_steps
        self.report: Optional[Dict[str, Any]] = None
        self._state = None

    def on_train_begin(self, logs=None):
        model = self.model
        opt = model.optimizer
        state = state_of(opt)
        if state is None:
            raise ConfigError("SyncCallback needs the model compiled with hvd_elastic.keras.DistributedOptimizer(...)")
        state.restart_if_finished()
        self._state = state
        policy, spec = state.cfg.policy, state.cfg.spec
        if self.budget is not None and spec.lockstep and horovod_env.horovod_elastic():
            raise ConfigError(f"SyncCallback(global_steps={self.budget}) under elastic Horovod with policy {policy}: "
                              f"each rank counts the steps it took since it started, so the ranks would stop at "
                              f"different steps; give hvd_elastic.keras.elastic.fit the job's length instead (epochs "
                              f"x steps_per_epoch, counted in the KerasState)")
        if not spec.horovod_optimizer and int(getattr(model, "steps_per_execution", 1) or 1) != 1:
            raise ConfigError(f"policy {policy} needs steps_per_execution=1 in model.compile (one engine step per "
                              f"batch)")
        if getattr(model, "jit_compile", False):
            # Horovod's ops have no XLA kernels here: compile the train step without XLA.
            model.jit_compile = False
            model.make_train_function(force=True)
        mode = None
        if not spec.horovod_optimizer:
            # "local": the traced step applies the optimizer on the rank's own copy (a policy of deltas only);
            # "defer": the callback hands the gradient to the engine, which applies it on the replica, or on the own
            # copy while the updates are deltas (a kind that switches: auto)
            mode = "local" if spec.deltas and not spec.lockstep_gradients else "defer"
            if state.mode != mode and model.train_function is not None:
                model.make_train_function(force=True)   # retrace with the new apply mode
        state.start(model.trainable_variables, model_variables=model.variables, root_rank=self.root_rank, mode=mode)
        state.session.watchdog.between_steps(_stall.USER)   # the batch callbacks mark the steps (watchdog.py)

    def on_train_batch_begin(self, batch, logs=None):
        self._state.session.watchdog.enter("step")

    def on_train_batch_end(self, batch, logs=None):
        state = self._state
        spec = state.cfg.spec
        if spec.horovod_optimizer:
            state.account_bsp_step()
        elif spec.balances_batches:
            state.lbbsp_step()
        elif state.mode == "defer":
            state.relaxed_step(state.deferred_gradient())
        else:
            state.relaxed_step(None)
        if self.budget is not None and state.global_steps() >= self.budget:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        # Under a relaxed policy this rank's training loop ends here: raise its finished flag now, before any other
        # collective (a rank gated on this rank's pushes would otherwise wait for it forever). The engine delivers
        # every update, every rank ends with the same weights, and the others run free meanwhile.
        if _fit_goes_on(self.model):
            return
        state = self._state
        last = self.model.stop_training or epoch + 1 >= int(self.params.get("epochs") or 0)
        if last and state.session.engine is not None:
            state.session.engine.finish()

    def on_train_end(self, logs=None):
        if _fit_goes_on(self.model):
            return
        self.report = self._state.finish()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch-end metrics (``logs``) over all ranks. Put it after SyncCallback and before callbacks that
    read the logs (checkpointing, early stopping).

    bsp, lbbsp: one allreduce at every epoch end (the ranks are in lock-step anyway; under lbbsp each rank's logs
    are over its own batches and the average is unweighted). Relaxed policies: a collective at an
    epoch end would stop this rank's pushes while another rank may be gated on them (a deadlock), so each rank
    keeps its epoch logs and the average is taken once, after the final synchronization (on_train_end, one
    allgather); the averaged values then replace the per-rank ones in ``model.history`` (each epoch averaged over the
    ranks that ran it, matched by epoch number: ranks that ran fewer epochs, or joined an elastic job later,
    contribute to the epochs they ran). ``averaged``: {epoch: {metric: mean}}."""

    def on_train_begin(self, logs=None):
        state = state_of(self.model.optimizer)
        self._relaxed = state is not None and state.cfg.spec.ticks
        if not getattr(self, "_goes_on", False):    # a fit that goes on from a cut epoch keeps its epochs' logs
            self._epochs: Dict[int, Dict[str, float]] = {}
        self._goes_on = False

    @staticmethod
    def _numeric(logs):
        return sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = self._numeric(logs)
        if self._relaxed:
            self._epochs[int(epoch)] = {k: float(logs[k]) for k in keys}
            return
        if not keys:
            return
        vals = np.array([float(logs[k]) for k in keys], np.float64)
        out = hvd.allreduce(tf.constant(vals), op=hvd.Average, name="hvd_elastic.metrics").numpy()
        for k, v in zip(keys, out):
            logs[k] = float(v)

    def on_train_end(self, logs=None):
        if not self._relaxed:
            return
        if _fit_goes_on(self.model):
            self._goes_on = True       # the average waits for the run's last fit (a collective here could deadlock)
            return
        everyone = hvd.allgather_object(self._epochs, name="hvd_elastic.metrics")
        averaged = {}
        for e in sorted({e for x in everyone for e in x}):
            rows = [x[e] for x in everyone if e in x]
            averaged[e] = {k: float(np.mean([r[k] for r in rows if k in r])) for k in rows[0]}
        self.averaged = averaged
        history = getattr(self.model, "history", None)
        hist, epochs = getattr(history, "history", None), list(getattr(history, "epoch", []))
        if isinstance(hist, dict):
            for k, series in hist.items():
                for i, e in enumerate(epochs[:len(series)]):
                    if k in averaged.get(e, {}):
                        series[i] = averaged[e][k]


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Horovod's learning-rate warm-up as a schedule: from ``lr / size`` to ``lr`` over `warmup_steps` optimizer
    iterations (then `after`, a float or another schedule, or ``lr``).

    A schedule, not a callback that assigns the learning rate between batches: under the gradient policies each
    tick is one optimizer step applied on every rank, and the optimizer's iteration count (ticks applied) is the
    same on every rank when a tick is applied, so the learning rate is too -- a per-rank batch counter would give
    ranks different rates for the same tick and break replica consistency."""

    def __init__(self, lr: float, warmup_steps: int, size: Optional[int] = None, after=None):
        self.lr, self.warmup_steps = float(lr), max(int(warmup_steps), 1)
        self.size = int(size if size is not None else hvd.size())
        self.after = after

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        frac = tf.minimum(step / float(self.warmup_steps), 1.0)
        warm = self.lr / self.size * (1.0 + (self.size - 1) * frac)
        if self.after is None:
            return warm
        after = self.after(step) if callable(self.after) else tf.constant(float(self.after), tf.float32)
        return tf.where(step < self.warmup_steps, warm, after)

    def get_config(self):
        return {"lr": self.lr, "warmup_steps": self.warmup_steps, "size": self.size}


def lbbsp_dataset(optimizer, data, seed: int = 0, drop_last: bool = True, shuffle: bool = True) -> tf.data.Dataset:
    """The ``tf.data`` input of ``model.fit`` under policy lbbsp: each element is this rank's batch for one step.

    `data` is an array or a tuple of arrays with the same first dimension (``(x, y)`` or ``(x, y, sample_weight)``).
    Step i of an epoch takes the next B indices of one shuffled order shared by all ranks (``seed + epoch``) and
    this rank gets b_p of them (dealt in rank order: at equal sizes every n-th, as ``tf.data``'s ``shard``) -- the
    size the policy decided after the previous step -- so across ranks an epoch covers every sample exactly once
    (:class:`hvd_elastic.lbbsp.BatchPlan`; ``drop_last`` as there). The batches are gathered by a ``tf.data`` map,
    so a further ``.map`` (augmentation, decoding) may follow; nothing may batch, shuffle or prefetch it again: a
    batch drawn before the previous step is done raises an error. The dataset's length is the number of steps per
    epoch (``len(data) // B``, rounded up without drop_last)."""
    state = state_of(optimizer, "lbbsp_dataset")
    if not state.cfg.spec.balances_batches:
        raise ConfigError(f"lbbsp_dataset() needs policy lbbsp (HVD_ELASTIC_POLICY=lbbsp); this optimizer runs "
                          f"policy {state.cfg.policy}")
    single = not isinstance(data, (tuple, list))
    arrays = [np.asarray(a) for a in ((data,) if single else data)]
    if not arrays or any(len(a) != len(arrays[0]) for a in arrays):
        raise ValueError(f"lbbsp_dataset(): data must be arrays of one length, got lengths "
                         f"{[len(a) for a in arrays]}")
    if horovod_env.horovod_elastic() and state.plan is not None:
        raise ConfigError("policy lbbsp under elastic Horovod: lbbsp_dataset() was called again for this optimizer "
                          "(a new dataset starts the epoch over); make it once, before the function of "
                          "hvd_elastic.keras.elastic.run, so that the KerasState keeps its place in the data")
    # Horovod's resets of the rank set (0 outside elastic Horovod): a pass one cut short resumes where it stood
    plan = BatchPlan(len(arrays[0]), lambda: state.session.lbbsp, seed=seed, drop_last=drop_last, shuffle=shuffle,
                     resets=_elastic_resets)
    state.plan = plan     # hvd_elastic.keras.elastic.KerasState keeps its place in the data
    tensors = [tf.constant(a) for a in arrays]

    def gather(idx):
        out = tuple(tf.gather(t, idx) for t in tensors)
        return out[0] if single else out

    ds = tf.data.Dataset.from_generator(
        lambda: plan.batches("hvd_elastic.keras.lbbsp_dataset (do not prefetch it)"),
        output_signature=tf.TensorSpec([None], tf.int64))
    options = tf.data.Options()
    # One batch per step, drawn when the step starts: tf.data's default optimizations read ahead (measured on TF
    # 2.21: two elements ahead of the consumer even with inject_prefetch off).
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options).map(gather)
    return ds.apply(tf.data.experimental.assert_cardinality(len(plan)))


def batch_sizes(optimizer) -> List[int]:
    """Every rank's batch size for the next step (identical on every rank), under policy lbbsp."""
    lbbsp = state_of(optimizer, "batch_sizes").session.lbbsp
    if lbbsp is None:
        raise TypeError("batch_sizes() needs an optimizer made by hvd_elastic.keras.DistributedOptimizer with "
                        "policy lbbsp")
    return list(lbbsp.sizes)


def global_steps(optimizer) -> int:
    """Steps taken by all ranks together, as far as this rank knows."""
    return state_of(optimizer, "global_steps").global_steps()


def settings(optimizer):
    """The settings the optimizer runs under (``settings(opt).policy``; ``settings(opt).spec``: what the policy is)."""
    return state_of(optimizer, "settings").cfg


__all__ = ["DistributedOptimizer", "MetricAverageCallback", "SyncCallback", "WarmupSchedule", "batch_sizes",
           "broadcast_variables", "elastic", "global_steps", "lbbsp_dataset", "scale_lr", "settings"]


from . import elastic  # noqa: E402  (hvd_elastic.keras.elastic: elastic Horovod for model.fit)
