"""Type stubs for hvd_elastic._native, the C++17 scheduler (native/; see docs/native.md).

Times are integer nanoseconds. Every rule is a pure function of state all ranks hold identically. Bad input raises
ValueError (a rule's check, with a message naming the argument) or TypeError (wrong argument type).
"""
from typing import Sequence, overload

import numpy as np
import numpy.typing as npt

# ---- Clocks -------------------------------------------------------------------------------------------------------

class WorkerClocks:
    """Per-worker clocks (pushes so far) and recent iteration intervals, in integer ns."""

    def __init__(self, n: int, history: int = 16) -> None: ...
    def record_push(self, worker: int, t_ns: int) -> None: ...
    def observe(self, worker: int, clock: int, last_push_ns: int, interval_ns: int) -> None:
        """Set a worker's clock, last push and latest interval from a summary (interval_ns = -1: unknown)."""
    def reset_timing(self) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def history(self) -> int: ...
    def clock(self, worker: int) -> int: ...
    @property
    def clocks(self) -> list[int]: ...
    def last_push_ns(self, worker: int) -> int: ...
    def last_interval_ns(self, worker: int) -> int: ...
    def intervals(self, worker: int) -> list[int]: ...
    @property
    def last_push_times(self) -> list[int]:
        """last_p of every worker (-1: no push since the last reset_timing)."""
    @property
    def last_intervals(self) -> list[int]:
        """I_p of every worker (-1: fewer than two pushes since the last reset_timing)."""
    @property
    def min_clock(self) -> int: ...
    @property
    def max_clock(self) -> int: ...
    @property
    def gap(self) -> int: ...
    def slowest_by_clock(self) -> int: ...
    def fastest_by_clock(self) -> int: ...
    def slowest_by_interval(self) -> int: ...
    def median_interval_ns(self, worker: int) -> int:
        """Median of the kept intervals of a worker (lower middle for an even count); -1 if none."""
    def slowest_by_median_interval(self) -> int:
        """Worker with the longest median interval (ties to the lowest rank); -1 if none measured."""

# ---- ZipLine (ElasticBSP) -----------------------------------------------------------------------------------------

class Barrier:
    """Worker p runs iterations[p] (j_p, 1..R) more iterations, then waits at the barrier max(Z)."""

    @property
    def iterations(self) -> list[int]: ...
    @property
    def barrier_ns(self) -> int:
        """max(Z)."""
    @property
    def earliest_ns(self) -> int:
        """min(Z)."""
    @property
    def spread_ns(self) -> int:
        """d_Z = max(Z) - min(Z)."""
    def __eq__(self, other: object) -> bool: ...

PushTimes = npt.NDArray[np.int64] | Sequence[Sequence[int]]

def zipline_barrier(predicted: PushTimes) -> Barrier:
    """Exact barrier, O(nR log n): min d_Z, then earliest max(Z), then fewest iterations per worker."""

def gridscan_barrier(predicted: PushTimes) -> Barrier:
    """The papers' O(R^2 n) heuristic: candidates are the slowest worker's points only."""

def fullgridscan_barrier(predicted: PushTimes) -> Barrier:
    """Exact, O(R^2 n^2); same answer as zipline_barrier."""

def predict_push_times(last_ns: Sequence[int], interval_ns: Sequence[int], R: int) -> npt.NDArray[np.int64]:
    """e_p[i] = last_p + i * I_p for i = 1..R, shape (n, R)."""

def zipline_barrier_from_intervals(last_ns: Sequence[int], interval_ns: Sequence[int], R: int) -> Barrier: ...
def zipline_barrier_from_clocks(clocks: WorkerClocks, R: int) -> Barrier: ...

# ---- Predictors ---------------------------------------------------------------------------------------------------

def predict_last_interval(history: Sequence[int]) -> int: ...
def predict_median_interval(history: Sequence[int], window: int = 8) -> int: ...
def predict_ewma_interval(history: Sequence[int], alpha: float = 0.3) -> int: ...
def predict_arx_intervals(
    history: Sequence[int],
    horizon: int = 1,
    order: int = 2,
    window: int = 32,
    exo: Sequence[float] | None = None,
    exo_order: int = 1,
    ridge: float = 1e-3,
    trend: bool = True,
    shift_threshold: float = 5.0,
) -> list[int]:
    """ARX forecast of the next `horizon` intervals; exo needs len(history) + 1 readings or more."""

def predict_arx_interval(
    history: Sequence[int],
    order: int = 2,
    window: int = 32,
    exo: Sequence[float] | None = None,
    exo_order: int = 1,
    ridge: float = 1e-3,
    trend: bool = True,
    shift_threshold: float = 5.0,
) -> int: ...

# ---- SSP / DSSP ---------------------------------------------------------------------------------------------------

@overload
def ssp_may_proceed(clocks: WorkerClocks, worker: int, s: int) -> bool: ...
@overload
def ssp_may_proceed(clocks: Sequence[int], worker: int, s: int) -> bool:
    """True iff t_p - min_q t_q <= s (s = 0 is BSP)."""
