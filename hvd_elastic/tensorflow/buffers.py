"""The TensorFlow side of the data plane: flat update buffers as ``tf.Variable`` s (on the device TensorFlow places
them), see hvd_elastic/engine/buffers.py for the contract.

Gradients go from the model's gradient tensors into the pending buffer with one ``assign_add`` (no numpy), Horovod
reduces the buffer through a ``tf.function`` (hvd_elastic.tensorflow._core), and a tick's sum reaches the
optimizer's ``apply`` as a tensor. A buffer is one 1-D variable; ``head(buf, n)`` is a view of its first n words
(``Head``: in-place operations on it are sliced assignments). Nothing model-sized is allocated per push.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..engine.buffers import HostBuffers


class Head:
    """The first `n` words of a buffer variable, as a target of in-place operations."""

    __slots__ = ("var", "n")

    def __init__(self, var: tf.Variable, n: int):
        self.var, self.n = var, n

    def value(self) -> tf.Tensor:
        return self.var[:self.n]

    def assign(self, value):
        self.var[:self.n].assign(value)

    def assign_add(self, value):
        self.var[:self.n].assign(self.var[:self.n] + value)


class TfBuffers(HostBuffers):
    """Flat buffers as 1-D tf.Variables of one float dtype (tensorflow-cpu: host memory)."""

    def __init__(self, dtype):
        self.dtype = tf.as_dtype(dtype)

    def tensor(self, x) -> tf.Tensor:
        """The value of a buffer, a head, a tensor or an array, as a tensor of this dtype."""
        if isinstance(x, (Head, tf.Variable)):
            return x.value()
        return tf.cast(tf.convert_to_tensor(x), self.dtype)

    def zeros(self, n: int) -> tf.Variable:
        return tf.Variable(tf.zeros([n], self.dtype), trainable=False)

    def zero_(self, buf):
        buf.assign(tf.zeros_like(self.tensor(buf)))

    def add_(self, dst, src, alpha: float = 1.0):
        src = self.tensor(src)
        dst.assign_add(src if alpha == 1.0 else src * tf.constant(alpha, self.dtype))

    def copy_(self, dst, src):
        dst.assign(self.tensor(src))

    def clone(self, src) -> tf.Variable:
        return tf.Variable(tf.identity(self.tensor(src)), trainable=False)

    def head(self, buf, n: int):
        return buf if n == int(buf.shape[0]) else Head(buf, n)

    def set_words(self, buf, offset: int, words: np.ndarray):
        buf[offset:offset + len(words)].assign(tf.constant(words, self.dtype))

    def get_words(self, buf, offset: int, n: int) -> np.ndarray:
        return buf[offset:offset + n].numpy()

    def numpy(self, buf) -> np.ndarray:
        return self.tensor(buf).numpy()

    def nbytes(self, buf) -> int:
        return int(buf.shape[0]) * self.dtype.size
