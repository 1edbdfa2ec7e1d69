"""Train a small MLP on scikit-learn's digits with hvd-elastic, under the policy in HVD_ELASTIC_POLICY.

Launch (4 ranks; rank 3 an emulated straggler):

    HVD_ELASTIC_EMULATE_DELAY='*:0.005,3:0.03' horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py
    HVD_ELASTIC_EMULATE_DELAY='*:0.005,3:0.03' mpirun -np 4 python examples/torch_digits.py

Prints the test accuracy and (rank 0) each rank's compute / wait / communication time.
"""
import argparse
import json
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_elastic.torch as hvde


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16, help="per-rank batch size")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate before scaling by the number of ranks")
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--summary", default="", help="rank 0 writes accuracy, wall time and policy here as JSON")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    # Each rank trains on its own shard of the training set.
    x_tr, y_tr = torch.from_numpy(x_tr[hvd.rank()::hvd.size()]), torch.from_numpy(y_tr[hvd.rank()::hvd.size()])
    x_te, y_te = torch.from_numpy(x_te), torch.from_numpy(y_te)

    model = make_model()
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                                    momentum=args.momentum),
                                    named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    # The job is a budget of global steps (all ranks together): under bsp every rank takes the same share; under
    # the relaxed policies fast ranks take more steps than slow ones, which is where the time goes down.
    steps_per_epoch = len(x_tr) // args.batch_size
    total = args.epochs * steps_per_epoch * hvd.size()
    g = torch.Generator().manual_seed(1000 + hvd.rank())
    order, pos, next_report = torch.randperm(len(x_tr), generator=g), 0, total // args.epochs
    t0 = time.perf_counter()
    with hvde.training(opt):
        while hvde.global_steps(opt) < total:
            if pos + args.batch_size > len(order):
                order, pos = torch.randperm(len(x_tr), generator=g), 0
            idx = order[pos:pos + args.batch_size]
            pos += args.batch_size
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            if hvd.rank() == 0 and hvde.global_steps(opt) >= next_report:
                print(f"global step {hvde.global_steps(opt)}/{total}: loss {loss.item():.3f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
                next_report += total // args.epochs
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    wall = time.perf_counter() - t0
    if hvd.rank() == 0:
        print(f"test accuracy: {acc:.4f}  (policy {hvde.settings(opt).policy}, {wall:.1f} s wall)", flush=True)
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump({"accuracy": acc, "wall_s": wall, "policy": hvde.settings(opt).policy}, f)


if __name__ == "__main__":
    main()
