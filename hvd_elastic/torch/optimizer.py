"""PyTorch frontend: builds the optimizer for the configured policy and instruments it.

- bsp: the optimizer *is* Horovod's ``horovod.torch.DistributedOptimizer`` (same arguments, same arithmetic); the
  plugin only times it (compute vs time blocked in the gradient allreduce) and injects emulated straggler delay.
- relaxed policies (asp, ssp, dssp, zipline, wbsp): the user's optimizer becomes a subclass of its own class whose
  ``step()`` hands the local gradient (or, for wbsp, the model delta after a local step) to the sync engine
  (hvd_elastic.engine), and applies the ticks the engine delivers. Horovod's ops move the bytes.

Horovod compatibility (docs/horovod-compat.md): Horovod's argument checks and warnings with Horovod's messages, the
swap by assignment (``hvd.DistributedOptimizer = hvde.DistributedOptimizer``), several live optimizers per process,
optimizer state that ``hvd.broadcast_optimizer_state`` and checkpoints can use mid-training, and a relaxed
optimizer left unfinished at interpreter exit is finished there with a one-line warning naming ``finish()``.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import sys
import time
import types
from typing import Any, Dict, List

import horovod.torch as hvd
import horovod.torch.functions as _hvd_functions
import torch
# Horovod's own optimizer, taken from its defining module: a user may swap hvd.DistributedOptimizer for ours by
# assignment, and then hvd.DistributedOptimizer is this module's function (calling it from bsp would recurse).
from horovod.torch.optimizer import DistributedOptimizer as _HOROVOD_DISTRIBUTED_OPTIMIZER

from .. import config as _config, horovod_env
from .. import stall as _stall
from ..engine.engine import Frontend, SyncEngine
from ..engine.ticker import TickerError
from ..errors import ConfigError, HvdElasticError
from ..session import Session
from . import collectives
from .attached import Attached, attach, state_of
from .backward_push import BackwardPush
from .buffers import FlatParams
from .momentum import RoundSgd, step_with_momentum_share
from .wrapping import (SynchronizeProtocol, horovod_argument_checks, parameter_names, refuse_sparse_gradients,
                       refuse_unsupported_arguments, wrap_class)

# ---- bsp ---------------------------------------------------------------------------------------------------------
def _instrument_bsp(opt, session: Session):
    """Wrap Horovod's optimizer instance: time compute, inject emulated delay, time the blocking synchronize."""
    hvd_step, hvd_synchronize = opt.step, opt.synchronize
    state = {"blocked": 0.0}

    def synchronize(self):
        t0 = time.perf_counter()
        session.watchdog.enter("Horovod's gradient allreduce")
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
POLL_S = (5e-5, 1e-3)   # _allreduce_sum: first and longest sleep between polls of a pending collective


def _allreduce_sum(tensors, name):
    """In-place Sum allreduce of flat torch tensors over all ranks (the engine's data plane).

    It waits by polling with sleeps (50 us, doubling up to 1 ms), not in hvd.synchronize(): Horovod's wait spins
    (std::this_thread::yield in a loop, taking and dropping the GIL), whichever thread waits -- the tick thread
    during a probe or a streamed chunk, or the training thread running its own tick (run_inline) while the round
    waits for a slower rank. Spinning ranks take the cores the others compute on where ranks share them, and the
    GIL from their own tick thread: 4 ranks on 2 cores (examples/torch_digits.py, every push in lock-step) took
    1.6-1.9x as long spinning as polling. Polling costs at most 1 ms after the collective completes."""
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        nap = POLL_S[0]
        while not hvd.poll(h):
            time.sleep(nap)
            nap = min(2 * nap, POLL_S[1])
        hvd.synchronize(h)


def _relaxed_step(self, closure=None):
    """step() of a relaxed-policy optimizer: push this step's update to the engine, apply delivered ticks, and
    wait while the policy's gate is closed."""
    elastic = self._hvd_elastic.elastic
    if elastic is None:
        return _relaxed_step_body(self, closure)
    elastic.before_step()
    try:
        return _relaxed_step_body(self, closure)
    except TickerError as e:   # the tick thread met Horovod's failure: Horovod's elastic loop takes it from here
        raise elastic.failed(e) from e


