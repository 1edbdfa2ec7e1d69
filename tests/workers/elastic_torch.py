"""A Horovod elastic job (horovodrun --elastic, Gloo) with hvd_elastic.torch.DistributedOptimizer under the policy of
HVD_ELASTIC_POLICY, as a Horovod user writes it: TorchState(model, optimizer, batch), ``@hvd.elastic.run``,
``state.commit()`` every step (every --commit-every steps).

The rank set changes mid-run in one of two ways:
- through the host discovery script, which prints the file given by --hosts-file: at step --remove-at rank 0
  writes ``localhost:<np - 1>`` (the driver stops a worker, the others re-form the job), at each step --add-at
  ``localhost:<np>`` again (a new worker starts this script from the top, joins, and is brought to the same state by
  state.sync());
- by a crash: at step --kill-at the worker on --kill-host (by default the last host of --host-names: on one machine
  the discovery script lists ``localhost:1`` and ``127.0.0.1:1``, two names of it, and the kill is on 127.0.0.1)
  SIGKILLs itself, once (a marker file next to --hosts-file); the survivors get HorovodInternalError and resume; the
  driver blacklists the host (for the cooldown, then starts a new worker there, which joins; or, with no cooldown, for
  good, and an --add-at lists another host).
``--wait STEP:SIZE`` (repeatable): at that step every rank trains on (steps not counted) and commits until the job
has SIZE ranks, so the changes land at known steps however long the driver takes.

Under lbbsp the script is a Horovod elastic script with a sampler (Horovod's ElasticSampler pattern): one epoch of
--steps global batches of --global-batch samples drawn by hvd_elastic.torch.LbbspSampler, which the TorchState
holds; the wait loop only commits (lbbsp's commit is Horovod's). The model carries an audit: a parameter `seen` with
one entry per sample whose gradient through lbbsp's exchange is -1/B on each sample of the global batch, stepped
with lr B and no momentum, so that after the epoch seen[i] is the number of times sample i's gradient is in the
weights -- 1 everywhere when every sample was taken exactly once over the resets (rolled-back steps and a failed
step's batch included); ``audit_off=<samples whose count is not 1>``.

Prints, per rank at the end: ``ELASTIC rank=<r> size=<n> batch=<b> global=<hvd_elastic.torch.global_steps: the job's
steps over every reset> sizes=<sizes seen by rank 0's state>
digest=<crc32 of the weights> pushed=<pushes of the final ranks since the last reset> applied=<updates applied by
this rank since then> resets=<resets this optimizer saw> resumed=<per reset: updates in the state resumed from, -1:
the commit> lost=<per reset: the survivors' pushes not in that state> in_flight=<... not yet in a tick each survivor
had applied> beyond_commit=<the updates that state holds beyond the new rank 0's last commit> before_reset=<per
reset: the report's seconds from this rank's last step to the reset's start> step_to_reset_end=<per reset: seconds
from this rank's last opt.step() to the reset's end, measured here> entry_is_commit=<per reset: 1 if the weights
train() starts again with, before any step, are those of this rank's last state.commit(), else 0>``, and rank 0 the
plugin's report (HVD_ELASTIC_REPORT is on).
"""
import argparse
import os
import signal
import time
import zlib

import horovod.torch as hvd
import numpy as np
import torch

import hvd_elastic.torch as hvde

import discovery
from discovery import listed

ap = argparse.ArgumentParser()
ap.add_argument("--hosts-file", required=True)
ap.add_argument("--np", type=int, default=3)
ap.add_argument("--steps", type=int, default=120)
ap.add_argument("--remove-at", type=int, default=-1)
ap.add_argument("--add-at", type=int, action="append", default=[], help="repeatable")
ap.add_argument("--kill-at", type=int, default=-1)
ap.add_argument("--kill-host", default="", help="the host whose worker --kill-at kills (default: the last of "
                                                "--host-names, 127.0.0.1 without them)")
ap.add_argument("--wait", action="append", default=[], help="STEP:SIZE")
ap.add_argument("--host-names", default="", help="comma list: the discovery file lists the first k of these hosts "
                                                 "with one slot each (a cluster) instead of localhost:k")
ap.add_argument("--step-sleep", type=float, default=0.05)
ap.add_argument("--commit-every", type=int, default=1)
ap.add_argument("--global-batch", type=int, default=32, help="lbbsp: B")
args = ap.parse_args()
waits = dict(tuple(map(int, w.split(":"))) for w in args.wait)
LBBSP = os.environ.get("HVD_ELASTIC_POLICY") == "lbbsp"
LR = 0.01   # per rank: the learning rate is LR x the ranks of the moment (a reset callback sets it)

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
if LBBSP:
    N = args.steps * args.global_batch            # one epoch of --steps global batches
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).double()
    model.seen = torch.nn.Parameter(torch.zeros(N, dtype=torch.float64))
    data = torch.randn(N, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    groups = [{"params": [p for n, p in model.named_parameters() if n != "seen"]},
              {"params": [model.seen], "lr": float(args.global_batch), "momentum": 0.0}]
    sgd = torch.optim.SGD(groups, lr=0.01, momentum=0.9)
    opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                    global_batch=args.global_batch)
    sampler = hvde.LbbspSampler(N, opt, seed=0)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, batch=0, sizes=[])
else:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    sgd = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
    opt = hvde.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0, sizes=[])


# when this rank's last opt.step() returned, and per reset the time from it to the reset's end (a reset callback)
stepped = {"at": time.perf_counter(), "gaps": [], "lr_off": 0}
state.register_reset_callbacks([lambda: stepped["gaps"].append(time.perf_counter() - stepped["at"])])
if not LBBSP:
    # Horovod's elastic pattern: the learning rate follows the number of ranks (a reset callback sets it); every step
    # must train at the rate of the ranks of the moment (counted: lr_off)
    def scale_lr():
        for group in opt.param_groups:
            group["lr"] = LR * hvd.size()
    state.register_reset_callbacks([scale_lr])


def weights_digest() -> int:
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return zlib.crc32(np.ascontiguousarray(weights).tobytes())


# the weights at this rank's last commit, and per train() entry after a reset whether it starts with them
commits = discovery.Commits(state, weights_digest)
commit = commits.commit


def write_hosts(slots):
    discovery.write_hosts(args.hosts_file, slots, args.host_names)


def train_step(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 8, generator=g)
    y = x.sum(1, keepdim=True)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    stepped["lr_off"] += any(abs(group["lr"] - LR * hvd.size()) > 1e-12 for group in opt.param_groups)
    opt.step()
    stepped["at"] = time.perf_counter()


def lbbsp_step(idx):
    """One step on this rank's share of the global batch, with the audit's term."""
    x = data[idx]
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)) - model.seen[idx].sum() / len(idx)
    loss.backward()
    opt.step()
    stepped["at"] = time.perf_counter()


def batches():
    """This rank's steps: the sampler's epoch under lbbsp (it resumes after a reset), else a step count."""
    if LBBSP:
        for idx in sampler:
            yield lambda: lbbsp_step(idx)
    else:
        while state.batch < args.steps:
            yield lambda: train_step(1000 * state.batch + hvd.rank())


def hold():
    """A wait STEP:SIZE at the current batch: training goes on (steps not counted in state.batch) until the driver
    has changed the rank set; commit() raises HostsUpdatedInterrupt then (lbbsp: Horovod's commit sees it without
    training). Called after each step and when train() starts again after a reset, which may resume at a wait's
    batch."""
    while state.batch in waits and hvd.size() != waits[state.batch]:
        if not LBBSP:
            train_step(1000 * state.batch + 100 + hvd.rank())
        time.sleep(0.2)
        commit()


@hvd.elastic.run
def train(state):
    commits.entered()
    hold()
    for step in batches():
        step()
        state.batch += 1
        if not state.sizes or state.sizes[-1] != hvd.size():
            state.sizes = state.sizes + [hvd.size()]
        if hvd.rank() == 0 and state.batch == args.remove_at:
            write_hosts(args.np - 1)
        if hvd.rank() == 0 and state.batch in args.add_at:
            write_hosts(args.np)
        marker = args.hosts_file + ".killed"
        if state.batch == args.kill_at and discovery.is_kill_host(args.host_names, args.kill_host) \
                and not os.path.exists(marker):
            open(marker, "w").close()
            print(f"KILLED rank={hvd.rank()} at batch {state.batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.step_sleep)
        if state.batch % args.commit_every == 0:
            commit()
        hold()


train(state)
report = hvde.finish(opt)
audit = f" audit_off={int((model.seen.detach() - 1).abs().gt(1e-6).sum())}" if LBBSP else ""
digest = weights_digest()
counters = [r["counters"] for r in report["ranks"]]
mine = counters[hvd.rank()]
# pushed: every final rank's pushes into the last engine (the one built after the last reset); applied: the updates
# of all ranks in the ticks this rank applied -- equal when nothing was lost or applied twice since that reset
print(f"ELASTIC rank={hvd.rank()} size={hvd.size()} batch={state.batch} global={hvde.global_steps(opt)} "
      f"sizes={','.join(map(str, state.sizes))} digest={digest} "
      f"pushed={sum(c.get('pushed', 0) for c in counters)} applied={mine.get('applied_contributions', 0)} "
      f"resets={mine.get('elastic_resets', 0)} resumed={listed(mine.get('elastic_resumed_from_updates', []))} "
      f"lost={listed(mine.get('elastic_lost_updates', []))} "
      f"in_flight={listed(mine.get('elastic_in_flight_updates', []))} "
      f"beyond_commit={listed(mine.get('elastic_beyond_commit_updates', []))} "
      f"before_reset={listed(mine.get('elastic_before_reset_s', []))} "
      f"step_to_reset_end={listed(round(g, 3) for g in stepped['gaps'])} "
      f"entry_is_commit={listed(commits.entry_is_commit)} lr_off={stepped['lr_off']} "
      f"loads={mine.get('elastic_replica_loads', 0)} replaced={mine.get('elastic_sync_replaced', 0)}"
      f"{audit}", flush=True)
