"""Worker: Horovod's DistributedOptimizer properties under each policy of --policies (default: HVD_ELASTIC_POLICY).

The script makes the one-line swap by assignment (``hvd.DistributedOptimizer = hvde.DistributedOptimizer``) and
then uses Horovod's names only, as a Horovod script would; the policies run one after the other in one process, each
set in HVD_ELASTIC_POLICY as a user would (read at every optimizer's construction). Every check is collective-safe:
what it asserts is computed from values every rank holds (allgathered), so a failure stops every rank at the same
point. Each check prints 'check <policy> <name>: ok' on rank 0. After bsp and after the last policy an optimizer is
left unfinished on purpose: the exit handler must finish the last policy's one if it is relaxed and say so, and
leave bsp's (Horovod's own optimizer) alone. Checks: see CHECKS.
"""
import argparse
import hashlib
import os
import tempfile
import warnings

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from horovod.torch.optimizer import DistributedOptimizer as horovod_optimizer

import hvd_elastic.torch as hvde
from hvd_elastic.errors import ConfigError

POLICY = RELAXED = GRADIENT_POLICY = MID_TRAINING_COLLECTIVES = None     # set_policy()


def set_policy(policy):
    global POLICY, RELAXED, GRADIENT_POLICY, MID_TRAINING_COLLECTIVES
    os.environ["HVD_ELASTIC_POLICY"] = POLICY = policy
    RELAXED = POLICY not in ("bsp", "lbbsp")
    GRADIENT_POLICY = POLICY in ("asp", "ssp", "dssp", "zipline")
    # zipline may hold a rank at a barrier until another rank has pushed *more* steps than this script gives it, so
    # a collective called mid-training (a broadcast, a barrier, building another optimizer), or a second optimizer
    # stepped in turn with the first, can deadlock: there the checks call collectives only before the first step or
    # after finish(), and step several optimizers one after the other (docs/horovod-compat.md).
    MID_TRAINING_COLLECTIVES = POLICY != "zipline"


def same_everywhere(value, what):
    everyone = hvd.allgather_object(value, name="compat.check")
    assert all(v == everyone[0] for v in everyone), f"{what} differs across ranks: {everyone}"
    return everyone


def digest_tensors(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().double().contiguous().numpy().tobytes())
    return h.hexdigest()


def weights_digest(model):
    return digest_tensors(model.state_dict().values())


def state_digest(opt):
    """Digest of the optimizer state: structure (keys, shapes) and values."""
    sd = opt.state_dict()
    h = hashlib.sha256()
    for pid in sorted(sd["state"]):
        for k, v in sorted(sd["state"][pid].items()):
            h.update(f"{pid}.{k}".encode())
            h.update(v.detach().double().contiguous().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


def state_structure(opt):
    sd = opt.state_dict()
    return [(pid, k, tuple(v.shape) if torch.is_tensor(v) else type(v).__name__)
            for pid in sorted(sd["state"]) for k, v in sorted(sd["state"][pid].items())]


def named(model, prefix):
    """Distinct names per model: Horovod names its gradient allreduces after them, so two models stepped in turn
    need distinct names under bsp (plain Horovod fails with 'same name as another tensor' otherwise)."""
    return [(f"{prefix}.{n}", p) for n, p in model.named_parameters()]


def mlp(seed=0, d_in=10, h=8, d_out=4):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d_in, h), torch.nn.Tanh(), torch.nn.Linear(h, d_out))


def batches(seed, d_in=10, d_out=4, n=16):
    g = torch.Generator().manual_seed(seed * 100 + hvd.rank())
    while True:
        yield torch.randn(n, d_in, generator=g), torch.randint(0, d_out, (n,), generator=g)


