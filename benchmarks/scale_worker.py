"""One rank of the model-size scale benchmark (benchmarks/scale.py): a stack of Linear layers of about --params
parameters, homogeneous ranks, SGD with momentum 0.9 and lr scaled by ranks, as a Horovod user writes it.

--impl horovod: plain horovod.torch.DistributedOptimizer (the reference); --impl hvd_elastic: the plugin under
HVD_ELASTIC_POLICY. Times --steps steps after --warmup untimed ones, the plugin's finish() included in the timed
part (it is part of the job). Writes one JSON line on rank 0 with per-rank step time, peak RSS and bytes reduced.
"""
import argparse
import json
import resource
import time

import horovod.torch as hvd
import torch

WIDTH = {1: 512, 10: 1024, 30: 2048}


def build(params_m: int):
    """A stack of square Linear layers (width x width + width each) of about params_m million parameters."""
    w = WIDTH.get(params_m, 1024)
    depth = max(1, round(params_m * 1e6 / (w * w + w)))
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]), w


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1, help="millions of parameters (1, 10, 30)")
    ap.add_argument("--impl", choices=["hvd_elastic", "horovod"], default="hvd_elastic")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()
    model, width = build(args.params)
    numel = sum(p.numel() for p in model.parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.001 * size, momentum=0.9)
    lbbsp = False
    if args.impl == "horovod":
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    else:
        import hvd_elastic.torch as hvde
        opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        lbbsp = opt._hvd_elastic.cfg.policy == "lbbsp"

    def batch_of():
        return hvde.batch_sizes(opt)[rank] if lbbsp else args.batch
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator().manual_seed(rank)

    def one_step():
        b = batch_of()
        x = torch.randn(b, width, generator=gen)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        one_step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    report = None
    if args.impl == "hvd_elastic":
        import hvd_elastic.torch as hvde
        report = hvde.finish(opt)
    elapsed = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    counters = report["ranks"][rank]["counters"] if report else {}
    steps = args.warmup + args.steps
    # The engine counts what its ticks moved (whole run); plain Horovod and bsp reduce each gradient once per step,
    # lbbsp one buffer of the gradient and a 3-column metadata table (16-bit pieces) per step.
    if "bytes_reduced" in counters:
        bytes_per_step = counters["bytes_reduced"] / steps
    else:
        policy = report["policy"] if report else "horovod"
        bytes_per_step = 4.0 * (numel + (size * 3 * 4 if policy == "lbbsp" else 0))
    mine = {"rank": rank, "step_s": elapsed / args.steps, "peak_rss_mb": rss_mb, "bytes_per_step": bytes_per_step,
            "ticks": counters.get("ticks"), "payload_collectives": counters.get("payload_collectives"),
            "buffers": counters.get("buffers_allocated"), "held_max": counters.get("held_ticks_max")}
    everyone = hvd.allgather_object(mine)
    if rank == 0:
        print("SCALE " + json.dumps({"numel": numel, "ranks": everyone}), flush=True)


if __name__ == "__main__":
    main()
