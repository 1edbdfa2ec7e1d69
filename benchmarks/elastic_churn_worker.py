"""One worker of the elastic churn benchmark (benchmarks/elastic_churn.py): MNIST-1D's 1-D CNN under
``horovodrun --elastic`` as a Horovod elastic script (TorchState, ``@hvd.elastic.run``, ``state.commit()`` every
--commit-every steps), with plain Horovod's optimizer (--impl horovod) or hvd_elastic's under HVD_ELASTIC_POLICY. Not a
user API.

The job starts with 4 workers: three on host ``127.0.0.1``, one on ``localhost`` (two names of this machine, listed
by the discovery script's file --hosts-file). One worker of 127.0.0.1 (the one with local rank 2 at the start) is
--slow-factor times slower for the whole run (per-sample sleeps between forward and backward, as the matrix's
profiles). Events, in the job's global steps (batches of --batch-size samples):
- at --kill-at x --global-steps, the worker on localhost drops its host from the file and SIGKILLs itself;
- at --add-at x --global-steps, the observer (the lowest rank on 127.0.0.1 at the start) lists the host again:
  the driver starts a new worker there, which joins at the next commit.
Global steps: the lock-step arms (Horovod, lbbsp) count them in the state (a step of n ranks is n batches; lbbsp's is
B / --batch-size whatever the ranks), committed and restored with the model; the tick policies ask
hvd_elastic.torch.global_steps (the updates in the state each reset resumed from plus the current engine's).

The observer keeps a snapshot of the weights (wbsp: the global model) every --eval-every of its steps, with the wall
time since the job's start, and evaluates them after training; it also measures each reset's gap (from its last step
before the reset to its first after). It writes --out (JSON).
"""
import json
import os
import signal
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_elastic.torch as hvde
from benchmarks.matrix import worker_arguments
from benchmarks.torch_worker import build_model, slim_report
from hvd_elastic import registry
from hvd_elastic.emulation import Straggler
from hvd_elastic.torch.attached import state_of

NOMINAL_RANKS = 4    # the job's size between the events: SGD's learning rate is scaled by it, lbbsp's B is 4 batches
MAIN, SPARE = "127.0.0.1", "localhost"   # three workers on MAIN for the whole run; SPARE's is killed, then replaced


def hosts_text(with_spare: bool = True) -> str:
    """The discovery script's answer: MAIN's three slots, and SPARE's one."""
    return f"{MAIN}:3\n" + (f"{SPARE}:1\n" if with_spare else "")