def train(model, opt, data, steps):
    for _ in range(steps):
        x, y = next(data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def finish(opt):
    """finish() under every policy (bsp too: the report); returns this rank's report counters."""
    report = hvde.finish(opt)
    return report["ranks"][hvd.rank()].get("counters", {})


def check_engine_counters(counters_list):
    """Per engine: every pushed update applied exactly once on every rank."""
    if not RELAXED:
        return
    for i, counters in enumerate(counters_list):
        everyone = hvd.allgather_object(counters, name="compat.counters")
        pushed = sum(c["pushed"] for c in everyone)
        assert pushed > 0, (i, everyone)
        assert all(c["applied_contributions"] == pushed for c in everyone), (i, everyone)


# ---- checks -------------------------------------------------------------------------------------------------------
def check_two_optimizers():
    """Two live optimizers (e.g. a GAN), interleaved steps, each finished; then a third one after they finished."""
    models = [mlp(1), mlp(2, h=6)]
    opts = [hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5),
                                     named_parameters=named(m, f"two{i}")) for i, m in enumerate(models)]
    for m in models:
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    data = [batches(1), batches(2)]
    if MID_TRAINING_COLLECTIVES:    # interleaved steps
        for _ in range(6):
            for m, o, d in zip(models, opts, data):
                train(m, o, d, 1)
        counters = [finish(o) for o in opts]
    else:   # zipline: each rank could be held on a different optimizer, waiting for the other; one after the other
        counters = []
        for m, o, d in zip(models, opts, data):
            train(m, o, d, 6)
            counters.append(finish(o))
    for m in models:
        same_everywhere(weights_digest(m), "weights after finish")
    check_engine_counters(counters)
    # A new optimizer after finished ones: on the same model (bsp: a copy -- Horovod's gradient hooks of the first
    # optimizer stay on its parameters, so plain Horovod refuses a second optimizer there).
    model = models[0]
    if not RELAXED:
        model = mlp(1)
        model.load_state_dict(models[0].state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model, "third"))
    train(model, opt, data[0], 3)
    check_engine_counters([finish(opt)])
    same_everywhere(weights_digest(model), "weights after a third optimizer")


def check_wbsp_second_optimizer_while_first_lives():
    """A second optimizer built while the first is live (not finished yet), as Horovod's tests do."""
    if not MID_TRAINING_COLLECTIVES:
        return
    m1, m2 = mlp(3), mlp(4)
    o1 = hvd.DistributedOptimizer(torch.optim.Adam(m1.parameters(), lr=0.01), named_parameters=named(m1, "live1"))
    train(m1, o1, batches(3), 2)
    o2 = hvd.DistributedOptimizer(torch.optim.Adam(m2.parameters(), lr=0.01), named_parameters=named(m2, "live2"))
    train(m2, o2, batches(4), 2)
    train(m1, o1, batches(5), 2)
    counters = [finish(o1), finish(o2)]
    same_everywhere([weights_digest(m1), weights_digest(m2)], "weights after finish")
    check_engine_counters(counters)


