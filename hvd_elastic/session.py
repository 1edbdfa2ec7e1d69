"""One training run of a wrapped optimizer, framework-free and shared by every frontend: configuration,
telemetry, emulated slowness, the sync engine (relaxed policies, set by the frontend), the LB-BSP controller
(policy lbbsp) and the end-of-run report. The frontend passes its rank, size and ``allgather_object``."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

from .config import Config
from .emulation import Straggler
from .lbbsp import LbbspController
from .telemetry import Telemetry, finish_report


class Session:
    def __init__(self, cfg: Config, rank: int, size: int, allgather_object: Callable[[Any], list]):
        self.cfg, self.rank, self.size = cfg, rank, size
        self._allgather_object = allgather_object
        self.telemetry = Telemetry(rank, size, cfg.policy)
        self.straggler = Straggler.from_config(cfg, rank, size)
        self.last_step_end = time.perf_counter()
        self.engine = None          # SyncEngine under the relaxed policies (built by the frontend)
        self.lbbsp: Optional[LbbspController] = (LbbspController(cfg, rank, size, self.telemetry)
                                                 if cfg.policy == "lbbsp" else None)
        self.report: Optional[Dict[str, Any]] = None

    def begin_step(self, samples: int = 0) -> float:
        """Measure this step's compute (since the last step ended) and inject emulated delay; returns compute."""
        compute = time.perf_counter() - self.last_step_end
        slept = self.straggler.pause(compute, samples)
        self.telemetry.emulated_s += slept
        return compute + slept

    def finish(self) -> Dict[str, Any]:
        """Collective: flush every update, final sync, end-of-run report (idempotent)."""
        if self.report is None:
            if self.engine is not None:
                self.engine.finish()
            self.report = finish_report(self.telemetry, self._allgather_object, self.cfg.describe(),
                                        print_on_rank0=self.cfg.report, json_path=self.cfg.report_json)
        return self.report
