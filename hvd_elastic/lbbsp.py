"""LB-BSP (Chen et al., SoCC 2020), framework-free part: still BSP, but each rank's batch size is re-sized at
every iteration boundary so that all ranks finish the iteration together, with the global batch B fixed.

The frontends (``hvd_elastic.torch``, ``hvd_elastic.keras``) only move tensors; the rules live here and in the
native module:

- :meth:`LbbspController.exchange` -- every step is one synchronous Sum-allreduce of ``[b_p * g_p | metadata]``,
  where g_p is the rank's mean gradient over its b_p samples and the metadata table (each rank fills its own row:
  step time in ns, b_p, whether the batch starts a pass over the data) rides in the same buffer as exact 16-bit
  pieces (``engine.table.encode_meta``). The applied gradient is ``sum_p b_p g_p / sum_p b_p``: the gradient of
  one process over the whole global batch. The PyTorch frontend reduces each gradient as backward produces it and
  submits the table just before the last one (Horovod fuses them), once this step's compute is known, so the sizes
  follow this step's times as in :meth:`LbbspController.step`; :meth:`LbbspController.finish_overlapped` completes
  that exchange (at the optimizer's synchronize() or step()), :meth:`LbbspController.end_step` steps.
- :meth:`LbbspController.update` -- the next sizes, from the table every rank received (so every rank feeds the
  same inputs to the native rule and gets the same sizes): cpu mode ``lbbsp_batch_sizes_cpu`` over the throughput
  ``v_p = 1 / predicted per-sample time`` (predictor ``HVD_ELASTIC_PREDICTOR`` over each rank's per-sample time
  history), gpu mode ``LbbspGpuController.update`` over step times averaged over its window. The step time is
  this rank's computation (data, forward, backward, emulated delay), not the wait in the allreduce.
- :class:`BatchPlan` -- the data: each step takes the next B indices of one shuffled order shared by all ranks
  (same seed, per epoch), dealt to the ranks one at a time in rank order until rank p has its b_p
  (:func:`batch_positions`); so an epoch covers every sample exactly once across ranks whatever the sizes, and at
  equal sizes each rank's batch is the one torch's DistributedSampler (or ``tf.data``'s ``shard``) gives it.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np

from . import _native
from .engine.table import META_PIECES, decode_meta, encode_meta
from .errors import ConfigError, HvdElasticError
from .predictors import predict_interval

_META = 3                      # columns of the metadata table: step time (ns), samples, first step of a pass
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
        self.pass_start = False            # the batch drawn for this step is the first of a pass over the data
        # Set by a frontend from a step's backward until its step(): ends that step without applying it, where the
        # script skipped step() (torch.amp.GradScaler does after an overflow); see end_unstepped
        self.unstepped: Optional[Callable[[], None]] = None
        self.history = [[] for _ in range(size)]   # per-sample ns, per rank (cpu mode)
        self.window_times: List[np.ndarray] = []   # gpu mode: step times since the last update
        if self.mode == "gpu":
            self.gpu = _native.LbbspGpuController(self.batch_size, self.caps, tolerance=cfg.lbbsp_tolerance)
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
        self.buffer: Optional[np.ndarray] = None   # [b_p * g_p | n x _META table], see bind()
        self.numel = 0
        self._publish()

    def bind(self, numel: int, dtype) -> np.ndarray:
        """Allocate the step's allreduce buffer for a model of `numel` parameters (the frontend wraps it in its own
        tensor type without copying, so the collective reduces it in place)."""
        self.numel = int(numel)
        self.buffer = np.zeros(self.numel + self.size * _META * META_PIECES, dtype)
        return self.buffer

    def encode_row(self, compute_s: float, out: np.ndarray):
        """Write this rank's row of the table into `out` (n x _META x META_PIECES words; the other rows zero), so
        that a Sum over ranks is an allgather: each row has exactly one contributor and every 16-bit piece is exact
        in float32/float64."""
        out[:] = 0
        r0 = self.rank * _META * META_PIECES
        encode_meta(np.array([int(compute_s * 1e9), self.local_batch(), int(self.pass_start)], np.int64),
                    out[r0:r0 + _META * META_PIECES])

    def decode_table(self, words: np.ndarray) -> np.ndarray:
        return decode_meta(words, self.size, _META)

    def exchange(self, grad: np.ndarray, compute_s: float,
                 allreduce: Callable[[], None]) -> Tuple[np.ndarray, np.ndarray, float]:
        """One synchronous step's collective: `grad` is this rank's mean gradient over its local batch, `allreduce`
        Sum-reduces :attr:`buffer` ([b_p g_p | table]) in place on every rank. Returns (the gradient over the
        global batch, the table of every rank's (step ns, samples, pass start), seconds blocked in the collective).
        Call :meth:`update` with the table once the gradient is applied."""
        b, numel, buf = self.local_batch(), self.numel, self.buffer
        buf[:numel] = grad
        buf[:numel] *= b
        self.encode_row(compute_s, buf[numel:])
        t0 = time.perf_counter()
        allreduce()
        blocked = time.perf_counter() - t0
        table = self.decode_table(buf[numel:])
        return buf[:numel] / int(table[:, 1].sum()), table, blocked

    def step(self, session, grad: np.ndarray, allreduce: Callable[[], None], apply: Callable[[np.ndarray], None]):
        """One lbbsp step of a frontend (`session`: hvd_elastic.session.Session): this rank's compute time (with
        the emulated per-sample delay), the :meth:`exchange` of `grad` (this rank's mean gradient), `apply` of the
        global-batch gradient with the user's optimizer, the next sizes, the step's telemetry."""
        compute = session.begin_step(samples=self.local_batch())
        global_grad, table, blocked = self.exchange(grad, compute, allreduce)
        self.end_step(session, table, compute, blocked, lambda: apply(global_grad))

    def row(self, compute_s: float, dtype) -> np.ndarray:
        """This rank's row of the step's table (:meth:`encode_row`) in a new array of `dtype`, for a frontend that
        submits the table on its own: in the gradients' dtype (float32 or float64: the 16-bit pieces are exact in
        both) Horovod can fuse it with the gradients that are ready in the same cycle instead of running one more
        collective (it fuses only tensors of one dtype)."""
        words = np.zeros(self.size * _META * META_PIECES, dtype)
        self.encode_row(compute_s, words)
        return words

    def finish_overlapped(self, wait_table: Callable[[], np.ndarray], wait_gradients: Callable[[], None],
                          divide: Callable[[int], None]) -> Tuple[np.ndarray, float]:
        """The exchange of a frontend whose weighted gradients b_p g_p were submitted for reduction during backward
        (per-parameter hooks, as Horovod overlaps bsp) and whose :meth:`row` went out with the last of them:
        `wait_table()` returns the summed table words, `wait_gradients()` waits for the summed b_p g_p, `divide(B)`
        divides them by the global batch B = sum_p b_p. Returns (the table, seconds blocked). Then
        :meth:`end_step`."""
        t0 = time.perf_counter()
        table = self.decode_table(wait_table())
        wait_gradients()
        blocked = time.perf_counter() - t0
        divide(int(table[:, 1].sum()))
        return table, blocked

    def end_step(self, session, table: np.ndarray, compute: float, blocked: float, apply: Callable[[], None],
                 resize: bool = True):
        """After the step's exchange (:meth:`exchange`, :meth:`finish_overlapped`): `apply()` runs the user's
        optimizer step, then the next sizes from this step's table (:meth:`update`; `resize=False` for a step
        ended unapplied), and the step's telemetry (`compute`: this rank's compute time of the step, with the
        emulated per-sample delay; `blocked`: seconds in the exchange)."""
        t1 = time.perf_counter()
        apply()
        self.update(table, resize)
        t2 = time.perf_counter()
        session.telemetry.add_step(compute + (t2 - t1), blocked)
        session.last_step_end = t2

    def end_unstepped(self):
        """End, unapplied, a step whose backward ran and whose step() the script skipped (:attr:`unstepped`), if
        there is one: the sampler's next draw and the optimizer's zero_grad() call this."""
        if self.unstepped is not None:
            self.unstepped()

    def local_batch(self) -> int:
        return self.drawn if self.drawn is not None else self.sizes[self.rank]

    def update(self, meta: np.ndarray, resize: bool = True):
        """One iteration boundary: meta[p] = (step ns, samples, pass start) of every rank; decide the next sizes
        (from the table only, so every rank decides the same). `resize=False`: the sizes stay as they are, so that
        a script that read them before a skipped step was ended (its zero_grad() ends it) draws the batch they
        weight; its times still count towards the next re-size (cpu mode)."""
        step_ns, samples = meta[:, 0], meta[:, 1]
        if self.steps == 0 or meta[:, 2].any() or (self.mode == "gpu" and not resize):
            # The first step's time includes each rank's start-up since the optimizer was built, and the first step
            # of a pass over the data the framework's epoch-boundary work (a tenth of a second or more under Keras,
            # uneven across ranks): not a speed. In gpu mode a step ended unapplied is not a window's sample either.
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
            throughput = [1e9 / max(predict_interval(self.cfg.predictor, h), 1) for h in self.history]
            new = list(_native.lbbsp_resize_cpu(throughput, self.sizes, self.batch_size, self.caps,
                                                self.cfg.lbbsp_tolerance)) if resize else self.sizes
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
        self.pass_start = False
        self._publish()

    def _publish(self):
        c = self.telemetry.counters
        c["lbbsp_sizes"] = list(self.sizes)               # the sizes for the next step, every rank's
        c["lbbsp_size_min"], c["lbbsp_size_max"] = self.size_min, self.size_max
        c["lbbsp_resizes"] = self.resizes
        c["lbbsp_step_ms_mean"] = round(self.step_ns_sum / max(self.steps, 1) / 1e6, 3)
        # dict: kept out of the printed table, carried by the JSON report
        c["lbbsp_trace"] = {"size_changes": self.trace, "step_ms_per_10": self.step_ms_trace}


def batch_positions(sizes, rank: int) -> np.ndarray:
    """The positions (0 .. B-1, ascending) within a global batch that rank `rank` takes when the ranks take
    ``sizes[p]`` samples each: the B positions are dealt one at a time in rank order, a rank leaving the deal once it
    has its share. At equal sizes rank p gets positions p, p + n, p + 2n, ...: the split of torch's
    DistributedSampler (and of ``tf.data``'s ``shard``), so with equal speeds lbbsp computes exactly the per-rank
    batches -- and, summed, the gradient -- that Horovod computes on that sampler's order. Every rank computes every
    rank's positions alike from the shared sizes."""
    sizes = np.asarray(sizes, np.int64)
    dealt = np.arange(int(sizes.max()))[:, None] < sizes[None, :]     # round k: the ranks that still take one
    position = (np.cumsum(dealt.ravel()) - 1).reshape(dealt.shape)
    return position[:int(sizes[rank]), rank]


class BatchPlan:
    """Which samples each rank takes at each step of an epoch, under policy lbbsp (used by the frontends' data
    paths: ``hvd_elastic.torch.LbbspSampler``, ``hvd_elastic.keras.lbbsp_dataset``).

    Each epoch shuffles ``range(dataset_len)`` with ``permutation(dataset_len, seed + epoch)`` (default: numpy's
    default generator; the torch frontend passes torch's ``randperm``, the permutation of torch's
    DistributedSampler): the same order on every rank; no shuffle with ``shuffle=False``. Step i of the epoch takes
    positions ``[i B, (i+1) B)`` of that order; rank p takes ``b_p`` of them (:func:`batch_positions`: dealt in rank
    order, at equal sizes every n-th), with the sizes decided after the previous step. The remainder
    ``dataset_len % B`` is dropped (``drop_last=True``) or the last global batch is completed from the start of the
    order (``drop_last=False``: every sample at least once). Each pass uses the epoch set by :meth:`set_epoch` or
    else the previous pass's epoch + 1 (0 first). A batch's size is only known once the previous step is done, so
    drawing ahead of the steps (prefetching) raises HvdElasticError; a step whose backward ran but whose step() the
    script skipped (``LbbspController.unstepped``) is ended, unapplied and with the sizes unchanged, when the next
    batch is drawn.

    Elastic Horovod: :meth:`state_dict` is the plan's place in the data (the pass under way and how many of its
    global batches were stepped) and :meth:`load_state_dict` makes the next pass resume there; a pass cut short by a
    reset of the rank set (`resets()` moved since its last draw) resumes at its first batch not stepped. A resumed
    pass deals each remaining global batch over the ranks of the moment, so every sample of the epoch is still taken
    once; the batch of a step that failed with the lost rank is taken again, whole, over the new ranks."""

    def __init__(self, dataset_len: int, controller: Callable[[], LbbspController], seed: int = 0,
                 drop_last: bool = True, shuffle: bool = True,
                 permutation: Optional[Callable[[int, int], np.ndarray]] = None,
                 resets: Callable[[], int] = lambda: 0):
        self.n = int(dataset_len)
        self._controller = controller          # a callable: the frontend's current controller
        self.B = controller().batch_size
        if self.n < self.B:
            raise ConfigError(f"the dataset has {self.n} samples, fewer than the global batch "
                              f"HVD_ELASTIC_GLOBAL_BATCH={self.B}: lower the global batch or use more data")
        self.seed, self.drop_last, self.shuffle = int(seed), bool(drop_last), bool(shuffle)
        self.epoch = 0                         # the next pass's epoch
        self._permutation = permutation or (lambda n, seed: np.random.default_rng(seed).permutation(n))
        self._resets = resets                  # resets of the rank set so far (elastic Horovod; else always 0)
        self._resume: Optional[Tuple[int, int]] = None   # (epoch, first batch) of the next pass (load_state_dict)
        # the latest draw: (epoch, batch index, the controller that sized it, its steps then, resets then)
        self._drawn: Optional[Tuple[int, int, LbbspController, int, int]] = None

    def set_epoch(self, epoch: int):
        """The next pass is epoch `epoch`, from its start; a pass to resume (:meth:`load_state_dict`, a reset) is
        kept when it is of that epoch."""
        pending = self._pending()
        self._resume = pending if pending is not None and pending[0] == int(epoch) else None
        self._drawn = None
        self.epoch = int(epoch)

    def position(self) -> Tuple[int, int]:
        """(epoch, global batches of it stepped): where the data stands. After a completed pass, (next epoch, 0)."""
        if self._resume is not None:
            return self._resume
        if self._drawn is None:
            return self.epoch, 0
        epoch, i, ctl, steps, _ = self._drawn
        done = i + 1 if ctl.steps > steps else i
        return (epoch + 1, 0) if done >= len(self) else (epoch, done)

    def state_dict(self) -> dict:
        """The plan's place in the data, for a checkpoint or elastic Horovod's TorchState (identical on every rank:
        the steps are synchronous)."""
        epoch, batches = self.position()
        return {"epoch": epoch, "batches": batches}

    def load_state_dict(self, state: dict):
        """Resume at `state` (:meth:`state_dict`): the next pass is that epoch, from that global batch."""
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if not 0 <= batches <= len(self):
            raise ValueError(f"lbbsp batch plan: batches={batches} is outside this epoch's 0..{len(self)} batches")
        self._resume, self._drawn, self.epoch = (epoch, batches), None, epoch

    def _pending(self) -> Optional[Tuple[int, int]]:
        """Where the next pass resumes: a loaded state, or a pass that a reset of the rank set cut short."""
        if self._resume is not None:
            return self._resume
        if self._drawn is not None and self._drawn[4] != self._resets():
            return self.position()
        return None

    def __len__(self) -> int:
        """Steps per epoch."""
        return self.n // self.B if self.drop_last else -(-self.n // self.B)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's shared order of sample indices (identical on every rank); global batch i is positions
        [i B, (i+1) B). With drop_last=False it is completed to a multiple of B from its own start."""
        if self.shuffle:
            order = np.asarray(self._permutation(self.n, self.seed + epoch))
        else:
            order = np.arange(self.n)
        if not self.drop_last and self.n % self.B:
            order = np.concatenate([order, order[:self.B - self.n % self.B]])
        return order.astype(np.int64)

    def batches(self, what: str) -> Iterator[np.ndarray]:
        """One epoch: this rank's indices for each step. `what` names the caller in the prefetch error."""
        # The epoch is taken when the pass starts: a pass need not run to its end (Keras stops reading a dataset
        # of known length after its last step).
        epoch, start = self._pending() or (self.epoch, 0)
        self._resume = None
        self.epoch = epoch + 1
        order = self.order(epoch)
        for i in range(start, len(self)):
            ctl = self._controller()
            ctl.end_unstepped()
            if ctl.drawn is not None and ctl.drawn_at == ctl.steps:
                raise HvdElasticError(f"{what}: a batch was drawn before the previous one was stepped; lbbsp decides "
                                      f"each batch's size after the previous step, so draw one batch per step")
            mine = i * self.B + batch_positions(ctl.sizes, ctl.rank)
            ctl.drawn, ctl.drawn_at, ctl.pass_start = len(mine), ctl.steps, i == start
            self._drawn = (epoch, i, ctl, ctl.steps, self._resets())
            yield order[mine]
