"""Worker: build hvd_elastic.torch.DistributedOptimizer under the given environment and exit 0 if it works.

TEST_RANK_ENV='1:HVD_ELASTIC_POLICY=ssp' sets a variable on one rank only (to make ranks disagree)."""
import os
import sys

import horovod.torch as hvd
import torch

import hvd_elastic.torch as hvde

hvd.init()
for item in filter(None, os.environ.get("TEST_RANK_ENV", "").split(";")):
    rank, _, assignment = item.partition(":")
    if int(rank) == hvd.rank():
        name, _, value = assignment.partition("=")
        os.environ[name] = value
kwargs = {}
if os.environ.get("TEST_KWARG_POLICY"):
    kwargs["policy"] = os.environ["TEST_KWARG_POLICY"]
model = torch.nn.Linear(4, 2)
opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters(), **kwargs)
hvde.finish(opt)
print(f"config ok on rank {hvd.rank()}: policy={hvde.settings(opt).policy}", flush=True)
sys.exit(0)