def main():
    ap = worker_arguments(__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["hvd_elastic", "horovod"], default="hvd_elastic")
    ap.add_argument("--hosts-file", required=True)
    ap.add_argument("--kill-at", type=float, default=1 / 3)
    ap.add_argument("--add-at", type=float, default=2 / 3)
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--slow-factor", type=float, default=3.0)
    args = ap.parse_args()
    marks = os.path.dirname(os.path.abspath(args.hosts_file))

    def mark(name: str) -> str:
        return os.path.join(marks, name)

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    host = os.environ.get("HOROVOD_HOSTNAME", "")
    joiner = os.path.exists(mark("killed"))
    # the workers of the start (all there: a joiner skips this) agree on the observer: the lowest rank on MAIN
    everyone = [] if joiner else hvd.allgather_object(host, name="churn.hosts")
    observer = not joiner and hvd.rank() == everyone.index(MAIN)
    slow = not joiner and host == MAIN and hvd.local_rank() == 2
    straggler = Straggler(sample_delay_s=float(args.sample_delay) * (args.slow_factor if slow else 1.0))
    print(f"CHURN worker rank={hvd.rank()} host={host} slow={slow} joiner={joiner}", flush=True)

    data = np.load(args.data)
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(data[k]) for k in ("x_tr", "y_tr", "x_te", "y_te"))
    model = build_model(args.task)
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * NOMINAL_RANKS, momentum=args.momentum)
    B = args.batch_size * NOMINAL_RANKS
    if args.impl == "horovod":
        opt, spec = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters()), None
    else:
        spec = registry.policy(os.environ.get("HVD_ELASTIC_POLICY", registry.DEFAULT))
        opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                        **({"global_batch": B} if spec.balances_batches else {}))
    lockstep = spec is None or spec.lockstep
    extra = {}
    if spec is not None and spec.balances_batches:
        sampler = extra["sampler"] = hvde.LbbspSampler(len(x_tr), opt, seed=args.seed)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, steps=0, t_start=time.time(), **extra)

    def global_steps() -> int:
        return state.steps if lockstep else hvde.global_steps(opt)

    def weights():
        if spec is not None and spec.deltas:   # W under deltas (wbsp; auto once its updates are deltas)
            engine = state_of(opt).session.engine
            if engine is None:
                return None
            if engine.updates.global_model is not None:
                return engine.updates.global_model.detach().to(torch.float32).clone()
        return torch.cat([p.detach().reshape(-1) for p in params])

    rng = np.random.default_rng([args.seed, os.getpid()])

    def random_batches():
        while True:
            yield torch.from_numpy(rng.integers(0, len(x_tr), args.batch_size))

    def batches():
        """lbbsp: its sampler's epochs (resumed after a reset); the others: uniformly random batches of their own."""
        if spec is None or not spec.balances_batches:
            yield from random_batches()
        while True:
            for idx in sampler:
                yield torch.as_tensor(idx)

    snaps, gaps = [], []
    progress = {"last_end": None, "entries": 0, "local": 0}

    @hvd.elastic.run
    def train(state):
        progress["entries"] += 1
        gap_from = progress["last_end"] if progress["entries"] > 1 else None
        for idx in batches():
            if global_steps() >= args.global_steps:
                break
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            straggler.pause(0.0, samples=len(idx))
            loss.backward()
            opt.step()
            now = time.time()
            if gap_from is not None:
                gaps.append(round(now - gap_from, 3))
                gap_from = None
            progress["last_end"] = now
            progress["local"] += 1
            if lockstep:
                state.steps += (B // args.batch_size) if spec is not None and spec.balances_batches else hvd.size()
            steps = global_steps()
            if observer and progress["local"] % args.eval_every == 0:
                w = weights()
                if w is not None:
                    snaps.append((now - state.t_start, steps, w))
            if host == SPARE and not joiner and steps >= args.kill_at * args.global_steps:
                write_hosts(args.hosts_file, with_second=False)
                open(mark("killed"), "w").close()
                print(f"CHURN killed rank={hvd.rank()} at global step {steps}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if observer and os.path.exists(mark("killed")) and not os.path.exists(mark("added")) \
                    and steps >= args.add_at * args.global_steps:
                write_hosts(args.hosts_file, with_second=True)
                open(mark("added"), "w").close()
                print(f"CHURN added a worker at global step {steps}", flush=True)
            if progress["local"] % args.commit_every == 0:
                state.commit()

    train(state)
    report = hvde.finish(opt) if args.impl != "horovod" else None
    wall = time.time() - state.t_start
    if observer:
        def accuracy():
            with torch.no_grad():
                return float((model(x_te).argmax(1) == y_te).float().mean())
        final = accuracy()
        curve = []
        for t, steps, w in snaps:     # evaluated now, outside the timed loop
            torch.nn.utils.vector_to_parameters(w, params)
            curve.append([t, steps, accuracy()])
        curve.append([wall, global_steps(), final])
        counters = report["ranks"][hvd.rank()]["counters"] if report else {}
        with open(args.out, "w") as f:
            json.dump({"policy": os.environ.get("HVD_ELASTIC_POLICY", "horovod") if args.impl != "horovod"
                       else "horovod", "wall_s": wall, "final_accuracy": final, "curve": curve, "gaps_s": gaps,
                       "local_steps": progress["local"], "size_at_end": hvd.size(),
                       "counters": {k: v for k, v in counters.items() if k.startswith("elastic_")},
                       "report": slim_report(report) if report else None}, f)


def write_hosts(path: str, with_second: bool):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(hosts_text(with_second))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
