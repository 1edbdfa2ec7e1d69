"""Worker for tests/test_cuda_safety.py: hands Horovod's in-place broadcast a Parameter itself (as the plugin's start-up
broadcast once did), which the test guard (tests/guards/sitecustomize.py) must refuse; --detached: p.detach()."""
import sys

import horovod.torch as hvd
import torch

hvd.init()
layer = torch.nn.Linear(4, 2)
params = {n: (p.detach() if "--detached" in sys.argv else p) for n, p in layer.named_parameters()}
hvd.broadcast_parameters(params, root_rank=0)
print(f"rank {hvd.rank()}: broadcast done", flush=True)
