"""The kinds of update a relaxed policy exchanges, one class each; a policy names its kind (``Policy.updates``)
and the engine (engine.py) holds one instance, so no code asks which kind it runs.

- :class:`GradientUpdates` (asp, ssp, dssp, zipline): each step pushes this rank's gradient / n (BSP's average:
  a tick's sum is the update as it is applied); every tick's sum is applied with the optimizer (with the tick's share
  of a round, for momentum) on every rank's replica, in tick order -- the parameter server's role, played by every
  rank, so weights and optimizer state stay identical everywhere.
- :class:`DeltaUpdates` (wbsp): each rank trains its own copy with its own optimizer (a local step, then the push)
  and pushes model deltas; the engine keeps the global model W (W += tick sum / n), which a rank downloads into its
  copy when the policy says so.

- :class:`GradientsThenDeltas` (auto): gradients while the ranks go in lock-step from the start (Horovod's
  arithmetic on one replica), deltas from the first switch to the relaxed mode on (:meth:`to_deltas`, at a tick
  every rank applies: :meth:`GradientsThenDeltas.observe`).

All work on the frontend's buffers (engine/buffers.py) and the callbacks the frontend gives the engine.
"""
from __future__ import annotations

from typing import Any, Callable, Optional


class _OneKind:
    """An update kind that never switches."""

    def observe(self, view, in_lockstep: bool, tick_index: int):
        """A tick was applied (the kind that switches decides there); nothing for a fixed kind."""

    def holds(self, clock: int, rank: int) -> bool:
        """Must this rank wait before its next push for the kind to switch? Never for a fixed kind."""
        return False

    def counters(self) -> dict:
        return {}


class GradientUpdates(_OneKind):
    """Push gradients, apply every tick with the optimizer on the shared replica."""

    local_step = False    # the frontend runs no optimizer step of its own before the push
    # weights and optimizer state are the same on every rank once every rank applied the same ticks: the engine's
    # sync_replicas (a collective, so fixed for the run) brings them there
    syncs_replicas = True
    align_peers = True    # peer alignment (HVD_ELASTIC_PEER_WAIT): equally fast ranks compute on the same replica
    holds_own_pushes = False   # a rank's weights hold its own pushes only once a tick delivers them
    global_model = None        # no global model: the replica's weights are the model's own
    streams = True             # a frontend may hand the gradient over while backward produces it
    # the lock-step fallback may measure relaxed where lock-step's own cost alone could make it pay: a relaxed phase
    # leaves the same replica and optimizer behind, and lock-step after it is BSP's again
    relax_on_cost = True

    def __init__(self, buffers, numel: int, size: int,
                 apply_gradient: Optional[Callable[[Any, float, float], None]] = None, **_):
        if apply_gradient is None:
            raise TypeError("gradient policies need apply_gradient")
        self.size, self.apply_gradient = size, apply_gradient
        # Each gradient enters the tick's sum scaled by 1 / n, folded into the push's own add, so applying a tick is
        # a plain copy into the optimizer's gradients (for n a power of two, bit for bit BSP's sum, then / n).
        self.push_scale = 1.0 / size

    def push_function(self, accumulate: Callable[[Any, float], None]) -> Callable[[Any, float], None]:
        """What the push adds into the send buffer: ``accumulate(dst, alpha)`` (alpha x this step's gradient; the
        engine's alpha already holds push_scale)."""
        return accumulate

    def pushed(self):
        pass

    def apply(self, update, count: int):
        """One optimizer step with the tick's summed gradients (`count` of them, each pushed / n); ``share`` = count
        / n is the part of a round the tick carries, from which the frontend's momentum rule
        (HVD_ELASTIC_MOMENTUM_PER) knows where rounds start."""
        self.apply_gradient(update, 1.0, count / self.size)

    def proceeding(self):
        pass

    def finish(self):
        pass


