"""Train an MLP on scikit-learn's digits under LB-BSP: a fixed global batch, re-split every step so that slow ranks
take fewer samples and every rank finishes the step together.

Launch (4 ranks; rank 3 three times slower per sample, emulated by a sleep):

    HVD_ELASTIC_POLICY=lbbsp HVD_ELASTIC_GLOBAL_BATCH=64 \\
    HVD_ELASTIC_EMULATE_SAMPLE_DELAY='*:0.0005,3:0.0015' mpirun -np 4 python examples/torch_lbbsp.py

The same job under bsp (even split of 16 samples a rank, so the same per-sample costs are per-step delays):

    HVD_ELASTIC_POLICY=bsp HVD_ELASTIC_EMULATE_DELAY='*:0.008,3:0.024' mpirun -np 4 python examples/torch_lbbsp.py

Prints each epoch's time, the batch sizes reached, the test accuracy and (rank 0) each rank's compute / wait /
communication time.
"""
import argparse
import os
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_elastic.torch as hvde


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=64, help="B, if HVD_ELASTIC_GLOBAL_BATCH is not set")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--momentum", type=float, default=0.5)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    train = torch.utils.data.TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr))
    x_te, y_te = torch.from_numpy(x_te), torch.from_numpy(y_te)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    # global_batch= is only a default here: HVD_ELASTIC_GLOBAL_BATCH, if set, must agree (keywords win).
    B = int(os.environ.get("HVD_ELASTIC_GLOBAL_BATCH", args.global_batch))
    policy = os.environ.get("HVD_ELASTIC_POLICY", "bsp").lower()
    extra = {"global_batch": B} if policy == "lbbsp" else {}
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum),
                                    named_parameters=model.named_parameters(), **extra)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    if policy == "lbbsp":
        # One shared shuffled order per epoch; rank p takes b_p of each step's B samples.
        sampler = hvde.LbbspSampler(len(train), opt, seed=0)
        loader = torch.utils.data.DataLoader(train, batch_sampler=sampler)
    else:
        # The usual Horovod recipe: a shard per rank, B / n samples a rank per step.
        sampler = torch.utils.data.distributed.DistributedSampler(train, hvd.size(), hvd.rank(), seed=0,
                                                                  drop_last=True)
        loader = torch.utils.data.DataLoader(train, batch_size=B // hvd.size(), sampler=sampler, drop_last=True)

    t0 = time.perf_counter()
    with hvde.training(opt):
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            t_epoch = time.perf_counter()
            for xb, yb in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            if hvd.rank() == 0:
                sizes = hvde.batch_sizes(opt) if policy == "lbbsp" else [B // hvd.size()] * hvd.size()
                print(f"epoch {epoch}: loss {loss.item():.3f}, {time.perf_counter() - t_epoch:.2f} s, "
                      f"batch sizes {sizes}", flush=True)
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    if hvd.rank() == 0:
        print(f"test accuracy: {acc:.4f}  (policy {policy}, global batch {B}, "
              f"{time.perf_counter() - t0:.1f} s wall)", flush=True)


if __name__ == "__main__":
    main()
