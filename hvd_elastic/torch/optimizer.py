"""PyTorch frontend: builds the optimizer for the configured policy and instruments it.

- bsp: the optimizer *is* Horovod's ``horovod.torch.DistributedOptimizer`` (same arguments, same arithmetic); the
  plugin only times it (compute vs time blocked in the gradient allreduce) and injects emulated straggler delay.
- relaxed policies (asp, ssp, dssp, zipline, wbsp): the user's optimizer becomes a subclass of its own class whose
  ``step()`` hands the local gradient (or, for wbsp, the model delta after a local step) to the sync engine
  (hvd_elastic.engine), and applies the ticks the engine delivers. Horovod's ops move the bytes.
"""
from __future__ import annotations

import contextlib
import time
import types
from typing import Any, Dict

import horovod.torch as hvd
import numpy as np
import torch

from .. import config as _config
from ..engine.engine import SyncEngine
from ..engine.policies import POLICIES as RELAXED_POLICIES, make_policy
from ..errors import ConfigError
from ..session import Session

# Policies this frontend can run; the configuration recognises every policy of the design.
IMPLEMENTED_POLICIES = ("bsp", "lbbsp") + tuple(RELAXED_POLICIES)


# ---- bsp ---------------------------------------------------------------------------------------------------------
def _instrument_bsp(opt, session: Session):
    """Wrap Horovod's optimizer instance: time compute, inject emulated delay, time the blocking synchronize."""
    hvd_step, hvd_synchronize = opt.step, opt.synchronize
    state = {"blocked": 0.0}

    def synchronize(self):
        t0 = time.perf_counter()
        hvd_synchronize()
        state["blocked"] += time.perf_counter() - t0

    def step(self, closure=None):
        compute = session.begin_step()
        state["blocked"] = 0.0
        t_before = time.perf_counter()
        out = hvd_step(closure)
        t_end = time.perf_counter()
        blocked = state["blocked"]
        # Applying the update is computation; the blocking wait inside synchronize() is not.
        session.telemetry.add_step(compute + (t_end - t_before - blocked), blocked)
        session.last_step_end = t_end
        return out

    opt.synchronize = types.MethodType(synchronize, opt)
    opt.step = types.MethodType(step, opt)
    return opt


# ---- relaxed policies --------------------------------------------------------------------------------------------
class _FlatParams:
    """Fixed layout of the trainable parameters in one flat float buffer (same order on every rank)."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ConfigError(f"relaxed policies need one parameter dtype, got {sorted(map(str, dtypes))}")
        self.dtype = {torch.float64: np.float64}.get(next(iter(dtypes), torch.float32), np.float32)
        self.slices = []
        off = 0
        for p in self.params:
            self.slices.append((p, off, p.numel()))
            off += p.numel()
        self.numel = off

    def gradients(self) -> np.ndarray:
        out = np.zeros(self.numel, self.dtype)
        for p, off, n in self.slices:
            if p.grad is not None:
                out[off:off + n] = p.grad.detach().reshape(-1).to("cpu", copy=False).numpy()
        return out

    def set_gradients(self, g: np.ndarray):
        for p, off, n in self.slices:
            p.grad = torch.from_numpy(g[off:off + n]).view_as(p).to(p.device, p.dtype)

    def weights(self) -> np.ndarray:
        out = np.empty(self.numel, self.dtype)
        with torch.no_grad():
            for p, off, n in self.slices:
                out[off:off + n] = p.detach().reshape(-1).to("cpu", copy=False).numpy()
        return out

    def set_weights(self, w: np.ndarray):
        with torch.no_grad():
            for p, off, n in self.slices:
                p.copy_(torch.from_numpy(w[off:off + n]).view_as(p))


def _allreduce_sum(arrays, name):
    handles = [hvd.allreduce_async_(torch.from_numpy(a), op=hvd.Sum, name=f"{name}.{i}")
               for i, a in enumerate(arrays)]
    for h in handles:
        hvd.synchronize(h)


def _relaxed_step(self, closure=None):
    """step() of a relaxed-policy optimizer: push this step's update to the engine, apply delivered ticks, and
    wait while the policy's gate is closed."""
    session = self._hvd_elastic
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    compute = session.begin_step()
    flat = self._hvd_elastic_flat
    if session.engine.policy.kind == "delta":
        t0 = time.perf_counter()
        self._hvd_elastic_inner_step()        # a local step on this rank's own copy
        compute += time.perf_counter() - t0
        session.engine.step(None, compute)
    else:
        session.engine.step(flat.gradients(), compute)
    session.telemetry.add_step(compute)
    session.last_step_end = time.perf_counter()
    return loss


def _no_synchronize(self):
    """Relaxed policies exchange updates in the background; there is nothing to synchronize per step."""


@contextlib.contextmanager
def _skip_synchronize(self):
    yield


def refuse_unsupported_arguments(policy, *, compression, op, gradient_predivide_factor, sparse_as_dense,
                                 process_set, op_note="only Average", also=()):
    """Horovod DistributedOptimizer arguments a non-bsp policy cannot honour are an error, never ignored."""
    unsupported = []
    if compression is not hvd.Compression.none:
        unsupported.append("compression")
    if op != hvd.Average:
        unsupported.append(f"op ({op_note})")
    if gradient_predivide_factor != 1.0:
        unsupported.append("gradient_predivide_factor")
    if sparse_as_dense:
        unsupported.append("sparse_as_dense")
    if process_set is not hvd.global_process_set:
        unsupported.append("process_set (only the global set)")
    unsupported.extend(also)
    if unsupported:
        raise ConfigError(f"policy {policy} does not support these DistributedOptimizer arguments: "
                          f"{', '.join(unsupported)}; use policy bsp or the defaults")