@overload
def ssp_staleness(clocks: WorkerClocks, worker: int) -> int: ...
@overload
def ssp_staleness(clocks: Sequence[int], worker: int) -> int:
    """t_p - min_q t_q."""

def dssp_sync_controller(last_p: int, interval_p: int, last_s: int, interval_s: int, r_max: int) -> int:
    """r* in [0, r_max]: extra iterations after which p's push lands closest to a push of the slowest worker."""

def dssp_credit(clocks: WorkerClocks, worker: int, credit: int, s_lower: int, s_upper: int) -> tuple[bool, int, int]:
    """(proceed, credit_after, granted r* or -1) for a worker that has just pushed."""

def dssp_may_resume(clocks: WorkerClocks, worker: int, s_lower: int) -> bool: ...

class LockstepRule:
    """The gradient policies' lock-step fallback: BSP's pace while relaxing is predicted to deliver less than
    min_gain x lock-step's pushes per second (native/include/hvd_elastic/lockstep.h)."""

    def __init__(self, n: int, min_gain: float, settle: int, sample: int, relaxed_sample: int) -> None: ...
    def observe(self, clocks: list[int], interval_ns: list[int], last_push_ns: list[int],
                finished: list[bool], outside: list[bool] = ...) -> bool: ...
    @property
    def lockstep(self) -> bool: ...
    @property
    def gain(self) -> float: ...
    @property
    def overhead_lockstep_ns(self) -> float: ...
    @property
    def overhead_relaxed_ns(self) -> float: ...
    @property
    def switches(self) -> int: ...
    @property
    def switch_pushes(self) -> list[int]: ...
    @property
    def lockstep_pushes(self) -> int: ...
    @property
    def pushes(self) -> int: ...
    @property
    def origin(self) -> list[int]: ...
    @property
    def size(self) -> int: ...
    @property
    def min_gain(self) -> float: ...


class DsspState:
    """Per-worker DSSP credits; no iteration starts with staleness above s_upper."""

    def __init__(self, n: int, s_lower: int, s_upper: int) -> None: ...
    def on_push(self, clocks: WorkerClocks, worker: int) -> bool: ...
    def may_resume(self, clocks: WorkerClocks, worker: int) -> bool: ...
    def credit(self, worker: int) -> int: ...
    @property
    def credits(self) -> list[int]: ...
    @property
    def size(self) -> int: ...
    @property
    def s_lower(self) -> int: ...
    @property
    def s_upper(self) -> int: ...
    @property
    def r_max(self) -> int: ...
    @property
    def grants(self) -> int: ...
    @property
    def refusals(self) -> int: ...
    @property
    def max_staleness_admitted(self) -> int: ...

# ---- LB-BSP -------------------------------------------------------------------------------------------------------

def lbbsp_batch_sizes_cpu(
    throughput: Sequence[float], batch_size: int, caps: Sequence[int] | None = None
) -> list[int]:
    """Sizes proportional to throughput, summing to batch_size, each in [1, caps[p]]."""
def lbbsp_resize_cpu(throughput: Sequence[float], current: Sequence[int], batch_size: int,
                     caps: Sequence[int] | None = None, tolerance: float = 0.05) -> list[int]:
    """`current` while its predicted finish times b_p / v_p are within `tolerance` of each other
    (max - min <= tolerance * max), else lbbsp_batch_sizes_cpu(throughput, batch_size, caps)."""

class LbbspMove:
    @property
    def from_worker(self) -> int: ...
    @property
    def to_worker(self) -> int: ...
    @property
    def amount(self) -> int: ...
    @property
    def reversed(self) -> bool: ...
    @property
    def converged(self) -> bool: ...

class LbbspGpuController:
    """GPU mode: move `step` samples from the straggler to the fastest worker with headroom; halve on reversal."""

    def __init__(
        self,
        batch_size: int,
        caps: Sequence[int],
        *,
        step: int | None = None,
        tolerance: float = 0.05,
        window: int = 1,
        sizes: Sequence[int] | None = None,
    ) -> None: ...
    def update(self, step_times_ns: Sequence[int]) -> list[int]: ...
    @property
    def sizes(self) -> list[int]: ...
    @property
    def caps(self) -> list[int]: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def window(self) -> int: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def converged(self) -> bool: ...
    @property
    def moves(self) -> int: ...
    @property
    def last_move(self) -> LbbspMove: ...

# ---- WBSP ---------------------------------------------------------------------------------------------------------

def wbsp_may_download(uploaded_since_last_download: Sequence[bool], slowest: int) -> bool:
    """True iff worker `slowest` uploaded since the last download (slowest = -1: every worker did)."""

class WbspState:
    def __init__(self, n: int) -> None: ...
    def on_upload(self, worker: int) -> None: ...
    def on_download(self, worker: int) -> None: ...
    def may_download(self, worker: int, slowest: int) -> bool: ...
    def uploaded_since_last_download(self, worker: int) -> list[bool]: ...
    def uploads(self, worker: int) -> int: ...
    def downloads(self, worker: int) -> int: ...
    @property
    def size(self) -> int: ...
