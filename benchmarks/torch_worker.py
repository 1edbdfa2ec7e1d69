"""One benchmark job (a rank of it): a model of the chosen task (--task digits: an MLP on scikit-learn's digits;
--task mnist1d: a 1-D CNN on MNIST-1D) under one policy and one heterogeneity profile, launched by
``python -m benchmarks`` with mpirun or horovodrun. Not a user API.

The policy comes from HVD_ELASTIC_POLICY (set by the driver), or ``--impl horovod`` for plain
``horovod.torch.DistributedOptimizer`` (the reference; timed here with the plugin's Telemetry, the same split as bsp).
The optimizer is what a Horovod user writes: SGD(lr = per-rank lr x ranks, momentum). --seed sets the model's
initialization and the batch order (the data set is fixed): torch's DistributedSampler for every policy but lbbsp,
whose LbbspSampler draws the same permutation, so at equal batch sizes every arm of a seed sees the same batches. The
profile's emulated slowness is injected here, the same way for every policy: between forward and backward (before the
gradient exists, so before a push at the end of backward), a sleep of ``step_delay + sample_delay x batch`` scaled by
the jitter / non-dedicated factors (hvd_elastic.emulation).

Evaluation is kept out of the timed loop: every --eval-every local steps rank 0 only takes a snapshot (a copy of the
flat trainable parameters, the wall time and the global step; under wbsp the global model W instead of its
local copy), and evaluates the snapshots after training and finish(). It writes the JSON result: the accuracy curve
(wall seconds, global steps, accuracy) from the initial model (0 s, step 0) to the final one after the final
synchronization (identical weights on every rank), and the end-of-run report.
"""
import json
import os
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde
from benchmarks.matrix import worker_arguments, worker_straggler
from hvd_elastic import registry
from hvd_elastic.torch.attached import state_of
from hvd_elastic.telemetry import Telemetry, finish_report


def build_model(task: str) -> torch.nn.Module:
    if task == "mnist1d":
        from benchmarks.mnist1d_task import torch_model
        return torch_model()
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 10))


def slim_report(report):
    """The report without the per-rank staleness traces (1000 clocks per rank: results.json would grow by MBs)."""
    for r in report.get("ranks", []):
        r.get("counters", {}).pop("staleness_trace", None)
    return report


def main():
    ap = worker_arguments(__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["hvd_elastic", "horovod"], default="hvd_elastic")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    data = np.load(args.data)
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(data[k]) for k in ("x_tr", "y_tr", "x_te", "y_te"))
    model = build_model(args.task)
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    straggler = worker_straggler(args, rank, size)
    if args.impl == "horovod":
        # BENCH_GRADIENT_PREDIVIDE_FACTOR: the matrix's control cell (matrix.py, CONTROLS)
        predivide = float(os.environ.get("BENCH_GRADIENT_PREDIVIDE_FACTOR", "1"))
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                       gradient_predivide_factor=predivide)
        policy, telemetry = "horovod", Telemetry(rank, size, "horovod")
    else:
        lbbsp = registry.policy(os.environ.get("HVD_ELASTIC_POLICY", registry.DEFAULT)).balances_batches
        opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                        **({"global_batch": args.batch_size * size} if lbbsp else {}))
        policy, telemetry = hvde.settings(opt).policy, None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    spec = registry.policy(policy) if policy in registry.NAMES else None
    if spec is not None and spec.balances_batches:
        sampler = hvde.LbbspSampler(len(x_tr), opt, seed=args.seed)

        def batches():
            while True:
                for idx in sampler:
                    yield torch.as_tensor(idx)
    else:
        # A Horovod user's sampler. LbbspSampler draws the same permutation, so at equal batch sizes every policy
        # sees the same global batches in the same order.
        sampler = torch.utils.data.DistributedSampler(range(len(x_tr)), num_replicas=size, rank=rank,
                                                      shuffle=True, seed=args.seed, drop_last=True)

        def batches():
            epoch = 0
            while True:
                sampler.set_epoch(epoch)
                for chunk in torch.tensor(list(sampler)).split(args.batch_size):
                    if len(chunk) == args.batch_size:
                        yield chunk
                epoch += 1

    def global_steps(local):
        # in steps of --batch-size samples (an lbbsp step of B samples counts `size` of them)
        return local * size if policy == "horovod" else hvde.global_steps(opt)

    updates = state_of(opt).session.engine.updates if spec is not None and spec.deltas else None

    def weights():
        # under deltas the global model W the ranks download (trainable parameters flattened in model.parameters()
        # order; every tick updates it in place, the copy keeps this snapshot's values); auto has W only once its
        # updates are deltas
        if updates is not None and updates.global_model is not None:
            return updates.global_model.detach().to(torch.float32).clone()
        return torch.cat([p.detach().reshape(-1) for p in params])

    def accuracy():
        with torch.no_grad():
            return float((model(x_te).argmax(1) == y_te).float().mean())

    # The curve starts at the initial model (taken before the clock starts), so every run has a curve even when
    # rank 0 snapshots rarely (e.g. a short run in which the others take most of the global steps).
    snaps, local = ([(0.0, 0, weights())] if rank == 0 else []), 0
    hvd.allreduce(torch.zeros(1), name="bench.start")      # start together
    t0 = last_end = time.perf_counter()
    # The report measures from here, as the reference does: set-up (broadcasts, first optimizer construction) is
    # not training time.
    if telemetry is not None:
        telemetry.restart(t0)
    else:
        session = state_of(opt).session
        session.telemetry.restart(t0)
        session.last_step_end = t0
    for idx in batches():
        if global_steps(local) >= args.global_steps:
            break
        opt.zero_grad()
        loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
        # The emulated compute goes between forward and backward, where a slower device spends it: a gradient
        # pushed at the end of backward (the relaxed policies' default) is then as old as a real slow step's, and
        # nothing after the push hides the tick. Slept after backward, i.e. after that push, it would hide the wait
        # for the own tick and keep a straggler's gradients as fresh as a fast rank's.
        straggler.pause(0.0, samples=len(idx))
        loss.backward()
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
            snaps.append((time.perf_counter() - t0, global_steps(local), weights()))
    if telemetry is not None:
        report = finish_report(telemetry, hvd.allgather_object, {"policy": "horovod"}, print_on_rank0=False)
    else:
        report = hvde.finish(opt)
    wall = time.perf_counter() - t0
    if rank == 0:
        final = accuracy()            # the weights after the final synchronization (every rank's)
        finite = bool(torch.isfinite(torch.cat([p.detach().reshape(-1) for p in params])).all())
        curve = []
        for t, steps, w in snaps:     # evaluated now, outside the timed loop
            torch.nn.utils.vector_to_parameters(w, params)
            curve.append([t, steps, accuracy()])
        # the job's real gradient count after finish(): a relaxed rank checks the budget against its own view, so
        # each of the others may take one step past it
        curve.append([wall, global_steps(local), final])
        with open(args.out, "w") as f:
            json.dump({"policy": policy, "wall_s": wall, "final_accuracy": final, "curve": curve,
                       "report": slim_report(report), "local_steps": local, "seed": args.seed,
                       "finite_weights": finite}, f)


if __name__ == "__main__":
    main()
