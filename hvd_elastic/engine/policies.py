"""Policy glue: each relaxed policy maps the engine's events to its native decision rule.

A policy object sees the tick stream (identical on every rank) and this rank's own clock, and answers one
question: may this rank start its next step? The rules themselves live in the native scheduler
(``hvd_elastic._native``); this file only feeds them state and keeps the counters the report shows.

Events, in order: attach(engine) once; per step on_push(clock), then on_tick(tick, view) for each tick applied,
may_proceed(clock) until it says yes, on_proceed(clock); finish() at the end.
"""
from __future__ import annotations

from typing import Dict, Type

import numpy as np


class Policy:
    """Base: ASP-like (never waits). Subclasses override the gate."""

    name = "base"
    kind = "gradient"   # "gradient": push gradients, apply ticks with the optimizer; "delta": push model deltas

    def __init__(self, cfg):
        self.cfg = cfg
        self.engine = None
        self.gaps: Dict[int, int] = {}    # clock gap (own clock - slowest clock) at each step start -> count

    def attach(self, engine):
        self.engine = engine

    @property
    def rank(self):
        return self.engine.rank

    def own_gap(self, clock: int) -> int:
        """How many steps this rank has completed beyond the slowest rank, as far as the ticks show."""
        clocks = self.engine.view.clocks.copy()
        clocks[self.rank] = clock
        return int(clock - clocks.min())

    def on_push(self, clock: int):
        pass

    def on_tick(self, tick, view):
        pass

    def may_proceed(self, clock: int) -> bool:
        return True

    def on_proceed(self, clock: int):
        gap = self.own_gap(clock)
        self.gaps[gap] = self.gaps.get(gap, 0) + 1

    def finish(self):
        t = self.engine.telemetry
        if self.gaps:
            t.counters["max_clock_gap"] = max(self.gaps)
            t.counters["clock_gap_histogram"] = {str(k): v for k, v in sorted(self.gaps.items())}


class Asp(Policy):
    """Asynchronous parallel: push every step, apply every tick, never wait (staleness unbounded)."""

    name = "asp"


POLICIES: Dict[str, Type[Policy]] = {cls.name: cls for cls in (Asp,)}


def make_policy(cfg) -> Policy:
    return POLICIES[cfg.policy](cfg)