def _build_relaxed(optimizer, session: Session, compression, op, gradient_predivide_factor, sparse_as_dense,
                   process_set):
    refuse_unsupported_arguments(session.cfg.policy, compression=compression, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 sparse_as_dense=sparse_as_dense, process_set=process_set)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    flat = _FlatParams(params)
    base = optimizer.__class__
    # __module__: horovod.torch.broadcast_optimizer_state() initialises an empty optimizer state with a dummy
    # step(); for classes from Horovod's optimizer module it calls the wrapped optimizer's own step instead. Ours
    # must be treated the same way: a dummy step through the engine would push an update and, depending on when
    # each rank applies ticks, leave ranks with differently shaped state (and the broadcast would hang).
    cls = type(base.__name__, (base,), {"step": _relaxed_step, "synchronize": _no_synchronize,
                                        "skip_synchronize": _skip_synchronize,
                                        "__module__": hvd.DistributedOptimizer.__module__})
    optimizer.__class__ = cls   # same object, same state; only step() changes
    optimizer._hvd_elastic_flat = flat
    optimizer._hvd_elastic_inner_step = types.MethodType(base.step, optimizer)

    def apply_gradient(g):
        flat.set_gradients(g)
        optimizer._hvd_elastic_inner_step()

    epoch_ns = hvd.broadcast_object(time.time_ns(), root_rank=0, name="hvd_elastic.epoch")
    policy = make_policy(session.cfg)
    # Weights must be identical before the engine snapshots them (delta policies keep the global model).
    hvd.broadcast_parameters({f"p{i}": p for i, p in enumerate(flat.params)}, root_rank=0)
    session.engine = SyncEngine(policy, session.rank, session.size, flat.numel, flat.dtype, _allreduce_sum,
                                session.telemetry, tick_s=session.cfg.tick_ms / 1000.0, epoch_ns=epoch_ns,
                                apply_gradient=apply_gradient, read_params=flat.weights, write_params=flat.set_weights)
    return optimizer


def DistributedOptimizer(optimizer, named_parameters=None, compression=hvd.Compression.none,
                         backward_passes_per_step=1, op=hvd.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=hvd.global_process_set,
                         **policy_kwargs):
    """A drop-in for ``horovod.torch.DistributedOptimizer`` that runs under the configured policy.

    Takes Horovod's arguments unchanged; any hvd-elastic knob may be passed as a keyword (``policy="ssp"``,
    ``staleness=3``, ...) and wins over its ``HVD_ELASTIC_*`` variable. Collective: call it on every rank.
    Raises ConfigError (one line, on every rank) for bad settings or ranks that disagree. Under a relaxed policy
    the parameters are broadcast from rank 0 here, and ``finish(opt)`` must end training.

    Example::

        opt = hvd_elastic.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                                     named_parameters=model.named_parameters())
    """
    cfg = _config.load(policy_kwargs, hvd.allgather_object, hvd.rank(), IMPLEMENTED_POLICIES, "PyTorch")
    session = Session(cfg, hvd.rank(), hvd.size(), hvd.allgather_object)
    if cfg.policy == "bsp":
        opt = hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters, compression=compression,
                                       backward_passes_per_step=backward_passes_per_step, op=op,
                                       gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                                       groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set)
        opt = _instrument_bsp(opt, session)
    elif cfg.policy == "lbbsp":
        from .lbbsp import build_lbbsp
        opt = build_lbbsp(optimizer, session, compression=compression, op=op,
                          gradient_predivide_factor=gradient_predivide_factor, sparse_as_dense=sparse_as_dense,
                          process_set=process_set, backward_passes_per_step=backward_passes_per_step)
    else:
        opt = _build_relaxed(optimizer, session, compression, op, gradient_predivide_factor, sparse_as_dense,
                             process_set)
    opt._hvd_elastic = session
    opt.finish = session.finish
    return opt


def global_steps(optimizer) -> int:
    """Steps taken by all ranks together, as far as this rank knows (exact under bsp; under relaxed policies the
    delivered clocks of the others plus this rank's own steps). Loop on it to train for a global step budget."""
    session = getattr(optimizer, "_hvd_elastic", None)
    if session is None:
        raise TypeError("global_steps() takes an optimizer made by hvd_elastic.torch.DistributedOptimizer")
    if session.engine is None:
        return session.telemetry.steps * session.size
    view, own = session.engine.view, session.engine.ticker.clock
    return int(view.clocks.sum() - view.clocks[session.rank] + own)


def finish(optimizer) -> Dict[str, Any]:
    """Collective end of training: deliver and apply every pushed update, leave all ranks with identical weights,
    and report. Returns the report (a dict) on every rank; rank 0 prints it unless HVD_ELASTIC_REPORT=0."""
    session = getattr(optimizer, "_hvd_elastic", None)
    if session is None:
        raise TypeError("finish() takes an optimizer made by hvd_elastic.torch.DistributedOptimizer")
    return session.finish()


@contextlib.contextmanager
def training(optimizer):
    """Context manager around the training loop: calls :func:`finish` when the loop ends normally."""
    yield optimizer
    finish(optimizer)
