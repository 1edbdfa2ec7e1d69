"""One benchmark job (a rank of it): an MLP on scikit-learn's digits under one policy and one heterogeneity profile,
launched by ``python -m hvd_elastic.bench`` with mpirun or horovodrun. Not a user API.

The policy comes from HVD_ELASTIC_POLICY (set by the driver), or ``--impl horovod`` for plain
``horovod.torch.DistributedOptimizer`` (the reference; timed here with the plugin's Telemetry, the same split as
bsp). The profile's emulated slowness is injected here, the same way for every policy: after backward, a sleep of
``step_delay + sample_delay x batch`` scaled by the jitter / non-dedicated factors (hvd_elastic.emulation).

Rank 0 evaluates the test accuracy every --eval-every local steps (its own weights; under wbsp its local copy)
and writes the JSON result: the accuracy curve (wall seconds, global steps, accuracy), the final accuracy after the
final synchronization (identical weights on every rank) and the end-of-run report.
"""
import json
import os
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde
from hvd_elastic.bench.matrix import worker_arguments, worker_straggler
from hvd_elastic.telemetry import Telemetry, finish_report


def main():
    ap = worker_arguments(__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["hvd_elastic", "horovod"], default="hvd_elastic")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()
    data = np.load(args.data)
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(data[k]) for k in ("x_tr", "y_tr", "x_te", "y_te"))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.5)
    straggler = worker_straggler(args, rank, size)
    if args.impl == "horovod":
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        policy, telemetry = "horovod", Telemetry(rank, size, "horovod")
    else:
        lbbsp = os.environ.get("HVD_ELASTIC_POLICY") == "lbbsp"
        opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                        **({"global_batch": args.batch_size * size} if lbbsp else {}))
        policy, telemetry = opt._hvd_elastic.cfg.policy, None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    if policy == "lbbsp":
        sampler = hvde.LbbspSampler(len(x_tr), opt, seed=0)

        def batches():
            while True:
                for idx in sampler:
                    yield torch.as_tensor(idx)
    else:
        shard = torch.arange(rank, len(x_tr), size)

        def batches():
            g = torch.Generator().manual_seed(1000 + rank)
            while True:
                for chunk in shard[torch.randperm(len(shard), generator=g)].split(args.batch_size):
                    if len(chunk) == args.batch_size:
                        yield chunk

    def accuracy():
        with torch.no_grad():
            return float((model(x_te).argmax(1) == y_te).float().mean())

    def global_steps(local):
        # in steps of --batch-size samples (an lbbsp step of B samples counts `size` of them)
        return local * size if policy == "horovod" else hvde.global_steps(opt)

    # The curve starts at the initial accuracy (taken before the clock starts), so every run has a curve even when
    # rank 0 evaluates rarely (e.g. a short run in which the others take most of the global steps).
    curve, local = ([[0.0, 0, accuracy()]] if rank == 0 else []), 0
    hvd.allreduce(torch.zeros(1), name="bench.start")      # start together
    t0 = last_end = time.perf_counter()
    # The report measures from here, as the reference does: set-up (broadcasts, first optimizer construction) is
    # not training time.
    if telemetry is not None:
        telemetry.start = t0
    else:
        session = opt._hvd_elastic
        session.telemetry.start = session.last_step_end = t0
    for idx in batches():
        if global_steps(local) >= args.global_steps:
            break
        opt.zero_grad()
        F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
        straggler.pause(0.0, samples=len(idx))
        if telemetry is not None:
            t_step = time.perf_counter()
            opt.step()
            last = time.perf_counter()
            telemetry.add_step(t_step - last_end, last - t_step)
            last_end = last
        else:
            opt.step()
        local += 1
        if rank == 0 and local % args.eval_every == 0:
            curve.append([time.perf_counter() - t0, global_steps(local), accuracy()])
    if telemetry is not None:
        report = finish_report(telemetry, hvd.allgather_object, {"policy": "horovod"}, print_on_rank0=False)
    else:
        report = hvde.finish(opt)
    wall = time.perf_counter() - t0
    final = accuracy()
    if rank == 0:
        curve.append([wall, args.global_steps, final])
        with open(args.out, "w") as f:
            json.dump({"policy": policy, "wall_s": wall, "final_accuracy": final, "curve": curve,
                       "report": report, "local_steps": local}, f)


if __name__ == "__main__":
    main()
