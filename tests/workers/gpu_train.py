"""Worker for tests/test_gpu.py: one policy on CUDA tensors, as a Horovod user on a GPU host writes it.

Each rank trains an MLP of about --hidden^2 x 2 parameters on cuda:<local_rank % devices> (two ranks on one GPU share
cuda:0), rank 1 slowed by --delay seconds a step. bsp: trained twice from the same start, first with
horovod.torch.DistributedOptimizer, then through the plugin; both weight vectors' hashes are written. Other policies:
--steps local steps, then finish(). PyTorch's sync debug mode is on ("warn") during the steps; every synchronizing
call is recorded with the thread and whether a frame of hvd_elastic made it, so the test can count the plugin's own.
Writes rank<r>.json.
"""
import argparse
import hashlib
import json
import os
import threading
import time
import traceback
import warnings

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde

PLUGIN_DIR = os.path.dirname(hvde.__file__).rsplit(os.sep, 1)[0]   # .../hvd_elastic


class SyncLog:
    """Every synchronizing CUDA call PyTorch warns about (set_sync_debug_mode("warn")), from any Python thread."""

    def __init__(self):
        self.calls = []
        self._show = warnings.showwarning

    def __enter__(self):
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):
                return self._show(message, category, filename, lineno, file, line)
            stack = traceback.extract_stack()[:-1]
            plugin = [f"{f.filename}:{f.lineno} {f.name}" for f in stack if f.filename.startswith(PLUGIN_DIR)]
            self.calls.append({"thread": threading.current_thread().name, "plugin": plugin[-3:],
                               "message": str(message)[:200]})

        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show


def digest(model) -> str:
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().numpy()
    return hashlib.sha256(w.tobytes()).hexdigest()


def make_model(hidden, device):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(device)


def batches(device, steps, rank, size=lambda: 64):
    """A learnable synthetic task; `size()`: this step's batch size (lbbsp: the policy's)."""
    g = torch.Generator().manual_seed(11 + rank)
    w = torch.randn(256, 10, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        x = torch.randn(size(), 256, generator=g)
        yield x.to(device), (x @ w).argmax(1).to(device)


def train(model, opt, data, delay):
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if delay:
            time.sleep(delay)
        opt.step()
        losses.append(loss.detach())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--delay", type=float, default=0.01, help="seconds slept by rank 1 each step")
    args = ap.parse_args()
    hvd.init()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    rank, policy = hvd.rank(), os.environ.get("HVD_ELASTIC_POLICY", "bsp")
    delay = args.delay if rank == 1 else 0.0
    out = {"rank": rank, "policy": policy, "device": str(device), "gpu": torch.cuda.get_device_name(device)}
    if policy == "bsp":
        ref = make_model(args.hidden, device)
        ref_opt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9),
                                           named_parameters=ref.named_parameters())
        hvd.broadcast_parameters(ref.state_dict(), root_rank=0)
        train(ref, ref_opt, list(batches(device, args.steps, rank)), delay)
        out["reference_sha256"] = digest(ref)
    model = make_model(args.hidden, device)
    out["numel"] = sum(p.numel() for p in model.parameters())
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    size = (lambda: hvde.batch_sizes(opt)[rank]) if policy == "lbbsp" else (lambda: 64)
    data = list(batches(device, args.steps, rank, size)) if policy != "lbbsp" else batches(device, args.steps, rank,
                                                                                             size)
    torch.cuda.reset_peak_memory_stats(device)
    with SyncLog() as log:    # the steps only: data made beforehand (lbbsp: its batches are sized step by step)
        losses = train(model, opt, data, delay)
    report = hvde.finish(opt)
    out["losses"] = [float(v) for v in torch.stack(losses).cpu()]
    out.update(weights_sha256=digest(model), report=report, syncs=log.calls,
               peak_gpu_mb=torch.cuda.max_memory_allocated(device) / 2**20)
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
