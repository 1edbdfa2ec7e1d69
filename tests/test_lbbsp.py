"""LB-BSP under PyTorch on real multi-rank runs (docs/design.md, "Invariants", 6; the rule: docs/algorithms.md).

- every step's batch sizes sum to the global batch B (recorded by every rank: every rank sees the same sizes);
- within an epoch every sample is processed exactly once across ranks (every rank records its indices);
- the applied gradient equals one process's gradient over the same global batch (rank 0 recomputes it);
- under a 3x straggler (per-sample emulated delay) the sizes approach the speed ratio, from the step after the first
  timed one, and the fast ranks' wait share falls well below bsp's with the same straggler; when the straggler
  recovers the sizes follow;
- the sampler's order is torch's DistributedSampler's (whatever the sizes, the same global batches);
- Horovod's clipping protocol (synchronize(), clip, step() inside skip_synchronize()) clips the global-batch gradient;
  a step skipped after synchronize() (GradScaler's overflow) is ended unapplied, sizes unchanged, at the next draw or
  at zero_grad() (a script drawing its own batches from batch_sizes());
- drawing batches ahead of the steps (DataLoader workers prefetching) is refused;
- bad input (B below the number of ranks, caps that cannot hold B, a dataset smaller than B) stops every rank with
  one line (one real launch; the messages in one process).
Speeds come from sleeps (HVD_ELASTIC_EMULATE_SAMPLE_DELAY), so 4 ranks on 2 cores behave like workers of different
speeds; assertions on speed are coarse and relative.
"""
import json
import os

import numpy as np
import pytest

from hvd_elastic.config import Config
from hvd_elastic.errors import ConfigError
from hvd_elastic.lbbsp import batch_positions, check_settings
from launch import launch
from test_bad_input import _assert_every_rank_failed_with


def _ranks(path, n):
    return [json.load(open(os.path.join(path, f"rank{r}.json"))) for r in range(n)]


def _run(launcher, np_, args, env, tmp_path, timeout=240):
    res = launch(launcher, np_, "tests/workers/lbbsp_train.py", [tmp_path, *args], env=env, timeout=timeout)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return _ranks(tmp_path, np_)


CHECK = {  # launcher, ranks, B, samples, extra env, extra args
    "cpu_mpirun": ("mpirun", 3, 48, 480, {"HVD_ELASTIC_PREDICTOR": "ewma"}, []),
    # gpu mode, caps, and a dataset that is not a multiple of B with padding (drop_last=False)
    "gpu_caps_pad_horovodrun": ("horovodrun", 3, 48, 500,
                                {"HVD_ELASTIC_LBBSP_MODE": "gpu", "HVD_ELASTIC_LBBSP_CAPS": "*:30,1:20"}, ["--pad"]),
}


