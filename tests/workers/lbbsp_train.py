"""Worker for tests/test_lbbsp.py: train under HVD_ELASTIC_POLICY (lbbsp, or bsp as the baseline) and write, per
rank, what the invariants need.

--mode check: synthetic data of --samples samples, LbbspSampler through a DataLoader for --epochs epochs; records
              every step's sizes (all ranks'), this rank's indices per epoch, and on rank 0 the largest difference
              between the applied (aggregated) gradient and a gradient computed locally over the concatenated
              global batch. --clip C: Horovod's clipping protocol at every step (synchronize(), clip_grad_norm_ to
              C, step() inside skip_synchronize()); rank 0 also records how far the gradient after synchronize()
              is from the global-batch one, and the applied gradient is compared with that one clipped;
              --skip-every K: every K-th step of an epoch calls synchronize() and skips step() (what
              torch.amp.GradScaler does after an overflow), and the weights must be unchanged at the next step.
              --own-batches: no LbbspSampler draws; the script takes its slice of each global batch of the
              sampler's order from hvde.batch_sizes() itself, then calls opt.zero_grad() (which ends a skipped step).
--mode train: scikit-learn digits for --steps steps with LbbspSampler (bsp: random batches of B / n per rank);
              --recover-at K sets this rank's per-sample emulated delay to --recovered-delay from step K on (a
              straggler that recovers mid-run). Records every step's sizes and the end-of-run report. With --runs
              (a JSON list of the optimizer's keywords, e.g. [{"policy": "lbbsp"}, {"policy": "bsp", "steps":
              80}], "steps" overriding --steps), one run after the other in one process: rank<r>.<policy>.json.
"""
import argparse
import copy
import hashlib

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.errors as hvde_errors
import hvd_elastic.torch as hvde
from hvd_elastic.lbbsp import batch_positions
from hvd_elastic.torch.attached import state_of

import faults
from runs import each_run, write_outputs


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def grads(model):
    return torch.cat([p.grad.detach().flatten() for p in model.parameters()]).numpy()


def own_batches(sampler, epoch, opt, x, y):
    """A script's own data path under lbbsp: this rank's batch_sizes() share of each global batch."""
    order = sampler.order(epoch)
    for i in range(len(sampler)):
        idx = order[i * sampler.B + torch.from_numpy(batch_positions(hvde.batch_sizes(opt), hvd.rank()))]
        yield x[idx], y[idx]


