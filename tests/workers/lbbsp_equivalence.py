"""Worker: with equal batch sizes lbbsp is Horovod. Train the same model from the same initialization over the same
data order twice -- plain horovod.torch.DistributedOptimizer fed by torch's DistributedSampler, then
hvd_elastic.torch.DistributedOptimizer(policy="lbbsp") fed by LbbspSampler (same seed) with a tolerance that keeps
the sizes equal -- and write both weight sets (as float32 bytes, hex) and lbbsp's report."""
import json
import os
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde

SAMPLES, PER_RANK, EPOCHS, SEED = 640, 16, 2, 3


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 12, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long())


def model_and_sgd():
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.9)


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()


def train(opt, model, loader, set_epoch):
    for epoch in range(EPOCHS):
        set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return flat_weights(model)


def main():
    out_dir = sys.argv[1]
    hvd.init()
    torch.set_num_threads(1)
    ds = data()

    model, sgd = model_and_sgd()
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    w_init = flat_weights(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True,
                                                  seed=SEED, drop_last=True)
    w_hvd = train(opt, model, torch.utils.data.DataLoader(ds, batch_size=PER_RANK, sampler=sampler, drop_last=True),
                  sampler.set_epoch)

    model, sgd = model_and_sgd()
    opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), policy="lbbsp",
                                    global_batch=PER_RANK * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = hvde.LbbspSampler(len(ds), opt, seed=SEED)
    w_lbbsp = train(opt, model, torch.utils.data.DataLoader(ds, batch_sampler=sampler), sampler.set_epoch)
    report = hvde.finish(opt)
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "w_hvd": w_hvd.astype(np.float32).tobytes().hex(),
                   "w_lbbsp": w_lbbsp.astype(np.float32).tobytes().hex(),
                   "moved": float(np.abs(w_hvd - w_init).max()),
                   "counters": report["ranks"][hvd.rank()]["counters"]}, f)


if __name__ == "__main__":
    main()
