"""Worker: train the same model k steps with horovod.torch.DistributedOptimizer and with
hvd_elastic.torch.DistributedOptimizer (policy bsp) from the same seed and data; write both weight sets."""
import json
import os
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde

STEPS = 12


def train(make_opt):
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))
    opt = make_opt(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(99 + hvd.rank())   # each rank its own data, as in real training
    for _ in range(STEPS):
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt, torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().astype(np.float64)


def main():
    out_dir = sys.argv[1]
    hvd.init()
    torch.set_num_threads(1)
    _, w_hvd = train(lambda o, m: hvd.DistributedOptimizer(o, named_parameters=m.named_parameters()))
    opt, w_plugin = train(lambda o, m: hvde.DistributedOptimizer(o, named_parameters=m.named_parameters()))
    report = hvde.finish(opt)
    torch.manual_seed(1234)
    init = torch.cat([p.detach().flatten() for p in torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5)).parameters()]).numpy()
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "w_hvd": w_hvd.tolist(), "w_plugin": w_plugin.tolist(),
                   "w_init": init.astype(np.float64).tolist(),
                   "report_steps": [r["steps"] for r in report["ranks"]]}, f)


if __name__ == "__main__":
    main()
