"""HVD_ELASTIC_KEEP_HEAP (hvd_elastic/heap.py): glibc takes both thresholds, once per process."""
import subprocess
import sys

CHECK = """
import ctypes, hvd_elastic.heap as h
assert h.keep_freed_memory() is True, "glibc refused a threshold"
assert h.keep_freed_memory() is True   # idempotent
# the trim threshold holds: a freed 64 MiB top-of-heap block is kept (no brk shrink), so re-allocating it is free
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.sbrk.restype = ctypes.c_void_p
p = libc.malloc(24 << 20)   # below the 32 MiB mmap threshold: from the heap
top = libc.sbrk(0)
libc.free(ctypes.c_void_p(p))
assert libc.sbrk(0) == top, "the heap was trimmed"
print("ok")
"""


def test_keep_freed_memory_sets_glibc_thresholds_once_and_the_heap_is_not_trimmed():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
