"""How the PyTorch frontend wraps a user's optimizer, shared by every policy's builder (optimizer.py: bsp and the
relaxed policies; lbbsp.py): Horovod's argument checks and messages, Horovod's synchronize() protocol, the one way
of wrapping (``wrap_class``: the same object becomes an instance of a subclass of its own class, as Horovod builds
a new class for the user's optimizer class) and the refusals of arguments a policy cannot honour.
"""
from __future__ import annotations

import contextlib
import types
import warnings
from typing import Dict

import horovod.torch as hvd
import torch
# Horovod's own optimizer, taken from its defining module: a user may swap hvd.DistributedOptimizer for ours by
# assignment, and then hvd.DistributedOptimizer is the plugin's function.
from horovod.torch.optimizer import DistributedOptimizer as _HOROVOD_DISTRIBUTED_OPTIMIZER

from ..errors import ConfigError
from ..registry import HOROVOD_ARGUMENTS
from ..wrapping import subclass_in_place

# horovod.torch.broadcast_optimizer_state() calls the wrapped optimizer's own step (not ours) for classes of this
# module; our optimizer classes declare it (see _build_relaxed).
HOROVOD_OPTIMIZER_MODULE = _HOROVOD_DISTRIBUTED_OPTIMIZER.__module__

# Horovod's messages, word for word (horovod/torch/optimizer.py, v0.28.1), for the checks it makes.
_MSG_NOT_TUPLES = ("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                   "model.named_parameters().")
_MSG_DUPLICATES = "Parameter names in named_parameters must be unique. Found duplicates: %s"
_MSG_UNNAMED = ("named_parameters was specified, but one or more model parameters were not named. Python object "
                "ids: %s")
_MSG_STEP_AFTER_SYNCHRONIZE = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                               "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                               "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your "
                               "code.")



# ---- Horovod's argument checks -----------------------------------------------------------------------------------
def parameter_names(optimizer, named_parameters) -> Dict[torch.Tensor, str]:
    """Horovod's checks of ``named_parameters`` (same ValueErrors, same messages) and its parameter -> name map; names
    default to Horovod's ``allreduce.noname.<group>.<index>`` (identical on every rank)."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(optimizer.param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError(_MSG_NOT_TUPLES)
    seen, dups = set(), set()
    for name, _ in named_parameters:
        (dups if name in seen else seen).add(name)
    if dups:
        raise ValueError(_MSG_DUPLICATES % ", ".join(dups))
    # Built as Horovod builds it (a set difference), so that several ids come out in Horovod's order.
    unnamed = ({id(v) for group in optimizer.param_groups for v in group["params"]}
               - {id(v) for _, v in named_parameters})
    if unnamed:
        raise ValueError(_MSG_UNNAMED % ", ".join(str(i) for i in unnamed))
    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


def horovod_argument_checks(op, gradient_predivide_factor, backward_passes_per_step):
    """The checks horovod.torch.DistributedOptimizer makes before building (same errors, same messages)."""
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")


class SynchronizeProtocol:
    """Horovod's synchronize() / skip_synchronize() protocol for optimizers whose exchange happens elsewhere
    (relaxed policies: the engine; lbbsp overrides synchronize() to complete its exchange). synchronize() exchanges
    nothing: the gradients stay this rank's own, so clipping between synchronize() and step() clips the local
    gradient before it is pushed. step() after synchronize() without skip_synchronize() gives Horovod's warning."""

    def synchronize(self):
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes

    def _hvd_elastic_begin_step(self):
        if getattr(self, "_should_synchronize", True) and getattr(self, "_synchronized", False):
            warnings.warn(_MSG_STEP_AFTER_SYNCHRONIZE)
        self._synchronized = False


def wrap_class(optimizer, state, step, extra=None):
    """Make `optimizer` (same object, same state) an instance of a subclass of its own class with our step(),
    Horovod's synchronize protocol and Horovod's optimizer module (see HOROVOD_OPTIMIZER_MODULE); `state` (its
    Attached) learns the user's class and step."""
    attrs = {"step": step, "_synchronized": False, "_should_synchronize": True}   # Horovod's protocol's defaults
    for name in ("synchronize", "skip_synchronize", "set_backward_passes_per_step", "_hvd_elastic_begin_step"):
        attrs[name] = SynchronizeProtocol.__dict__[name]
    attrs.update(extra or {})
    state.base = subclass_in_place(optimizer, attrs, HOROVOD_OPTIMIZER_MODULE)
    state.inner_step = types.MethodType(state.base.step, optimizer)
    return optimizer



def refuse_sparse_gradients(state):
    """A sparse gradient of the optimizer whose Attached is `state` is a one-line error (policy bsp takes them)."""
    policy = state.session.cfg.policy
    for p in state.flat.params:
        if p.grad is not None and p.grad.is_sparse:
            name = state.names.get(p, "?")
            raise ConfigError(f"policy {policy} cannot exchange the sparse gradient of parameter {name!r} (sparse "
                              f"allreduce and sparse_as_dense are policy bsp only; policy wbsp takes sparse "
                              f"gradients too): use policy bsp or wbsp, or dense gradients (e.g. "
                              f"nn.Embedding(sparse=False))")



def refuse_unsupported_arguments(spec, *, compression, op, gradient_predivide_factor, sparse_as_dense, process_set,
                                 backward_passes_per_step=1, op_note="only Average"):
    """Horovod DistributedOptimizer arguments the policy refuses (its registry entry: ``spec.refuses``), given at other
    than their defaults, are an error, never ignored."""
    given = {"compression": compression is not hvd.Compression.none, "op": op != hvd.Average,
             "gradient_predivide_factor": gradient_predivide_factor != 1.0, "sparse_as_dense": bool(sparse_as_dense),
             "process_set": process_set is not hvd.global_process_set,
             "backward_passes_per_step": backward_passes_per_step != 1}
    labels = {"op": f"op ({op_note})", "process_set": "process_set (only the global set)"}
    unsupported = [labels.get(k, k) for k in HOROVOD_ARGUMENTS if k in spec.refuses and given[k]]
    if unsupported:
        raise ConfigError(f"policy {spec.name} does not support these DistributedOptimizer arguments: "
                          f"{', '.join(unsupported)}; use policy bsp or the defaults")
