"""How a tick travels: the Sum-allreduce of the payload and of the table, and where the table rides.

The table rides in the payload buffer's tail where buffers live in host memory (one allreduce per full tick: the
buffer is [update | encoded table]); with device buffers it travels in a host buffer of its own, so reading it
never waits for the device. A probe reduces the table alone. Every tick has the same collectives, with the same
names and shapes, on every rank, whichever thread issues them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .table import META_COLUMNS, META_PIECES, decode_meta, encode_meta


class Wire:
    """The collectives of one rank's ticks. `allreduce_sum(parts, name)` is an in-place Sum allreduce over
    all ranks of buffers of the kind `buffers` makes; `bytes_reduced` counts what it moved."""

    def __init__(self, buffers, numel: int, size: int, allreduce_sum: Callable[[list, str], None],
                 name: str):
        self.buffers, self.numel, self.size, self.name = buffers, numel, size, name
        self.allreduce_sum = allreduce_sum
        self.meta_words = size * META_COLUMNS * META_PIECES
        self._meta_kind = buffers.host_twin()
        self._meta_in_payload = self._meta_kind is buffers
        self.length = numel + (self.meta_words if self._meta_in_payload else 0)   # words of a payload buffer
        self._meta_buffer = self._meta_kind.zeros(self.meta_words)
        self._words = np.zeros(self.meta_words, np.float64)   # the encoded table of the next tick
        self.bytes_reduced = 0

    def encode(self, table: np.ndarray):
        """The next tick's table (this rank's row filled, the others -1: zeros once encoded)."""
        encode_meta(table, self._words)

    def write_table(self, send):
        """Write the encoded table where this tick's table travels: the tail of the payload buffer `send` (host
        buffers: returns None), or the host table buffer (device buffers, and every probe: returns it)."""
        if self._meta_in_payload and send is not None:
            self.buffers.set_words(send, self.numel, self._words)
            return None
        self._meta_kind.set_words(self._meta_buffer, 0, self._words)
        return self._meta_buffer

    def read_table(self, send) -> np.ndarray:
        """The reduced table of the tick whose payload was `send` (None: a probe)."""
        if self._meta_in_payload and send is not None:
            words = self.buffers.get_words(send, self.numel, self.meta_words)
        else:
            words = self._meta_kind.get_words(self._meta_buffer, 0, self.meta_words)
        return decode_meta(words, self.size)

    def _reduce(self, parts: list, name: str):
        self.allreduce_sum(parts, name)
        self.bytes_reduced += sum(self.buffers.nbytes(p) for p in parts)

    def full(self, send):
        """A full tick in one allreduce: the payload `send` and the table."""
        table = self.write_table(send)
        self._reduce([send] if table is None else [self.buffers.head(send, self.numel), table], self.name)

    def probe(self):
        """A probe: the table alone."""
        self._reduce([self.write_table(None)], f"{self.name}.meta")

    def chunk(self, send, chunk, k: int, last: bool):
        """Chunk k of a full tick in chunks (`chunk`: a view of the payload buffer `send`); the table rides with the
        `last`. Counted once for the whole payload (chunks_sent)."""
        table = self.write_table(send) if last else None
        parts = [chunk, self.buffers.view(send, self.numel, self.length) if table is None else table] if last \
            else [chunk]
        self.allreduce_sum(parts, f"{self.name}.s{k}")

    def chunks_sent(self, send):
        self.bytes_reduced += self.buffers.nbytes(send)
