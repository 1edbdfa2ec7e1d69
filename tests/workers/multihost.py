"""Worker for tests/test_multihost.py: on a cluster of hosts (ci/cluster.sh), train a small model under each policy in
turn in one job (the policy passed as the keyword argument, which wins over HVD_ELASTIC_POLICY), rank 1 slower, with
a collective of the script's own between steps. Rank 0 writes <out>/multihost.json: every rank's host name, and per
policy every rank's final-weights hash, steps and report counters.
"""
import argparse
import hashlib
import json
import os
import socket
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde


def train(policy: str, steps: int, delay: float):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    knobs = {"global_batch": 16 * hvd.size()} if policy == "lbbsp" else {}
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                    named_parameters=model.named_parameters(), policy=policy, **knobs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    w = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        b = hvde.batch_sizes(opt)[hvd.rank()] if policy == "lbbsp" else 16
        x = torch.randn(b, 32, generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), (x @ w).argmax(1)).backward()
        if delay:
            time.sleep(delay)
        opt.step()
        if step % 10 == 9:
            hvd.allreduce(torch.ones(1))      # an unnamed collective of the script's own
    report = hvde.finish(opt)
    digest = hashlib.sha256(torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes())
    return {"weights": digest.hexdigest(), "counters": report["ranks"][hvd.rank()]["counters"],
            "steps": report["ranks"][hvd.rank()]["steps"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--policies", default="bsp,asp,ssp,dssp,zipline,wbsp,lbbsp")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    delay = 0.02 if hvd.rank() == 1 else 0.002
    mine = {"host": socket.gethostname(), "policies": {}}
    for policy in args.policies.split(","):
        mine["policies"][policy] = train(policy, args.steps, delay)
        print(f"multihost: rank {hvd.rank()} on {mine['host']}: {policy} done", flush=True)
    everyone = hvd.allgather_object(mine, name="multihost.result")
    if hvd.rank() == 0:
        with open(os.path.join(args.out_dir, "multihost.json"), "w") as f:
            json.dump(everyone, f)


if __name__ == "__main__":
    main()
