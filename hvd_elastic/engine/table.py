"""The tick table: one row per rank, reduced in every tick, its columns and codec (the pure functions of it that pace
the ticks: engine/pacing/rules.py).

Every tick carries a metadata table (int64, size x META_COLUMNS) in which each rank fills only its own row and
the other ranks add zeros, so the Sum-allreduce is an allgather of every rank's clock, push times and step time.
Every rank receives the same tables in the same order; every decision below is a function of tables alone, so
every rank takes it identically and issues the same collectives.

The table travels in a buffer of the update's dtype (with the payload where both live in host memory: one
allreduce, one dtype, since Horovod only fuses tensors of one dtype and on Gloo every extra collective costs
milliseconds). Each int64 (all values are >= -1) is stored as value + 1 in META_PIECES 16-bit pieces, which
float32 and float64 hold exactly, so the Sum returns every piece exactly (encode_meta, decode_meta).

Words used here and in the ticker (engine/ticker.py has the full glossary): a rank's *push* adds an update to its
next tick; *pending* pushes wait for a full tick; a *probe* carries the table alone and announces what is
pending; a *release* is the decision, after a probe, to send the pending pushes in a full tick now; the *hold* is
how long a release waits for ranks due to push (a fraction of a period); a rank's *peers* are the ranks whose step
compute time is within PEER_SPEED of its own; a thread *joins* a tick when it enters the tick's collective.
"""
from __future__ import annotations

from typing import List

import numpy as np

# Columns, one row per rank. COUNT: pushes this tick delivers; CLOCK: own pushes delivered up to and including
# this tick; LAST_PUSH_NS: time of the last push sent (it goes with CLOCK); INTERVAL_NS: the rank's step compute
# time; FINISHED: the rank has finished; SEQ: the tick's index (every row the same, or the ranks are out of step);
# PENDING / PENDING_SINCE_NS: pushes waiting (probes only) and when the first of them came; NOW_NS: the row's
# snapshot time; PERIOD_NS: measured time between the rank's pushes (moving average). STREAM: a streamed push is
# under way (probes only); LEAD_NS: the rank's measured stream begin -> end time. GATED: the rank's training
# thread is held by its policy's rule (a barrier, a staleness bound, peer alignment) or waits in a collective of
# the script's own, so it pushes nothing before a later tick opens its gate: a release never waits for it (nor, for
# its own row, a join). OUTSIDE: the second case alone (a gate may let the others reach that collective:
# zipline's barrier). HOSTS: the latest change of the rank set elastic Horovod's driver announced to the rank
# (timestamp x 4 + its kind, 0: none): the ranks agree on it through the ticks instead of a broadcast per commit
# (torch/elastic.py).
COUNT, CLOCK, LAST_PUSH_NS, INTERVAL_NS, FINISHED, SEQ, PENDING, PENDING_SINCE_NS, NOW_NS, PERIOD_NS, STREAM, \
    LEAD_NS, GATED, OUTSIDE, HOSTS = range(15)
META_COLUMNS = 15
META_PIECES = 4   # 16-bit pieces per int64
_BASE = 1 << 16
CHUNK_WORDS, MAX_CHUNKS = 1 << 20, 4   # a streamed tick's payload: chunks of at least CHUNK_WORDS, at most MAX


_SHIFTS = np.arange(META_PIECES, dtype=np.int64) * 16   # piece k of a value: bits 16k .. 16k + 15


def encode_meta(meta: np.ndarray, out: np.ndarray):
    """A table (any shape, values >= -1) into `out`'s words, META_PIECES per value (piece k of value i at word
    i x META_PIECES + k)."""
    v = meta.astype(np.int64).ravel() + 1
    if v.min() < 0 or v.max() >= (1 << 62):
        raise ValueError("tick metadata out of range")
    out[:] = ((v[:, None] >> _SHIFTS) & (_BASE - 1)).ravel()


def decode_meta(words: np.ndarray, size: int, columns: int = META_COLUMNS) -> np.ndarray:
    """Inverse of encode_meta for a (size x columns) table (the tick's, or any other riding the same way)."""
    pieces = np.rint(words).astype(np.int64).reshape(size * columns, META_PIECES)
    return ((pieces << _SHIFTS).sum(axis=1) - 1).reshape(size, columns)


class Tick:
    """One completed tick: `index`, the summed `update` (a view of `buffer`; None when nobody pushed), the
    table, the time spent in its collectives. Hand `buffer` back with Ticker.recycle once applied."""

    __slots__ = ("index", "update", "meta", "comm_s", "buffer")

    def __init__(self, index: int, update, meta: np.ndarray, comm_s: float, buffer=None):
        self.index, self.update, self.meta, self.comm_s, self.buffer = index, update, meta, comm_s, buffer

    @property
    def total_count(self) -> int:
        return int(self.meta[:, COUNT].sum())


def chunk_bounds(numel: int) -> List[int]:
    """Word offsets of a streamed tick's payload chunks: numel // CHUNK_WORDS equal chunks (1 to MAX_CHUNKS).
    A function of the model size only, so every rank cuts the same chunks."""
    k = max(1, min(MAX_CHUNKS, numel // CHUNK_WORDS))
    return [numel * i // k for i in range(k + 1)]