def run_check_case(worker_run, case, tmp_path, grad_atol):
    """Invariant 6 on a --mode check run of an lbbsp worker (tests/workers/lbbsp_train.py or keras_lbbsp.py, which
    record the same fields): launch CHECK[case], assert what both frontends promise, return the ranks' records."""
    launcher, n, B, samples, env, extra = CHECK[case]
    env = {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": str(B),
           "HVD_ELASTIC_EMULATE_SAMPLE_DELAY": "*:0.0003,2:0.0015", **env}
    epochs = 2
    ranks = worker_run(launcher, n, ["--mode", "check", "--samples", samples, "--epochs", epochs, *extra], env,
                       tmp_path)
    steps_per_epoch = -(-samples // B) if "--pad" in extra else samples // B
    caps = [20 if p == 1 else 30 for p in range(n)] if "CAPS" in str(env) else [B] * n
    for r in ranks:
        assert len(r["steps"]) == epochs * steps_per_epoch == epochs * r["steps_per_epoch"]
        assert [s["sizes"] for s in r["steps"]] == [s["sizes"] for s in ranks[0]["steps"]]   # same on every rank
        for s in r["steps"]:
            assert sum(s["sizes"]) == B, s                                   # invariant 6: sum is B, every step
            assert all(1 <= b <= c for b, c in zip(s["sizes"], caps)), s
            assert s["local"] == s["sizes"][r["rank"]]                       # the data path gave what was decided
        assert "draw one batch per step" in r["prefetch_error"], r["prefetch_error"][-500:]
    sizes = np.array([s["sizes"] for s in ranks[0]["steps"]])
    assert len({tuple(s) for s in sizes}) > 1, "the sizes never changed"
    # rank 2 (five times the others' per-sample delay) gets less than B/n and less than rank 1 (the same work per
    # sample as rank 0); rank 0 also computes the reference gradient each step, a cost of its own that grows with the
    # machine's load (on a loaded machine its share fell below rank 2's), so its share is not compared
    last = sizes[-5:].mean(axis=0)
    assert last[2] < B / n and last[2] < last[1], sizes[-5:]
    for e in range(epochs):
        seen = sorted(i for r in ranks for i in r["indices"][e])
        if "--pad" in extra:   # every sample at least once; the last global batch is completed from the start
            assert set(seen) == set(range(samples)) and len(seen) == steps_per_epoch * B
        else:                  # every sample exactly once
            assert seen == list(range(samples))
    assert ranks[0]["indices"][0] != ranks[0]["indices"][1]                  # a new shuffle each epoch
    assert ranks[0]["grad_checked"] == epochs * steps_per_epoch
    assert ranks[0]["grad_err"] < grad_atol, ranks[0]["grad_err"]
    assert len({r["weights_sha256"] for r in ranks}) == 1
    counters = [r["report"]["ranks"][r["rank"]]["counters"] for r in ranks]
    final = counters[0]["lbbsp_sizes"]       # decided after the last step (not recorded in the steps)
    changes = int((sizes[1:] != sizes[:-1]).any(axis=1).sum()) + int(final != list(sizes[-1]))
    assert all(c["lbbsp_sizes"] == final and c["lbbsp_resizes"] == changes for c in counters), (counters, changes)
    assert sum(final) == B
    assert counters[2]["lbbsp_size_min"] < B // n < counters[1]["lbbsp_size_max"]
    return ranks


@pytest.mark.parametrize("case", sorted(CHECK))
def test_sizes_sum_to_B_each_sample_once_per_epoch_and_gradient_is_the_global_batch_gradient(case, tmp_path):
    ranks = run_check_case(_run, case, tmp_path, grad_atol=1e-6)
    assert all("num_workers must be 0" in r["prefetch_error"] for r in ranks)
    # torch: the order is DistributedSampler's, so whatever the sizes the global batches are the usual sampler's
    assert all(r["same_batches_as_distributed_sampler"] == [True, True] for r in ranks)


@pytest.mark.parametrize("batches", ["sampler", "own"])
def test_horovods_clipping_protocol_clips_the_global_batch_gradient_and_a_skipped_step_stays_unapplied(tmp_path,
                                                                                                       batches):
    # synchronize() completes the weighted exchange (as Horovod's leaves the averaged gradient), so the script clips
    # the gradient over the global batch, and step() inside skip_synchronize() applies it as clipped: no race with
    # reductions still in flight, no second exchange, the same weights on every rank. A step whose step() the script
    # skips after synchronize() (torch.amp.GradScaler after an overflow) is ended, unapplied, at the next draw of
    # LbbspSampler ("sampler") or, where the script takes its batches from batch_sizes() itself ("own"), at its
    # next opt.zero_grad(); either way the sizes stay, so the batch drawn before that weighs what it holds.
    env = {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "48",
           "HVD_ELASTIC_EMULATE_SAMPLE_DELAY": "*:0.0003,2:0.0015"}
    res = launch("mpirun", 3, "tests/workers/lbbsp_train.py",
                 [tmp_path, "--mode", "check", "--samples", 480, "--epochs", 1, "--clip", 0.05, "--skip-every", 4,
                  *(["--own-batches"] if batches == "own" else [])],
                 env=env, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    assert "skip_synchronize() context" not in res.output, res.output[-3000:]    # Horovod's warning: not due here
    ranks = _ranks(tmp_path, 3)
    assert len({tuple(s["sizes"]) for s in ranks[0]["steps"]}) > 1, "the sizes never changed"
    r0 = ranks[0]
    assert len(r0["steps"]) == 10 and r0["grad_checked"] == 8 and r0["clipped_steps"] >= 6, r0["clipped_steps"]
    assert r0["sync_err"] < 1e-6, r0["sync_err"]      # after synchronize(): the global-batch gradient
    assert r0["grad_err"] < 1e-6, r0["grad_err"]      # applied: that gradient clipped to norm 0.05
    assert r0["skipped_unchanged"] == 2               # steps 3 and 7: no step(), the weights as they were
    assert all(r["report"]["ranks"][r["rank"]]["counters"]["lbbsp_unapplied_steps"] == 2 for r in ranks)
    assert all(r["report"]["ranks"][r["rank"]]["counters"]["lbbsp_resizes"] > 0 for r in ranks)
    assert len({r["weights_sha256"] for r in ranks}) == 1


def test_a_step_ended_unapplied_keeps_the_sizes_and_its_times_count_towards_the_next_resize():
    # In one process, the rule every rank runs on the same table: a skipped step (resize=False) leaves the sizes a
    # script may already have drawn its batch by, and its per-sample times still reach the history, so the next
    # applied step re-sizes from both.
    from hvd_elastic.lbbsp import LbbspController
    from hvd_elastic.telemetry import Telemetry

    size = 3
    cfg = Config.from_env({}, policy="lbbsp", global_batch=48)
    ctl = LbbspController(cfg, 0, size, Telemetry(0, size, "lbbsp"))

    def table(ns_per_sample):
        return np.array([[ns * b, b, 0] for ns, b in zip(ns_per_sample, ctl.sizes)], np.int64)

    ctl.update(table([1000, 1000, 1000]))                     # step 0: start-up, never a speed
    ctl.update(table([1000, 1000, 5000]), resize=False)
    assert ctl.sizes == [16, 16, 16] and ctl.steps == 2 and len(ctl.history[2]) == 1
    ctl.update(table([1000, 1000, 5000]))
    assert ctl.sizes[2] < ctl.sizes[0] and sum(ctl.sizes) == 48 and len(ctl.history[2]) == 2


STEPS, RECOVER = 240, 120
FAST, SLOW = 0.0005, 0.0015          # seconds per sample: rank 3 is 3x slower until it recovers


def test_straggler_sizes_follow_speed_ratio_then_recovery_and_fast_ranks_stop_waiting(tmp_path):
    # One job: lbbsp, then the bsp baseline -- the same per-sample costs at the even split (16 samples a rank), as
    # per-step delays; the straggler stays slow (its wait share is lbbsp's ceiling), and fewer steps measure it.
    runs = [{"policy": "lbbsp", "global_batch": 64, "predictor": "ewma",
             "emulate_sample_delay": f"*:{FAST},3:{SLOW}"},
            {"policy": "bsp", "global_batch": 64, "steps": 80, "emulate_delay": f"*:{16 * FAST},3:{16 * SLOW}"}]
    res = launch("mpirun", 4, "tests/workers/lbbsp_train.py",
                 [tmp_path, "--mode", "train", "--steps", STEPS, "--recover-at", RECOVER, "--recovered-delay", FAST,
                  "--runs", json.dumps(runs)], timeout=300)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    lb, bsp = ([json.load(open(os.path.join(tmp_path, f"rank{r}.{p}.json"))) for r in range(4)]
               for p in ("lbbsp", "bsp"))
    sizes = np.array(lb[0]["sizes"])
    assert all(r["sizes"] == lb[0]["sizes"] for r in lb)
    assert (sizes.sum(axis=1) == 64).all()
    assert len({r["weights_sha256"] for r in lb}) == 1
    # Slow phase: speed ratio 3:3:3:1 means 19.2 / 6.4 samples; the fixed per-step costs pull towards the even 16.
    slow = sizes[RECOVER - 40:RECOVER].mean(axis=0)
    assert slow[3] < 10 and slow[:3].min() > 17, slow
    # After the recovery the straggler's share grows back towards the even split.
    recovered = sizes[-40:].mean(axis=0)
    assert recovered[3] > 12 and recovered[:3].max() < 20, recovered
    lb_wait = [r["wait_share"] for r in lb[0]["report"]["ranks"]]
    bsp_wait = [r["wait_share"] for r in bsp[0]["report"]["ranks"]]
    assert max(lb_wait[:3]) < 0.6 * min(bsp_wait[:3]), (lb_wait, bsp_wait)
    assert lb[0]["accuracy"] > 0.85, lb[0]["accuracy"]
    counters = lb[0]["report"]["ranks"][3]["counters"]
    assert counters["lbbsp_size_min"] < 10 and counters["lbbsp_resizes"] > 0
    assert counters["lbbsp_trace"]["size_changes"][0] == [0, 16]
    # the sizes follow each step's own times: step 0 (start-up) is not a speed, step 1's re-sizes step 2
    assert counters["lbbsp_trace"]["size_changes"][1][0] == 2, counters["lbbsp_trace"]["size_changes"][:4]


# A bad setting found at start-up (check_settings: the same inputs on every rank, so every rank raises the same
# ConfigError) or by the data path (LbbspSampler) stops every rank with one line: one real launch; the other messages
# are checked in one process below.
def test_a_dataset_smaller_than_B_stops_every_rank_with_one_line():
    res = launch("mpirun", 2, "tests/workers/lbbsp_bad.py",
                 env={"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "64", "TEST_DATASET_LEN": "50"},
                 timeout=120)
    _assert_every_rank_failed_with(
        res, 2, "the dataset has 50 samples, fewer than the global batch HVD_ELASTIC_GLOBAL_BATCH=64")


def test_settings_checks_without_a_job():
    assert check_settings(Config.from_env({"HVD_ELASTIC_GLOBAL_BATCH": "64", "HVD_ELASTIC_LBBSP_CAPS": "*:100,2:10"}),
                          4) == [64, 64, 10, 64]
    with pytest.raises(ConfigError, match="policy lbbsp needs the global batch: set HVD_ELASTIC_GLOBAL_BATCH"):
        check_settings(Config.from_env({}), 2)
    with pytest.raises(ConfigError, match="HVD_ELASTIC_LBBSP_CAPS names rank 5 but the job has 4 ranks"):
        check_settings(Config.from_env({"HVD_ELASTIC_GLOBAL_BATCH": "64", "HVD_ELASTIC_LBBSP_CAPS": "5:3"}), 4)
    with pytest.raises(ConfigError, match="HVD_ELASTIC_LBBSP_CAPS='1:2.5' is not valid; accepted: .*whole SAMPLES"):
        Config.from_env({"HVD_ELASTIC_LBBSP_CAPS": "1:2.5"})
    with pytest.raises(ConfigError, match=r"HVD_ELASTIC_GLOBAL_BATCH=1 is smaller than the number of ranks \(2\)"):
        check_settings(Config.from_env({"HVD_ELASTIC_GLOBAL_BATCH": "1"}), 2)
    with pytest.raises(ConfigError,
                       match="HVD_ELASTIC_LBBSP_CAPS caps sum to 50 samples, below HVD_ELASTIC_GLOBAL_BATCH=64"):
        check_settings(Config.from_env({"HVD_ELASTIC_GLOBAL_BATCH": "64", "HVD_ELASTIC_LBBSP_CAPS": "*:20,1:30"}), 2)


@pytest.mark.parametrize("sizes", [[16, 16, 16, 16], [10, 30, 6, 18], [1, 47], [5, 1, 1, 9, 2]])
def test_batch_positions_deal_every_position_once_and_equal_sizes_split_as_distributed_sampler(sizes):
    import torch
    B, n = sum(sizes), len(sizes)
    dealt = [batch_positions(sizes, p) for p in range(n)]
    assert [len(d) for d in dealt] == sizes
    assert all((np.diff(d) > 0).all() for d in dealt)
    assert sorted(np.concatenate(dealt).tolist()) == list(range(B))
    # dealt in rank order: among the ranks still taking samples, position k goes to the next one
    owner = np.empty(B, int)
    for p, d in enumerate(dealt):
        owner[d] = p
    assert owner[:n].tolist() == list(range(n))
    if len(set(sizes)) == 1:
        # torch's DistributedSampler over 3 global batches: rank p's i-th batch of B / n is exactly its positions
        order = torch.randperm(3 * B, generator=torch.Generator().manual_seed(4))
        for p in range(n):
            ds = list(torch.utils.data.DistributedSampler(range(3 * B), num_replicas=n, rank=p, shuffle=True,
                                                          seed=4))
            for i in range(3):
                assert ds[i * sizes[p]:(i + 1) * sizes[p]] == order[i * B + dealt[p]].tolist()


def test_a_plan_resumed_over_other_ranks_takes_every_remaining_sample_of_the_epoch_once():
    # In one process, the data side of elastic Horovod: a pass stopped after some global batches is resumed from its
    # state_dict (a commit, or a reset that cut the pass short) over a different number of ranks with other sizes;
    # the batches stepped before and the ones taken after cover the epoch exactly once.
    from hvd_elastic.lbbsp import BatchPlan, LbbspController
    from hvd_elastic.telemetry import Telemetry

    B, steps = 24, 10
    cfg = Config.from_env({}, policy="lbbsp", global_batch=B)

    def controllers(size):
        return [LbbspController(cfg, r, size, Telemetry(r, size, "lbbsp")) for r in range(size)]

    def take(plans, ctls, count, sizes=None):
        """`count` synchronous steps of every rank's plan; returns the sample indices taken."""
        taken, its = [], [p.batches("test") for p in plans]
        for _ in range(count):
            for it in its:
                taken.extend(next(it).tolist())
            for c in ctls:
                c.update(np.array([[1000 * b, b, 0] for b in c.sizes], np.int64))
                if sizes:
                    c.sizes = list(sizes)
        return taken

    resets = [0]
    ctls = controllers(3)
    plans = [BatchPlan(steps * B, (lambda c=c: c), seed=3, resets=lambda: resets[0]) for c in ctls]
    before = take(plans, ctls, 4, sizes=[4, 12, 8])
    assert {tuple(p.state_dict().items()) for p in plans} == {(("epoch", 0), ("batches", 4))}

    # a commit: new ranks (2 of them, a joiner among them) load the state and resume at batch 4
    ctls2 = controllers(2)
    plans2 = [BatchPlan(steps * B, (lambda c=c: c), seed=3, resets=lambda: resets[0]) for c in ctls2]
    for p in plans2:
        p.load_state_dict(plans[0].state_dict())
    after = take(plans2, ctls2, steps - 4, sizes=[5, 19])
    order = plans[0].order(0)
    assert sorted(before + after) == sorted(order.tolist()) and len(before + after) == steps * B
    assert {tuple(p.state_dict().items()) for p in plans2} == {(("epoch", 1), ("batches", 0))}

    # a reset that cuts a pass short without a load (an announced change): the next pass resumes it
    taken = take(plans2, ctls2, 3)
    resets[0] += 1
    rest = take(plans2, ctls2, steps - 3)
    assert sorted(taken + rest) == sorted(plans2[0].order(1).tolist())
    # without a reset, a new pass starts the next epoch from its start, as before
    assert sorted(take(plans2, ctls2, 1)) == sorted(plans2[0].order(2)[:B].tolist())
    with pytest.raises(ValueError, match="batches=11 is outside this epoch's 0..10 batches"):
        plans2[0].load_state_dict({"epoch": 0, "batches": 11})
