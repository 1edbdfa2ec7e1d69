"""LB-BSP for PyTorch: the optimizer's step and the batch sampler. The rules (weighted exchange, re-sizing, which
samples each rank takes) live in :mod:`hvd_elastic.lbbsp`; this file only moves tensors.

Example::

    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(), policy="lbbsp", global_batch=64)
    loader = DataLoader(dataset, batch_sampler=hvde.LbbspSampler(len(dataset), opt, seed=0))
    with hvde.training(opt):
        for epoch in range(epochs):
            for x, y in loader:
                opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
"""
from __future__ import annotations

import time
from typing import List

import horovod.torch as hvd
import horovod.torch.elastic.state as _elastic_state
import torch

from .. import horovod_env
from ..elastic import LbbspResets
from ..errors import HvdElasticError
from ..lbbsp import BatchPlan, LbbspController
from .attached import state_of
from .buffers import FlatParams
from .wrapping import SynchronizeProtocol, refuse_sparse_gradients, refuse_unsupported_arguments, wrap_class

class _Overlap:
    """LB-BSP's exchange overlapped with backward, as Horovod overlaps bsp: a post-accumulate-grad hook per
    parameter scales its gradient by this rank's batch size b_p and submits its Sum allreduce at once (Horovod
    negotiates by name, so the order in which gradients become ready may differ across ranks). Before the last one,
    backward is all but done: the step's compute is measured there (Session.begin_step, which also sleeps an
    emulated delay, where a slower device would spend it) and this rank's row of the small table (step time, b_p,
    pass start; LbbspController.row) is submitted in the gradients' dtype, so Horovod can fuse it with that last
    gradient and the next sizes follow this step's times. synchronize() (or step(), without it) waits for both and
    divides the gradients by B = sum_p b_p; step() then runs the user's optimizer. One backward per step: a second
    gradient of the same parameter before step() is an error."""

    def __init__(self, state, params, dtype):
        self.state, self.session, self.params = state, state.session, params
        self.dtype = dtype      # the table's words: the gradients' numpy twin (float32 for 16-bit gradients)
        self.handles = {}
        self.table = None       # (tensor, handle) of this step's table allreduce, submitted before the last gradient
        self.compute = 0.0      # this step's compute up to the table's submission, and when that was
        self.measured_at = 0.0
        self.exchanged = None   # (table, compute, blocked, when) once synchronize() completed this step's exchange
        self._index = {id(p): i for i, p in enumerate(params)}
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    @property
    def ctl(self) -> LbbspController:
        return current_controller(self.state)

    def forget(self):
        """Elastic Horovod reset the rank set: the exchange under way failed or was abandoned with the old ranks."""
        self.handles.clear()
        self.table = self.exchanged = None

    def _name(self, p) -> str:
        """The parameter's Horovod name (the optimizer's named_parameters), the same on every rank."""
        name = self.state.names.get(p)
        return name if name is not None else f"p{self._index[id(p)]}"

    def _submit_table(self):
        self.compute = self.session.begin_step(samples=self.ctl.local_batch())
        self.measured_at = time.perf_counter()
        words = torch.from_numpy(self.ctl.row(self.compute, self.dtype))
        self.table = words, hvd.allreduce_async_(words, op=hvd.Sum, name="hvd_elastic.lbbsp.table")

    def _submit(self, p):
        if p.grad.is_sparse:
            refuse_sparse_gradients(self.state)
        if not self.handles:
            self.ctl.unstepped = self._unapplied
        if len(self.handles) == len(self.params) - 1:
            self._submit_table()
        p.grad.mul_(self.ctl.local_batch())
        self.handles[p] = hvd.allreduce_async_(p.grad, op=hvd.Sum, name=f"hvd_elastic.lbbsp.{self._name(p)}")

    def _ready(self, p):
        if self.exchanged is not None:
            raise HvdElasticError(f"policy lbbsp: the gradient of parameter {self._name(p)!r} was computed after "
                                  f"optimizer.synchronize() and before step(): one backward per step, then "
                                  f"synchronize() (optional) and step(); a script that skips step() calls "
                                  f"optimizer.zero_grad() before the next backward")
        if p in self.handles:
            raise HvdElasticError(f"policy lbbsp: the gradient of parameter {self._name(p)!r} was computed twice "
                                  f"before optimizer.step(): one backward per step (gradient accumulation, "
                                  f"backward_passes_per_step, is policy bsp only)")
        self._submit(p)

    def synchronize(self):
        """Complete this step's exchange, once: what backward left unsubmitted (parameters without a gradient add
        zeros, on every rank alike), the wait for the table and the gradients, the division by B. Then `.grad`
        holds the gradient over the global batch, as Horovod's synchronize() leaves the averaged gradient there for
        the script to clip before step()."""
        if self.exchanged is not None:
            return
        with torch.no_grad():
            for p in self.params:
                if p not in self.handles:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._submit(p)
        # the step's compute: up to the table's submission, and what the script did from then until now
        compute = self.compute + (time.perf_counter() - self.measured_at)

        def wait_table():
            words, handle = self.table
            hvd.synchronize(handle)
            self.table = None
            return words.numpy()

        def wait_gradients():
            for h in self.handles.values():
                hvd.synchronize(h)
            self.handles.clear()

        def divide(total):
            with torch.no_grad():
                torch._foreach_div_([p.grad for p in self.params], total)

        table, blocked = self.ctl.finish_overlapped(wait_table, wait_gradients, divide)
        self.exchanged = table, compute, blocked, time.perf_counter()

    def step(self, applied=True):
        """End this step: the user's optimizer step over the global-batch gradient and the next sizes, or, not
        `applied` (a step the script skipped), neither."""
        self.synchronize()
        table, compute, blocked, done = self.exchanged
        self.exchanged = None
        self.ctl.unstepped = None
        # what the script did between synchronize() and step() (clipping) counts as compute
        compute += time.perf_counter() - done
        apply = self.state.inner_step if applied else (lambda: None)
        self.ctl.end_step(self.session, table, compute, blocked, apply, resize=applied)

    def _unapplied(self):
        """The script skipped step() after this step's backward (torch.amp.GradScaler does after an overflow, on every
        rank alike: it reads the global-batch gradient after synchronize()): the exchange completes, the weights and
        the sizes stay as they are (a script that drew its batch from batch_sizes() before its zero_grad() ended
        this step drew the size the next step weights it by); LbbspController.unstepped."""
        self.session.telemetry.count("lbbsp_unapplied_steps")
        self.step(applied=False)


