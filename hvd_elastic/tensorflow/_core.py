"""Shared TensorFlow / Keras 3 glue: one optimizer wrapper for ``model.fit`` (hvd_elastic.keras) and for custom
training loops (hvd_elastic.tensorflow). Only ``horovod.tensorflow`` ops are used (Horovod's own Keras layer is
broken on Keras 3). Every policy rule lives in the engine / native scheduler; this file only moves tensors.

How the wrapped optimizer's ``apply()`` behaves, by mode (set when training starts):
- "average" (bsp): exact gradient averaging with one grouped Average-allreduce, then the optimizer's own ``apply`` --
  works in graph mode (inside ``model.fit``'s ``tf.function`` or the user's) and eagerly; the time blocked in the
  allreduce is measured with ``tf.timestamp`` and read by the step accounting.
- "defer" (model.fit, gradient policies and auto): the traced train step only stores the gradients into buffers;
  the callback hands them to the engine at ``on_train_batch_end`` (eager), and the engine applies ticks with the
  optimizer's own ``apply`` (a ``tf.function`` over one flat gradient); while auto's updates are deltas, that apply
  steps the rank's own copy first and the engine uploads the delta.
- "local" (model.fit, wbsp): the optimizer steps the rank's own copy in the graph; the callback uploads the delta.
- "defer" also serves lbbsp under model.fit: the callback runs the synchronous weighted exchange
  (hvd_elastic.lbbsp) on the stored gradient and applies the result with the optimizer's own ``apply``.
- "eager" (custom loops, relaxed policies): ``apply_gradients`` must be called eagerly and does the engine step.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .. import config as _config, horovod_env
from ..engine.engine import Frontend
from ..errors import ConfigError, HvdElasticError
from ..session import Session
from ..wrapping import subclass_in_place
from .buffers import TfBuffers

def load_config(policy_kwargs: Dict[str, Any], frontend: str) -> _config.Config:
    return _config.load(policy_kwargs, lambda obj: hvd.allgather_object(obj, name="hvd_elastic.config"),
                        hvd.rank(), frontend)


def _np(v) -> np.ndarray:
    return np.asarray(v.numpy() if hasattr(v, "numpy") else v)


def broadcast_variables(variables, root_rank: int = 0, name: str = "hvd_elastic.bcast"):
    """Collective: overwrite `variables` (Keras or tf Variables) with rank `root_rank`'s values, eagerly.

    One broadcast per dtype (the values travel flattened), so the cost does not grow with the number of layers."""
    variables = list(variables)
    by_dtype: Dict[str, List[Any]] = {}
    for v in variables:
        by_dtype.setdefault(str(_np(v).dtype), []).append(v)
    for dtype in sorted(by_dtype):
        vs = by_dtype[dtype]
        flat = np.concatenate([_np(v).reshape(-1) for v in vs]) if vs else np.zeros(0, dtype)
        if dtype == "bool":
            flat = flat.astype(np.int32)
        out = hvd.broadcast(tf.convert_to_tensor(flat), root_rank, name=f"{name}.{dtype}").numpy()
        off = 0
        for v in vs:
            shape = _np(v).shape
            n = int(np.prod(shape, dtype=np.int64))
            v.assign(out[off:off + n].reshape(shape).astype(dtype))
            off += n


_TICK_FUNCTIONS: Dict[Any, Any] = {}


def _allreduce_sum(buffers, name):
    """In-place Sum allreduce over all ranks of flat buffers: tf.Variables (the engine's data plane) or numpy arrays
    (LB-BSP's exchange); the call waits in TF's runtime.

    Through a tf.function: an eager Horovod TF op is negotiated under its op type's name whatever ``name`` says, so
    an eager tick would collide with any other eager collective the training thread has in flight (metric
    averaging, broadcasts); inside a graph the op carries ``name``."""
    for i, b in enumerate(buffers):
        dtype = tf.as_dtype(b.dtype)
        key = (name, i, tuple(b.shape), dtype.name)
        fn = _TICK_FUNCTIONS.get(key)
        if fn is None:
            op_name = f"{name}.{i}".replace(".", "_")
            fn = tf.function(lambda t, _n=op_name: hvd.allreduce(t, op=hvd.Sum, name=_n), autograph=False,
                             jit_compile=False, input_signature=[tf.TensorSpec(b.shape, dtype)])
            _TICK_FUNCTIONS[key] = fn
        if isinstance(b, np.ndarray):
            b[...] = fn(tf.convert_to_tensor(b)).numpy()
        else:
            b.assign(fn(b.value()))


class _FlatVars:
    """Fixed layout of the trainable variables in one flat float buffer (same order on every rank)."""

    def __init__(self, variables):
        self.variables = list(variables)
        dtypes = {str(_np(v).dtype) for v in self.variables}
        if len(dtypes) != 1 or not dtypes <= {"float32", "float64"}:
            raise ConfigError(f"relaxed policies need one float32/float64 dtype for the trainable variables, got "
                              f"{sorted(dtypes)}")
        self.dtype = np.dtype(dtypes.pop())
        self.shapes = [tuple(_np(v).shape) for v in self.variables]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.numel = int(sum(self.sizes))

    def weights(self) -> tf.Tensor:
        return tf.cast(tf.concat([tf.reshape(v, [-1]) for v in self.variables], 0), self.dtype)

    def set_weights(self, w):
        w = w.value() if isinstance(w, tf.Variable) else tf.convert_to_tensor(w)
        for v, part in zip(self.variables, self.split(w)):
            v.assign(part)

    def flatten(self, tensors) -> tf.Tensor:
        """One flat tensor of the gradients (zeros for a variable without one)."""
        parts = [tf.zeros([n], self.dtype) if t is None else tf.reshape(tf.cast(tf.convert_to_tensor(t), self.dtype),
                                                                          [-1])
                 for t, n in zip(tensors, self.sizes)]
        return tf.concat(parts, 0)

    def split(self, flat):
        parts = tf.split(flat, self.sizes)
        return [tf.reshape(p, s) for p, s in zip(parts, self.shapes)]


def _session(cfg: _config.Config) -> Session:
    return Session(cfg, hvd.rank(), hvd.size(), lambda obj: hvd.allgather_object(obj, name="hvd_elastic.report"),
                   lambda: (hvd.rank(), hvd.size()))


class ElasticState:
    """The plugin's per-optimizer state (kept off the Keras optimizer's attribute tracking)."""

    def __init__(self, optimizer, base_cls, cfg: _config.Config, policy_kwargs: Dict[str, Any], frontend: str):
        self.optimizer, self.base_cls, self.policy_kwargs, self.frontend = optimizer, base_cls, policy_kwargs, frontend
        self.session = _session(cfg)
        self.mode = "average" if cfg.spec.horovod_optimizer else "eager"
        self.blocked = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvd_elastic_blocked")
        self.flat: Optional[_FlatVars] = None
        self.buffers: Optional[List[tf.Variable]] = None
        self.started = False
        self.apply_flat = None
        self.elastic = None    # elastic Horovod under a tick policy (tensorflow/elastic.py)
        self.lbbsp_resets = None   # ... and under lbbsp
        self.plan = None       # lbbsp: the batch plan of the latest lbbsp_dataset (kept in the elastic state)

    @property
    def cfg(self) -> _config.Config:
        return self.session.cfg

    # ---- start / end -------------------------------------------------------------------------------------------
    def restart_if_finished(self):
        """A finished session (a second model.fit) starts a fresh one: same settings, new engine and report."""
        if self.session.report is not None:
            self.session = _session(load_config(self.policy_kwargs, self.frontend))
            self.started = False
            self.elastic = self.lbbsp_resets = None   # elastic Horovod: the new session's, from its start

    def start(self, trainable_variables, model_variables=None, root_rank: int = 0, mode: Optional[str] = None):
        """Collective: build the optimizer, broadcast weights and optimizer state from `root_rank`, start the
        engine for relaxed policies. `mode` overrides the apply mode (model.fit: defer / local)."""
        if self.elastic is not None and self.elastic.ticking():
            return     # hvd_elastic.keras.elastic.fit: the rest of a cut epoch, in a fit of its own; the engine runs on
        opt = self.optimizer
        trainable_variables = list(trainable_variables)
        if not opt.built:
            opt.build(trainable_variables)
        broadcast_variables(list(model_variables if model_variables is not None else trainable_variables)
                            + list(opt.variables), root_rank)
        if mode is not None:
            self.mode = mode
        spec = self.session.cfg.spec
        if not spec.horovod_optimizer:
            self._build_flat(trainable_variables)
        if self.session.lbbsp is not None:
            if horovod_env.horovod_elastic():
                self._follow_lbbsp_resets()
            self.session.lbbsp.bind(self.flat.numel, self.flat.dtype)
        elif self.ensure_elastic(trainable_variables) is not None:
            # built now and again after each reset, for the ranks of the moment, from the most advanced replica
            self.elastic.before_step()
        elif spec.ticks:
            self.start_engine()
        self.started = True
        self.session.last_step_end = time.perf_counter()

    def ensure_elastic(self, trainable_variables):
        """Elastic Horovod under a tick policy: this optimizer's ElasticRun, made at its first use -- the state's sync
        (hvd_elastic.keras.elastic.KerasState.sync, where a worker that joins has none yet: the flat layout of
        `trainable_variables`, the model's, in the order every rank has) or the first start. None under other
        policies, or outside elastic Horovod."""
        if not (self.session.cfg.spec.ticks and horovod_env.horovod_elastic()):
            return None
        if self.elastic is None:
            from .elastic import elastic_run
            if self.flat is None:
                self._build_flat(list(trainable_variables))
            self.elastic = elastic_run(self)
        return self.elastic

    def _follow_lbbsp_resets(self):
        """lbbsp under elastic Horovod: the controller for the ranks of the moment (hvd_elastic.elastic)."""
        if self.lbbsp_resets is None:
            from ..elastic import LbbspResets
            self.lbbsp_resets = LbbspResets()
            self.session.counter_sources.append(self.lbbsp_resets.counters)
        self.lbbsp_resets.follow(self.session)

    def _build_flat(self, trainable_variables):
        """The flat layout of the trained variables, the gradient buffers (defer mode), and ``apply_flat``: the
        optimizer's own apply over one flat gradient."""
        self.flat = flat = _FlatVars(trainable_variables)
        if self.mode == "defer" and self.buffers is None:
            self.buffers = [tf.Variable(tf.zeros(shape, flat.dtype), trainable=False, name="hvd_elastic_grad")
                            for shape in flat.shapes]
        base_apply, opt = self.base_cls.apply, self.optimizer

        @tf.function(autograph=False, jit_compile=False)
        def apply_flat(g):
            base_apply(opt, flat.split(g), flat.variables)

        self.apply_flat = apply_flat

    def start_engine(self, recover=None):
        """Collective: the engine for the current ranks; recover(epoch_and_id) (elastic Horovod) brings every rank to
        one state first and returns the job's (epoch_ns, engine id)."""
        s, flat, apply_flat = self.session, self.flat, self.apply_flat
        if recover is not None:
            s.follow_ranks()
            epoch_ns, _ = recover((time.time_ns(), 0))
        else:
            epoch_ns = hvd.broadcast_object(time.time_ns(), root_rank=0, name="hvd_elastic.epoch")
        buffers = TfBuffers(flat.dtype)
        s.start_engine(Frontend(flat.numel, buffers, _allreduce_sum, tick_name="hvd_elastic.tick", epoch_ns=epoch_ns,
                                # momentum per tick: a Keras optimizer's momentum is a constant of its compiled step
                                apply_gradient=lambda update, scale, share: apply_flat(
                                    buffers.tensor(update) if scale == 1.0 else buffers.tensor(update) * scale),
                                read_params=flat.weights, write_params=flat.set_weights))

    def finish(self) -> Dict[str, Any]:
        """Collective: flush every update, final sync, end-of-run report (idempotent)."""
        return self.session.finish()

    # ---- per step (eager) ----------------------------------------------------------------------------------------
    def account_bsp_step(self):
        """After a bsp step (eager side): compute = wall since the last step minus time blocked in the allreduce."""
        s = self.session
        total = time.perf_counter() - s.last_step_end
        blocked = max(float(self.blocked.numpy()), 0.0)
        compute = max(total - blocked, 0.0)
        slept = s.straggler.pause(compute)
        s.telemetry.emulated_s += slept
        s.telemetry.add_step(compute + slept, blocked)
        s.last_step_end = time.perf_counter()

    def relaxed_step(self, flat_grad: Optional[tf.Tensor]):
        """Hand this step's update to the engine and apply delivered ticks. `flat_grad`: this step's flat gradient,
        None where the rank's own copy took its local step already (model.fit's "local" mode). While the engine's
        updates are deltas (wbsp; auto once relaxed: the engine says which, step by step), the optimizer's apply of
        the gradient on this rank's own copy comes first (timed as compute) and the engine reads the weights;
        otherwise the gradient is pushed."""
        s = self.session
        if s.engine is None or s.engine.finished:
            raise HvdElasticError("training step after finish() (or before training started): start a new "
                                  "DistributedOptimizer / model.fit for more training")
        if s.engine.updates.local_step:
            s.relaxed_step(local_step=None if flat_grad is None else lambda: self.apply_flat(flat_grad))
        else:
            s.relaxed_step(lambda dst, alpha: s.engine.buffers.add_(dst, flat_grad, alpha))

    def lbbsp_step(self):
        """One lbbsp step (eager, model.fit): the synchronous weighted exchange of the stored gradient (this rank's
        mean over its b_p samples), the optimizer's apply of the global-batch gradient, the next batch sizes."""
        ctl = self.session.lbbsp
        if ctl.drawn is None:
            raise ConfigError("policy lbbsp: the batches must come from hvd_elastic.keras.lbbsp_dataset(optimizer, "
                              "data) (one per step, sized by the policy); this step's batch did not")
        buf = ctl.buffer
        ctl.step(self.session, self.deferred_gradient().numpy(), lambda: _allreduce_sum([buf], "hvd_elastic.lbbsp"),
                 lambda grad: self.apply_flat(tf.convert_to_tensor(grad)))

    def deferred_gradient(self) -> tf.Tensor:
        return self.flat.flatten(self.buffers)

    def global_steps(self) -> int:
        steps = self.session.global_steps()
        return self.elastic.global_steps(steps) if self.elastic is not None else steps


# Horovod's Keras DistributedOptimizer keyword arguments (horovod.tensorflow.keras, v0.28.1) and their defaults.
HOROVOD_KERAS_ARGUMENTS = {"name": None, "device_dense": "", "device_sparse": "", "compression": hvd.Compression.none,
                           "sparse_as_dense": False, "gradient_predivide_factor": 1.0, "op": hvd.Average,
                           "backward_passes_per_step": 1, "average_aggregated_gradients": False, "num_groups": 0,
                           "groups": None, "process_set": hvd.global_process_set, "scale_local_gradients": True}


def _is_default(name, value) -> bool:
    default = HOROVOD_KERAS_ARGUMENTS[name]
    if name in ("compression", "process_set"):
        return value is default
    return value == default


def check_horovod_arguments(policy: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    """Horovod's Keras DistributedOptimizer arguments under `policy` (its registry entry), with Horovod's meaning under
    bsp (the gradient exchange is Horovod's grouped allreduce, given compression, op, the predivide factor and
    devices); elsewhere only the defaults (a one-line ConfigError names the others and policy bsp). ``name`` (op
    names only), ``groups`` / ``num_groups`` (one group anyway: bsp's grouped allreduce, the relaxed policies' tick),
    ``sparse_as_dense`` (bsp always densifies: the same values as Horovod's sparse allgather) and
    ``scale_local_gradients`` (no local variables here) change nothing."""
    args = {**HOROVOD_KERAS_ARGUMENTS, **args}
    if policy.horovod_optimizer:
        if args["gradient_predivide_factor"] != 1.0 and args["op"] != hvd.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")   # Horovod's message
        refused = []
        if args["op"] not in (hvd.Average, hvd.Sum):
            refused.append("op (Average or Sum)")
        if args["backward_passes_per_step"] != 1 or args["average_aggregated_gradients"]:
            refused.append("backward_passes_per_step / average_aggregated_gradients (use the Keras optimizer's own "
                           "gradient_accumulation_steps)")
        if args["process_set"] is not hvd.global_process_set:
            refused.append("process_set (only the global set)")
        if refused:
            raise ConfigError(f"policy {policy.name} of hvd_elastic.keras does not support these DistributedOptimizer "
                              f"arguments: {', '.join(refused)}")
        return args
    refused = [k for k in HOROVOD_KERAS_ARGUMENTS if k not in ("name", "scale_local_gradients", "groups", "num_groups")
               and not _is_default(k, args[k])]
    if refused:
        raise ConfigError(f"policy {policy.name} does not support these DistributedOptimizer arguments: "
                          f"{', '.join(refused)}; use policy bsp or the defaults")
    return args


def _bsp_average(state: ElasticState, grads):
    """Exact gradient averaging (one grouped Average allreduce, or Horovod's arguments given to the Keras
    DistributedOptimizer: compression, op, predivide factor); records the time blocked in it."""
    idx = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in idx]
    if not dense:
        return grads
    a = getattr(state, "horovod_args", HOROVOD_KERAS_ARGUMENTS)
    f = float(a["gradient_predivide_factor"])
    with tf.control_dependencies(dense):
        t0 = tf.timestamp()
    with tf.control_dependencies([t0]):
        reduced = hvd.grouped_allreduce(dense, op=a["op"], compression=a["compression"],
                                        prescale_factor=1.0 / f, postscale_factor=f,
                                        device_dense=a["device_dense"], device_sparse=a["device_sparse"],
                                        name="hvd_elastic.bsp")
    with tf.control_dependencies(reduced):
        t1 = tf.timestamp()
    state.blocked.assign(t1 - t0)
    out = list(grads)
    for i, r in zip(idx, reduced):
        out[i] = r
    return out


def _elastic_apply(self, grads, trainable_variables=None):
    """``apply`` of a wrapped optimizer (see the module docstring for the modes)."""
    state: ElasticState = self._hvd_elastic
    grads = list(grads)
    if state.mode == "average":
        eager = tf.executing_eagerly()
        if eager and not state.started:          # custom loop: first eager step broadcasts from rank 0
            state.start(trainable_variables if trainable_variables is not None else self._trainable_variables)
        out = state.base_cls.apply(self, _bsp_average(state, grads), trainable_variables)
        if eager:
            state.account_bsp_step()
        return out
    if state.mode == "defer":
        for buf, g in zip(state.buffers, grads):
            buf.assign(tf.zeros_like(buf) if g is None else tf.cast(tf.convert_to_tensor(g), buf.dtype))
        return None
    if state.mode == "local":
        return state.base_cls.apply(self, grads, trainable_variables)
    # "eager": custom training loop under a relaxed policy
    if state.session.lbbsp is not None:
        raise ConfigError("policy lbbsp runs under model.fit: add hvd_elastic.keras.SyncCallback() to the callbacks "
                          "and feed hvd_elastic.keras.lbbsp_dataset(optimizer, data)")
    if not tf.executing_eagerly():
        raise ConfigError(f"policy {state.cfg.policy}: call apply_gradients() eagerly (outside tf.function) in a "
                          f"custom loop -- compute the gradients in a tf.function -- or, with model.fit, add "
                          f"hvd_elastic.keras.SyncCallback() to the callbacks")
    if not state.started or (state.elastic is not None and not state.elastic.ticking()):
        # the first step, and under elastic Horovod the first after a reset (every rank, a joiner included): the
        # broadcast and the engine for the ranks of the moment, from the most advanced replica
        state.start(trainable_variables if trainable_variables is not None else self._trainable_variables)
    # under deltas a local step on this rank's own copy first, through the same tf.function as the ticks
    state.relaxed_step(state.flat.flatten(grads))
    return None


def wrap_optimizer(optimizer, policy_kwargs: Dict[str, Any], frontend: str,
                   horovod_args: Optional[Dict[str, Any]] = None):
    """Make `optimizer` (a Keras 3 optimizer instance) run under the configured policy; same object returned.
    `horovod_args`: Horovod's DistributedOptimizer keyword arguments (check_horovod_arguments)."""
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer takes a Keras 3 optimizer instance, got {type(optimizer).__name__}")
    if state_of(optimizer) is not None:
        raise TypeError("this optimizer is already wrapped by hvd_elastic")
    cfg = load_config(policy_kwargs, frontend)
    horovod_args = check_horovod_arguments(cfg.spec, horovod_args or {})
    if not cfg.spec.horovod_optimizer and getattr(optimizer, "gradient_accumulation_steps", None):
        raise ConfigError(f"policy {cfg.policy} does not support gradient_accumulation_steps; use policy bsp")
    base = subclass_in_place(optimizer, {"apply": _elastic_apply}, optimizer.__class__.__module__)
    state = ElasticState(optimizer, base, cfg, policy_kwargs, frontend)
    state.horovod_args = horovod_args
    object.__setattr__(optimizer, "_hvd_elastic", state)   # bypasses Keras' attribute tracking (not a variable)
    return optimizer


def state_of(optimizer, caller: str = "") -> Optional[ElasticState]:
    """The optimizer's ElasticState (the one place that reads it from outside the optimizer); None, or with `caller`
    a TypeError naming it, if hvd_elastic did not wrap it."""
    state = getattr(optimizer, "_hvd_elastic", None)
    if state is None and caller:
        raise TypeError(f"{caller}() takes an optimizer made by hvd_elastic's DistributedOptimizer")
    return state

