"""The PyTorch side of the data plane: flat update buffers as torch tensors on the parameters' device, and the
trainable parameters' fixed layout inside them (see hvd_elastic/engine/buffers.py for the contract).

Gradients go from ``p.grad`` into the pending buffer with one fused ``torch._foreach_add_`` (no copy out, no numpy),
Horovod reduces the buffer where it lives (CPU or CUDA), and a tick's sum reaches the optimizer written in place
into the parameters' own ``.grad`` tensors (this rank's gradient is in the update buffer by then): nothing
model-sized is allocated per push, per tick or per apply, and applying keeps no model-sized buffer of its own.
"""
from __future__ import annotations

import contextlib
import zlib
from typing import List

import horovod.torch as hvd
import numpy as np
import torch

from ..errors import ConfigError


class TorchBuffers:
    """Flat buffers as 1-D torch tensors of one dtype on one device. On CUDA, hand-overs between threads are ordered
    with events on the device (fence / after) and a tick's collectives run on the device's default stream
    (collective_scope): no host synchronization."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, torch.device(device)
        self.host_resident = self.device.type == "cpu"
        self._digest_weights = {}   # n -> the multipliers of fold_digest on the device

    def host_twin(self) -> "TorchBuffers":
        return self if self.host_resident else TorchBuffers(self.dtype, torch.device("cpu"))

    def fence(self):
        if self.device.type != "cuda":
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def after(self, fence) -> None:
        if fence is not None:
            torch.cuda.current_stream(self.device).wait_event(fence)

    @contextlib.contextmanager
    def collective_scope(self):
        if self.device.type != "cuda":
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(torch.cuda.default_stream(self.device)):
            yield

    def fold_digest(self, acc, sample: torch.Tensor):
        """An integer checksum of the sample's bits, computed and kept on the sample's device (exact: integer sums
        do not depend on the order of summation), so a replica check reads nothing back until digest_value."""
        if sample.device.type == "cpu":
            return zlib.crc32(np.ascontiguousarray(sample.numpy()), acc or 0)
        bits = sample.detach().contiguous().view(_SAME_SIZE_INT[sample.element_size()]).to(torch.int64)
        w = self._digest_weights.get(bits.numel())
        if w is None:
            w = self._digest_weights[bits.numel()] = \
                torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device) * 2654435761
        h = (bits * w).sum()
        return h if acc is None else acc * 1000003 + h

    def digest_value(self, acc) -> int:
        return int(acc.item()) if isinstance(acc, torch.Tensor) else int(acc or 0)

    def zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=self.dtype, device=self.device)

    def zero_(self, buf: torch.Tensor):
        buf.zero_()

    def add_(self, dst: torch.Tensor, src: torch.Tensor, alpha: float = 1.0):
        dst.add_(src, alpha=alpha)

    def copy_(self, dst: torch.Tensor, src: torch.Tensor):
        dst.copy_(src)

    def clone(self, src: torch.Tensor) -> torch.Tensor:
        return src.detach().clone()

    def head(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        return buf[:n]

    def view(self, buf: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return buf[start:stop]

    def set_words(self, buf: torch.Tensor, offset: int, words: np.ndarray):
        buf[offset:offset + len(words)].copy_(torch.from_numpy(words))

    def get_words(self, buf: torch.Tensor, offset: int, n: int) -> np.ndarray:
        return buf[offset:offset + n].cpu().numpy()

    def numpy(self, buf: torch.Tensor) -> np.ndarray:
        return buf.detach().cpu().numpy()

    def nbytes(self, buf: torch.Tensor) -> int:
        return buf.numel() * buf.element_size()


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class FlatParams:
    """Fixed layout of the trainable parameters in one flat buffer (same order on every rank)."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ConfigError(f"relaxed policies need one parameter dtype, got {sorted(map(str, dtypes))}")
        devices = {p.device for p in self.params}
        if len(devices) > 1:
            raise ConfigError(f"relaxed policies need every trainable parameter on one device, got "
                              f"{sorted(map(str, devices))}")
        self.torch_dtype = next(iter(dtypes), torch.float32)
        self.device = next(iter(devices), torch.device("cpu"))
        self.dtype = {torch.float64: np.float64}.get(self.torch_dtype, np.float32)   # the numpy twin (lbbsp)
        self.buffers = TorchBuffers(self.torch_dtype, self.device)
        self.slices = []
        off = 0
        for p in self.params:
            self.slices.append((p, off, p.numel()))
            off += p.numel()
        self.numel = off
        self._grad = None        # fallback .grad storage for parameters without a gradient (made once, if ever)
        self._weights = None     # scratch for read_params (delta policies)
        self.ready_events = None   # CUDA: per parameter, the event of its gradient's production (streamed push)
        self.index = {id(p): i for i, p in enumerate(self.params)}

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        return [flat[off:off + n].view_as(p) for p, off, n in self.slices]

    # ---- engine callbacks (torch tensors) ------------------------------------------------------------------------
    def accumulate_range(self, dst: torch.Tensor, start: int, stop: int, alpha: float):
        """dst += alpha x words [start, stop) of this rank's flat gradient (dst: a view of that range). Called by the
        tick thread during backward (a streamed push) for words whose parameters' gradients are final: on CUDA it
        first orders its stream after the events recorded when those gradients were produced (mark_ready)."""
        with torch.no_grad():
            for i, (p, off, n) in enumerate(self.slices):
                lo, hi = max(off, start), min(off + n, stop)
                if lo >= hi or p.grad is None:
                    continue
                ev = self.ready_events[i] if self.ready_events is not None else None
                if ev is not None:
                    torch.cuda.current_stream(self.device).wait_event(ev)
                dst[lo - start:hi - start].add_(p.grad.detach().reshape(-1)[lo - off:hi - off], alpha=alpha)

    def mark_ready(self, index: int):
        """Parameter `index`'s gradient was just produced (its post-accumulate-grad hook): on CUDA, record where."""
        if self.device.type == "cuda":
            if self.ready_events is None:
                self.ready_events = [None] * len(self.slices)
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.ready_events[index] = ev

    def accumulate_gradients(self, dst: torch.Tensor, alpha: float):
        """dst += alpha x this rank's gradients (parameters without a gradient add nothing)."""
        pairs = [(v, p.grad) for v, (p, _, _) in zip(self.views(dst), self.slices) if p.grad is not None]
        if pairs:
            dsts, grads = zip(*pairs)
            torch._foreach_add_(list(dsts), [g.detach() for g in grads], alpha=alpha)

    def load_gradient(self, update: torch.Tensor, scale: float):
        """p.grad = scale x update, written in place into the gradient tensors backward made (this rank's own gradient
        has been pushed by then: the update buffer holds its copy), so applying a tick allocates nothing and keeps no
        model-sized buffer of its own. A parameter without a dense gradient of its own shape (None after
        zero_grad(set_to_none=True), e.g. at finish()) gets a slice of one preallocated buffer, made once."""
        dsts, srcs = [], []
        for i, ((p, _, _), src) in enumerate(zip(self.slices, self.views(update))):
            g = p.grad
            if g is None or g.is_sparse or g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
                if self._grad is None:
                    self._grad = torch.empty(self.numel, dtype=self.torch_dtype, device=self.device)
                    self._grad_views = self.views(self._grad)
                g = p.grad = self._grad_views[i]
            dsts.append(g)
            srcs.append(src)
        with torch.no_grad():
            if scale == 1.0:
                torch._foreach_copy_(dsts, srcs)
            else:   # one pass per tensor (a copy, then a multiply in place, would read and write it twice)
                for g, src in zip(dsts, srcs):
                    torch.mul(src, scale, out=g)

    def weights(self) -> torch.Tensor:
        """The weights as one flat tensor (a scratch buffer, overwritten by the next call)."""
        if self._weights is None:
            self._weights = torch.empty(self.numel, dtype=self.torch_dtype, device=self.device)
        self.weights_into(self._weights)
        return self._weights

    def weights_into(self, out: torch.Tensor):
        """Copy the weights into the flat tensor `out` (a buffer of the engine's: no scratch copy of the model)."""
        with torch.no_grad():
            torch._foreach_copy_(self.views(out), [p.detach() for p in self.params])

    def sample_weights(self, k: int) -> torch.Tensor:
        """Every k-th weight of the flat layout (weights()[::k]), on the parameters' device, read from the parameters
        themselves: no flat copy of the model (zipline's replica check at each barrier, TorchBuffers.fold_digest)."""
        with torch.no_grad():
            parts = [p.detach().reshape(-1)[(-off) % k::k] for p, off, n in self.slices if (-off) % k < n]
            return torch.cat(parts) if parts else torch.zeros(0, dtype=self.torch_dtype, device=self.device)

    def broadcast_weights(self, root_rank: int):
        """Collective: every rank's weights become the root's. The parameters go to Horovod's in-place broadcast
        detached: on a GPU without GPU collectives Horovod copies the result back with autograd on, which refuses
        a tensor that requires grad."""
        hvd.broadcast_parameters({f"p{i}": p.detach() for i, p in enumerate(self.params)}, root_rank=root_rank)

    def set_weights(self, w: torch.Tensor):
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.views(w))

    def add_weights_into(self, dst: torch.Tensor, alpha: float):
        """dst += alpha x the weights (a flat buffer of the engine's), read from the parameters themselves."""
        with torch.no_grad():
            torch._foreach_add_(self.views(dst), [p.detach() for p in self.params], alpha=alpha)

    def add_to_weights(self, src: torch.Tensor, alpha: float):
        """The weights += alpha x src (a flat buffer), in place in the parameters."""
        with torch.no_grad():
            torch._foreach_add_(self.params, self.views(src), alpha=alpha)

    # ---- numpy (lbbsp's exchange buffer) --------------------------------------------------------------------------
    def gradients(self) -> np.ndarray:
        out = np.zeros(self.numel, self.dtype)
        for p, off, n in self.slices:
            if p.grad is not None:
                out[off:off + n] = p.grad.detach().reshape(-1).to("cpu", copy=False).numpy()
        return out

    def set_gradients(self, g: np.ndarray):
        for p, off, n in self.slices:
            p.grad = torch.from_numpy(g[off:off + n]).view_as(p).to(p.device, p.dtype)
