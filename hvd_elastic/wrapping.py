"""The one way hvd-elastic wraps a user's optimizer, in every frontend (torch/wrapping.py, tensorflow/_core.py).

As Horovod does, the optimizer runs as an instance of a new class built for the user's optimizer class (a subclass
with the plugin's methods); unlike Horovod, the *same* object is re-classed instead of a new one built from its
parameters, so the user's references, its state and (Keras) its tracked variables stay valid. The one exception is
PyTorch's bsp, which *is* Horovod's own DistributedOptimizer, timed by instance attributes (torch/optimizer.py:
``horovod.torch.broadcast_optimizer_state`` calls ``super(type(opt), opt).step()`` on Horovod's class, so one more
subclass layer would route its dummy step through Horovod's allreduce).
"""
from __future__ import annotations

from typing import Any, Dict


def subclass_in_place(obj, attrs: Dict[str, Any], module: str) -> type:
    """Make `obj` an instance of ``type(name of its class, (its class,), attrs)`` declared in `module`; returns the
    original class."""
    base = obj.__class__
    obj.__class__ = type(base.__name__, (base,), {**attrs, "__module__": module})
    return base