def check_broadcast_state_and_checkpoint():
    """Mid-training: per-tensor broadcast of the state (Horovod's test pattern: needs the same structure on every
    rank), hvd.broadcast_optimizer_state, a checkpoint saved by rank 0, resumed into a new model + optimizer,
    training continued, both finished: identical state and weights everywhere, nothing lost."""
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
                 lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01)):
        model = mlp(5)
        opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        data = batches(5)
        train(model, opt, data, 3)
        counters = [] if MID_TRAINING_COLLECTIVES else [finish(opt)]
        # Horovod's test walks the state on every rank and broadcasts each tensor: same structure needed.
        same_everywhere(state_structure(opt), "optimizer state structure after a step")
        sd = opt.state_dict()
        for pid in sorted(sd["state"]):
            for k, v in sorted(sd["state"][pid].items()):
                if torch.is_tensor(v):
                    hvd.broadcast(v.clone(), root_rank=0, name=f"compat.state.{pid}.{k}")
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        same_everywhere(state_digest(opt), "optimizer state after broadcast_optimizer_state")
        if GRADIENT_POLICY:   # replicas were synchronized: the broadcast changed nothing
            same_everywhere(weights_digest(model), "weights after broadcast_optimizer_state")
        if MID_TRAINING_COLLECTIVES:
            train(model, opt, data, 3)
        # Checkpoint (rank 0 only, non-collective), resume into a new model + optimizer.
        path = os.path.join(tempfile.gettempdir(), f"compat_ckpt_{os.getppid()}.pt")
        if hvd.rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        hvd.allgather_object(0, name="compat.barrier")
        model2 = mlp(6)
        opt2 = hvd.DistributedOptimizer(make(model2.parameters()), named_parameters=named(model2, "resumed"))
        if hvd.rank() == 0:
            ckpt = torch.load(path)
            model2.load_state_dict(ckpt["model"])
            opt2.load_state_dict(ckpt["optimizer"])
            saved = state_digest(opt2)
        hvd.broadcast_optimizer_state(opt2, root_rank=0)
        hvd.broadcast_parameters(model2.state_dict(), root_rank=0)
        digests = same_everywhere(state_digest(opt2), "resumed optimizer state")
        if hvd.rank() == 0:
            assert digests[0] == saved, "the broadcast changed the loaded state"
            os.unlink(path)
        same_everywhere(weights_digest(model2), "resumed weights")
        train(model2, opt2, batches(6), 4)
        if MID_TRAINING_COLLECTIVES:
            train(model, opt, data, 2)
            counters.append(finish(opt))
        counters.append(finish(opt2))
        same_everywhere([weights_digest(model), weights_digest(model2)], "weights after finish")
        if GRADIENT_POLICY:   # the replicas did not drift apart after the mid-training broadcast
            same_everywhere([state_digest(opt), state_digest(opt2)], "optimizer state after finish")
        check_engine_counters(counters)


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(10, 8), torch.nn.Linear(8, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y1 = self.fc2(h)
        return y1, self.fc3(torch.relu(y1))


def check_force_allreduce():
    """A parameter with no gradient on some rank (rank 0 uses only the first head) is still updated everywhere."""
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
                 lambda p: torch.optim.Adam(p, lr=0.01), lambda p: torch.optim.RMSprop(p, lr=0.01, centered=True)):
        model = TwoHeads()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters())
        before = model.fc3.weight.detach().clone()
        data = batches(8)
        for _ in range(3):
            x, y = next(data)
            y1, y2 = model(x)
            loss = F.mse_loss(y1 if hvd.rank() == 0 else y2, F.one_hot(y, 4).float())
            opt.zero_grad()
            loss.backward()
            opt.step()
        counters = finish(opt)
        same_everywhere(weights_digest(model), "weights after finish")
        assert not torch.equal(before, model.fc3.weight.detach()), "fc3 was never updated"
        check_engine_counters([counters])


def check_named_parameters():
    """Duplicate or missing names: Horovod's ValueError and message; no named_parameters: Horovod's default names."""
    model = mlp(9)
    cases = {"duplicates": lambda m: [("same", p) for p in m.parameters()],
             "missing": lambda m: list(m.named_parameters())[1:],
             "several missing": lambda m: list(m.named_parameters())[:1],
             "not tuples": lambda m: [p for p in m.parameters()]}
    for what, named in cases.items():
        messages = []
        for make in (horovod_optimizer, hvd.DistributedOptimizer):
            try:
                make(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model))
                messages.append(None)
            except ValueError as e:
                messages.append(str(e))
        assert messages[0] is not None and messages[0] == messages[1], (what, messages)
    m = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": m[0].parameters()},
                                                    {"params": m[1].parameters(), "lr": 0.05}], lr=0.1))
    names = opt._parameter_names
    assert len(names) == 4 and len(set(names.values())) == 4, names
    same_everywhere(sorted(names.values()), "default parameter names")
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    train(m, opt, batches(9), 3)
    check_engine_counters([finish(opt)])
    same_everywhere(weights_digest(m), "weights after finish")


def check_clipping_and_synchronize_warning():
    """synchronize() + clip + skip_synchronize(): no warning, gradient clipped; step() after synchronize()
    without skip_synchronize(): Horovod's warning."""
    model = mlp(10)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    data = batches(10)
    for clip in (True, False):
        x, y = next(data)
        opt.zero_grad()
        (100 * F.cross_entropy(model(x), y)).backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if clip:
                prior = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
                clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
                assert clipped < prior and abs(clipped - 0.1) < 1e-4, (prior, clipped)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        texts = [str(w.message) for w in caught if "skip_synchronize" in str(w.message)]
        assert len(texts) == (0 if clip else 1), texts
        if not clip:
            assert texts[0].startswith("optimizer.step() called without optimizer.skip_synchronize() context after "
                                       "optimizer.synchronize()."), texts
    check_engine_counters([finish(opt)])
    same_everywhere(weights_digest(model), "weights after finish")


