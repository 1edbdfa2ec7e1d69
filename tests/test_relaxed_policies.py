"""Relaxed policies on real multi-rank runs under mpirun: what needs real processes, Horovod's collectives and a real
model -- a large model's streamed pushes, asp's fast ranks running ahead of a straggler, zipline's barriers and
wbsp's downloads under a straggler, each with the invariants (docs/design.md, "Invariants": nothing lost, identical
replicas) and learning.

Each policy is trained on 4 ranks (rank 3 ten times slower, injected as sleep) until a global budget of steps, one
policy after the other in one job (the policy and its knobs as the optimizer's keywords). The engine's logic under
scripted schedules (the staleness bounds reached and kept, degenerate settings giving BSP's weights, zipline at the
bound, join and auto tick pacing, own pushes in flight, wbsp's measured slowest rank) is tested in one process:
tests/test_engine.py and tests/test_engine_pacing.py, which also hold the exact figures of each speed claim. Here a
speed claim is checked with the margin that separates it from lock-step, since a loaded machine blurs the figures.
These run under mpirun: on a 2-core machine a Gloo collective takes 20-40 ms under load (MPI: about 5 ms), longer
than the fast ranks' step, so under horovodrun --gloo the tick latency, not the straggler, bounds the fast ranks
(docs/design.md).
"""
import json
import os

import pytest

from launch import launch, selected

STRAGGLER = {"HVD_ELASTIC_EMULATE_DELAY": "*:0.002,3:0.02"}


# test -> its run of the straggler job: the optimizer's keywords (the policy and its knobs; "target": the global
# steps). The selected tests' runs go in one job, one after the other from the same start.
RUNS = {
    "test_asp_never_waits_and_fast_ranks_run_ahead": {"policy": "asp", "target": 1200},
    # Every rank predicts from the same tick-delivered history, so it places the same barriers on all.
    "test_zipline_barriers_bound_iterations_and_replicas_match_at_every_barrier": {
        "policy": "zipline", "lookahead": 6, "predictor": "last"},
    "test_wbsp_downloads_only_models_that_include_the_slowest_upload": {"policy": "wbsp", "wbsp_overlap": True},
    "test_auto_leaves_lockstep_under_a_persistent_straggler_and_keeps_the_invariants": {"policy": "auto"},
}


@pytest.fixture(scope="module")
def straggler_runs(request, tmp_path_factory):
    """policy -> the 4 ranks' outputs of its run in the straggler job (4 ranks, rank 3 ten times slower)."""
    runs = [RUNS[name] for name in selected(request, RUNS)]
    out = tmp_path_factory.mktemp("straggler")
    res = launch("mpirun", 4, "tests/workers/relaxed_train.py",
                 [out, "--mode", "train", "--target", "800", "--runs", json.dumps(runs)], env=STRAGGLER, timeout=400)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return {run["policy"]: [json.load(open(os.path.join(out, f"rank{r}.{run['policy']}.json"))) for r in range(4)]
            for run in runs}