def _lbbsp_step(self, closure=None):
    """step() under lbbsp: the gradients' weighted allreduces and the table's (submitted during backward), the
    user's optimizer step over the global-batch gradient, the next sizes."""
    self._hvd_elastic_begin_step()      # Horovod's synchronize()/step() warning
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    self._hvd_elastic.overlap.step()
    return loss


def _lbbsp_synchronize(self):
    """Horovod's synchronize() under lbbsp: completes this step's weighted exchange, so `.grad` holds the gradient
    over the global batch (Horovod's: the averaged gradient), which the script may clip before step() inside
    skip_synchronize()."""
    SynchronizeProtocol.synchronize(self)
    self._hvd_elastic.overlap.synchronize()


def _lbbsp_zero_grad(self, *args, **kwargs):
    """zero_grad() under lbbsp: a step whose backward ran and whose step() the script skipped (torch.amp.GradScaler
    after an overflow) is ended unapplied first, as LbbspSampler's next draw ends it, so that its reductions are
    complete before the gradients are zeroed and the next backward starts a new step."""
    self._hvd_elastic.overlap.ctl.end_unstepped()
    return self._hvd_elastic.base.zero_grad(self, *args, **kwargs)


class LbbspElastic:
    """lbbsp under elastic Horovod (``hvd.elastic.run``). The steps are synchronous, so a reset is Horovod's: after a
    failure every rank restores its last commit and takes rank 0's state; after an announced change the ranks go on
    from the step they all committed. What lbbsp adds: at its first use after the reset (the sampler's draw, a
    gradient's hook, zero_grad(), step()) the batch plan is rebuilt for the ranks of the moment
    (hvd_elastic.elastic.LbbspResets), the exchange the failure cut short forgotten, and :class:`LbbspSampler` (in
    the TorchState) resumes the epoch at its first global batch not stepped (:class:`hvd_elastic.lbbsp.BatchPlan`)."""

    def __init__(self, state):
        from . import elastic
        elastic.install()
        self.state = state
        self.plan_resets = LbbspResets()

    def before_step(self):
        """Rebuild the batch plan if Horovod has reset the rank set since it was built."""
        if self.plan_resets.follow(self.state.session):
            self.state.overlap.forget()

    def global_steps(self, steps: int) -> int:
        """lock-step: the script counts the job's steps in its state, committed and synced with the model."""
        return steps

    def counters(self) -> dict:
        return self.plan_resets.counters()


def current_controller(state) -> LbbspController:
    """The optimizer's LB-BSP controller, for the ranks of the moment (rebuilt after an elastic reset)."""
    if state.elastic is not None:
        state.elastic.before_step()
    return state.session.lbbsp


