"""The sync engine: turns a policy's decisions into pushes, pulls and waits around Horovod ticks.

Framework-free: updates travel in flat buffers of the frontend's own tensor type, made and combined by its
``Buffers`` (the contract: engine/buffers.py; tf.Variables: tensorflow/buffers.py; torch tensors: torch/buffers.py).
The frontend supplies ``allreduce_sum(buffers, name, block)`` (an in-place Sum allreduce over all ranks, with Horovod's
ops) and the callbacks of the policy's update kind (engine/updates.py): ``apply_gradient(update, scale, share)``
for gradient policies (one optimizer step on the replica with gradient scale x update; share: the part of a round
of n gradients the tick carries), ``read_params()`` (or ``read_params_into(buf)``, which spares a flat copy) /
``write_params(w)`` for delta policies (wbsp), and where the frontend can, ``add_params_into(dst, alpha)`` /
``add_to_params(src, alpha)`` (dst += alpha x weights, weights += alpha x src, in place in its parameters).

Per training step the frontend calls :meth:`SyncEngine.step` (and may call :meth:`SyncEngine.push` earlier, when the
update is complete, or stream it while backward produces it: :meth:`SyncEngine.stream_begin`). The engine pushes the
update, applies completed ticks in tick order (pull) and blocks while the policy's gate is closed, applying ticks as
they arrive. A rank held at its step boundary -- by the policy's rule, or by its own update in flight unless the
policy reads fresh (asp, wbsp, zipline with R > 1) -- resumes on exactly the state of the tick that released it:
ticks that completed after that one wait for its next step boundary. (Applying them too would let its next
gradient see other ranks' *next* updates, which BSP never does: with s = 0 the weights would drift from BSP's.
With the push at the end of backward a fast rank's next update is often already in such a tick.) A rank whose gate
is open applies every completed tick (freshest weights).
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable, Deque, Optional


from .. import heap as _heap
from .. import watchdog as _watchdog
from ..errors import HvdElasticError
from ..telemetry import Telemetry
from .staleness import StalenessLog, compensation_weight
from .table import CLOCK, Tick
from .ticker import Ticker
from .view import GlobalView


class SyncEngine:
    """One rank's side of a relaxed-synchronization run."""

    def __init__(self, policy, rank: int, size: int, numel: int, buffers,
                 allreduce_sum: Callable[[list, str, bool], None], telemetry: Telemetry,
                 tick_s: float, epoch_ns: int,
                 apply_gradient: Optional[Callable[[Any, float, float], None]] = None,
                 read_params: Optional[Callable[[], Any]] = None,
                 write_params: Optional[Callable[[Any], None]] = None,
                 read_params_into: Optional[Callable[[Any], None]] = None,
                 add_params_into: Optional[Callable[[Any, float], None]] = None,
                 add_to_params: Optional[Callable[[Any, float], None]] = None,
                 sample_params: Optional[Callable[[int], Any]] = None,
                 stall_timeout_s: float = 120.0, tick_name: str = "hvd_elastic.tick", stream: bool = False):
        self.policy, self.rank, self.size = policy, rank, size
        if policy.cfg.keep_heap:
            _heap.keep_freed_memory()
        self.buffers = buffers
        self.telemetry = telemetry
        self.numel = numel
        # Replica checks (zipline's barrier digest): every k-th weight of the flat layout as a buffer of the frontend's
        # kind (Buffers.fold_digest); a frontend that can read them without a flat copy of the model passes its own.
        self.sample_params = sample_params or (lambda k: self.buffers.numpy(read_params())[::k])
        self.view = GlobalView(size)
        self.stall_timeout_s = stall_timeout_s
        self.pushed = 0                  # updates this rank pushed
        self.applied_contributions = 0   # sum of push counts over the ticks this rank applied (all ranks' pushes)
        self.finished = False
        self.busy_s = 0.0                # time spent applying updates (counted as compute, not wait)
        self._backlog: Deque[Tick] = collections.deque()   # completed ticks taken but not applied yet
        # Staleness (engine/staleness.py): updates held by the weights this rank computes its next update on, and
        # (clock, that count) for each own push not applied yet.
        self.staleness = StalenessLog()
        self.applied_at_read = 0
        self._unapplied: Deque = collections.deque()
        self.updates = policy.updates(self, apply_gradient=apply_gradient, read_params=read_params,
                                      write_params=write_params, read_params_into=read_params_into,
                                      add_params_into=add_params_into, add_to_params=add_to_params)
        # Peer alignment (HVD_ELASTIC_PEER_WAIT) also bounds how long a tick holds pushes for ranks due to push.
        self.ticker = Ticker(numel, buffers, rank, size, allreduce_sum, tick_s=tick_s, epoch_ns=epoch_ns,
                             name=tick_name, hold_fraction=policy.cfg.peer_wait,
                             stream=stream and not self.updates.local_step,
                             pacing=self._pacing(policy.cfg.tick_pacing), join_stragglers=policy.joins_stragglers)
        policy.attach(self)

    def _pacing(self, knob: str) -> str:
        """HVD_ELASTIC_TICK_PACING as the ticker runs it: auto joins ticks for the gradient policies only (their ranks
        wait for their own push's tick, so its round trip is on their critical path); a delta policy (wbsp) uploads
        while its next step computes, and keeps probe pacing."""
        return "probe" if knob == "auto" and self.updates.local_step else knob

    # ---- per step ----------------------------------------------------------------------------------------------
    def step(self, accumulate: Optional[Callable[[Any, float], None]], compute_s: float, pushed: bool = False):
        """Push this step's update (unless ``pushed``: :meth:`push` already did, at the end of backward), pull
        completed ticks, and wait while the policy's gate is closed.

        Gradient policies: ``accumulate(dst, alpha)`` adds alpha x the gradient into dst. Delta policies: pass
        None (the update is the delta of read_params() since the last upload)."""
        t0 = time.perf_counter()
        busy0 = self.busy_s
        self.ticker.stream_wait()   # a tick may still read this step's gradients, which applying ticks overwrites
        if not pushed:
            self.push(accumulate, compute_s)
        self._pull(block=False, until_open=self._holds(self.policy.blocked_by(self.ticker.clock)))
        self.telemetry.comm_s += (time.perf_counter() - t0) - (self.busy_s - busy0)
        self._gate()
        self.policy.on_proceed(self.ticker.clock)
        self.updates.proceeding()
        self.telemetry.compute_s += self.busy_s - busy0

    def push(self, accumulate: Optional[Callable[[Any, float], None]], interval_s: float):
        """Hand this step's update to the next tick (the first half of :meth:`step`; a frontend may call it as soon
        as the update is complete, e.g. when backward ends, so that the tick runs while the rank still computes).
        ``interval_s``: the rank's step compute time, for the schedulers' predictions."""
        weight = self._push_weight()
        add = self.updates.push_function(accumulate)
        # inline: this rank waits for its own push's tick (no push may stay in flight), so while ticks are joined
        # its training thread may send it itself (Ticker.run_inline)
        self.ticker.push(lambda dst: add(dst, weight), int(interval_s * 1e9), inline=self.policy.max_inflight == 0)
        self._pushed(weight)

    def _push_weight(self) -> float:
        if self.policy.compensation == "none":
            return 1.0
        return compensation_weight(self.policy.compensation,
                                   self.ticker.updates_before_next_push(self.applied_at_read), self.size)

    def _pushed(self, weight: float):
        self.staleness.add_weight(weight)
        self._unapplied.append((self.ticker.clock, self.applied_at_read))
        self.updates.pushed()
        self.pushed += 1
        self.telemetry.count("pushes")
        self.policy.on_push(self.ticker.clock)

    # A streamed push (gradient policies, a frontend whose backward reports gradients as they are produced): the
    # tick reads the gradient chunk by chunk while backward runs (ticker.py, stream_begin). Same update, same
    # accounting as push(); the gradients must stay as they are until step() (stream_wait).
    def stream_begin(self, accumulate_range: Callable[[Any, int, int, float], None]) -> bool:
        """Backward starts: announce this step's gradient; False: push it normally (ticker.stream_begin says when).
        ``accumulate_range(dst, start, stop, alpha)`` adds alpha x words [start, stop) of the gradient into dst."""
        weight = self._push_weight()
        if not self.ticker.stream_begin(lambda dst, start, stop: accumulate_range(dst, start, stop, weight)):
            return False
        self._stream_weight = weight
        return True

    def stream_ready(self, start: int, stop: int):
        self.ticker.stream_ready(start, stop)

    def stream_end(self, interval_s: float):
        """The gradient is complete: it counts as this step's push (step() is then called with pushed=True)."""
        self.ticker.stream_end(int(interval_s * 1e9))
        self._pushed(self._stream_weight)

    @property
    def streaming(self) -> bool:
        return self.ticker.streaming

    def _gate(self):
        """Block while the policy says so; time blocked on own uploads is communication, the rest waiting."""
        last_progress = time.monotonic()
        while True:
            t0, busy0 = time.perf_counter(), self.busy_s
            reason = self.policy.blocked_by(self.ticker.clock)
            self.ticker.gated = reason == "wait"    # no push of this rank before a tick opens the gate
            if reason is None:
                return
            _watchdog.enter(f"the {self.policy.name} gate")
            progressed = self._pull(block=True, timeout=1.0, until_open=self._holds(reason))
            blocked = (time.perf_counter() - t0) - (self.busy_s - busy0)
            if reason == "comm":
                self.telemetry.comm_s += blocked
            else:
                self.telemetry.wait_s += blocked
            if progressed:
                last_progress = time.monotonic()
            else:
                self._check_stall(last_progress, "gate")

    def _holds(self, reason: Optional[str]) -> bool:
        """Whether a rank blocked for `reason` resumes on exactly the state of the tick that opens its gate."""
        return reason == "wait" or (reason == "comm" and not self.policy.fresh_reads)

    def _check_stall(self, last_progress: float, what: str):
        """Called while this rank waits with nothing delivered for a while. Ticks that stopped are an error here;
        a stall (no rank making progress for HVD_ELASTIC_STALL_TIMEOUT) is the watchdog's one rule for every
        policy (hvd_elastic/watchdog.py: it names the rank from heartbeats and ends the process), so this only
        tells it where this rank waits."""
        if self.ticker.stopped:
            raise HvdElasticError(f"ticks stopped while waiting at the {what}")
        _watchdog.enter(f"the {self.policy.name} {what}")

    def _pull(self, block: bool, timeout: Optional[float] = None, until_open: bool = False) -> int:
        """Apply completed ticks in tick order; returns how many. block: wait (up to timeout) for one when none is
        pending. until_open: stop right after the tick at which the policy's gate opens."""
        self._backlog.extend(self.ticker.take(block=block and not self._backlog, timeout=timeout))
        applied = 0
        while self._backlog:
            if applied and until_open and self.policy.blocked_by(self.ticker.clock) is None:
                break
            self._apply(self._backlog.popleft())
            applied += 1
        return applied

    def _apply(self, tick: Tick):
        self.view.update(tick.meta)
        delivered = int(tick.meta[self.rank, CLOCK])
        while self._unapplied and self._unapplied[0][0] <= delivered:
            clock, applied_at_read = self._unapplied.popleft()
            self.staleness.add(self.applied_contributions - applied_at_read, clock)
        if tick.update is not None:
            t0 = time.perf_counter()
            self.updates.apply(tick.update, tick.total_count)
            self.ticker.recycle(tick)
            self.busy_s += time.perf_counter() - t0
            self.applied_contributions += tick.total_count
            self.telemetry.count("ticks_applied")
        self.policy.on_tick(tick, self.view)

    def _wait_until(self, condition: Callable[[], bool], what: str):
        last_progress = time.monotonic()
        while not condition():
            if self._pull(block=True, timeout=1.0):
                last_progress = time.monotonic()
            elif not condition():
                self._check_stall(last_progress, what)

    # ---- end of training ---------------------------------------------------------------------------------------
    def finish(self):
        """Collective: deliver and apply every pushed update on every rank, stop the tick thread, and leave every
        rank with the same weights (for delta policies: the final global model)."""
        if self.finished:
            return
        t0 = time.perf_counter()
        if self.ticker.streaming:   # a backward whose step() never came: its announced gradient is pushed, as
            self.stream_end(0.0)    # a push at the end of backward would have been
        self.ticker.stream_wait()
        self.ticker.finish()
        self._wait_until(lambda: self.ticker.stopped, "final barrier")
        self._pull(block=False)
        self.ticker.join(timeout=self.stall_timeout_s)
        self.updates.finish()
        self.finished = True
        self.telemetry.wait_s += time.perf_counter() - t0
        self.telemetry.counters.update({
            **self.ticker.counters(), "pushed": self.pushed,
            "applied_contributions": self.applied_contributions, **self.staleness.counters()})
        self.policy.finish()
