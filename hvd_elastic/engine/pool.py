"""The tick's update buffers: the pending buffer pushes accumulate into, a zeroed spare, and the buffers the
training thread gives back once it has applied their tick.

The buffers are the frontend's own tensors (engine/buffers.py), preallocated and reused: pushes accumulate in place
into the pending buffer; a full tick takes it and leaves the spare in its place, or, when none is free, leaves none
and the next push takes one (pending()); the training thread gives each applied tick's buffer back (give_back), and
the tick thread zeroes it for reuse. No model-sized allocation per tick: a rank makes at most as many buffers as it
holds at once (`allocated`, `held_max`: buffers_allocated and held_ticks_max in the report), and keeps up to
POOL_LIMIT.

Buffers on a device are handed from one thread to the other in order (handed/received: a CUDA event recorded by
the thread done with a buffer, waited for on the device's queue by the next one; nothing on the host).
"""
from __future__ import annotations

import threading
from typing import List

POOL_LIMIT = 8    # applied ticks' buffers kept for reuse (beyond it, given back to the allocator). Keeping them
                  # never raises the peak (a buffer is only made when none is free), and a rank that applies
                  # several ticks per step (a straggler k times slower: about k) then makes none per step


class BufferPool:
    """One rank's model-sized buffers of `length` words, made by `buffers`. `lock` is the ticker's: methods marked
    "(under the lock)" expect the caller to hold it, the others take it."""

    def __init__(self, buffers, length: int, lock: threading.Condition):
        self.buffers, self.length, self._lock = buffers, length, lock
        self._fences = {}                        # id(buffer) -> its last hand-over (Buffers.fence)
        self._pending = buffers.zeros(length)    # this rank's pushes since its last full tick
        self.spare = None                        # a zeroed buffer for the next full tick or push
        self._returned: List = []                # applied ticks' buffers, given back (not zeroed yet)
        self.allocated = 1                       # model-sized buffers made over the run
        self.held = 0                            # delivered ticks whose buffer is not given back yet
        self.held_max = 0

    # ---- hand-overs between the threads -------------------------------------------------------------------------
    def handed(self, buf):
        """The calling thread is done with `buf` for now: whichever thread uses it next first waits for this work
        (Buffers.fence: a CUDA event; nothing on the host, where every operation is complete when it returns)."""
        f = self.buffers.fence()
        if f is not None:
            self._fences[id(buf)] = f

    def received(self, buf):
        """The calling thread is about to use `buf`: order its work after the last hand-over of it."""
        if self._fences:
            self.buffers.after(self._fences.pop(id(buf), None))

    # ---- the pending buffer -----------------------------------------------------------------------------------------
    def pending(self):
        """(Under the lock.) The pending buffer. A full tick takes it and leaves the spare in its place, or nothing
        when no spare is free (the last tick's buffer is not given back yet): the first push after that makes it --
        the spare if the tick thread has zeroed one since, else a given-back buffer (zeroed here), else a new one.
        Made lazily, a rank whose previous tick is still unapplied when the next one leaves holds two buffers (that
        tick, the one in flight), not three."""
        if self._pending is None:
            if self.spare is not None:
                self._pending, self.spare = self.spare, None
            else:
                self._pending = self._zeroed(self._take_free())
        return self._pending

    def take_pending(self):
        """(Under the lock.) A full tick takes the pending buffer (it exists: ensure_pending) and leaves the spare."""
        send, self._pending, self.spare = self._pending, self.spare, None
        return send

    def ensure_pending(self):
        """Before a full tick: nothing pushed since the last full tick took the pending buffer, so a zeroed one to
        receive this tick's sum in."""
        if self._pending is None:
            self.keep(self.zeroed())

    def refill(self):
        """The tick thread, between ticks: zero the next spare now, off the release's path."""
        if self.spare is None and self._returned:
            self.keep(self.zeroed())

    # ---- zeroed buffers ---------------------------------------------------------------------------------------------
    def zeroed(self):
        """A zeroed model-sized buffer: a given-back one (zeroed here, outside the lock) or a new one."""
        with self._lock:
            buf = self._take_free()
        return self._zeroed(buf)

    def _take_free(self):
        """(Under the lock.) A given-back buffer, or None after counting the new one the caller is to make."""
        if self._returned:
            return self._returned.pop()
        self.allocated += 1
        return None

    def _zeroed(self, buf):
        """`buf` (from _take_free) zeroed, or a new zeroed buffer when it is None."""
        if buf is None:
            return self.buffers.zeros(self.length)
        self.received(buf)
        self.buffers.zero_(buf)
        self.handed(buf)
        return buf

    def keep(self, buf):
        """A zeroed buffer, as the pending buffer if there is none (a full tick needs one), else as the spare, else
        back to the pool."""
        with self._lock:
            if self._pending is None:
                self._pending = buf
            elif self.spare is None:
                self.spare = buf
            else:
                self._returned.append(buf)

    # ---- delivered ticks' buffers ---------------------------------------------------------------------------------
    def delivered(self):
        """(Under the lock.) A tick's buffer goes to the training thread."""
        self.held += 1
        self.held_max = max(self.held_max, self.held)

    def give_back(self, buf):
        """The training thread has applied the tick whose sum `buf` holds."""
        self.handed(buf)
        with self._lock:
            self.held -= 1
            if len(self._returned) < POOL_LIMIT:
                self._returned.append(buf)