class DeltaUpdates(_OneKind):
    """Push model deltas of this rank's own copy; keep the global model and download it.

    Buffers: the global model W and ``base`` -- the weights the next delta is measured from (those of the last upload
    or download). A download reads W as it stands at the rank's step boundary (the policy decides when: once W holds
    the upload it waits for), so no second, published copy of W is kept. A step's upload adds weights - base into
    the send buffer straight from the parameters; base moves to the uploaded weights at the end of the step
    (:meth:`proceeding`), or a download in that step rewrites both. Per step 3 model-sized passes (2 for the upload,
    1 to move base); a download that keeps the rank's latest upload 3 instead of that 1. (A frontend without
    in-place access to its parameters -- TensorFlow's -- goes through read_params / write_params and one flat
    scratch buffer more.)"""

    local_step = True
    syncs_replicas = False    # optimizer state is per rank by design
    align_peers = False
    holds_own_pushes = True    # the rank's own copy holds each delta it uploads (see staleness.py)
    push_scale = 1.0           # deltas are pushed as they are; apply() averages them into W
    streams = False
    # relaxed is measured only where the ranks' compute times spread: a relaxed phase moves each rank's own copy at
    # the script's rate on its own gradients, and the run stays off BSP's path after it
    relax_on_cost = False

    def __init__(self, buffers, numel: int, size: int, read_params: Optional[Callable[[], Any]] = None,
                 write_params: Optional[Callable[[Any], None]] = None,
                 read_params_into: Optional[Callable[[Any], None]] = None,
                 add_params_into: Optional[Callable[[Any, float], None]] = None,
                 add_to_params: Optional[Callable[[Any, float], None]] = None, **_):
        if (read_params is None and read_params_into is None) or write_params is None:
            raise TypeError("delta policies need read_params (or read_params_into) and write_params")
        b = self.buffers = buffers
        self.numel, self.size, self.write_params = numel, size, write_params
        # The frontend's in-place access to its parameters where it has it (torch: no flat copy of the model), else
        # through read_params() / write_params() (a flat copy per call).
        self.read_params_into = read_params_into or (lambda buf: b.copy_(buf, read_params()))
        self.add_params_into = add_params_into or (lambda dst, alpha: b.add_(dst, read_params(), alpha))
        self.add_to_params = add_to_params or self._add_to_params_by_copy
        self._scratch = None   # _add_to_params_by_copy's
        self.global_model = b.zeros(numel)     # W, identical on every rank at start
        self.read_params_into(self.global_model)
        self.base = b.clone(self.global_model)        # what the next delta is measured from
        self._base_behind = False                      # an upload was made since base last moved

    def _add_to_params_by_copy(self, src, alpha: float):
        """add_to_params for a frontend without in-place access: through a flat scratch copy (made once)."""
        if self._scratch is None:
            self._scratch = self.buffers.zeros(self.numel)
        self.read_params_into(self._scratch)
        self.buffers.add_(self._scratch, src, alpha)
        self.write_params(self._scratch)

    def push_function(self, accumulate=None) -> Callable[[Any, float], None]:
        """The delta since the last upload (or download): weights - base, read from the parameters."""
        b, base = self.buffers, self.base

        def add_delta(dst, alpha):
            self.add_params_into(dst, alpha)
            b.add_(dst, base, -alpha)
        return add_delta

    def pushed(self):
        self._base_behind = True

    def apply(self, update, count: int):
        self.buffers.add_(self.global_model, update, 1.0 / self.size)

    def proceeding(self):
        """The step ends: the next delta is measured from the weights just uploaded (unless a download moved base)."""
        if self._base_behind:
            self.read_params_into(self.base)
            self._base_behind = False

    def download(self, keep_latest: bool = False):
        """Replace this rank's weights by the global model W.
        keep_latest: this rank's latest upload (made in this step: the weights are still the uploaded ones) is not in
        W yet (it is still on its way): keep it in the weights, which then are W + that delta (weights - base),
        instead of undoing the rank's own last step until a later download brings it back."""
        b = self.buffers
        if keep_latest:
            if not self._base_behind:
                raise RuntimeError("download(keep_latest=True) without an upload since base last moved")
            b.add_(self.base, self.global_model, -1.0)   # base - W ...
            self.add_to_params(self.base, -1.0)          # ... off the weights: W + (weights - base)
            self.read_params_into(self.base)
        else:
            self.write_params(self.global_model)
            b.copy_(self.base, self.global_model)
        self._base_behind = False

    def finish(self):
        self.download()


