"""One training run of a wrapped optimizer, framework-free and shared by every frontend: configuration,
telemetry, emulated slowness, the sync engine (relaxed policies: :meth:`Session.start_engine`, the one place an
engine is built), the LB-BSP controller (policy lbbsp) and the end-of-run report. The frontend passes its rank, size
and ``allgather_object``."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import stall as _stall
from . import watchdog as _watchdog
from .config import Config
from .emulation import Straggler
from .engine.engine import Frontend, SyncEngine
from .engine.policies import make_policy
from .lbbsp import LbbspController
from .telemetry import Telemetry, finish_report


class Session:
    def __init__(self, cfg: Config, rank: int, size: int, allgather_object: Callable[[Any], list],
                 rank_and_size: Optional[Callable[[], Tuple[int, int]]] = None):
        self.cfg, self.rank, self.size = cfg, rank, size
        # Elastic Horovod renumbers the ranks when the rank set changes: the report asks for the current ones.
        self._rank_and_size = rank_and_size
        self._allgather_object = allgather_object
        self.telemetry = Telemetry(rank, size, cfg.policy)
        self.straggler = Straggler.from_config(cfg, rank, size)
        self._slept_early = False   # this step's emulated delay was slept when backward started (emulate_early)
        self.last_step_end = time.perf_counter()
        self._last_compute: Optional[float] = None
        self.engine: Optional[SyncEngine] = None   # under the relaxed policies (start_engine)
        # elastic Horovod: the latest change of the rank set the ranks had reset for, agreed at the engine's start
        # (hvd_elastic/elastic.py); the engine's ticks stop after one that announces a later change
        self.rank_set_baseline: Optional[int] = None
        self.lbbsp: Optional[LbbspController] = (LbbspController(cfg, rank, size, self.telemetry)
                                                 if cfg.spec.balances_batches else None)
        self.report: Optional[Dict[str, Any]] = None
        self.counter_sources: list = []   # callables adding counters to the report (elastic Horovod's resets)
        # Faults (watchdog.py): heartbeats and the stall rule; collective the first time in a process. A step
        # counts as progress; frontends that know when the script's own code runs mark their steps with
        # watchdog.enter() (else the rank counts as inside its training loop).
        self.watchdog = _watchdog.session_started(cfg.stall_timeout, rank, size, allgather_object,
                                                  cfg.policy)
        self.watchdog.between_steps(_stall.UNKNOWN)
        self.telemetry.on_step = self.watchdog.step_done

    def follow_ranks(self):
        """Elastic Horovod renumbers the ranks when the rank set changes: take the current rank and size."""
        if self._rank_and_size is not None:
            self.rank, self.size = self._rank_and_size()
            self.telemetry.rank, self.telemetry.size = self.rank, self.size

    def start_engine(self, frontend: Frontend) -> SyncEngine:
        """Build this session's sync engine for the configured relaxed policy (collective: every rank, the same
        frontend shape and tick name)."""
        policy = make_policy(self.cfg, self.rank, self.size)
        self.engine = SyncEngine(policy, self.rank, self.size, frontend, self.telemetry, self.cfg,
                                 rank_set_baseline=self.rank_set_baseline)
        return self.engine

    def begin_step(self, samples: int = 0) -> float:
        """Measure this step's compute (since the last step ended) and inject emulated delay, unless
        :meth:`emulate_early` already slept it inside that compute; returns compute."""
        compute = time.perf_counter() - self.last_step_end
        self.watchdog.enter("step")
        if self._slept_early:
            self._slept_early = False
            return compute
        slept = self.straggler.pause(compute, samples)
        self.telemetry.emulated_s += slept
        return compute + slept

    def emulate_early(self):
        """Backward starts and its gradient will be pushed when it ends: sleep this step's emulated delay now, where
        a slower device spends it, so that the pushed gradient is as old as that device's would be (slept at step()
        instead, it would come after the push: a straggler's gradients as fresh as a fast rank's, its tick hidden
        behind the sleep). Once per step; HVD_ELASTIC_EMULATE_SLOWDOWN scales the compute measured so far."""
        if self._slept_early or not self.straggler.active:
            return
        self._slept_early = True
        self.telemetry.emulated_s += self.straggler.pause(time.perf_counter() - self.last_step_end)

    def push(self, accumulate: Callable[[Any, float], None]):
        """Push this step's gradient before step() (the frontend calls it when backward has produced all of it);
        the step() that follows runs :meth:`relaxed_step` with ``pushed=True``. The schedulers' step time is the
        previous step's (this one's compute is not over yet)."""
        self.engine.push(accumulate, self._interval())

    def _interval(self) -> float:
        return self._last_compute if self._last_compute is not None else time.perf_counter() - self.last_step_end

    def stream_begin(self, accumulate_range: Callable[[Any, int, int, float], None]) -> bool:
        """Backward starts: stream this step's gradient to the next tick as backward produces it (engine.py);
        False: push it when complete instead. End it with :meth:`stream_end`."""
        return self.engine.stream_begin(accumulate_range)

    def stream_end(self):
        """The streamed gradient is complete: it is this step's push (as :meth:`push`)."""
        self.engine.stream_end(self._interval())

    def relaxed_step(self, accumulate: Optional[Callable[[Any, float], None]] = None,
                     local_step: Optional[Callable[[], None]] = None, pushed: bool = False):
        """One training step under a relaxed policy, the sequence every frontend shares: this step's compute (since
        the last step ended, plus emulated delay), the local optimizer step of delta policies (``local_step()``,
        timed as compute), the engine's push (unless ``pushed``: :meth:`push` did it) / pull / gate
        (engine.SyncEngine.step), the step's accounting.
        ``accumulate(dst, alpha)``: gradient policies' push (adds alpha x this step's gradient into dst)."""
        compute = self.begin_step()
        if local_step is not None:
            t0 = time.perf_counter()
            local_step()
            compute += time.perf_counter() - t0
        self.engine.step(accumulate, compute, pushed=pushed)
        self._last_compute = compute
        self.telemetry.add_step(compute)
        self.last_step_end = time.perf_counter()

    def wait_for_first_update(self):
        """Relaxed gradient policies: block until the first tick with an update is applied (its optimizer state
        exists on every rank from then on); the wait is not this rank's next step's compute."""
        self.engine.wait_for_first_update()
        self.last_step_end = time.perf_counter()

    def global_steps(self) -> int:
        """Steps taken by all ranks together, as far as this rank knows: exact in lock-step (bsp, lbbsp); under
        relaxed policies the others' delivered clocks plus this rank's own steps."""
        if self.engine is None:
            return self.telemetry.steps * self.size
        return self.engine.global_steps()

    def finish(self) -> Dict[str, Any]:
        """Collective: flush every update, final sync, end-of-run report (idempotent)."""
        if self.report is None:
            self.follow_ranks()
            self.watchdog.enter("finish")
            if self.engine is not None:
                self.engine.finish()
            self.watchdog.progress()
            self.watchdog.enter("finish")     # the report's allgather
            self.telemetry.counters.update(self.watchdog.side_channel_stats())   # noise on the side channel, if any
            for source in self.counter_sources:
                self.telemetry.counters.update(source())
            self.report = finish_report(self.telemetry, self._allgather_object, self.cfg.describe(),
                                        print_on_rank0=self.cfg.report, json_path=self.cfg.report_json)
            self.watchdog.enter(self.watchdog.between)
            self.watchdog.disarm()
        return self.report