def check_backward_passes_per_step():
    """Two backward passes accumulate locally, then one step (relaxed policies: the accumulated gradient is the
    update pushed)."""
    model = mlp(11)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    data = batches(11)
    for _ in range(3):
        opt.zero_grad()
        for _ in range(2):
            x, y = next(data)
            F.cross_entropy(model(x), y).backward()
        opt.step()
    check_engine_counters([finish(opt)])
    same_everywhere(weights_digest(model), "weights after finish")


def check_sparse_gradients():
    """nn.Embedding(sparse=True): bsp (Horovod's sparse allreduce) and wbsp (local steps, dense deltas) train;
    the gradient policies refuse it with one line naming sparse_as_dense and the policies that take it."""
    torch.manual_seed(12)
    emb = torch.nn.Embedding(20, 4, sparse=True)
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters())
    idx = torch.tensor([[1, 2, 3], [4, 5, 6 + hvd.rank()]])
    opt.zero_grad()
    emb(idx).sum().backward()
    try:
        opt.step()
        error = None
    except ConfigError as e:
        error = str(e)
    if GRADIENT_POLICY:
        assert error is not None and "sparse_as_dense" in error and "policy bsp" in error \
            and f"policy {POLICY}" in error and "\n" not in error, error
        opt.zero_grad(set_to_none=True)
    else:
        assert error is None, error
    check_engine_counters([finish(opt)] if not GRADIENT_POLICY else [])
    if GRADIENT_POLICY:
        finish(opt)
    same_everywhere(weights_digest(emb), "weights after finish")


def check_refused_arguments():
    """An argument the policy cannot honour: one line naming the argument and policy bsp."""
    model = mlp(13)
    try:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=hvd.Compression.fp16)
        error = None
    except ConfigError as e:
        error = str(e)
    if RELAXED:
        assert error is not None and "compression" in error and "policy bsp" in error and "\n" not in error, error
    else:
        assert error is None, error
        train(model, opt, batches(13), 2)
        finish(opt)
        same_everywhere(weights_digest(model), "weights after finish")


CHECKS = [check_two_optimizers, check_wbsp_second_optimizer_while_first_lives, check_broadcast_state_and_checkpoint,
          check_force_allreduce, check_named_parameters, check_clipping_and_synchronize_warning,
          check_backward_passes_per_step, check_sparse_gradients, check_refused_arguments]


def leave_unfinished(tag):
    """An optimizer the script never finishes (relaxed: the exit handler finishes it and says so in one line)."""
    model = mlp(14)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named(model, tag))
    train(model, opt, batches(14), 3 + (2 * hvd.rank() if RELAXED else 0))   # relaxed: ranks end apart
    return model, opt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checks", nargs="*", help="only these checks (default: every one)")
    ap.add_argument("--policies", default=os.environ.get("HVD_ELASTIC_POLICY", "bsp"))
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("HVD_ELASTIC_REPORT", "0")
    hvd.DistributedOptimizer = hvde.DistributedOptimizer     # the one-line swap by assignment
    policies = args.policies.split(",")
    left = []     # the unfinished optimizers (and their models), alive until the interpreter exits
    for i, policy in enumerate(policies):
        set_policy(policy)
        for check in CHECKS:
            name = check.__name__[len("check_"):]
            if args.checks and name not in args.checks:
                continue
            check()
            if hvd.rank() == 0:
                print(f"check {policy} {name}: ok", flush=True)
        if policy == "bsp" or i == len(policies) - 1:
            left.append(leave_unfinished(f"unfinished.{policy}"))
    if hvd.rank() == 0:
        print("end of script", flush=True)
    if os.environ.get("COMPAT_RAISE_AT_END"):
        raise RuntimeError("raised on purpose")   # no finish at exit then: one error line, non-zero exit


if __name__ == "__main__":
    main()
