"""Worker: a PyTorch training loop that runs Horovod collectives of its own between steps, as scripts do.

Each policy of --policies in turn, in one process (a fresh model and optimizer each, the policy as the optimizer's
keyword argument). First Horovod's test_torch.py::test_broadcast_state_no_grad pattern right after the optimizer is
built (broadcast_parameters, broadcast_optimizer_state, then an unnamed hvd.broadcast of a gradient). Then every
rank takes --steps local steps (policy lbbsp: batches from LbbspSampler) and every --every steps calls, in this
order, named and unnamed: hvd.allreduce, hvd.allreduce_ (in place), hvd.broadcast, hvd.allgather, hvd.allreduce_async +
hvd.synchronize, hvd.broadcast_object, hvd.allgather_object. Every result is checked against what the ranks put in.
Writes rank<r>.<policy>.json per policy: the calls made and checked, the local steps, the final weights' hash, the
report; prints a line as each policy starts and ends, so a hang names the policy it happened in.
"""
import argparse
import hashlib
import json
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde


def state_no_grad_pattern(model, opt):
    """Horovod's test_broadcast_state_no_grad, after the plugin's optimizer is built."""
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = torch.ones(3) * (hvd.rank() + 1)
    bgrad = hvd.broadcast(grad, root_rank=0)
    assert torch.equal(bgrad, torch.ones(3)), bgrad


def user_calls(step, named):
    """One round of the script's own collectives; returns how many were checked."""
    r, n = hvd.rank(), hvd.size()
    tag = f"user.{step}" if named else None

    def nm(kind):
        return f"{tag}.{kind}" if named else None

    got = hvd.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name=nm("allreduce"))
    assert torch.equal(got, torch.full((4,), float(n * (n + 1) // 2))), got
    t = torch.full((2,), float(r))
    hvd.allreduce_(t, op=hvd.Sum, name=nm("allreduce_"))
    assert torch.equal(t, torch.full((2,), float(n * (n - 1) // 2))), t
    got = hvd.broadcast(torch.tensor([float(r), step]), root_rank=n - 1, name=nm("broadcast"))
    assert got.tolist() == [float(n - 1), float(step)], got
    got = hvd.allgather(torch.tensor([[r]]), name=nm("allgather"))
    assert got.flatten().tolist() == list(range(n)), got
    h = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name=nm("async"))
    assert hvd.synchronize(h).item() == n
    obj = hvd.broadcast_object({"step": step, "rank": r}, root_rank=0, name=nm("bobj"))
    assert obj == {"step": step, "rank": 0}, obj
    everyone = hvd.allgather_object(r * 10, name=nm("gobj"))
    assert everyone == [q * 10 for q in range(n)], everyone
    return 7


def train(policy, args):
    """One policy's run: the optimizer (the policy as its keyword argument, which wins over HVD_ELASTIC_POLICY),
    Horovod's broadcast pattern, --steps local steps with the script's collectives every --every, the report."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    knobs = {"global_batch": 2 * args.batch} if policy == "lbbsp" else {}
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                    named_parameters=model.named_parameters(), policy=policy, **knobs)
    state_no_grad_pattern(model, opt)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(4096, 20, generator=g), torch.randint(0, 4, (4096,), generator=g)
    if policy == "lbbsp":
        batches = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                   batch_sampler=hvde.LbbspSampler(len(x), opt, seed=1)))
    else:
        gen = torch.Generator().manual_seed(100 + hvd.rank())
        batches = ((x[i], y[i]) for i in iter(lambda: torch.randint(0, len(x), (args.batch,), generator=gen), None))
    checked = 0
    with hvde.training(opt):
        for step in range(args.steps):
            xb, yb = next(batches)
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            if (step + 1) % args.every == 0:
                checked += user_calls(step, named=(step // args.every) % 2 == 1)
                checked += user_calls(step, named=(step // args.every) % 2 == 0)
    report = opt.finish()
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    return {"rank": hvd.rank(), "policy": policy, "checked": checked, "steps": args.steps,
            "weights_sha256": hashlib.sha256(w.tobytes()).hexdigest(), "report": report}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--policies", default=os.environ.get("HVD_ELASTIC_POLICY", "bsp"),
                    help="comma list, run one after the other in this process (default: HVD_ELASTIC_POLICY)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch (lbbsp: global batch 2 x this)")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    for policy in args.policies.split(","):
        print(f"user_collectives: rank {hvd.rank()}: {policy} starts", flush=True)
        result = train(policy, args)
        with open(os.path.join(args.out_dir, f"rank{hvd.rank()}.{policy}.json"), "w") as f:
            json.dump(result, f)
        print(f"user_collectives: rank {hvd.rank()}: {policy} done", flush=True)


if __name__ == "__main__":
    main()
