"""Worker: the benchmark's MNIST-1D task (1-D CNN, SGD at a Horovod user's lr --lr x ranks, momentum 0.5) under
each policy of --policies in turn (a fresh model and optimizer each, the policy as the optimizer's keyword;
wbsp-overlap: wbsp with wbsp_overlap) until a global budget of gradients, with the last rank three times slower (sleep
per sample, between forward and backward as in the benchmark). Writes per rank and policy (rank<r>.<policy>.json):
the test accuracy after finish(), a hash of the final weights and the end-of-run report (staleness included)."""
import argparse
import hashlib
import json
import os
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde
from benchmarks.mnist1d_task import torch_model


VARIANTS = {"wbsp-overlap": ("wbsp", {"wbsp_overlap": True})}


def run(name, args, data):
    policy, knobs = VARIANTS.get(name, (name, {}))
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    x_tr, y_tr, x_te, y_te = data
    model = torch_model()
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.5),
                                    named_parameters=model.named_parameters(), policy=policy, **knobs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    delay = args.sample_ms / 1000 * (3 if rank == size - 1 else 1)
    shard = torch.arange(rank, len(x_tr), size)
    g = torch.Generator().manual_seed(1000 * (args.seed + 1) + rank)
    steps = 0
    curve = []

    def test_accuracy():
        with torch.no_grad():
            return float((model(x_te).argmax(1) == y_te).float().mean())

    while hvde.global_steps(opt) < args.budget:
        for idx in shard[torch.randperm(len(shard), generator=g)].split(32):
            if len(idx) < 32 or hvde.global_steps(opt) >= args.budget:
                break
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            time.sleep(delay * len(idx))   # before backward, where a slower device spends it: before the push
            loss.backward()
            opt.step()
            steps += 1
            if args.eval_every and rank == 0 and steps % args.eval_every == 0:
                curve.append(round(test_accuracy(), 3))
    report = hvde.finish(opt)
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    acc = test_accuracy()
    for r in report["ranks"]:
        r["counters"].pop("staleness_trace", None)
    with open(os.path.join(args.out_dir, f"rank{rank}.{name}.json"), "w") as f:
        json.dump({"rank": rank, "accuracy": acc, "weights_sha256": hashlib.sha256(w.tobytes()).hexdigest(),
                   "local_steps": steps, "curve": curve, "report": report}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--data", required=True)
    ap.add_argument("--policies", default=os.environ.get("HVD_ELASTIC_POLICY", "bsp"),
                    help=f"comma list of policies or {', '.join(VARIANTS)}")
    ap.add_argument("--budget", type=int, default=2000)
    ap.add_argument("--sample-ms", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0, help="model init and data order")
    ap.add_argument("--eval-every", type=int, default=0, help="rank 0: test accuracy every N local steps (a curve)")
    ap.add_argument("--lr", type=float, default=0.025, help="per-rank learning rate (x ranks, as Horovod scales it)")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    d = np.load(args.data)
    data = [torch.from_numpy(d[k]) for k in ("x_tr", "y_tr", "x_te", "y_te")]
    for name in args.policies.split(","):
        run(name, args, data)


if __name__ == "__main__":
    main()
