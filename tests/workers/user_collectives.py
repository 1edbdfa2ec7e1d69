"""Worker: a PyTorch training loop that runs Horovod collectives of its own between steps, as scripts do.

First Horovod's test_torch.py::test_broadcast_state_no_grad pattern right after the optimizer is built
(broadcast_parameters, broadcast_optimizer_state, then an unnamed hvd.broadcast of a gradient). Then every rank takes
--steps local steps (policy lbbsp: batches from LbbspSampler) and every --every steps calls, in this order, named
and unnamed: hvd.allreduce, hvd.allreduce_ (in place), hvd.broadcast, hvd.allgather, hvd.allreduce_async +
hvd.synchronize, hvd.broadcast_object, hvd.allgather_object. Every result is checked against what the ranks put in.
Writes rank<r>.json: the calls made and checked, the local steps, the final weights' hash, the report.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    lbbsp = os.environ.get("HVD_ELASTIC_POLICY") == "lbbsp"
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                    named_parameters=model.named_parameters())
    state_no_grad_pattern(model, opt)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(4096, 20, generator=g), torch.randint(0, 4, (4096,), generator=g)
    if lbbsp:
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
    with open(os.path.join(args.out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "checked": checked, "steps": args.steps,
                   "weights_sha256": hashlib.sha256(w.tobytes()).hexdigest(), "report": report}, f)


if __name__ == "__main__":
    main()
