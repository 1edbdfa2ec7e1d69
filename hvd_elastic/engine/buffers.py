"""Flat update buffers in the frontend's own tensor type: what the data plane needs from a framework, nothing more.

The engine never touches a framework tensor directly: it asks its ``Buffers`` to allocate, zero, accumulate and
scale flat buffers, and to move the tick metadata (a few hundred words, always numpy on the engine's side) in and
out of a buffer's tail. The frontends supply their own: ``TorchBuffers`` (hvd_elastic/torch/buffers.py: torch
tensors, on the device they live on) and ``TfBuffers`` (hvd_elastic/tensorflow/buffers.py: tf.Variables), so that
updates stay framework tensors from backward to the tick and back. ``NumpyBuffers`` (below) is the reference
implementation, used by the tests.

Every operation is in place on preallocated buffers: no model-sized allocation per push, per tick or per apply.

Buffers that live on an accelerator (torch CUDA tensors) add three things, with host defaults in ``HostBuffers``:
- ``host_resident`` / ``host_twin()``: the tick metadata rides in the payload's tail only for host buffers; with
  device buffers it travels in a host buffer of its own (``host_twin()``), so reading a tick's table never waits
  for the device.
- ``fence()`` / ``after(fence)``: a buffer handed from one thread to another (a push to the tick, a completed tick
  to the optimizer, an applied tick's buffer back to the pool) is fenced by its writer and waited for by its next
  user on the device's queue (a CUDA event, not a host wait); ``None`` on the host.
- ``collective_scope()``: the context a tick's collectives run in (CUDA: the buffers' device and its default
  stream, the stream Horovod records its ready events on and, on NCCL, orders its completion on).
``fold_digest`` / ``digest_value`` keep a running checksum of weight samples (zipline's replica check) where the
weights live, read once at the end of training.
"""
from __future__ import annotations

import contextlib
import zlib

import numpy as np


class HostBuffers:
    """The defaults of buffers in host memory: no fences, no device, the metadata in the payload's tail."""

    host_resident = True

    def host_twin(self):
        """Buffers of the same kind in host memory (the tick metadata's, when these live on a device)."""
        return self

    def fence(self):
        """Mark the calling thread's work on buffers so far; None where every operation is done when it returns."""
        return None

    def after(self, fence) -> None:
        """Order the calling thread's next operations after `fence` (without blocking the host)."""

    def collective_scope(self):
        return contextlib.nullcontext()

    def fold_digest(self, acc, sample):
        """A running checksum (acc: None at first) folded with the words of `sample` (a buffer of this kind), bit
        exact: equal weights give equal digests."""
        words = sample if isinstance(sample, np.ndarray) else self.numpy(sample)
        return zlib.crc32(np.ascontiguousarray(words), acc or 0)

    def digest_value(self, acc) -> int:
        return int(acc or 0)


class NumpyBuffers(HostBuffers):
    """Flat buffers as numpy arrays of one float dtype."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def zeros(self, n: int):
        return np.zeros(n, self.dtype)

    def zero_(self, buf):
        buf.fill(0)

    def add_(self, dst, src, alpha: float = 1.0):
        """dst += alpha * src (src: a buffer of this kind, or anything numpy accepts)."""
        if alpha == 1.0:
            np.add(dst, src, out=dst)
        else:
            dst += alpha * np.asarray(src)

    def copy_(self, dst, src):
        np.copyto(dst, src)

    def clone(self, src):
        return np.array(src, dtype=self.dtype, copy=True)

    def head(self, buf, n: int):
        """The first n words of buf (a view)."""
        return buf[:n]

    def view(self, buf, start: int, stop: int):
        """Words [start, stop) of buf (a view: an in-place allreduce of it changes buf)."""
        return buf[start:stop]

    def set_words(self, buf, offset: int, words: np.ndarray):
        buf[offset:offset + len(words)] = words

    def get_words(self, buf, offset: int, n: int) -> np.ndarray:
        return np.asarray(buf[offset:offset + n])

    def numpy(self, buf) -> np.ndarray:
        """The buffer's values as a numpy array (a view where possible; for digests and checks, not the hot path)."""
        return np.asarray(buf)

    def nbytes(self, buf) -> int:
        return int(buf.nbytes)