def _relaxed_step_body(self, closure):
    state = self._hvd_elastic
    session = state.session
    synchronized = self._synchronized
    self._hvd_elastic_begin_step()
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    engine = session.engine
    if engine.finished:
        raise HvdElasticError("optimizer.step() after finish(opt): this optimizer's training has ended; build a new "
                              "hvd_elastic.torch.DistributedOptimizer for more training")
    if engine.updates.local_step:     # deltas (wbsp; auto once relaxed): a local step on this rank's own copy
        session.relaxed_step(local_step=state.inner_step)
        return loss
    pushed = state.backward.settle(synchronized)
    refuse_sparse_gradients(state)
    session.relaxed_step(state.flat.accumulate_gradients, pushed=pushed)
    if engine.applied_contributions == 0:
        # The optimizer state (momentum, Adam moments) is created by the first applied tick. Waiting for it once
        # here (already so under HVD_ELASTIC_MAX_INFLIGHT=0) gives every rank the same state *structure* from its
        # first step on, so collective helpers that walk the state (broadcasts) match across ranks.
        session.wait_for_first_update()
    return loss


def _relaxed_synchronize(self):
    """Horovod's synchronize(): nothing to exchange (the gradient stays this rank's own until it is pushed); the
    script is about to change the gradients, which must not have been pushed yet (backward_push.py)."""
    backward = self._hvd_elastic.backward
    if backward is not None:
        backward.synchronize_called()
    SynchronizeProtocol.synchronize(self)


def _called_by_broadcast_optimizer_state():
    """The frame of horovod.torch.broadcast_optimizer_state that (through at most a few wrappers) calls
    state_dict(), or None."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        if frame.f_code is _hvd_functions.broadcast_optimizer_state.__code__:
            return frame
        frame = frame.f_back
    return None


def _relaxed_state_dict(self):
    """state_dict(): this rank's replica, non-collective (a checkpoint written by rank 0 alone is fine). Called by
    horovod.torch.broadcast_optimizer_state (a collective: every rank calls it), it first brings every rank to the
    same applied tick, so that the state broadcast from the root is the state every rank holds and replicas stay
    identical after it."""
    frame = _called_by_broadcast_optimizer_state()
    # broadcast_optimizer_state calls state_dict() a second time on the ranks whose state was empty (after its
    # dummy step); only the first call, made by every rank, may be collective.
    if frame is not None and "state_dict" not in frame.f_locals:
        sync_replicas(self)
    return self._hvd_elastic.base.state_dict(self)


def sync_replicas(optimizer):
    """Collective, finish-free: every rank applies exactly the same ticks (all ticks completed on any rank when it
    is called), so under the gradient policies weights and optimizer state are identical on every rank when it
    returns. Pushed updates not in those ticks stay pending and are applied later, on every rank alike. No-op for
    wbsp (optimizer state is per rank by design), lbbsp and bsp (lock-step) and finished optimizers."""
    state = state_of(optimizer)
    engine = state.session.engine if state is not None else None
    if engine is not None and not engine.abandoned:
        name = f"{engine.ticker.name}.sync"
        engine.sync_replicas(lambda n: int(hvd.allgather(torch.tensor([n], dtype=torch.int64), name=name).max()))


_ENGINE_IDS = itertools.count()      # relaxed engines built in this process: the same sequence on every rank


def _build_relaxed(optimizer, state: Attached, backward_passes_per_step: int = 1):
    session, names = state.session, state.names
    params = [p for g in optimizer.param_groups for p in g["params"]]
    flat = FlatParams(params)
    # __module__ (wrap_class): horovod.torch.broadcast_optimizer_state() initialises an empty optimizer state with a
    # dummy step(); for classes from Horovod's optimizer module it calls the wrapped optimizer's own step instead.
    # Ours must be treated the same way: a dummy step through the engine would push an update on some ranks only.
    wrap_class(optimizer, state, _relaxed_step, {"state_dict": _relaxed_state_dict,
                                                 "synchronize": _relaxed_synchronize})
    state.flat = flat
    _UNFINISHED[:] = [s for s in _UNFINISHED if s.report is None]
    _UNFINISHED.append(session)
    _install_exit_handlers()

    def start(recover=None):
        _start_engine(optimizer, state, backward_passes_per_step, recover)

    if horovod_env.horovod_elastic():
        # Elastic Horovod: a worker that joins builds its optimizer while the others sync; the engine is built at
        # the first step() (and again after each reset), where every rank is (torch/elastic.py).
        from .elastic import elastic_run
        state.elastic = elastic_run(optimizer, state, start)
        state.backward = BackwardPush(flat, session, names, False)
    else:
        start()
    return optimizer


def _start_engine(optimizer, state: Attached, backward_passes_per_step: int, recover=None):
    """Collective: build this optimizer's engine for the current ranks. recover(epoch_and_id) (elastic Horovod)
    brings every rank to one state and returns the job's (epoch_ns, engine id)."""
    session, flat = state.session, state.flat
    if recover is not None:
        session.follow_ranks()
    per = session.cfg.momentum_per
    rounds = RoundSgd(optimizer, state.inner_step, session.size) \
        if per == "round" and RoundSgd.applies(optimizer) else None

    def apply_gradient(update, scale, share):
        flat.load_gradient(update, scale)
        if rounds is not None:
            rounds(int(round(share * session.size)))
        else:
            step_with_momentum_share(optimizer, state.inner_step, share if per != "tick" else 1.0)

    engine_id = next(_ENGINE_IDS)
    if recover is not None:
        # Ranks that joined later count their engines from 0: the job takes the largest id.
        epoch_ns, engine_id = recover((time.time_ns(), engine_id))
        _advance_engine_ids(engine_id)
    else:
        # Construction is collective and happens in the same order on every rank, so the n-th engine of each rank
        # has the same id: its tick tensor name is unique in the process and identical across ranks.
        everyone = hvd.allgather_object((time.time_ns(), engine_id), name="hvd_elastic.engine")
        if len({e for _, e in everyone}) != 1:
            raise ConfigError(f"ranks built different numbers of relaxed optimizers before this one (engine ids "
                              f"{[e for _, e in everyone]}): build them in the same order on every rank")
        epoch_ns = everyone[0][0]
        # Weights must be identical before the engine snapshots them (delta policies keep the global model); after
        # a reset, recover() has made them so.
        flat.broadcast_weights(root_rank=0)
    stream = session.cfg.push_at_backward and backward_passes_per_step == 1 and recover is None
    session.start_engine(Frontend(
        flat.numel, flat.buffers, _allreduce_sum, tick_name=f"hvd_elastic.torch.tick.{engine_id}",
        epoch_ns=epoch_ns, apply_gradient=apply_gradient, read_params=flat.weights,
        write_params=flat.set_weights, read_params_into=flat.weights_into, add_params_into=flat.add_weights_into,
        add_to_params=flat.add_to_weights, sample_params=flat.sample_weights, stream=stream))
    _watch_own_collectives(session.engine)
    state.backward = BackwardPush(flat, session, state.names, stream and session.engine.updates.streams)


