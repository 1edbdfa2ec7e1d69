"""LB-BSP for PyTorch (Chen et al., SoCC 2020): still BSP, but each rank's batch size is re-sized at every
iteration boundary so that all ranks finish the iteration together, with the global batch B fixed.

- Every step is one synchronous Sum-allreduce (Horovod's ``allreduce_``) of ``[b_p * g_p | metadata]``, where g_p
  is the rank's mean gradient over its b_p samples and the metadata table (each rank fills its own row: step time
  in ns, b_p) rides in the same buffer as exact 16-bit pieces (the engine's trick, ``ticker.encode_meta``). The
  applied gradient is ``sum_p b_p g_p / sum_p b_p``: the gradient of one process over the whole global batch.
- The step time is this rank's computation (data, forward, backward, emulated delay), not the wait in the
  allreduce. Every rank receives the same table, so every rank feeds the same inputs to the native rule
  (``hvd_elastic._native``) and gets the same next sizes: cpu mode ``lbbsp_batch_sizes_cpu`` over the throughput
  ``v_p = 1 / predicted per-sample time`` (predictor ``HVD_ELASTIC_PREDICTOR`` over each rank's per-sample time
  history), gpu mode ``LbbspGpuController.update`` over step times averaged over its window.
- :class:`LbbspSampler` hands out the data: each step takes the next B indices of one shuffled order shared by all
  ranks (same seed, per epoch) and rank p takes its slice of b_p of them, at offset ``sum_{q<p} b_q``.

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
import types
from typing import List, Optional

import horovod.torch as hvd
import numpy as np
import torch

from .. import _native
from ..engine.ticker import META_PIECES, decode_meta, encode_meta
from ..errors import ConfigError, HvdElasticError

_META = 2                      # columns of the metadata table: step time (ns), samples this step
HISTORY = 32                   # per-sample times kept per rank for the cpu-mode predictor
TRACE_LIMIT = 2000             # most size changes kept in the report trace


def _caps(cfg, size: int) -> List[int]:
    spec = cfg.lbbsp_caps
    for key in spec:
        if key != "*" and key >= size:
            raise ConfigError(f"HVD_ELASTIC_LBBSP_CAPS names rank {key} but the job has {size} ranks (0..{size - 1})")
    return [int(spec.get(p, spec.get("*", cfg.global_batch))) for p in range(size)]


def check_settings(cfg, size: int) -> List[int]:
    """Validate the lbbsp settings against the job; returns the per-rank caps. Same inputs on every rank, so every
    rank raises the same ConfigError."""
    B = cfg.global_batch
    if B == 0:
        raise ConfigError("policy lbbsp needs the global batch: set HVD_ELASTIC_GLOBAL_BATCH (or global_batch=) to "
                          "the number of samples all ranks take together per step")
    if B < size:
        raise ConfigError(f"HVD_ELASTIC_GLOBAL_BATCH={B} is smaller than the number of ranks ({size}); accepted: "
                          f"integer >= {size} (every rank takes at least one sample per step)")
    caps = _caps(cfg, size)
    if sum(min(c, B) for c in caps) < B:
        raise ConfigError(f"HVD_ELASTIC_LBBSP_CAPS caps sum to {sum(caps)} samples, below HVD_ELASTIC_GLOBAL_BATCH="
                          f"{B}: the ranks cannot hold the global batch")
    return [min(c, B) for c in caps]


class LbbspController:
    """The per-job state every rank holds identically: current sizes, the rule, and the telemetry of the sizes."""

    def __init__(self, cfg, rank: int, size: int, telemetry):
        self.cfg, self.rank, self.size, self.telemetry = cfg, rank, size, telemetry
        self.batch_size = cfg.global_batch
        self.caps = check_settings(cfg, size)
        self.mode = cfg.lbbsp_mode
        self.steps = 0                     # completed synchronous steps
        self.drawn: Optional[int] = None   # size of the batch the sampler handed out for the next step
        self.drawn_at = -1                 # self.steps when the sampler last handed out a batch
        self.history = [[] for _ in range(size)]   # per-sample ns, per rank (cpu mode)
        self.window_times: List[np.ndarray] = []   # gpu mode: step times since the last update
        if self.mode == "gpu":
            self.gpu = _native.LbbspGpuController(self.batch_size, self.caps)
            self.sizes = list(self.gpu.sizes)
        else:
            self.gpu = None
            self.sizes = list(_native.lbbsp_batch_sizes_cpu([1.0] * size, self.batch_size, self.caps))
        self.resizes = 0
        self.trace = [[0, self.sizes[rank]]]
        self.size_min = self.size_max = self.sizes[rank]
        self.step_ns_sum = 0
        self.step_ms_trace: List[float] = []   # this rank's mean step time over each block of 10 steps
        self._block: List[int] = []
        self._publish()

    @property
    def offset(self) -> int:
        return int(sum(self.sizes[:self.rank]))

    def local_batch(self) -> int:
        return self.drawn if self.drawn is not None else self.sizes[self.rank]

    def _predict(self, history: List[int]) -> int:
        p = self.cfg.predictor
        if p == "ewma":
            return _native.predict_ewma_interval(history)
        if p == "arx":
            return _native.predict_arx_interval(history)
        return _native.predict_last_interval(history)

    def update(self, meta: np.ndarray):
        """One iteration boundary: meta[p] = (step ns, samples) of every rank; decide the next sizes."""
        step_ns, samples = meta[:, 0], meta[:, 1]
        if self.steps == 0:
            # The first step's time includes each rank's start-up since the optimizer was built: not a speed.
            new = self.sizes
        elif self.mode == "gpu":
            self.window_times.append(step_ns.copy())
            if len(self.window_times) >= self.gpu.window:
                mean = np.mean(np.stack(self.window_times), axis=0)
                self.window_times = []
                new = list(self.gpu.update([int(round(t)) for t in mean]))
            else:
                new = self.sizes
        else:
            for p in range(self.size):
                h = self.history[p]
                h.append(max(1, int(step_ns[p] // max(int(samples[p]), 1))))
                del h[:-HISTORY]
            throughput = [1e9 / max(self._predict(h), 1) for h in self.history]
            new = list(_native.lbbsp_batch_sizes_cpu(throughput, self.batch_size, self.caps))
        self.steps += 1
        mine = int(step_ns[self.rank])
        self.step_ns_sum += mine
        self._block.append(mine)
        if len(self._block) == 10:
            self.step_ms_trace.append(round(float(np.mean(self._block)) / 1e6, 3))
            self._block = []
        if new != self.sizes:
            self.resizes += 1
            if new[self.rank] != self.sizes[self.rank] and len(self.trace) < TRACE_LIMIT:
                self.trace.append([self.steps, int(new[self.rank])])
            self.sizes = [int(b) for b in new]
        self.size_min = min(self.size_min, self.sizes[self.rank])
        self.size_max = max(self.size_max, self.sizes[self.rank])
        self.drawn = None
        self._publish()

    def _publish(self):
        c = self.telemetry.counters
        c["lbbsp_sizes"] = list(self.sizes)               # the sizes for the next step, every rank's
        c["lbbsp_size_min"], c["lbbsp_size_max"] = self.size_min, self.size_max
        c["lbbsp_resizes"] = self.resizes
        c["lbbsp_step_ms_mean"] = round(self.step_ns_sum / max(self.steps, 1) / 1e6, 3)
        # dict: kept out of the printed table, carried by the JSON report
        c["lbbsp_trace"] = {"size_changes": self.trace, "step_ms_per_10": self.step_ms_trace}


def _lbbsp_step(self, closure=None):
    """step() under lbbsp: one synchronous weighted allreduce, the user's optimizer step, the next sizes."""
    session, ctl, flat = self._hvd_elastic, self._hvd_elastic_lbbsp, self._hvd_elastic_flat
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    b = ctl.local_batch()
    compute = session.begin_step(samples=b)
    n = session.size
    buf = self._hvd_elastic_buffer
    numel = flat.numel
    buf[:numel] = flat.gradients()
    buf[:numel] *= b
    buf[numel:] = 0
    # This rank's row of the (n x 2) table; the others' rows stay zero, so the Sum is an allgather (each row has
    # exactly one contributor and every 16-bit piece is exact in float32/float64).
    row = np.zeros(_META * META_PIECES, buf.dtype)
    encode_meta(np.array([int(compute * 1e9), b], np.int64), row)
    r0 = numel + session.rank * _META * META_PIECES
    buf[r0:r0 + _META * META_PIECES] = row
    t0 = time.perf_counter()
    hvd.allreduce_(self._hvd_elastic_tensor, op=hvd.Sum, name="hvd_elastic.lbbsp")
    t1 = time.perf_counter()
    table = decode_meta(buf[numel:], n, _META)
    total = int(table[:, 1].sum())
    flat.set_gradients(buf[:numel] / total)
    self._hvd_elastic_inner_step()
    ctl.update(table)
    t2 = time.perf_counter()
    session.telemetry.add_step(compute + (t2 - t1), t1 - t0)
    session.last_step_end = t2
    return loss


