"""Flat update buffers in the frontend's own tensor type: what the data plane needs from a framework, nothing more.

The engine never touches a framework tensor directly: it asks its ``Buffers`` to allocate, zero, accumulate and
scale flat buffers, and to move the tick metadata (a few hundred words, always numpy on the engine's side) in and
out of a buffer's tail. The frontends supply their own: ``TorchBuffers`` (hvd_elastic/torch/buffers.py: torch
tensors, on the device they live on) and ``TfBuffers`` (hvd_elastic/tensorflow/buffers.py: tf.Variables), so that
updates stay framework tensors from backward to the tick and back. ``NumpyBuffers`` (below) is the reference
implementation, used by the tests.

Every operation is in place on preallocated buffers: no model-sized allocation per push, per tick or per apply.
"""
from __future__ import annotations

import numpy as np


class NumpyBuffers:
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
