"""One elastic Horovod job (``horovodrun --elastic``) timing ``state.commit()``: an MLP of about --params million
parameters, SGD with momentum, TorchState(model, optimizer, batch), ``state.commit()`` every --commit-every steps (0:
never). Rank 0 prints one JSON line: the mean step time over the timed steps, and the time spent inside commit()."""
import argparse
import json
import time

import horovod.torch as hvd
import torch

import hvd_elastic.torch as hvde

ap = argparse.ArgumentParser()
ap.add_argument("--params", type=float, default=10.0, help="millions of parameters")
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--commit-every", type=int, default=1)
ap.add_argument("--impl", choices=("horovod", "hvd_elastic"), default="hvd_elastic")
args = ap.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
width = int((args.params * 1e6 / 2) ** 0.5)          # two width x width layers
model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                            torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
sgd = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
opt = (hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters()) if args.impl == "horovod"
       else hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters()))
state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0)
times = {"commit_s": 0.0, "t0": 0.0}


@hvd.elastic.run
def train(state):
    while state.batch < args.warmup + args.steps:
        if state.batch == args.warmup:
            times["t0"], times["commit_s"] = time.perf_counter(), 0.0
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(state.batch * 7 + hvd.rank()))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        state.batch += 1
        if args.commit_every and state.batch % args.commit_every == 0:
            t = time.perf_counter()
            state.commit()
            times["commit_s"] += time.perf_counter() - t


train(state)
elapsed = time.perf_counter() - times["t0"]
if args.impl == "hvd_elastic":
    hvde.finish(opt)
numel = sum(p.numel() for p in model.parameters())
if hvd.rank() == 0:
    print("ELASTIC_COMMIT " + json.dumps({"impl": args.impl, "policy": hvde.settings(opt).policy
                                          if args.impl == "hvd_elastic" else "horovod",
                                          "params_m": round(numel / 1e6, 2), "commit_every": args.commit_every,
                                          "step_s": elapsed / args.steps, "commit_s": times["commit_s"] / args.steps,
                                          "ranks": hvd.size()}), flush=True)
