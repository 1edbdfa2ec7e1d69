"""Emulated heterogeneous cluster: make some ranks slower on one machine, to rehearse a policy.

The slowdown is a sleep (no CPU used), so 4 ranks on 2 cores still behave like workers of different speeds.
Set with ``HVD_ELASTIC_EMULATE_DELAY='*:0.005,3:0.03'`` (extra seconds per step) and/or
``HVD_ELASTIC_EMULATE_SLOWDOWN='3:3'`` (rank 3's compute takes 3x as long), ``HVD_ELASTIC_EMULATE_SAMPLE_DELAY``
(per sample, lbbsp). Noise on top: ``HVD_ELASTIC_EMULATE_JITTER='*:0.2'`` (each step's extra x U[0.8, 1.2]) and
non-dedicated machines, ``HVD_ELASTIC_EMULATE_VARY_PERIOD=3`` with ``HVD_ELASTIC_EMULATE_VARY_FACTOR='*:3'`` (every
3 s each rank's extra is multiplied by a new factor drawn in [1, 3]). Draws are seeded by rank (reproducible).

Example::

    straggler = Straggler.from_config(cfg, rank=3, size=4)
    extra = straggler.pause(compute_s=0.004)   # sleeps, returns the seconds slept
"""
from __future__ import annotations

import time

import numpy as np

from .config import Config


class Straggler:
    """Per-rank injected delay: `delay_s` per step plus `sample_delay_s` per sample of the step's batch (when the
    caller knows it: lbbsp) plus (`slowdown` - 1) x the step's measured compute."""

    def __init__(self, delay_s: float = 0.0, slowdown: float = 1.0, sample_delay_s: float = 0.0,
                 jitter: float = 0.0, vary_period_s: float = 0.0, vary_factor: float = 1.0, seed: int = 0):
        self.delay_s = float(delay_s)
        self.slowdown = float(slowdown)
        self.sample_delay_s = float(sample_delay_s)
        self.jitter = float(jitter)
        self.vary_period_s, self.vary_factor = float(vary_period_s), float(vary_factor)
        self.seed = int(seed)
        self._rng = np.random.default_rng([self.seed, 1])
        self._t0 = time.perf_counter()
        self._period, self._factor = -1, 1.0

    @classmethod
    def from_config(cls, cfg: Config, rank: int, size: int) -> "Straggler":
        return cls(cfg.per_rank("emulate_delay", rank, size), cfg.per_rank("emulate_slowdown", rank, size),
                   cfg.per_rank("emulate_sample_delay", rank, size), cfg.per_rank("emulate_jitter", rank, size),
                   cfg.emulate_vary_period, cfg.per_rank("emulate_vary_factor", rank, size), seed=rank)

    def factor(self) -> float:
        """The current multiplier of the emulated extra: the non-dedicated factor of this period x jitter."""
        f = 1.0
        if self.vary_period_s > 0 and self.vary_factor > 1:
            period = int((time.perf_counter() - self._t0) // self.vary_period_s)
            if period != self._period:
                rng = np.random.default_rng([self.seed, 2, period])
                self._period, self._factor = period, float(rng.uniform(1.0, self.vary_factor))
            f = self._factor
        if self.jitter > 0:
            f *= max(0.0, 1.0 + self.jitter * float(self._rng.uniform(-1.0, 1.0)))
        return f

    @property
    def active(self) -> bool:
        return self.delay_s > 0 or self.slowdown > 1 or self.sample_delay_s > 0

    def pause(self, compute_s: float, samples: int = 0) -> float:
        """Sleep for this step's emulated extra time; return the seconds slept (they count as compute)."""
        extra = self.delay_s + self.sample_delay_s * max(samples, 0) + (self.slowdown - 1.0) * max(compute_s, 0.0)
        if extra > 0:
            extra *= self.factor()
        if extra > 0:
            time.sleep(extra)
        return extra