class GradientsThenDeltas:
    """auto's updates: :class:`GradientUpdates` until :meth:`to_deltas`, :class:`DeltaUpdates` from then on.

    While the ranks go in lock-step from the start, each round's tick sums the ranks' gradients and every rank applies
    it with its optimizer: Horovod's arithmetic, bit for bit where n is a power of two (GradientUpdates), and no model
    delta to take or global model to keep. At the first switch to the relaxed mode every rank's last gradient lands
    first, then :meth:`to_deltas` runs at the tick where they are all in, on every rank (:meth:`observe`): weights
    and optimizer state are then the same everywhere, so W and base start at them and each rank's optimizer state
    goes on as its own (wbsp's semantics). The switch is one way: lock-step after a relaxed phase uploads
    deltas (DeltaUpdates in lock-step: with SGD, BSP's step; docs/design.md, "auto")."""

    align_peers = False   # wbsp's rule: no peer alignment (and none in lock-step)
    # sync_replicas is a collective: every rank makes it, whichever side of the switch it has applied (under deltas
    # it brings every rank's W to the same ticks, which changes nothing the ranks compute on)
    syncs_replicas = True
    streams = False       # the kind of a step's push is known only when the step ends
    relax_on_cost = False  # as DeltaUpdates: the first relaxed phase ends the gradient rounds for the run

    def __init__(self, buffers, numel: int, size: int, relaxed: bool = False, **callbacks):
        """relaxed: the ranks start relaxed (no lock-step fallback: HVD_ELASTIC_RELAX_MIN_GAIN=0), deltas from the
        first push."""
        self._args, self._callbacks = (buffers, numel, size), callbacks
        self.current = GradientUpdates(buffers, numel, size, **callbacks)
        self.deltas = False
        self.first_delta = None     # per rank, the clock of its first delta push, once the switch is decided
        self.deltas_from_tick = -1  # the first tick that may carry deltas (-1: none yet)
        self.gradient_pushes = 0    # this rank's pushes of gradients
        if relaxed:
            self.to_deltas()
            self.deltas_from_tick = 0

    def to_deltas(self):
        """From the next push on, deltas: W and base from this rank's weights (those of every rank: the replica)."""
        self.current = DeltaUpdates(*self._args, **self._callbacks)
        self.deltas = True

    # what the engine and the frontends read: the current kind's
    local_step = property(lambda self: self.current.local_step)
    holds_own_pushes = property(lambda self: self.current.holds_own_pushes)
    global_model = property(lambda self: self.current.global_model)
    push_scale = property(lambda self: self.current.push_scale)

    def push_function(self, accumulate):
        return self.current.push_function(accumulate)

    def pushed(self):
        self.gradient_pushes += not self.deltas
        self.current.pushed()

    def apply(self, update, count: int):
        self.current.apply(update, count)

    def proceeding(self):
        self.current.proceeding()

    def observe(self, view, in_lockstep: bool, tick_index: int):
        """The switch, decided from the tick stream alone (so every rank makes it at the same tick). At the first
        tick after which the ranks no longer go in lock-step, rank q's pushes up to its clock in that tick + 1 are
        gradients -- in lock-step a rank has at most one push beyond its delivered clock, made before it applied this
        tick -- and from that + 2 on deltas (``first_delta``). A rank waits before its first delta push (:meth:`holds`)
        until every rank's gradients are in (or the rank finished), so that no tick sums a gradient with a delta; the
        tick where they are all in switches the kind, on every rank."""
        if self.deltas:
            return
        if self.first_delta is None:
            if in_lockstep:
                return
            self.first_delta = view.clocks + 2
        if ((view.clocks >= self.first_delta - 1) | view.finished).all():
            self.to_deltas()
            self.deltas_from_tick = tick_index + 1

    def holds(self, clock: int, rank: int) -> bool:
        """This rank's next push (clock + 1) is a delta and the kind has not switched yet."""
        return self.first_delta is not None and not self.deltas and clock + 1 >= self.first_delta[rank]

    def download(self, keep_latest: bool = False):
        """DeltaUpdates.download; nothing while gradients are pushed (every rank's weights hold every update
        applied: what W would be)."""
        if self.deltas:
            self.current.download(keep_latest)

    def finish(self):
        self.current.finish()

    def counters(self) -> dict:
        """For the report: this rank's gradient pushes, and the first tick that could carry deltas (-1: none)."""
        return {"gradient_pushes": self.gradient_pushes, "deltas_from_tick": self.deltas_from_tick}
