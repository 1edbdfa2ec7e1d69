"""The relaxed policies, one module each; the rules themselves live in the native scheduler (hvd_elastic._native).

``base`` holds what a policy is (the :class:`Gate` it decides from, the events it hears, peer alignment);
``asp``, ``ssp`` (ssp and dssp), ``zipline`` and ``wbsp`` one policy family each.
"""
from typing import Dict, Type

from .asp import Asp
from .base import Gate, Intervals, Policy, server_clocks
from .ssp import Dssp, Ssp
from .wbsp import Download, Wbsp
from .zipline import Zipline

RELAXED_POLICIES: Dict[str, Type[Policy]] = {cls.name: cls for cls in (Asp, Ssp, Dssp, Zipline, Wbsp)}


def make_policy(cfg, rank: int, size: int) -> Policy:
    return RELAXED_POLICIES[cfg.policy](cfg, rank, size)


__all__ = ["Asp", "Download", "Dssp", "Gate", "Intervals", "Policy", "RELAXED_POLICIES", "Ssp", "Wbsp", "Zipline",
           "make_policy", "server_clocks"]
