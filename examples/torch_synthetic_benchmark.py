"""Horovod's PyTorch synthetic benchmark, run by hvd-elastic under the policy in HVD_ELASTIC_POLICY (any of them).

The shape of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py (same flags, same output lines) with a small
CNN on 32x32 synthetic images instead of torchvision's ResNet-50 on 224x224, so that it runs on a CPU in seconds.

    HVD_ELASTIC_POLICY=bsp horovodrun -np 2 -H localhost:2 --gloo python examples/torch_synthetic_benchmark.py
    HVD_ELASTIC_POLICY=asp mpirun -np 2 python examples/torch_synthetic_benchmark.py
    HVD_ELASTIC_POLICY=lbbsp mpirun -np 2 python examples/torch_synthetic_benchmark.py   # B = 2 x --batch-size

Under lbbsp each step's batch on a rank has the size the policy gives it (``hvd_elastic.torch.batch_sizes``);
the global batch B is HVD_ELASTIC_GLOBAL_BATCH if set, else --batch-size x ranks, and img/sec counts the images a
rank actually took. ``--fp16-allreduce`` (Horovod's fp16 compression) works under bsp; the other policies refuse it
with one line. Prints, on rank 0, rank 0's img/sec for each iteration, the plugin's end-of-run report, then
"Img/sec per rank: mean +-1.96 std" (averaged over the ranks) and the total over ranks (the sum of their means).
"""
import argparse
import os
import timeit

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import hvd_elastic.torch as hvde

MODELS = ("cnn", "mlp")


def make_model(name, image_size, num_classes):
    """A small model defined here (torchvision is not a dependency): 'cnn' (two conv blocks) or 'mlp'."""
    nn = torch.nn
    if name == "cnn":
        flat = 16 * (image_size // 4) ** 2
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, num_classes))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size ** 2, 256), nn.ReLU(),
                             nn.Linear(256, num_classes))
    raise ValueError(f"--model must be one of {MODELS}, got {name!r}")


def main():
    ap = argparse.ArgumentParser(description="PyTorch synthetic benchmark (hvd-elastic)",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce (Horovod's; policy bsp only)")
    ap.add_argument("--model", default="cnn", choices=MODELS, help="model to benchmark")
    ap.add_argument("--batch-size", type=int, default=32,
                    help="input batch size per rank (lbbsp: the mean share of the global batch)")
    ap.add_argument("--image-size", type=int, default=32, help="side of the synthetic square RGB images")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count towards benchmark")
    ap.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
    ap.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(hvd.rank())        # different on purpose: the broadcast below makes the weights equal

    model = make_model(args.model, args.image_size, args.num_classes)
    policy = os.environ.get("HVD_ELASTIC_POLICY", "bsp").strip().lower()
    extra = {}
    global_batch = args.batch_size * hvd.size()
    if policy == "lbbsp":
        # A fixed global batch, re-split every step; HVD_ELASTIC_GLOBAL_BATCH, if set, wins (and must agree).
        global_batch = int(os.environ.get("HVD_ELASTIC_GLOBAL_BATCH") or global_batch)
        extra["global_batch"] = global_batch

    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod's call with the one-line swap; a relaxed policy refuses fp16 compression here with one line.
    optimizer = hvde.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                          compression=compression, **extra)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Fixed fake data, as many images as the largest batch a rank may get.
    most = global_batch if policy == "lbbsp" else args.batch_size
    data = torch.randn(most, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (most,))
    images = [0]                          # images this rank has taken so far

    def benchmark_step():
        b = hvde.batch_sizes(optimizer)[hvd.rank()] if policy == "lbbsp" else args.batch_size
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data[:b]), target[:b])
        loss.backward()
        optimizer.step()
        images[0] += b

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}" + (f" (lbbsp: global batch {global_batch})" if policy == "lbbsp" else ""))
    log(f"Number of CPUs (ranks): {hvd.size()}")
    log(f"Policy: {hvde.settings(optimizer).policy}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        before = images[0]
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = (images[0] - before) / elapsed
        log(f"Iter #{i}: {img_sec:.1f} img/sec per rank (rank 0)")
        img_secs.append(img_sec)

    # Required under the relaxed policies: every pushed update delivered, identical weights, the report (rank 0).
    hvde.finish(optimizer)

    # Results. Ranks may differ (lbbsp's batch sizes, a relaxed policy's waits), so every rank's figures count:
    # per rank = the mean over ranks of each rank's mean (+- the mean of their 1.96 std), total = the sum.
    per_rank = hvd.allgather_object((float(np.mean(img_secs)), float(1.96 * np.std(img_secs))))
    means, confs = [m for m, _ in per_rank], [c for _, c in per_rank]
    log(f"Img/sec per rank: {np.mean(means):.1f} +-{np.mean(confs):.1f}")
    log(f"Total img/sec on {hvd.size()} ranks: {sum(means):.1f} +-{sum(confs):.1f}")
    if policy == "lbbsp":
        taken = hvd.allgather_object(images[0])     # every step, warm-up included: B a step over the ranks
        log(f"lbbsp: global batch {global_batch}, last batch sizes {hvde.batch_sizes(optimizer)}, "
            f"images taken {taken}")


if __name__ == "__main__":
    main()
