"""One rank of the model-size scale benchmark (benchmarks/scale.py): a stack of Linear layers of about --params
parameters, homogeneous ranks, SGD with momentum 0.9 and lr scaled by ranks, as a Horovod user writes it.

--impl horovod: plain horovod.torch.DistributedOptimizer (the reference); --impl hvd_elastic: the plugin under
HVD_ELASTIC_POLICY. Times --steps steps after --warmup untimed ones, the plugin's finish() included in the timed
part (it is part of the job). --device cuda: the model on cuda:<local rank % devices>, peak GPU memory measured.
--delay RANK:SECONDS: that rank sleeps this long between forward and backward each step (a slower device); then
the ranks train for a global budget of steps x ranks steps (hvd_elastic.torch.global_steps) and the figure is the
job's throughput. Writes one JSON line on rank 0 with per-rank step time, peak RSS / GPU memory and bytes reduced.
"""
import argparse
import json
import resource
import time

import horovod.torch as hvd
import torch

from hvd_elastic import registry

WIDTH = {1: 512, 10: 1024, 30: 2048, 100: 4096}


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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--delay", default="", help="RANK:SECONDS slept by that rank each step (then a global budget)")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    slow_rank, delay = (int(args.delay.split(":")[0]), float(args.delay.split(":")[1])) if args.delay else (-1, 0.0)
    model, width = build(args.params)
    model = model.to(device)
    numel = sum(p.numel() for p in model.parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.001 * size, momentum=0.9)
    lbbsp = False
    if args.impl == "horovod":
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    else:
        import hvd_elastic.torch as hvde
        opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        lbbsp = hvde.settings(opt).spec.balances_batches

    def batch_of():
        return hvde.batch_sizes(opt)[rank] if lbbsp else args.batch
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator(device=device).manual_seed(rank)

    samples = [0]

    def one_step():
        b = batch_of()
        samples[0] += b
        x = torch.randn(b, width, generator=gen, device=device)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if rank == slow_rank:
            time.sleep(delay)
        loss.backward()
        opt.step()

    def global_steps(local):
        return hvde.global_steps(opt) if args.impl == "hvd_elastic" else local * size

    for _ in range(args.warmup):
        one_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    hvd.allreduce(torch.zeros(1), name="scale.start")   # every rank starts the timed part together
    samples[0] = 0
    t0 = time.perf_counter()
    local = 0
    if slow_rank < 0:
        for local in range(1, args.steps + 1):
            one_step()
    else:   # a global budget: under a relaxed policy the fast ranks take more of the steps
        budget = (args.warmup + args.steps) * size
        while global_steps(args.warmup + local) < budget:
            one_step()
            local += 1
    report = None
    if args.impl == "hvd_elastic":
        report = hvde.finish(opt)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    gpu_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    counters = report["ranks"][rank]["counters"] if report else {}
    steps = args.warmup + local
    # The engine counts what its ticks moved (whole run); plain Horovod and bsp reduce each gradient once per step,
    # lbbsp one buffer of the gradient and a 3-column metadata table (16-bit pieces) per step.
    if "bytes_reduced" in counters:
        bytes_per_step = counters["bytes_reduced"] / steps
    else:
        policy = report["policy"] if report else "horovod"
        balances = policy in registry.NAMES and registry.policy(policy).balances_batches
        bytes_per_step = 4.0 * (numel + (size * 3 * 4 if balances else 0))
    mine = {"rank": rank, "step_s": elapsed / max(local, 1), "elapsed_s": elapsed, "local_steps": local,
            "steps_total": steps,
            "samples_per_s": samples[0] / elapsed, "peak_gpu_mb": gpu_mb,
            "peak_rss_mb": rss_mb, "bytes_per_step": bytes_per_step,
            "ticks": counters.get("ticks"), "payload_collectives": counters.get("payload_collectives"),
            "buffers": counters.get("buffers_allocated"), "held_max": counters.get("held_ticks_max")}
    everyone = hvd.allgather_object(mine)
    if rank == 0:
        print("SCALE " + json.dumps({"numel": numel, "ranks": everyone}), flush=True)


if __name__ == "__main__":
    main()
