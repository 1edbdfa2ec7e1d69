"""Worker: a relaxed gradient policy (HVD_ELASTIC_POLICY) with gradient clipping done the ways scripts do it, to
check where the gradient is pushed (HVD_ELASTIC_PUSH_AT_BACKWARD) and that a clipped gradient is the one applied.

--clip none:      no clipping (pushed when backward ends, from the second step on)
--clip protocol:  Horovod's protocol every step: synchronize(), clip, step() inside skip_synchronize()
--clip always:    clip_grad_norm_ after backward every step, without synchronize()
--clip late:      like always, but only from step --late-at on (after the first step pushed at backward)
--clip off:       no clipping, push_at_backward=False (the knob as the optimizer's keyword)

--clip takes a comma-separated list: the cases run one after the other in one process, each from the same start
with its own optimizer. Plain SGD (no momentum), so a gradient clipped to norm c moves the weights by at most
lr x c / n per push: writes the distance the weights travelled, the pushes, the report and a hash of the final
weights per rank and case (rank<r>.<case>.json).
"""
import argparse
import hashlib
import json
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde


def train(clip_mode, args):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    kwargs = {"push_at_backward": False} if clip_mode == "off" else {}
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                    named_parameters=model.named_parameters(), **kwargs)
    w0 = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    g = torch.Generator().manual_seed(11 + hvd.rank())
    for step in range(args.steps):
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        clip = clip_mode == "always" or (clip_mode == "late" and step >= args.late_at)
        if clip_mode == "protocol":
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
            with opt.skip_synchronize():
                opt.step()
            continue
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        opt.step()
    report = hvde.finish(opt)
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    with open(os.path.join(args.out_dir, f"rank{hvd.rank()}.{clip_mode}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "distance": float((w - w0).norm()), "report": report,
                   "weights_sha256": hashlib.sha256(w.numpy().tobytes()).hexdigest()}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--clip", default="none", help="none|protocol|always|late|off, comma-separated")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--late-at", type=int, default=5)
    ap.add_argument("--max-norm", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args()
    cases = args.clip.split(",")
    bad = [c for c in cases if c not in ("none", "protocol", "always", "late", "off")]
    if bad:
        ap.error(f"--clip: {bad} not in none|protocol|always|late|off")
    hvd.init()
    torch.set_num_threads(1)
    for clip_mode in cases:
        print(f"case {clip_mode} on rank {hvd.rank()}: start", flush=True)
        train(clip_mode, args)
        print(f"case {clip_mode} on rank {hvd.rank()}: end", flush=True)


if __name__ == "__main__":
    main()
