"""The plugin's state of one wrapped PyTorch optimizer: one object (:class:`Attached`) in one attribute of the user's
optimizer. The wrapped optimizer's own methods read it as ``self._hvd_elastic``; every other module goes through
:func:`state_of`, the one place that reads it from outside.

Example::

    state = attach(optimizer, session)     # DistributedOptimizer(), once
    state_of(optimizer).session.cfg.policy
"""
from __future__ import annotations

from typing import Any, Dict, Optional

ATTRIBUTE = "_hvd_elastic"


class Attached:
    """What the plugin keeps for one optimizer (fields set by the policy's builder)."""

    def __init__(self, session):
        self.session = session              # the run: configuration, telemetry, engine (hvd_elastic.session)
        self.base: Optional[type] = None    # the user's optimizer class, below the plugin's subclass (wrap_class)
        self.inner_step = None              # the user's optimizer's own step(), bound to it
        self.flat = None                    # FlatParams of the trained parameters
        self.names: Dict[Any, str] = {}     # parameter -> its name (Horovod's, for messages)
        self.backward = None                # BackwardPush (tick policies' push at the end of backward)
        self.elastic = None                 # ElasticRun (elastic Horovod, tick policies)
        self.overlap = None                 # lbbsp's exchange overlapped with backward


def attach(optimizer, session) -> Attached:
    state = Attached(session)
    setattr(optimizer, ATTRIBUTE, state)
    return state


def state_of(optimizer, caller: str = "") -> Optional[Attached]:
    """The optimizer's Attached; None (or, with `caller`, a TypeError naming it) if hvd_elastic did not wrap it."""
    state = getattr(optimizer, ATTRIBUTE, None)
    if state is None and caller:
        raise TypeError(f"{caller}() takes an optimizer made by hvd_elastic.torch.DistributedOptimizer")
    return state