def _no_synchronize(self):
    """lbbsp synchronizes inside step(); there is nothing to synchronize separately."""


def build_lbbsp(optimizer, session, *, compression, op, gradient_predivide_factor, sparse_as_dense, process_set,
                backward_passes_per_step):
    from .optimizer import _FlatParams, _skip_synchronize, refuse_unsupported_arguments
    refuse_unsupported_arguments("lbbsp", compression=compression, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 sparse_as_dense=sparse_as_dense, process_set=process_set,
                                 op_note="only Average: lbbsp weights each rank by its batch size",
                                 also=["backward_passes_per_step"] if backward_passes_per_step != 1 else [])
    ctl = LbbspController(session.cfg, session.rank, session.size, session.telemetry)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    flat = _FlatParams(params)
    base = optimizer.__class__
    # Same reason as the relaxed policies: horovod.torch.broadcast_optimizer_state's dummy step must call the
    # wrapped optimizer's own step, not ours (which would run a collective on one side only).
    cls = type(base.__name__, (base,), {"step": _lbbsp_step, "synchronize": _no_synchronize,
                                        "skip_synchronize": _skip_synchronize,
                                        "__module__": hvd.DistributedOptimizer.__module__})
    optimizer.__class__ = cls
    optimizer._hvd_elastic_flat = flat
    optimizer._hvd_elastic_lbbsp = ctl
    optimizer._hvd_elastic_inner_step = types.MethodType(base.step, optimizer)
    optimizer._hvd_elastic_buffer = np.zeros(flat.numel + session.size * _META * META_PIECES, flat.dtype)
    optimizer._hvd_elastic_tensor = torch.from_numpy(optimizer._hvd_elastic_buffer)
    hvd.broadcast_parameters({f"p{i}": p for i, p in enumerate(flat.params)}, root_rank=0)
    return optimizer


