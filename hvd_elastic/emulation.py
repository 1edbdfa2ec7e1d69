"""Emulated heterogeneous cluster: make some ranks slower on one machine, to rehearse a policy.

The slowdown is a sleep (no CPU used), so 4 ranks on 2 cores still behave like workers of different speeds.
Set with ``HVD_ELASTIC_EMULATE_DELAY='*:0.005,3:0.03'`` (extra seconds per step) and/or
``HVD_ELASTIC_EMULATE_SLOWDOWN='3:3'`` (rank 3's compute takes 3x as long).

Example::

    straggler = Straggler.from_config(cfg, rank=3, size=4)
    extra = straggler.pause(compute_s=0.004)   # sleeps, returns the seconds slept
"""
from __future__ import annotations

import time

from .config import Config


class Straggler:
    """Per-rank injected delay: `delay_s` per step plus `sample_delay_s` per sample of the step's batch (when the
    caller knows it: lbbsp) plus (`slowdown` - 1) x the step's measured compute."""

    def __init__(self, delay_s: float = 0.0, slowdown: float = 1.0, sample_delay_s: float = 0.0):
        self.delay_s = float(delay_s)
        self.slowdown = float(slowdown)
        self.sample_delay_s = float(sample_delay_s)

    @classmethod
    def from_config(cls, cfg: Config, rank: int, size: int) -> "Straggler":
        return cls(cfg.per_rank("emulate_delay", rank, size), cfg.per_rank("emulate_slowdown", rank, size),
                   cfg.per_rank("emulate_sample_delay", rank, size))

    @property
    def active(self) -> bool:
        return self.delay_s > 0 or self.slowdown > 1 or self.sample_delay_s > 0

    def pause(self, compute_s: float, samples: int = 0) -> float:
        """Sleep for this step's emulated extra time; return the seconds slept (they count as compute)."""
        extra = self.delay_s + self.sample_delay_s * max(samples, 0) + (self.slowdown - 1.0) * max(compute_s, 0.0)
        if extra > 0:
            time.sleep(extra)
        return extra
