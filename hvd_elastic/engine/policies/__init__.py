"""The relaxed policies, one module each; the rules themselves live in the native scheduler (hvd_elastic._native).

``base`` holds what a policy is (the :class:`Gate` it decides from, the events it hears, peer alignment);
``asp``, ``ssp`` (ssp and dssp), ``zipline`` and ``wbsp`` one policy family each.
"""
from .base import Gate, Intervals, Policy, server_clocks
from .wbsp import Download


def make_policy(cfg, rank: int, size: int) -> Policy:
    """The rule object of the configured tick policy: the class its registry entry names (hvd_elastic/registry.py)."""
    return cfg.spec.rule_class()(cfg, rank, size)


__all__ = ["Download", "Gate", "Intervals", "Policy", "make_policy", "server_clocks"]
