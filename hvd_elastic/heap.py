"""Keep freed heap memory for reuse (HVD_ELASTIC_KEEP_HEAP, relaxed policies; glibc only).

A training step frees and re-allocates the same large blocks every step (``zero_grad()`` drops the gradients,
backward allocates new ones). glibc returns the freed top of its heap to the system when it exceeds a threshold
that it adapts at run time, and the next step's allocations fault every page back in. Under plain Horovod that is
rare; the relaxed step's allocation pattern can trigger it every step, and the page faults then make forward and
backward markedly slower (benchmarks/scale.py measures it: arm asp-noheap). Fixing both thresholds (mmap above 32 MiB
only, trim above 1 GiB only) keeps the freed blocks in the heap, as ``MALLOC_TRIM_THRESHOLD_`` /
``MALLOC_MMAP_THRESHOLD_`` would: the process's peak memory is unchanged, and memory it frees stays with the process
while it runs.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3    # glibc's mallopt() parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                      # the largest glibc accepts on 64-bit
TRIM_THRESHOLD = 1 << 30

_state = {"done": False, "applied": False}


def keep_freed_memory() -> bool:
    """Set both thresholds once per process; True if glibc took them (False elsewhere: nothing is changed)."""
    if not _state["done"]:
        _state["done"] = True
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            libc = None
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is not None:
            _state["applied"] = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _state["applied"]