def check(args):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(args.samples, 12, generator=g)
    y = torch.randint(0, 3, (args.samples,), generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                    named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = hvde.LbbspSampler(len(ds), opt, seed=11, drop_last=not args.pad)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler)
    steps, indices, grad_err, checked, sync_err, clipped = [], [], 0.0, 0, 0.0, 0
    unapplied, skipped = None, 0
    with hvde.training(opt):
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            order = sampler.order(epoch)
            mine = []
            for i, (xb, yb) in enumerate(own_batches(sampler, epoch, opt, x, y) if args.own_batches else loader):
                if unapplied is not None:     # the step skipped before this one left the weights as they were
                    skipped += int(np.array_equal(unapplied, flat(model)))
                    unapplied = None
                sizes = hvde.batch_sizes(opt)
                steps.append({"sizes": sizes, "local": len(xb)})
                # this rank's indices: the positions the sampler dealt it (recomputed here to record them)
                batch_idx = order[i * sampler.B + torch.from_numpy(batch_positions(sizes, hvd.rank()))]
                assert torch.equal(x[batch_idx], xb)
                mine.extend(batch_idx.tolist())
                ref = None
                if hvd.rank() == 0:
                    # reference: one process, the whole global batch, the same weights
                    m = copy.deepcopy(model)
                    m.zero_grad()
                    gb = order[i * sampler.B:(i + 1) * sampler.B]
                    F.cross_entropy(m(x[gb]), y[gb]).backward()
                    ref = grads(m)
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                if args.clip > 0:       # Horovod's protocol: synchronize(), clip, step() inside skip_synchronize()
                    opt.synchronize()
                    synced = grads(model)
                    if ref is not None:   # synchronize() left the global-batch gradient
                        sync_err = max(sync_err, float(np.abs(synced - ref).max()))
                    if args.skip_every and i % args.skip_every == args.skip_every - 1:
                        # no step(), as GradScaler after an overflow: the next draw or zero_grad() ends it unapplied
                        unapplied = flat(model)
                        continue
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                    with opt.skip_synchronize():
                        opt.step()
                    if ref is not None:   # step() applied the global-batch gradient clipped
                        ref = ref * min(1.0, args.clip / float(np.linalg.norm(ref)))
                        clipped += int(np.linalg.norm(synced) > args.clip)
                else:
                    opt.step()
                if ref is not None:
                    grad_err = max(grad_err, float(np.abs(grads(model) - ref).max()))
                    checked += 1
            indices.append(mine)
    report = opt.finish()
    # Drawing a second batch before stepping the first (what DataLoader workers' prefetching does) is refused.
    # The sampler's order is torch's DistributedSampler's: batches of B / n from DistributedSampler on each rank
    # make up the same global batches (as sets) at every full step of the epoch, whatever lbbsp's sizes.
    b = sampler.B // hvd.size()
    same_as_ds = []
    for epoch in range(args.epochs):
        per_rank = []
        for p in range(hvd.size()):
            ds_sampler = torch.utils.data.DistributedSampler(range(len(ds)), num_replicas=hvd.size(), rank=p,
                                                             shuffle=True, seed=11, drop_last=not args.pad)
            ds_sampler.set_epoch(epoch)
            per_rank.append(list(ds_sampler))
        order = sampler.order(epoch).tolist()
        same_as_ds.append(all(sorted(order[i * sampler.B:(i + 1) * sampler.B])
                              == sorted(j for p in range(hvd.size()) for j in per_rank[p][i * b:(i + 1) * b])
                              for i in range(len(ds) // sampler.B)))
    it, prefetch_error = iter(sampler), ""
    next(it)
    try:
        next(it)
    except hvde_errors.HvdElasticError as e:
        prefetch_error = str(e)
    return {"steps": steps, "indices": indices, "grad_err": grad_err, "grad_checked": checked,
            "sync_err": sync_err, "clipped_steps": clipped, "skipped_unchanged": skipped,
            "prefetch_error": prefetch_error, "same_batches_as_distributed_sampler": same_as_ds,
            "weights_sha256": hashlib.sha256(flat(model).tobytes()).hexdigest(), "report": report,
            "steps_per_epoch": len(sampler)}


def train(args, steps, **knobs):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = torch.from_numpy((x / 16.0).astype(np.float32)), torch.from_numpy(y)
    ds = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                    named_parameters=model.named_parameters(), **knobs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    lbbsp = hvde.settings(opt).spec.balances_batches
    B = hvde.settings(opt).global_batch or 64
    if lbbsp:
        loader = torch.utils.data.DataLoader(ds, batch_sampler=hvde.LbbspSampler(len(ds), opt, seed=5))
    else:
        g = torch.Generator().manual_seed(100 + hvd.rank())
        loader = [(x[idx], y[idx]) for idx in torch.randint(0, len(ds), (steps, B // hvd.size()), generator=g)]
    sizes, step = [], 0
    with hvde.training(opt):
        while step < steps:
            for xb, yb in loader:
                if step == args.recover_at:
                    if lbbsp:
                        state_of(opt).session.straggler.sample_delay_s = args.recovered_delay
                    else:   # bsp: the same per-sample cost at the even split, as a per-step delay
                        state_of(opt).session.straggler.delay_s = args.recovered_delay * B / hvd.size()
                sizes.append(hvde.batch_sizes(opt) if lbbsp else [len(xb)] * hvd.size())
                faults.inject(step, hvd.rank(), hvd.size())     # TEST_FAULT* (tests/test_faults.py)
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                step += 1
                if step >= steps:
                    break
    report = opt.finish()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    return {"sizes": sizes, "report": report, "accuracy": acc,
            "weights_sha256": hashlib.sha256(flat(model).tobytes()).hexdigest()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--mode", choices=["check", "train"], required=True)
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--pad", action="store_true", help="drop_last=False")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="check mode: clip the gradient to this norm with Horovod's synchronize() protocol")
    ap.add_argument("--own-batches", action="store_true",
                    help="--mode check: batches from batch_sizes() instead of LbbspSampler draws")
    ap.add_argument("--skip-every", type=int, default=0,
                    help="with --clip: every K-th step of an epoch synchronize() and no step() (GradScaler's overflow)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--recover-at", type=int, default=-1)
    ap.add_argument("--recovered-delay", type=float, default=0.0)
    ap.add_argument("--runs", default="", help="train mode: a JSON list of runs (the optimizer's keywords)")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    if args.mode == "check":
        outs = {f"rank{hvd.rank()}.json": check(args)}
    elif args.runs:
        outs = {f"rank{hvd.rank()}.{policy}.json": train(args, steps, **knobs)
                for policy, steps, knobs in each_run(args.runs, "steps", args.steps)}
    else:
        outs = {f"rank{hvd.rank()}.json": train(args, args.steps)}
    write_outputs(args.out_dir, hvd.rank(), outs)


if __name__ == "__main__":
    main()
