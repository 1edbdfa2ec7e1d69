"""Push at the end of backward (HVD_ELASTIC_PUSH_AT_BACKWARD, relaxed gradient policies).

Horovod starts its allreduce from per-parameter backward hooks, so the exchange runs while the rank still computes
(the rest of backward, anything before step()). A relaxed rank's tick can do the same: the push only needs the
whole gradient, which exists once every trainable parameter's ``.grad`` has been accumulated in this step's
backward. ``BackwardPush`` registers a post-accumulate-grad hook per parameter; when the last one fires, it pushes
(``Session.push``) and step() only pulls and gates.

Pushing early is only right if the gradient does not change after backward. A script may change it -- Horovod's
protocol for clipping (``optimizer.synchronize()``, clip, ``with optimizer.skip_synchronize(): optimizer.step()``),
clipping without it, a second backward pass before step() -- and then the gradient to push is the one step() sees.
The first complete step is watched, not pushed early: if the gradients changed after backward (another tensor or
an in-place change: the version counter moved), synchronize() was called, or a gradient arrived twice, this
optimizer pushes at step() for the rest of the run. Later, a step that changes its gradients after they were pushed
is an error (one line, naming the parameter and the knob), never a silently dropped change.
"""
from __future__ import annotations

from ..errors import HvdElasticError

WATCHING, ON, OFF = "watching", "on", "off"


class BackwardPush:
    """Per-parameter hooks that push a step's gradient when backward has produced all of it."""

    def __init__(self, flat, session, names, enabled: bool):
        self.flat, self.session, self.names = flat, session, names
        self.mode = WATCHING if enabled and flat.params else OFF
        self._reset()
        self._handles = ([p.register_post_accumulate_grad_hook(self._arrived) for p in flat.params]
                         if self.mode != OFF else [])

    def _reset(self):
        self._seen = set()
        self._twice = False
        self._marks = None       # (grad tensor, its version) per parameter once backward produced all of them
        self.pushed = False
        self.streaming = False   # this step's gradient is streamed to the tick as backward produces it

    def _arrived(self, p):
        engine = self.session.engine
        if engine is None or engine.finished:
            self.remove()
            return
        if id(p) in self._seen:
            self._twice = True
            return
        if self.mode == ON and not self._seen:        # backward starts: emulated delay, then stream if the engine
            self.session.emulate_early()               # takes it (the gradient is pushed at the end of backward)
            self.streaming = self.session.stream_begin(self.flat.accumulate_range)
        self._seen.add(id(p))
        if self.streaming:
            i = self.flat.index[id(p)]
            self.flat.mark_ready(i)
            _, off, n = self.flat.slices[i]
            engine.stream_ready(off, off + n)
        if len(self._seen) < len(self.flat.params):
            return
        grads = [q.grad for q in self.flat.params]
        if any(g is None or g.is_sparse for g in grads):
            return                                    # pushed (or refused) by step()
        self._marks = [(g, g._version) for g in grads]
        if self.mode == ON:
            if self.streaming:
                self.session.stream_end()
            else:
                self.session.push(self.flat.accumulate_gradients)
            self.session.telemetry.count("backward_pushes")
            self.pushed = True

    def synchronize_called(self):
        """optimizer.synchronize(): the script is about to change the gradients."""
        if self.pushed:
            raise HvdElasticError(
                f"policy {self.session.cfg.policy}: optimizer.synchronize() after this step's gradient was pushed at "
                f"the end of backward (HVD_ELASTIC_PUSH_AT_BACKWARD=1, and the script did not call synchronize() in "
                f"its first step): set HVD_ELASTIC_PUSH_AT_BACKWARD=0 to push at step(), after the change")

    def settle(self, synchronized: bool) -> bool:
        """At step(), after any closure ran backward: whether this step's gradient was already pushed. Decides the
        mode after the first complete step and refuses a gradient changed after it was pushed."""
        try:
            if self.streaming and not self.pushed:
                # Backward left a parameter without a dense gradient: the stream ends here, with what exists
                # (step() refuses a sparse one, as it does for any push).
                self.session.stream_end()
                self.pushed = True
            changed = self._changed(synchronized)
            if self.mode == WATCHING and self._marks is not None:
                self.mode = OFF if changed else ON
                if changed:
                    self.remove()
            elif self.pushed and changed:
                raise HvdElasticError(
                    f"policy {self.session.cfg.policy}: {changed} after this step's gradient was pushed at the end of "
                    f"backward (HVD_ELASTIC_PUSH_AT_BACKWARD=1): change gradients only between "
                    f"optimizer.synchronize() and step() from the first step on, or set HVD_ELASTIC_PUSH_AT_BACKWARD=0")
            return self.pushed
        finally:
            self._reset()

    def _changed(self, synchronized: bool) -> str:
        if synchronized:
            return "optimizer.synchronize() was called"
        if self._twice:
            return "a gradient was accumulated twice before step()"
        for (g, version), p in zip(self._marks or (), self.flat.params):
            if p.grad is not g or g._version != version:
                return f"the gradient of parameter {self.names.get(p, '?')!r} changed after backward"
        return ""

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