def _advance_engine_ids(used: int):
    """The next engine of this process gets an id above `used`."""
    global _ENGINE_IDS
    _ENGINE_IDS = itertools.count(used + 1)


def _watch_own_collectives(engine: SyncEngine):
    """The script's own collectives beside the engine's ticks (collectives.py): unnamed ones get names every rank
    agrees on, and while the training thread waits in one, this rank's tick row says so (OUTSIDE)."""
    collectives.install()

    def waiting(flag: bool):
        if engine.finished:
            collectives.remove_listener(waiting)
        else:
            engine.waiting_outside(flag)

    collectives.on_wait(waiting)


# ---- end of the process: relaxed optimizers the script never finished ----------------------------------------------
_UNFINISHED: List[Session] = []
_EXIT = {"installed": False}


def _install_exit_handlers():
    """Registered after hvd.init() (a relaxed optimizer exists), so atexit runs ours before Horovod's shutdown."""
    if not _EXIT["installed"]:
        _EXIT["installed"] = True
        atexit.register(_finish_at_exit)


def _finish_at_exit():
    live = [s for s in _UNFINISHED if s.report is None]
    _UNFINISHED.clear()
    if not live:
        return
    policy = live[0].cfg.policy
    # An uncaught exception ended the script (Python sets sys.last_value before the exit handlers run): the other
    # ranks may be anywhere, so a collective finish could hang; the job fails anyway.
    uncaught = getattr(sys, "last_value", None)
    if uncaught is not None:
        sys.stderr.write(f"hvd_elastic: error: policy {policy}: the script ended with {type(uncaught).__name__} "
                         f"before finish(opt); {len(live)} relaxed optimizer(s) left unfinished\n")
        sys.stderr.flush()
        return
    if not hvd.is_initialized():
        sys.stderr.write(f"hvd_elastic: error: policy {policy}: Horovod was shut down before finish(opt); call "
                         f"hvd_elastic.torch.finish(opt) (or use `with hvd_elastic.torch.training(opt):`) before "
                         f"hvd.shutdown()\n")
        sys.stderr.flush()
        return
    sys.stderr.write(f"hvd_elastic: warning: policy {policy}: the script ended without hvd_elastic.torch.finish(opt) "
                     f"(or `with hvd_elastic.torch.training(opt):`); finishing {len(live)} optimizer(s) at exit, so "
                     f"weights saved before this point were not final\n")
    sys.stderr.flush()
    for session in live:     # in creation order, the same on every rank
        session.engine.stall_timeout_s = min(session.engine.stall_timeout_s, 60.0)
        try:
            session.finish()
        except Exception as e:   # one line, and a failed exit status
            sys.stderr.write(f"hvd_elastic: error: policy {policy}: finishing at exit failed ({e}); call "
                             f"hvd_elastic.torch.finish(opt) at the end of training\n")
            sys.stderr.flush()
            import os
            os._exit(1)