def test_a_large_model_with_a_collective_of_the_scripts_own_every_step_moves_no_empty_payload(tmp_path):
    """2.25M parameters in lock-step (equal speeds), and an allreduce of the loss of the script's own after every
    step: while the ranks wait in it their tick threads join every tick at once, which for a payload this size must
    be probes (the payload moving empty each step would double the bytes). Horovod's weights under ssp s=0, every
    push applied once on every rank, no hang."""
    steps = 12
    res = launch("mpirun", 2, "tests/workers/relaxed_train.py",
                 [tmp_path, "--mode", "degenerate", "--steps", str(steps), "--hidden", "90000", "--policies", "ssp",
                  "--backward-delay", "0.03", "--user-collective"], env={"HVD_ELASTIC_STALENESS": "0"}, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.ssp.json"))) for r in range(2)]
    reports = [r["report"]["ranks"][r["rank"]]["counters"] for r in ranks]
    assert all(c["lockstep_share"] == 1.0 for c in reports), reports
    assert all(c["payload_collectives"] <= steps + 1 for c in reports), reports
    assert all(c["applied_contributions"] == 2 * steps for c in reports), reports
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    assert ranks[0]["ref_max_abs"] > 0 and ranks[0]["max_abs_diff"] <= 5e-5, ranks[0]["max_abs_diff"]


def test_streamed_pushes_of_a_large_model_keep_bsp_weights_and_every_update(tmp_path):
    """2.25M parameters: full ticks go in chunks and a rank's gradient is read during backward (streamed push,
    engine/stream.py). ssp s=0 must still give Horovod's weights; asp must apply every push once on every rank and
    leave identical replicas. One job: the BSP reference, then each policy from the same start. Backward sleeps 30 ms
    between the last layer's gradients and the first's (a one-layer model's backward ends before a probe has gone
    round, so a stream would seldom find a full tick to take it)."""
    env = {"HVD_ELASTIC_STALENESS": "0"}
    res = launch("mpirun", 2, "tests/workers/relaxed_train.py",
                 [tmp_path, "--mode", "degenerate", "--steps", "20", "--hidden", "90000", "--policies", "ssp,asp",
                  "--backward-delay", "0.03"], env=env, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    for policy in ("ssp", "asp"):
        ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.{policy}.json"))) for r in range(2)]
        reports = [r["report"]["ranks"][r["rank"]]["counters"] for r in ranks]
        assert ranks[0]["numel"] > 2 * (1 << 20)
        # the streamed path ran on every rank (the first steps push whole: periods are not measured yet)
        assert all(c["streamed_pushes"] > 0 for c in reports), (policy, reports)
        # metadata first at this size: a payload moves only in the tick after a probe that released it
        assert all(0 < 2 * c["payload_collectives"] <= c["ticks"] for c in reports), (policy, reports)
        pushed = sum(c["pushed"] for c in reports)
        assert pushed == 40 and all(c["applied_contributions"] == pushed for c in reports), (policy, reports)
        _buffers_reused(reports)
        # hashed after finish(), which applies the ticks still on their way (a peer's last push may come in a tick
        # of its own)
        assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], (policy, [
            {k: c.get(k) for k in ("ticks", "nonempty_ticks", "ticks_applied", "streamed_pushes", "backward_pushes",
                                   "payload_collectives")} for c in reports])
        if policy == "ssp":
            # Horovod's weights up to the order of summation: a round whose two gradients land in two ticks is
            # applied as two half steps (plain SGD: the same update, rounded differently): 0 (one tick per round) to
            # about 5e-6 over 2.25M weights and 20 steps, while one chunk left unread gives 0.08. This model at lr 0.2
            # amplifies rounding (plain BSP with its weights moved by 1e-7 ends about 1e-4 away after 20 steps and
            # 0.075 after 40), so more steps would fail on rounding alone; 20 keep the check sharp.
            for r in ranks:
                assert r["ref_max_abs"] > 0 and r["max_abs_diff"] <= 5e-5, r["max_abs_diff"]


def _buffers_reused(counters):
    """No model-sized allocation per tick: a rank makes at most as many update buffers as it needs at once (the
    ticks it holds, pending, the tick in flight, a spare), however many ticks it runs. (POOL_LIMIT keeps only so many
    given back: past it a rank holding more ticks at once may make some again.)"""
    from hvd_elastic.engine.pool import POOL_LIMIT
    for c in counters:
        assert c["nonempty_ticks"] > 10 and c["held_ticks_max"] >= 1, c
        if c["held_ticks_max"] <= POOL_LIMIT:
            assert c["buffers_allocated"] <= c["held_ticks_max"] + 3, c


def _common_invariants(ranks, policy):
    reports = [r["report"]["ranks"][r["rank"]] for r in ranks]
    _buffers_reused([rep["counters"] for rep in reports])
    pushed_total = sum(rep["counters"]["pushed"] for rep in reports)
    for r, rep in zip(ranks, reports):
        # Invariant 4: every pushed update applied exactly once on every rank (nothing lost, nothing doubled).
        assert rep["counters"]["applied_contributions"] == pushed_total, (policy, rep["counters"])
        assert rep["counters"]["pushed"] == r["local_steps"]
        # The run learned something: no policy "wins" by not learning.
        assert r["accuracy"] > 0.85, (policy, r["accuracy"])
    # Invariant 3: identical weights on every rank after the final barrier.
    assert len({r["weights_sha256"] for r in ranks}) == 1, policy
    return reports


def test_asp_never_waits_and_fast_ranks_run_ahead(straggler_runs):
    reports = _common_invariants(straggler_runs["asp"], "asp")
    # The exact bounds (wait share under 0.5 / 1.5 from peer alignment, the straggler's gradients 5x staler than the
    # fast ranks', fast ranks 3x its steps) hold on scripted step times in the harness (tests/test_engine_pacing.py).
    # Here, on real ranks of a loaded 2-core machine, each is checked with the margin that separates asp from
    # lock-step: waiting for the 10x slower straggler would be about 90% of the wall clock, and every rank would take
    # the same steps with gradients equally fresh.
    assert all(rep["wait_share"] < 0.5 for rep in reports), [rep["wait_share"] for rep in reports]
    # The straggler's delay is slept when backward starts (Session.emulate_early), before its gradient is pushed, as
    # a slower device spends it: the fast ranks' pushes during it make that gradient stale (about 3-4 updates), while
    # a fast rank's gradient misses little (about 1).
    stale = [rep["counters"]["staleness_mean"] for rep in reports]
    assert stale[3] > 1.0 and stale[3] > 2 * max(stale[:3]), stale
    # A fast rank's step is bounded by its tick's round trip (max in flight 0), not by the straggler: about 1.7-3x
    # the straggler's steps on a 2-core machine, depending on its load.
    fast_steps = [rep["steps"] for rep in reports[:3]]
    assert min(fast_steps) > 1.2 * reports[3]["steps"], [rep["steps"] for rep in reports]


def test_zipline_barriers_bound_iterations_and_replicas_match_at_every_barrier(straggler_runs):
    reports = _common_invariants(straggler_runs["zipline"], "zipline")
    counters = [rep["counters"] for rep in reports]
    assert counters[0]["barriers"] >= 5, counters[0]
    assert len({c["barriers"] for c in counters}) == 1
    assert all(c["max_iterations_between_barriers"] <= 6 for c in counters), counters
    # Invariant 3 at every barrier: a running digest of each rank's weights right after each barrier.
    assert len({c["barrier_digest"] for c in counters}) == 1, counters
    # Where each barrier goes (ZipLine's windows under a straggler, the bound while every rank is a peer) depends on
    # measured step times, which a loaded machine blurs: tests/test_engine_pacing.py checks it on scripted times.


def test_wbsp_downloads_only_models_that_include_the_slowest_upload(straggler_runs):
    reports = _common_invariants(straggler_runs["wbsp"], "wbsp")
    for rep in reports:
        c = rep["counters"]
        assert c["wbsp_slowest_rank"] == 3, c                 # measured, not configured
        assert c["wbsp_stale_downloads"] == 0, c              # invariant 7
        assert c["downloads"] > 0, c
        # nobody waits for the straggler (lock-step: about 90% of the wall clock; measured here: about 1%)
        assert rep["wait_share"] < 0.2, rep
    # Fast ranks run ahead (about 2x the straggler's steps here, bounded by their ticks' round trip) and download
    # about once per upload of the straggler, far less often than they step (about half; the harness checks the
    # exact figures on scripted step times, tests/test_engine_pacing.py).
    assert min(rep["steps"] for rep in reports[:3]) > 1.2 * reports[3]["steps"], [rep["steps"] for rep in reports]
    assert all(rep["counters"]["downloads"] < 0.75 * rep["steps"] for rep in reports[:3]), [
        (rep["counters"]["downloads"], rep["steps"]) for rep in reports]


def test_auto_leaves_lockstep_under_a_persistent_straggler_and_keeps_the_invariants(straggler_runs):
    """auto (wbsp with overlap and the lock-step fallback): lock-step until lock-step's cost is measured, its rounds
    gradients on one replica, then wbsp with overlap (deltas) for most of the run, the same switches on every rank;
    every upload in the global model once, the same final model everywhere, and the fast ranks ahead of the 10x
    straggler (in lock-step they would take its steps)."""
    reports = _common_invariants(straggler_runs["auto"], "auto")
    counters = [rep["counters"] for rep in reports]
    assert len({(c["lockstep_switches"], tuple(c["lockstep_switch_pushes"])) for c in counters}) == 1, counters
    c = counters[0]
    assert c["lockstep_switches"] >= 1 and c["lockstep_share"] < 0.5, c
    # gradients in the first lock-step rounds, deltas from one tick on, the same on every rank
    assert len({cc["deltas_from_tick"] for cc in counters}) == 1 and c["deltas_from_tick"] > 0, counters
    assert all(0 < cc["gradient_pushes"] < cc["pushed"] for cc in counters), counters
    assert min(rep["steps"] for rep in reports[:3]) > 1.2 * reports[3]["steps"], [rep["steps"] for rep in reports]