def batch_sizes(optimizer) -> List[int]:
    """Every rank's batch size for the next step (identical on every rank), under policy lbbsp."""
    return list(_controller(optimizer).sizes)


def _controller(optimizer) -> LbbspController:
    ctl = getattr(optimizer, "_hvd_elastic_lbbsp", None)
    if ctl is None:
        raise TypeError("this needs an optimizer made by hvd_elastic.torch.DistributedOptimizer with policy lbbsp")
    return ctl


class LbbspSampler(torch.utils.data.Sampler):
    """Batch sampler for policy lbbsp: ``DataLoader(ds, batch_sampler=LbbspSampler(len(ds), opt))``.

    Each epoch shuffles ``range(dataset_len)`` with ``seed + epoch`` (the same order on every rank; no shuffle with
    ``shuffle=False``). Step i of the epoch takes positions ``[i B, (i+1) B)`` of that order; rank p yields the
    ``b_p`` of them at offset ``sum_{q<p} b_q``, with the sizes the optimizer decided after the previous step. So
    across ranks an epoch covers every sample exactly once. The remainder ``dataset_len % B`` is dropped
    (``drop_last=True``) or the last global batch is completed from the start of the order (``drop_last=False``:
    every sample at least once, as torch's DistributedSampler pads). The epoch advances by one at each new
    iteration unless :meth:`set_epoch` is called.

    Batches must be drawn one step at a time (``num_workers=0``, the DataLoader's default), since each batch's size
    is only known once the previous step is done; drawing ahead raises an error.
    """

    def __init__(self, dataset_len, optimizer, seed: int = 0, drop_last: bool = True, shuffle: bool = True):
        self.n = int(dataset_len if isinstance(dataset_len, int) else len(dataset_len))
        self.ctl = _controller(optimizer)
        self.B = self.ctl.batch_size
        if self.n < self.B:
            raise ConfigError(f"the dataset has {self.n} samples, fewer than the global batch "
                              f"HVD_ELASTIC_GLOBAL_BATCH={self.B}: lower the global batch or use more data")
        self.seed, self.drop_last, self.shuffle = int(seed), bool(drop_last), bool(shuffle)
        self.epoch = 0
        self._epoch_set = False

    def set_epoch(self, epoch: int):
        self.epoch, self._epoch_set = int(epoch), True

    def __len__(self):
        return self.n // self.B if self.drop_last else -(-self.n // self.B)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's shared order of sample indices (identical on every rank); global batch i is positions
        [i B, (i+1) B). With drop_last=False it is completed to a multiple of B from its own start."""
        if not self.shuffle:
            order = torch.arange(self.n)
        else:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
        if not self.drop_last and self.n % self.B:
            order = torch.cat([order, order[:self.B - self.n % self.B]])
        return order

    def __iter__(self):
        epoch = self.epoch
        self._epoch_set = False
        order = self.order(epoch)
        ctl = self.ctl
        for i in range(len(self)):
            if ctl.drawn is not None and ctl.drawn_at == ctl.steps:
                raise HvdElasticError("LbbspSampler: a batch was drawn before the previous one was stepped; lbbsp "
                                      "decides each batch's size after the previous step, so draw one batch per "
                                      "step (DataLoader num_workers=0)")
            start = i * self.B + ctl.offset
            b = ctl.sizes[ctl.rank]
            ctl.drawn, ctl.drawn_at = b, ctl.steps
            yield order[start:start + b].tolist()
        if not self._epoch_set:
            self.epoch = epoch + 1
