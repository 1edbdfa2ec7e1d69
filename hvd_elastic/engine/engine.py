"""The sync engine: turns a policy's decisions into pushes, pulls and waits around Horovod ticks.

Data flows one way. The frontend describes itself once (:class:`Frontend`: its buffers, its Sum allreduce, its
callbacks) and calls the engine once per training step; the engine alone owns the run's state (clocks, the global
view, staleness bookkeeping, the backlog of delivered ticks) and asks the policy (policies/) what to do: the policy
decides from a :class:`~.policies.Gate` and its own state, and the engine carries the decision out. Time is accounted
in one place, the telemetry's spans.

Framework-free: updates travel in flat buffers of the frontend's own tensor type, made and combined by its
``Buffers`` (the contract: engine/buffers.py). ``allreduce_sum(buffers, name)`` is an in-place Sum allreduce
over all ranks with Horovod's ops. The update kind's callbacks (engine/updates.py): ``apply_gradient(update, scale,
share)`` for gradient policies (one optimizer step on the replica with gradient scale x update; share: the part of a
round of n gradients the tick carries), ``read_params()`` (or ``read_params_into(buf)``) / ``write_params(w)`` for
delta policies (wbsp), and where the frontend can, ``add_params_into(dst, alpha)`` / ``add_to_params(src, alpha)``.

Per training step the frontend calls :meth:`SyncEngine.step` (and may call :meth:`SyncEngine.push` earlier, when the
update is complete, or stream it while backward produces it: :meth:`SyncEngine.stream_begin`). The engine pushes the
update, applies completed ticks in tick order (pull) and blocks while the gate is closed, applying ticks as they
arrive. A rank held at its step boundary -- by the policy's rule, or by its own update in flight unless the policy
reads fresh (asp, wbsp, zipline with R > 1) -- resumes on exactly the state of the tick that released it: ticks that
completed after that one wait for its next step boundary. (Applying them too would let its next gradient see other
ranks' *next* updates, which BSP never does: with s = 0 the weights would drift from BSP's.) A rank whose gate is
open applies every completed tick (freshest weights).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Any, Callable, Deque, Optional

from .. import heap as _heap
from .. import watchdog as _watchdog
from ..errors import HvdElasticError
from ..telemetry import Telemetry
from .loop import TickerError
from .policies import Download, Gate, Policy
from .staleness import Staleness, compensation_weight
from .table import CLOCK, Tick
from .ticker import Ticker
from .view import GlobalView


@dataclasses.dataclass
class Frontend:
    """What a frontend gives the engine (see the module docstring for the callbacks' contracts)."""

    numel: int
    buffers: Any
    allreduce_sum: Callable[[list, str, bool], None]
    tick_name: str                  # Horovod name of the ticks: unique among live engines, the same on every rank
    epoch_ns: int                   # the job's common clock origin (time.time_ns() of rank 0 at start-up)
    apply_gradient: Optional[Callable[[Any, float, float], None]] = None
    read_params: Optional[Callable[[], Any]] = None
    write_params: Optional[Callable[[Any], None]] = None
    read_params_into: Optional[Callable[[Any], None]] = None
    add_params_into: Optional[Callable[[Any, float], None]] = None
    add_to_params: Optional[Callable[[Any, float], None]] = None
    # replica checks (a barrier's digest): every k-th weight of the flat layout, a buffer of the frontend's kind
    sample_params: Optional[Callable[[int], Any]] = None
    stream: bool = False            # the frontend can hand a gradient over while backward produces it

    def callbacks(self) -> dict:
        return {k: getattr(self, k) for k in ("apply_gradient", "read_params", "write_params", "read_params_into",
                                              "add_params_into", "add_to_params")}


class _StepGate:
    """When this step's gate checks started (reset at each push): the policy's rule is first consulted once this
    rank's own updates are in, peer alignment once the rule lets it go."""

    __slots__ = ("rule_since", "peer_since")

    def __init__(self):
        self.rule_since: Optional[float] = None
        self.peer_since: Optional[float] = None


class SyncEngine:
    """One rank's side of a relaxed-synchronization run."""

    DIGEST_WORDS = 1 << 20   # weights hashed per barrier for the replica check (barrier_digest)

    def __init__(self, policy: Policy, rank: int, size: int, frontend: Frontend, telemetry: Telemetry, cfg,
                 rank_set_baseline: Optional[int] = None):
        self.policy, self.rank, self.size, self.telemetry = policy, rank, size, telemetry
        if cfg.keep_heap:
            _heap.keep_freed_memory()
        self.buffers, self.numel = frontend.buffers, frontend.numel
        self.sample_params = frontend.sample_params or (lambda k: self.buffers.numpy(frontend.read_params())[::k])
        self.view = GlobalView(size)
        self.stall_timeout_s = cfg.stall_timeout   # how long finish() waits for the tick thread to end
        self.pushed = 0                  # updates this rank pushed
        self.applied_contributions = 0   # sum of push counts over the ticks this rank applied (all ranks' pushes)
        self.finished = False
        self.abandoned = False           # elastic Horovod's rank set changed: no more ticks (abandon)
        self._backlog: Deque[Tick] = collections.deque()   # completed ticks taken but not applied yet
        self.staleness = Staleness()     # engine/staleness.py
        self._step_gate = _StepGate()
        self._digest = None              # running checksum of the weights at each barrier (Buffers.fold_digest)
        self.updates = policy.updates(self.buffers, self.numel, size, relaxed=not policy.in_lockstep,
                                      **frontend.callbacks())
        # Peer alignment (HVD_ELASTIC_PEER_WAIT) also bounds how long a tick holds pushes for ranks due to push.
        self.ticker = Ticker(self.numel, self.buffers, rank, size, frontend.allreduce_sum, tick_s=cfg.tick_ms / 1000.0,
                             epoch_ns=frontend.epoch_ns, name=frontend.tick_name, hold_fraction=cfg.peer_wait,
                             stream=frontend.stream and self.updates.streams, pacing=cfg.tick_pacing,
                             relaxed_joins=policy.relaxed_joins,
                             lockstep=policy.lockstep.new_rule() if policy.lockstep is not None else None,
                             rank_set_baseline=rank_set_baseline)

    # ---- per step ----------------------------------------------------------------------------------------------
    def step(self, accumulate: Optional[Callable[[Any, float], None]], compute_s: float, pushed: bool = False):
        """Push this step's update (unless ``pushed``: :meth:`push` already did, at the end of backward), pull
        completed ticks, and wait while the gate is closed.

        Gradient policies: ``accumulate(dst, alpha)`` adds alpha x the gradient into dst. Delta policies: pass
        None (the update is the delta of the weights since the last upload)."""
        with self.telemetry.span("comm"):
            self.ticker.stream_wait()   # a tick may still read this step's gradients, which applying overwrites
            if not pushed:
                self.push(accumulate, compute_s)
            self._pull(block=False, until_open=None)
        self._wait_at_gate()
        with self.telemetry.span("compute"):
            self._proceed()
        self.ticker.resumed()

    def push(self, accumulate: Optional[Callable[[Any, float], None]], interval_s: float):
        """Hand this step's update to the next tick (the first half of :meth:`step`; a frontend may call it as soon
        as the update is complete, e.g. when backward ends, so that the tick runs while the rank still computes).
        ``interval_s``: the rank's step compute time, for the schedulers' predictions. inline (below): this rank
        waits for its own push's tick (no push may stay in flight), so while ticks are joined its training thread may
        send it itself (Ticker.run_inline)."""
        weight = self._push_weight()
        add = self.updates.push_function(accumulate)
        alpha = weight * self.updates.push_scale
        self.ticker.push(lambda dst: add(dst, alpha), int(interval_s * 1e9), inline=self._max_inflight() == 0)
        self._pushed(weight)

    def _push_weight(self) -> float:
        """The staleness compensation's weight of this push (1 without compensation); the push adds weight x
        updates.push_scale x the update."""
        if self.policy.compensation == "none":
            return 1.0
        return compensation_weight(self.policy.compensation,
                                   self.ticker.updates_before_next_push(self.staleness.read), self.size)

    def _pushed(self, weight: float):
        self.staleness.pushed(self.ticker.clock, weight, self.updates.holds_own_pushes)
        self.updates.pushed()
        self.pushed += 1
        self.telemetry.count("pushes")
        self._step_gate = _StepGate()
        self.policy.pushed(self.ticker.clock, self.ticker.interval_ns)

    def stream_begin(self, accumulate_range: Callable[[Any, int, int, float], None]) -> bool:
        """A streamed push (gradient policies, a frontend whose backward reports gradients as they are produced): the
        tick reads the gradient chunk by chunk while backward runs (ticker.py, stream_begin). Same update, same
        accounting as push(); the gradients must stay as they are until step() (stream_wait).

        Backward starts: announce this step's gradient; False: push it normally (ticker.stream_begin says when).
        ``accumulate_range(dst, start, stop, alpha)`` adds alpha x words [start, stop) of the gradient into dst."""
        weight = self._push_weight()
        alpha = weight * self.updates.push_scale
        if not self.ticker.stream_begin(lambda dst, start, stop: accumulate_range(dst, start, stop, alpha)):
            return False
        self._stream_weight = weight
        return True

    def stream_ready(self, start: int, stop: int):
        self.ticker.stream_ready(start, stop)

    def stream_end(self, interval_s: float):
        """The gradient is complete: it counts as this step's push (step() is then called with pushed=True)."""
        self.ticker.stream_end(int(interval_s * 1e9))
        self._pushed(self._stream_weight)

    # ---- the gate ----------------------------------------------------------------------------------------------
    def _max_inflight(self) -> int:
        return self.policy.max_inflight(self.ticker.interval_ns, self.ticker.push_latency_s)

    def _gate_input(self, inflight: int, peer_waited_s: float = 0.0) -> Gate:
        t = self.ticker
        return Gate(self.view, self.rank, t.clock, t.interval_ns, t.last_push_ns, inflight, peer_waited_s, t.now_ns())

    def _blocked_by(self) -> Optional[str]:
        """Why this rank may not start its next step: "comm" while more than max_inflight of its own pushes have
        not come back in a tick (a parameter-server worker reads weights that include its own updates; without this
        bound a fast rank would pile up gradients computed on the same stale weights), "wait" while the policy's
        rule, peer alignment or a switch of the update kind holds it for other ranks, None when it may go."""
        inflight = self._max_inflight()
        if self.ticker.clock - int(self.view.clocks[self.rank]) > inflight:
            return "comm"
        now, sg = time.monotonic(), self._step_gate
        if sg.rule_since is None:
            sg.rule_since = now
            self.policy.rule_starts(self._gate_input(inflight))
        if self.policy.waits(self._gate_input(inflight)) or self.updates.holds(self.ticker.clock, self.rank):
            return "wait"   # the policy's rule, or a switch of the update kind (engine/updates.py) holds it
        if sg.peer_since is None:
            sg.peer_since = now
        return "wait" if self.policy.waits_for_peers(self._gate_input(inflight, now - sg.peer_since)) else None

    def _wait_at_gate(self):
        """Block while the gate is closed; time blocked on own uploads is communication, the rest waiting."""
        last_progress = time.monotonic()
        while True:
            reason = self._blocked_by()
            self.ticker.gated = reason == "wait"    # no push of this rank before a tick opens the gate
            if reason is None:
                return
            _watchdog.enter(f"the {self.policy.name} gate")
            with self.telemetry.span(reason if reason == "comm" else "wait"):
                progressed = self._pull(block=True, timeout=1.0, until_open=self._holds(reason))
            if progressed:
                last_progress = time.monotonic()
            else:
                self._check_stall(last_progress, "gate")

    def _holds(self, reason: Optional[str]) -> bool:
        """Whether a rank blocked for `reason` resumes on exactly the state of the tick that opens its gate."""
        return reason == "wait" or (reason == "comm" and not self.policy.reads_fresh)

    def _proceed(self):
        """The rank starts its next step: what the policy asks first (a download), and the staleness bookkeeping."""
        decision = self.policy.proceeded(self._gate_input(self._max_inflight()))
        if isinstance(decision, Download) and self.updates.local_step:   # (weights that take every update need none)
            self._download(decision.keep_latest)
        self.updates.proceeding()
        if not self.updates.holds_own_pushes:
            self.staleness.read = self.applied_contributions   # the replica the next step computes on

    def _download(self, keep_latest: bool):
        self.updates.download(keep_latest)
        self.staleness.read = self.applied_contributions + int(keep_latest)
        self.telemetry.count("downloads")
        if keep_latest:
            self.telemetry.count("downloads_keeping_own")

    def _check_stall(self, last_progress: float, what: str):
        """Called while this rank waits with nothing delivered for a while. Ticks that stopped are an error here;
        a stall (no rank making progress for HVD_ELASTIC_STALL_TIMEOUT) is the watchdog's one rule for every
        policy (hvd_elastic/watchdog.py: it names the rank from heartbeats and ends the process), so this only
        tells it where this rank waits."""
        if self.ticker.stopped:
            raise HvdElasticError(f"ticks stopped while waiting at the {what}")
        _watchdog.enter(f"the {self.policy.name} {what}")

    # ---- pull --------------------------------------------------------------------------------------------------
    def _take(self, block: bool, timeout: Optional[float] = None):
        """Move completed ticks to the backlog; with block, first run this rank's pending push's tick itself where the
        ticker allows (Ticker.run_inline), then wait up to `timeout` for one."""
        if block:
            self.ticker.run_inline()
        self._backlog.extend(self.ticker.take(block=block, timeout=timeout))

    def _pull(self, block: bool, timeout: Optional[float] = None, until_open: Optional[bool] = False) -> int:
        """Apply completed ticks in tick order; returns how many. block: wait (up to timeout) for one when none is
        pending. until_open: stop right after the tick at which the gate opens (None: if the gate, as it stands
        when there is a tick to apply, holds the rank -- engine's module docstring)."""
        self._take(block=block and not self._backlog, timeout=timeout)
        if until_open is None and self._backlog:
            until_open = self._holds(self._blocked_by())
        applied = 0
        while self._backlog:
            if applied and until_open and self._blocked_by() is None:
                break
            self._apply(self._backlog.popleft())
            applied += 1
        return applied

    def _apply(self, tick: Tick):
        self.view.update(tick.meta)
        self.staleness.delivered(int(tick.meta[self.rank, CLOCK]), self.applied_contributions)
        if tick.update is not None:
            with self.telemetry.span("compute"):
                self.updates.apply(tick.update, tick.total_count)
            self.ticker.recycle(tick)
            self.applied_contributions += tick.total_count
            self.telemetry.count("ticks_applied")
        if self.policy.tick_applied(tick, self.view):
            self._check_replica()
        self.updates.observe(self.view, self.policy.in_lockstep, tick.index)

    def _check_replica(self):
        """At a barrier every rank's weights are identical by construction: fold a checksum of every k-th weight,
        k = ceil(size / DIGEST_WORDS) (all of a small model's), computed where the weights live."""
        k = max(1, -(-self.numel // self.DIGEST_WORDS))
        self._digest = self.buffers.fold_digest(self._digest, self.sample_params(k))

    def _wait_until(self, condition: Callable[[], bool], what: str):
        last_progress = time.monotonic()
        while not condition():
            if self._pull(block=True, timeout=1.0):
                last_progress = time.monotonic()
            elif not condition():
                self._check_stall(last_progress, what)

    def wait_for_first_update(self):
        """Block until this rank has applied a tick with an update (optimizer state exists from then on)."""
        with self.telemetry.span("wait"):
            self._wait_until(lambda: self.applied_contributions > 0, "first update")

    # ---- collective helpers ------------------------------------------------------------------------------------
    def sync_replicas(self, max_over_ranks: Callable[[int], int]):
        """Collective, finish-free: every rank applies exactly the ticks completed on any rank when it is called, so
        under the gradient policies (and auto's gradients) weights and optimizer state are identical on every rank when
        it returns.
        Pushed updates not in those ticks stay pending and are applied later, on every rank alike.
        ``max_over_ranks(n)``: the largest n of all ranks (the frontend's allgather). A no-op where replicas are not
        shared (wbsp: optimizer state is per rank by design) and once finished."""
        if self.finished or not self.updates.syncs_replicas:
            return
        with self.telemetry.span("wait"):
            completed = self.ticker.ticks          # ticks 0 .. completed-1 have completed on this rank
            self._take(block=False)
            target = max_over_ranks(completed)     # a rank completed tick target-1: every rank's thread joined it

            def taken():
                return max(completed, self._backlog[-1].index + 1 if self._backlog else 0)

            last_progress = time.monotonic()
            while taken() < target:
                before = len(self._backlog)
                self._take(block=True, timeout=1.0)
                if len(self._backlog) > before:
                    last_progress = time.monotonic()
                else:
                    self._check_stall(last_progress, "replica sync")
            while self._backlog and self._backlog[0].index < target:
                self._apply(self._backlog.popleft())
            self.staleness.read = self.applied_contributions    # the replica the next step computes on

    def waiting_outside(self, flag: bool):
        """The training thread waits in (True) or has left (False) a collective of the script's own: its tick row
        says so (OUTSIDE), so that a policy's barrier can yield to it."""
        if not self.finished:
            self.ticker.outside = flag

    def global_steps(self) -> int:
        """Steps taken by all ranks together as far as this rank knows: the others' delivered clocks plus its own."""
        return int(self.view.clocks.sum() - self.view.clocks[self.rank] + self.ticker.clock)

    # ---- end of training ---------------------------------------------------------------------------------------
    def finish(self):
        """Collective: deliver and apply every pushed update on every rank, stop the tick thread, and leave every
        rank with the same weights (for delta policies: the final global model)."""
        if self.finished:
            return
        with self.telemetry.span("wait"):
            if self.ticker.streaming:   # a backward whose step() never came: its announced gradient is pushed, as
                self.stream_end(0.0)    # a push at the end of backward would have been
            self.ticker.stream_wait()
            self.ticker.finish()
            self._wait_until(lambda: self.ticker.stopped, "final barrier")
            self._pull(block=False)
            self.ticker.join(timeout=self.stall_timeout_s)
            if self.updates.local_step:   # delta policies end on the final global model
                with self.telemetry.span("compute"):
                    self._download(False)
        self.finished = True
        self.telemetry.counters.update(self._counters())

    def abandon(self, drain: bool = False):
        """The rank set is about to change (elastic Horovod re-forms the job): stop the ticks at once, without a
        collective; drain: apply the ticks completed so far first, unless the ticks failed (where they stopped at a
        change of the rank set, those completed before the stop, on every rank). Pushes not in a completed tick are
        dropped -- on every rank alike: every rank's engine stops, and the next starts from one state broadcast to
        all."""
        if drain:   # TickerError: the ticks failed (nothing more applied), or every tick before the stop is applied
            with contextlib.suppress(TickerError):
                self._pull(block=False, until_open=False)
        self.abandoned = True
        self.ticker.abandon()

    def _counters(self) -> dict:
        out = {**self.ticker.counters(), "pushed": self.pushed, "applied_contributions": self.applied_contributions,
               **self.staleness.counters(), **self.policy.counters(), **self.updates.counters()}
        if not self.updates.local_step:
            out["max_inflight"] = self._max_inflight()
        if self.policy.has_barriers:
            out["barrier_digest"] = self.buffers.digest_value(self._digest)
        return out
