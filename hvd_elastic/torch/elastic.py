"""Elastic Horovod (``horovodrun --elastic``, ``@hvd.elastic.run``) under the tick policies, PyTorch's side: the
framework-free part is hvd_elastic/elastic.py; here Horovod's PyTorch elastic loop is routed through it
(:func:`install`) and :class:`TorchReplica` copies, loads and broadcasts the model and optimizer. lbbsp counts
Horovod's resets here too (:func:`resets`) and rebuilds its batch plan on its own (torch/lbbsp.py, LbbspElastic).

- hvd.elastic.run's reset (``horovod.torch.elastic``'s shutdown) stops every live engine first;
- ``TorchState.restore`` (after a failure) keeps every live engine's replica first;
- ``TorchState.check_host_updates`` (every commit) goes through the ticks while an engine runs;
- ``TorchState.sync`` (the loop's start, and after each reset) ends with the move to the most advanced survivor's
  replica, so the script's first step after a reset computes on the weights the new engine starts from; where that
  replica is broadcast, Horovod's broadcast of rank 0's parameters and optimizer state is left out.
docs/horovod-compat.md, "Elastic Horovod".
"""
from __future__ import annotations

import copy

import horovod.torch as hvd
import horovod.torch.elastic as _horovod_elastic
import torch
from horovod.torch.elastic.state import TorchState

from .. import elastic as _elastic
from ..elastic import ElasticRun, Replica, reset_began, resets   # noqa: F401  (resets, reset_began: lbbsp)


class TorchReplica(Replica):
    """A wrapped PyTorch optimizer's model (its flat parameters) and optimizer state."""

    def __init__(self, optimizer, state):
        self.optimizer, self.state = optimizer, state

    def allgather(self, obj, name):
        return hvd.allgather_object(obj, name=name)

    def capture(self, global_model):
        weights = self.state.flat.weights() if global_model is None else global_model
        return weights.clone(), copy.deepcopy(self.state.base.state_dict(self.optimizer))

    def load(self, weights, optimizer_state):
        """The snapshot's weights and per-parameter optimizer state (momentum buffers, step counts); each param
        group's hyperparameters (lr, momentum, ...) stay as they are -- after a reset the script's reset callbacks
        and Horovod's sync have set them for the new ranks, as under Horovod."""
        self.state.flat.set_weights(weights)
        kept = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(optimizer_state)
        for group, hyperparameters in zip(self.optimizer.param_groups, kept):
            group.update(hyperparameters)

    def broadcast(self, root_rank):
        self.state.flat.broadcast_weights(root_rank=root_rank)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=root_rank)

    def synced_by(self, objects):
        """TorchState.sync broadcasts its optimizers' state and its modules' parameters: this optimizer's must be
        among them, and each of its parameters in one of the modules."""
        objects = list(objects)
        if not any(o is self.optimizer for o in objects):
            return False
        synced = {id(p) for o in objects if isinstance(o, torch.nn.Module) for p in o.parameters()}
        return all(id(p) in synced for group in self.optimizer.param_groups for p in group["params"])


def elastic_run(optimizer, state, start_engine) -> ElasticRun:
    """The optimizer's side of elastic Horovod; Horovod's elastic loop is routed through hvd_elastic first."""
    install()
    return ElasticRun(TorchReplica(optimizer, state), state.session, start_engine)


_HOROVOD = {"shutdown": None, "restore": None, "check_host_updates": None, "sync": None}


def _stop_engines_then_shutdown():
    """horovod.torch.elastic's shutdown during a reset: stop every live engine's ticks, shut Horovod down (a tick
    under way fails there), then wait for the tick threads to end before Horovod is initialised again."""
    stopped = _elastic.stop_engines()
    _HOROVOD["shutdown"]()
    _elastic.join_stopped(stopped)


def _check_host_updates_through_ticks(self):
    """TorchState.check_host_updates: through the ticks while an engine runs (hvd_elastic.elastic)."""
    _elastic.check_host_updates(self, lambda: _HOROVOD["check_host_updates"](self))


def _keep_replicas_then_restore(self):
    """TorchState.restore (after a failure, before the reset): every live engine's replica is kept first."""
    _elastic.keep_replicas()
    _HOROVOD["restore"](self)


def _sync_then_resume_early(self):
    """TorchState.sync (the elastic loop's start, and after each reset): every live optimizer without a running engine
    learns which survivor's replica it takes (collective), Horovod's sync of rank 0's state follows -- less the
    models' parameters and the optimizers' state that a replica's broadcast replaces -- and then each takes that
    replica, before the script's first step computes a gradient."""
    objects = list(vars(self).values())
    plans = _elastic.plan_resumes(objects)
    replaced = [run for run, plan, covered in plans if plan.load and covered]
    if replaced and isinstance(getattr(self, "_handlers", None), dict):
        _sync_but(self, [run.replica.optimizer for run in replaced])
        for run in replaced:
            run.sync_replaced += 1
    else:
        _HOROVOD["sync"](self)
    _elastic.resume(plans)


def _sync_but(state, optimizers):
    """TorchState.sync without what the replicas' broadcast replaces: `optimizers`' state, and the parameters of each
    model whose parameters are all theirs (its buffers still come from rank 0, as under Horovod); every other handler
    and the script's own attributes as Horovod syncs them. Every rank leaves out the same (the plan is collective)."""
    replaced = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    for handler in state._handlers.values():
        value = handler.value
        if isinstance(value, torch.optim.Optimizer) and any(value is opt for opt in optimizers):
            continue
        if isinstance(value, torch.nn.Module) and all(id(p) in replaced for p in value.parameters()):
            params = {name for name, _ in value.named_parameters(remove_duplicate=False)}
            hvd.broadcast_parameters({k: v for k, v in value.state_dict().items() if k not in params}, root_rank=0)
            continue
        handler.sync()
    super(TorchState, state).sync()


def install():
    """Route hvd.elastic.run's reset through :func:`_stop_engines_then_shutdown`, TorchState.restore through
    :func:`_keep_replicas_then_restore`, TorchState.check_host_updates through the ticks and TorchState.sync through
    :func:`_sync_then_resume_early` (once per process)."""
    if _HOROVOD["shutdown"] is None:
        _HOROVOD["shutdown"], _horovod_elastic.shutdown = _horovod_elastic.shutdown, _stop_engines_then_shutdown
        _HOROVOD["restore"], TorchState.restore = TorchState.restore, _keep_replicas_then_restore
        _HOROVOD["check_host_updates"], TorchState.check_host_updates = \
            TorchState.check_host_updates, _check_host_updates_through_ticks
        _HOROVOD["sync"], TorchState.sync = TorchState.sync, _sync_then_resume_early
