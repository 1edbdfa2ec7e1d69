"""ASP: asynchronous parallel (docs/algorithms.md, "ASP"): push every step, apply every tick, never wait for
another rank; staleness unbounded."""
from .base import Policy


class Asp(Policy):
    """Asynchronous parallel: the base rule (never held by other ranks), reading fresh weights."""

    fresh_reads = True