# ---- the drop-in -------------------------------------------------------------------------------------------------
def DistributedOptimizer(optimizer, named_parameters=None, compression=hvd.Compression.none,
                         backward_passes_per_step=1, op=hvd.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=hvd.global_process_set,
                         **policy_kwargs):
    """A drop-in for ``horovod.torch.DistributedOptimizer`` that runs under the configured policy.

    Takes Horovod's arguments unchanged; any hvd-elastic knob may be passed as a keyword (``policy="ssp"``,
    ``staleness=3``, ...) and wins over its ``HVD_ELASTIC_*`` variable. Collective: call it on every rank.
    Raises ConfigError (one line, on every rank) for bad settings or ranks that disagree, and Horovod's ValueErrors
    (same messages) for bad ``named_parameters``. Under a relaxed policy the parameters are broadcast from rank 0
    here, and ``finish(opt)`` must end training (else it is finished at interpreter exit, with a warning).
    ``hvd.DistributedOptimizer = hvd_elastic.torch.DistributedOptimizer`` (the swap by assignment) works.

    Example::

        opt = hvd_elastic.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                                     named_parameters=model.named_parameters())
    """
    cfg = _config.load(policy_kwargs, hvd.allgather_object, hvd.rank(), "PyTorch")
    session = Session(cfg, hvd.rank(), hvd.size(), hvd.allgather_object, lambda: (hvd.rank(), hvd.size()))
    session.watchdog.between_steps(_stall.USER)   # step() marks the steps: the script's own code between them
    if cfg.spec.horovod_optimizer:
        opt = _HOROVOD_DISTRIBUTED_OPTIMIZER(
            optimizer, named_parameters=named_parameters, compression=compression,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
            sparse_as_dense=sparse_as_dense, process_set=process_set)
        opt = _instrument_bsp(opt, session)
        attach(opt, session)
    else:
        horovod_argument_checks(op, gradient_predivide_factor, backward_passes_per_step)
        names = parameter_names(optimizer, named_parameters)
        state = attach(optimizer, session)
        state.names = names
        if cfg.spec.balances_batches:
            from .lbbsp import build_lbbsp
            opt = build_lbbsp(optimizer, state, compression=compression, op=op,
                              gradient_predivide_factor=gradient_predivide_factor, sparse_as_dense=sparse_as_dense,
                              process_set=process_set, backward_passes_per_step=backward_passes_per_step)
        else:
            refuse_unsupported_arguments(cfg.spec, compression=compression, op=op,
                                         gradient_predivide_factor=gradient_predivide_factor,
                                         sparse_as_dense=sparse_as_dense, process_set=process_set)
            # groups / num_groups only group Horovod's allreduces; a tick is one buffer (one group) anyway.
            opt = _build_relaxed(optimizer, state, backward_passes_per_step)
        # Horovod's public attributes, for code that reads them.
        opt._parameter_names = names
        opt.backward_passes_per_step = backward_passes_per_step
        opt.op, opt.gradient_predivide_factor = op, gradient_predivide_factor
        opt.sparse_as_dense, opt.process_set = sparse_as_dense, process_set
    opt.finish = session.finish
    return opt


def global_steps(optimizer) -> int:
    """Steps taken by all ranks together, as far as this rank knows (exact under bsp; under relaxed policies the
    delivered clocks of the others plus this rank's own steps; under elastic Horovod and a tick policy, over every
    reset: the steps in the state each reset resumed from, on every rank, joiners included). Loop on it to train for
    a global step budget -- except under elastic Horovod with bsp or lbbsp, where it counts this process's steps
    times the ranks of the moment (a joiner counts from its own start): loop on a count kept in the TorchState."""
    state = state_of(optimizer, "global_steps")
    steps = state.session.global_steps()
    return state.elastic.global_steps(steps) if state.elastic is not None else steps


def settings(optimizer) -> _config.Config:
    """The settings the optimizer runs under (``settings(opt).policy``, ``settings(opt).spec`` for what the policy
    is: hvd_elastic/registry.py)."""
    return state_of(optimizer, "settings").session.cfg


def finish(optimizer) -> Dict[str, Any]:
    """Collective end of training: deliver and apply every pushed update, leave all ranks with identical weights,
    and report. Returns the report (a dict) on every rank; rank 0 prints it unless HVD_ELASTIC_REPORT=0."""
    state = state_of(optimizer, "finish")
    session, elastic = state.session, state.elastic
    if elastic is not None and session.report is None:
        elastic.before_step()        # a reset with no step after it: the engine to finish is built first
        session.counter_sources.append(elastic.counters)
    return session.finish()


@contextlib.contextmanager
def training(optimizer):
    """Context manager around the training loop: calls :func:`finish` when the loop ends normally."""
    yield optimizer
    finish(optimizer)