def build_lbbsp(optimizer, state, *, compression, op, gradient_predivide_factor, sparse_as_dense, process_set,
                backward_passes_per_step):
    refuse_unsupported_arguments(state.session.cfg.spec, compression=compression, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 sparse_as_dense=sparse_as_dense, process_set=process_set,
                                 backward_passes_per_step=backward_passes_per_step,
                                 op_note="only Average: lbbsp weights each rank by its batch size")
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    flat = FlatParams(params)   # checks: one dtype, one device
    # Same reason as the relaxed policies: horovod.torch.broadcast_optimizer_state's dummy step must call the
    # wrapped optimizer's own step, not ours (which would run a collective on one side only). synchronize() completes
    # the step's exchange (as Horovod's does), step() completes it where the script did not call synchronize(),
    # zero_grad() ends a step whose step() the script skipped.
    wrap_class(optimizer, state, _lbbsp_step, {"synchronize": _lbbsp_synchronize, "zero_grad": _lbbsp_zero_grad})
    state.flat = flat
    if horovod_env.horovod_elastic():
        # a worker that joins builds its optimizer alone: hvd.elastic.run's sync brings the weights
        state.elastic = LbbspElastic(state)
    else:
        flat.broadcast_weights(root_rank=0)
    state.overlap = _Overlap(state, flat.params, flat.dtype)
    return optimizer


def batch_sizes(optimizer) -> List[int]:
    """Every rank's batch size for the next step (identical on every rank), under policy lbbsp."""
    return list(_controller(optimizer).sizes)


def _controller(optimizer) -> LbbspController:
    state = state_of(optimizer)
    if state is None or state.session.lbbsp is None:
        raise TypeError("this needs an optimizer made by hvd_elastic.torch.DistributedOptimizer with policy lbbsp")
    return current_controller(state)


def _distributed_sampler_permutation(n: int, seed: int):
    """torch.utils.data.DistributedSampler's shuffle of range(n) for seed + epoch = `seed`."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()


class LbbspSampler(torch.utils.data.Sampler):
    """Batch sampler for policy lbbsp: ``DataLoader(ds, batch_sampler=LbbspSampler(len(ds), opt))``.

    Step i of an epoch takes the next B indices of one shuffled order shared by all ranks and this rank yields its
    ``b_p`` of them, with the sizes the optimizer decided after the previous step; so across ranks an epoch covers
    every sample exactly once (see :class:`hvd_elastic.lbbsp.BatchPlan`). The order is torch's
    ``DistributedSampler``'s (``torch.randperm`` seeded with ``seed + epoch``): whatever the sizes, step i takes the
    same global batch (as a set of samples) as B / n-sample batches from ``DistributedSampler(ds, seed=seed)`` on
    every rank, so lbbsp's gradient is the one Horovod averages on that order, up to rounding, and a job that
    switches between lbbsp and Horovod's usual sampler keeps its data order. The batch is dealt to the ranks as
    that sampler splits it (:func:`hvd_elastic.lbbsp.batch_positions`), so at equal sizes each rank's batch is the
    sampler's and lbbsp trains Horovod's weights to the last bit. The remainder
    ``dataset_len % B`` is dropped (``drop_last=True``) or the last global batch is completed from the start of the
    order (``drop_last=False``, as torch's DistributedSampler pads). The epoch advances by one at each new
    iteration unless :meth:`set_epoch` is called.

    Batches must be drawn one step at a time (``num_workers=0``, the DataLoader's default), since each batch's size
    is only known once the previous step is done; drawing ahead raises an error.

    Elastic Horovod: put the sampler in the ``TorchState`` (``TorchState(model, opt, sampler=sampler, ...)``), as
    Horovod's ElasticSampler: a commit keeps its place in the data (:meth:`state_dict`), and after a reset the next
    iteration resumes the epoch at its first global batch not stepped, dealt over the new ranks.
    """

    def __init__(self, dataset_len, optimizer, seed: int = 0, drop_last: bool = True, shuffle: bool = True):
        _controller(optimizer)
        n = int(dataset_len if isinstance(dataset_len, int) else len(dataset_len))
        resets = lambda: 0   # noqa: E731
        if horovod_env.horovod_elastic():
            from .elastic import resets
        self.plan = BatchPlan(n, lambda: _controller(optimizer), seed=seed, drop_last=drop_last, shuffle=shuffle,
                              permutation=_distributed_sampler_permutation, resets=resets)
        self.B = self.plan.B

    def set_epoch(self, epoch: int):
        self.plan.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The epoch under way and how many of its global batches were stepped (:class:`BatchPlan`)."""
        return self.plan.state_dict()

    def load_state_dict(self, state: dict):
        """The next iteration resumes at `state` (:meth:`state_dict`)."""
        self.plan.load_state_dict(state)

    def __len__(self):
        return len(self.plan)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's shared order of sample indices (identical on every rank); global batch i is positions
        [i B, (i+1) B)."""
        return torch.from_numpy(self.plan.order(epoch))

    def __iter__(self):
        for idx in self.plan.batches("LbbspSampler (DataLoader num_workers must be 0)"):
            yield idx.tolist()


# Horovod's TorchState keeps a sampler's state_dict() at each commit and loads it at restore and sync, for the types
# in its handler registry (Horovod's ElasticSampler): LbbspSampler is kept the same way.
_elastic_state.get_handler_registry().append((LbbspSampler, _elastic_state.SamplerStateHandler))
