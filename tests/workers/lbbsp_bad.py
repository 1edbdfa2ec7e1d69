"""Worker for tests/test_lbbsp.py's bad-input cases: build the lbbsp optimizer and an LbbspSampler over a dataset of
TEST_DATASET_LEN samples (default 1000), take one step, and exit 0 if all of that works."""
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde

hvd.init()
model = torch.nn.Linear(4, 2)
opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
n = int(os.environ.get("TEST_DATASET_LEN", "1000"))
sampler = hvde.LbbspSampler(n, opt)
x, y = torch.randn(n, 4), torch.randint(0, 2, (n,))
for idx in sampler:
    opt.zero_grad()
    F.cross_entropy(model(x[idx]), y[idx]).backward()
    opt.step()
    break
hvde.finish(opt)
print(f"lbbsp ok on rank {hvd.rank()}: sizes={hvde.batch_sizes(opt)}", flush=True)
