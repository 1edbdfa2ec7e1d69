"""The script's own Horovod collectives beside the plugin's (docs/horovod-compat.md, "Collectives of the script's own").

Horovod negotiates a collective by name, and names an unnamed one after a per-process counter of every handle it has
issued (``allreduce.noname.<handle>``, horovod/torch/mpi_ops_v2.cc). Under bsp the ranks issue the same calls in the
same order, so the counters agree. Under a relaxed policy the tick thread issues collectives of its own, at moments
that differ between ranks: the same unnamed call of the script then gets a different name on each rank, and every
rank waits in it forever. :func:`install` gives each unnamed collective of ``horovod.torch`` a name from a counter
of unnamed calls only (``<op>.noname.hvd_elastic.<k>``), which advances identically on every rank that makes the same
calls in the same order -- what Horovod requires of a script anyway. The plugin's own collectives are all named.

It also tells the watchdog (hvd_elastic/watchdog.py) when the training thread waits in a collective of the script's
own, and its tick metadata when a rank's training thread cannot reach its next step (engine: ``outside``), so that
a policy's gate lets the other ranks reach the same call (zipline's barrier yields) and a wait that never ends is
named as a stall instead of hanging.

Installed once per process, when the first relaxed optimizer is built (collective: every rank at the same point).
"""
from __future__ import annotations

import functools
import itertools
import sys
import threading
from typing import Callable, Dict

import horovod.torch.mpi_ops as _mpi_ops

from .. import stall as _stall
from .. import watchdog as _watchdog

PLUGIN_PREFIX = "hvd_elastic."   # the plugin's own collectives: never renamed, never reported as the script's
# Horovod's low-level enqueue functions (every collective of horovod.torch goes through one of them) -> the position
# of the `name` argument and the prefix Horovod puts before it.
_ENQUEUE = {"_allreduce_async": (2, "allreduce"), "_grouped_allreduce_async": (2, "grouped_allreduce"),
            "_allgather_async": (2, "allgather"), "_grouped_allgather_async": (2, "grouped_allgather"),
            "_broadcast_async": (3, "broadcast"), "_alltoall_async": (4, "alltoall"),
            "_reducescatter_async": (2, "reducescatter"), "_grouped_reducescatter_async": (2, "grouped_reducescatter")}

_state = {"installed": False}
_unnamed = itertools.count()
_unnamed_lock = threading.Lock()
_names: Dict[int, str] = {}            # handle -> Horovod name, for the script's own collectives in flight
_listeners: list = []                  # callables(bool): the training thread enters (True) / leaves a wait


def install():
    """Name unnamed collectives deterministically and watch the script's own waits (idempotent)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    for fn_name, (pos, prefix) in _ENQUEUE.items():
        fn = getattr(_mpi_ops, fn_name, None)
        if fn is not None:
            setattr(_mpi_ops, fn_name, _named(fn, pos, prefix))
    synchronize, watched = _mpi_ops.synchronize, _watched(_mpi_ops.synchronize)
    for name, module in list(sys.modules.items()):   # horovod.torch's modules bound it at import: rebind them all
        if name.startswith("horovod.torch") and getattr(module, "synchronize", None) is synchronize:
            module.synchronize = watched


def on_wait(listener: Callable[[bool], None]):
    """Call listener(True) when the training thread starts waiting in a collective of the script's own and
    listener(False) when it returns (the engine marks its tick row)."""
    _listeners.append(listener)


def remove_listener(listener: Callable[[bool], None]):
    if listener in _listeners:
        _listeners.remove(listener)


def _named(fn, pos: int, prefix: str):
    @functools.wraps(fn)
    def enqueue(*args, **kwargs):
        args = list(args)
        name = args[pos] if len(args) > pos else kwargs.get("name")
        if name is None:
            with _unnamed_lock:
                name = f"noname.hvd_elastic.{next(_unnamed)}"
            if len(args) > pos:
                args[pos] = name
            else:
                kwargs["name"] = name
        handle = fn(*args, **kwargs)
        if not name.startswith(PLUGIN_PREFIX):
            _names[handle] = f"{prefix}.{name}"
        return handle
    return enqueue


def _watched(synchronize):
    @functools.wraps(synchronize)
    def wait(handle):
        name = _names.pop(handle, None)
        wd = _watchdog.current()
        if name is None or wd is None or threading.current_thread().name.startswith("hvd_elastic-"):
            return synchronize(handle)
        before = wd.me.where
        wd.enter(_stall.collective(name))
        for listener in list(_listeners):
            listener(True)
        try:
            return synchronize(handle)
        finally:
            for listener in list(_listeners):
                listener(False)
            wd.enter(before)
    return wait
