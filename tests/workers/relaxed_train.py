"""Worker: train under the policy in HVD_ELASTIC_POLICY and write what the invariants need, per rank.

--mode degenerate: synthetic data, plain SGD; trains first with horovod.torch.DistributedOptimizer (BSP reference)
                   then, from the same start, with hvd_elastic under each policy of --policies in turn (the
                   policy as the optimizer's keyword); writes each policy's distance to the reference, its
                   weights' hash and its report (rank<r>.<policy>.json). --backward-delay makes backward that
                   many seconds longer (a sleep between the last layer's gradients and the first layer's, as a deeper
                   model's backward takes), so that a streamed push has a backward to overlap with.
--mode train:      scikit-learn digits, ranks loop until the global number of steps reaches a target; writes the
                   test accuracy, a hash of the final weights and the end-of-run report (rank<r>.json). With --runs
                   (a JSON list of the optimizer's keywords, e.g. [{"policy": "asp"}, {"policy": "zipline",
                   "lookahead": 6}], "target" overriding --target), one run after the other in one process, each
                   from the same start: rank<r>.<policy>.json.
"""
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

import faults
from runs import each_run, write_outputs


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def degenerate(steps, hidden, policies, backward_delay=0.0, user_collective=False):
    def run(make_opt):
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 4))
        if backward_delay > 0:
            def slow_backward(module, inputs, out):   # the gradient reaching the tanh's output: after the last
                out.register_hook(lambda g: time.sleep(backward_delay))   # layer's gradients, before the first's
            model[1].register_forward_hook(slow_backward)
        opt = make_opt(torch.optim.SGD(model.parameters(), lr=0.2), model)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        g = torch.Generator().manual_seed(5 + hvd.rank())
        for _ in range(steps):
            x, y = torch.randn(8, 20, generator=g), torch.randint(0, 4, (8,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if user_collective:   # a script's own collective between steps (its loss, averaged for a log line)
                hvd.allreduce(loss.detach(), name="test.loss")
        return opt, model

    _, ref = run(lambda o, m: hvd.DistributedOptimizer(o, named_parameters=m.named_parameters()))
    w_ref = flat(ref)
    outs = {}
    for policy in policies:
        opt, model = run(lambda o, m: hvde.DistributedOptimizer(o, named_parameters=m.named_parameters(),
                                                                policy=policy))
        # The weights after finish(), which applies the ticks still on their way (under asp a rank's last step does
        # not wait for them: read before finish, a rank misses the last tick when the peer's final push comes in a
        # tick of its own).
        report = hvde.finish(opt)
        w = flat(model)
        outs[policy] = {"numel": int(w.size), "max_abs_diff": float(np.abs(w.astype(np.float64) - w_ref).max()),
                        "ref_max_abs": float(np.abs(w_ref).max()),
                        "weights_sha256": hashlib.sha256(w.tobytes()).hexdigest(), "report": report}
    return outs


def train(out_dir, target_global_steps, batch, **knobs):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_tr, y_tr = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                    named_parameters=model.named_parameters(), **knobs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if os.environ.get("TEST_WRITE_HUB") and hvd.rank() == 0:   # test-only: where tests/test_side_channel.py knocks
        from hvd_elastic import watchdog
        tmp = os.path.join(out_dir, "hub.json.tmp")      # a file, not stdout: a launcher interleaves ranks' lines
        with open(tmp, "w") as f:
            json.dump(watchdog.current().channel.endpoints, f)
        os.replace(tmp, os.path.join(out_dir, "hub.json"))
    g = torch.Generator().manual_seed(100 + hvd.rank())
    steps = 0

    def user_collective():
        hvd.allreduce(torch.ones(1), name="test.user_collective")

    while hvde.global_steps(opt) < target_global_steps:
        faults.inject(steps, hvd.rank(), hvd.size(), collective=user_collective)   # TEST_FAULT*: stop, kill, ...
        idx = torch.randint(0, len(x_tr), (batch,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
        opt.step()
        steps += 1
    faults.inject(steps, hvd.rank(), hvd.size(), where="finish")
    report = hvde.finish(opt)
    w = flat(model)
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean()
    return {"accuracy": float(acc), "weights_sha256": hashlib.sha256(w.tobytes()).hexdigest(),
            "local_steps": steps, "report": report}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--mode", choices=["degenerate", "train"], required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--target", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=16, help="degenerate mode: hidden width (90000: 2.25M parameters)")
    ap.add_argument("--runs", default="", help="train mode: a JSON list of runs (the optimizer's keywords)")
    ap.add_argument("--backward-delay", type=float, default=0.0,
                    help="degenerate mode: seconds of sleep inside each backward")
    ap.add_argument("--user-collective", action="store_true",
                    help="degenerate mode: an allreduce of the loss of the script's own after every step")
    ap.add_argument("--policies", default=os.environ.get("HVD_ELASTIC_POLICY", "bsp"),
                    help="degenerate mode: the policies, in turn")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rank = hvd.rank()
    if args.mode == "degenerate":
        outs = {f"rank{rank}.{policy}.json": out
                for policy, out in degenerate(args.steps, args.hidden, args.policies.split(","),
                                              args.backward_delay, args.user_collective).items()}
    elif args.runs:
        outs = {}
        for policy, target, knobs in each_run(args.runs, "target", args.target):
            print(f"run {policy} on rank {rank}: start", flush=True)
            outs[f"rank{rank}.{policy}.json"] = train(args.out_dir, target, args.batch, **knobs)
            print(f"run {policy} on rank {rank}: end", flush=True)
    else:
        outs = {f"rank{rank}.json": train(args.out_dir, args.target, args.batch)}
    write_outputs(args.out_dir, rank, outs)


if __name__ == "__main__":
    main()
