"""Relaxed policies on real multi-rank runs: invariants 2-5 and 7 of architecture.md, and learning with a straggler.

Each policy is trained once on 4 ranks (rank 3 ten times slower, injected as sleep) until 800 global steps; one
run checks every invariant that applies to it. Degenerate settings are checked against Horovod's own BSP.
Claims about speed (fast ranks run ahead) are checked under mpirun only: on this 2-core machine a Gloo collective
takes 20-40 ms under load (MPI: about 5 ms), longer than the fast ranks' step, so under horovodrun --gloo the tick
latency, not the straggler, bounds the fast ranks (see docs/design.md).
"""
import json
import os

import numpy as np
import pytest

from launch import launch

STRAGGLER = {"HVD_ELASTIC_EMULATE_DELAY": "*:0.002,3:0.02"}


def _ranks(path, n):
    return [json.load(open(os.path.join(path, f"rank{r}.json"))) for r in range(n)]


def _run(launcher, env, tmp_path, np_=4, args=("--mode", "train", "--target", "800")):
    res = launch(launcher, np_, "tests/workers/relaxed_train.py", [tmp_path, *args], env=env, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return _ranks(tmp_path, np_)


DEGENERATE = {"ssp_s0": {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "0"},
              "dssp_0_0": {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_DSSP_LOWER": "0", "HVD_ELASTIC_DSSP_UPPER": "0"},
              "zipline_R1": {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "1"}}


@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_degenerate_settings_give_bsp_weights(case, tmp_path):
    launcher = ("horovodrun", "mpirun")[sorted(DEGENERATE).index(case) % 2]
    # 30 steps: a rank held at the gate must resume on exactly the tick that released it; the race that broke this
    # (later ticks, carrying the other rank's next gradient, applied too) hit about one 10-step run in ten under load.
    ranks = _run(launcher, {**DEGENERATE[case], "HVD_ELASTIC_EMULATE_DELAY": "1:0.01"}, tmp_path, np_=2,
                 args=("--mode", "degenerate", "--steps", "30"))
    for r in ranks:
        w, w_ref = np.asarray(r["w"]), np.asarray(r["w_ref"])
        assert np.abs(w_ref).max() > 0
        np.testing.assert_allclose(w, w_ref, rtol=0, atol=2e-6)
        counters = r["report"]["ranks"][r["rank"]]["counters"]
        assert counters["max_clock_gap"] == 0, counters
    assert ranks[0]["w"] == ranks[1]["w"]


@pytest.mark.parametrize("policy", ["ssp", "asp"])
def test_streamed_pushes_of_a_large_model_keep_bsp_weights_and_every_update(policy, tmp_path):
    """2.25M parameters: full ticks go in chunks and a rank's gradient is read during backward (streamed push,
    engine/stream.py). ssp s=0 must still give Horovod's weights; asp must apply every push once on every rank and
    leave identical replicas."""
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_STALENESS": "0"}
    ranks = _run("mpirun", env, tmp_path, np_=2, args=("--mode", "degenerate", "--steps", "20", "--hidden", "90000"))
    reports = [r["report"]["ranks"][r["rank"]]["counters"] for r in ranks]
    assert ranks[0]["numel"] > 2 * (1 << 20)
    # the streamed path ran (the first steps push whole: periods are not measured yet)
    assert sum(c["streamed_pushes"] for c in reports) > 0, reports
    # metadata first at this size: a payload moves only in the tick after a probe that released it
    assert all(0 < 2 * c["payload_collectives"] <= c["ticks"] for c in reports), reports
    pushed = sum(c["pushed"] for c in reports)
    assert pushed == 40 and all(c["applied_contributions"] == pushed for c in reports), reports
    _buffers_reused(reports)
    # (Failed one run in ten until the eleventh session: the worker hashed the weights before finish(), so a rank
    # whose peer's last push came in a tick of its own missed that tick. Per-tick hashes showed identical updates and
    # weights on both ranks at every tick.)
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], [
        {k: c.get(k) for k in ("ticks", "nonempty_ticks", "ticks_applied", "streamed_pushes", "backward_pushes",
                               "payload_collectives")} for c in reports]
    if policy == "ssp":
        # Horovod's weights up to the order of summation: a round whose two gradients land in two ticks is applied
        # as two half steps (plain SGD: the same update, rounded differently). Measured: 0 (one tick per round) to
        # 5.4e-6 over 2.25M weights and 20 steps; one chunk left unread gives 0.08. This model at lr 0.2 amplifies
        # rounding: plain BSP with its weights moved by 1e-7 ends 8.4e-5 away after 20 steps and 0.075 after 40
        # (single process, tenth session), so more steps would fail on rounding alone; 20 keep the check sharp.
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


def test_own_pushes_in_flight_let_equal_ranks_start_before_their_round_is_back(tmp_path):
    """HVD_ELASTIC_MAX_INFLIGHT=1: a rank starts its next step with its own push still in flight, so with equal
    speeds it computes on weights missing its round (its own and its peers' pushes of the last step): staleness
    about n. Peer alignment must not wait for that round: until the thirtieth session it compared the peers'
    delivered clocks with the rank's own clock, which counts the push in flight, and every rank waited for its
    round's tick anyway (30 ms steps, a ~5 ms tick: staleness about 0, the same as in flight 0)."""
    env = {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_MAX_INFLIGHT": "1", "HVD_ELASTIC_EMULATE_DELAY": "*:0.03"}
    reports = _common_invariants(_run("mpirun", env, tmp_path, args=("--mode", "train", "--target", "400")), "asp")
    means = [rep["counters"]["staleness_mean"] for rep in reports]
    assert all(m >= 2.0 for m in means), means


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_asp_never_waits_and_fast_ranks_run_ahead(launcher, tmp_path):
    # 1200 global steps: under Gloo's slow ticks asp's accuracy at 800 steps varied between 0.81 and 0.94.
    reports = _common_invariants(_run(launcher, {"HVD_ELASTIC_POLICY": "asp", **STRAGGLER}, tmp_path,
                                      args=("--mode", "train", "--target", "1200")), "asp")
    # asp's rule never holds a rank; the only wait is peer alignment (HVD_ELASTIC_PEER_WAIT, default 0.5 of the
    # rank's own step, only for ranks about as fast as it is), so at most 0.5 / 1.5 = 33% of the wall clock
    # (fast ranks measured 12-15% under a loaded mpirun at 0.25). Waiting for the 10x slower straggler would be ~90%.
    assert all(rep["wait_share"] < 0.34 for rep in reports), [rep["wait_share"] for rep in reports]
    if launcher == "mpirun":
        # The straggler's delay is slept when backward starts (Session.emulate_early), before its gradient is pushed,
        # as a slower device spends it: the fast ranks' pushes during it make that gradient stale. Measured mean
        # staleness, straggler vs the fast ranks' largest, under mpirun: 2.9-4.1 vs 0.03-0.24 (12x and more); slept
        # at step() (after the push, until the fifteenth session) 1.15 vs 0.38 (3.0x). Under horovodrun (Gloo's
        # slower ticks, the fast ranks barely run ahead) 1.1-2.1 vs 0.13-0.30 (3.8-13x): not asserted there.
        stale = [rep["counters"]["staleness_mean"] for rep in reports]
        assert stale[3] > 1.0 and stale[3] > 5 * max(stale[:3]), stale
        # Lock-step (bsp) would give 1.0x; a fast rank's step is bounded by its tick's round trip (max in flight 0),
        # not by the straggler. Measured fast / straggler steps: 2.2-3x on the sessions' first machine, 1.66-1.92x in
        # half the runs on the twelfth session's slower one (the same with the eleventh session's code), hence 1.5x.
        fast_steps = [rep["steps"] for rep in reports[:3]]
        assert min(fast_steps) > 1.5 * reports[3]["steps"], [rep["steps"] for rep in reports]


def test_ssp_gap_never_exceeds_staleness(tmp_path):
    env = {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "2", **STRAGGLER}
    reports = _common_invariants(_run("mpirun", env, tmp_path), "ssp")
    gaps = [rep["counters"]["max_clock_gap"] for rep in reports]
    assert max(gaps) == 2, gaps      # reached (the straggler is 10x slower) and never exceeded


def test_dssp_gap_never_exceeds_upper_bound(tmp_path):
    env = {"HVD_ELASTIC_POLICY": "dssp", "HVD_ELASTIC_DSSP_LOWER": "1", "HVD_ELASTIC_DSSP_UPPER": "4", **STRAGGLER}
    reports = _common_invariants(_run("horovodrun", env, tmp_path), "dssp")
    gaps = [rep["counters"]["max_clock_gap"] for rep in reports]
    assert 1 < max(gaps) <= 4, gaps  # beyond s_L thanks to credits, never beyond s_U
    assert sum(rep["counters"]["dssp_grants"] for rep in reports) > 0


@pytest.mark.parametrize("predictor", ["last", "median"])
def test_zipline_barriers_bound_iterations_and_replicas_match_at_every_barrier(predictor, tmp_path):
    # Every rank predicts from the same tick-delivered history, so every predictor places the same barriers on all.
    env = {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "6", "HVD_ELASTIC_PREDICTOR": predictor,
           **STRAGGLER}
    reports = _common_invariants(_run("mpirun", env, tmp_path), "zipline")
    counters = [rep["counters"] for rep in reports]
    assert counters[0]["barriers"] >= 5, counters[0]
    assert len({c["barriers"] for c in counters}) == 1
    assert all(c["max_iterations_between_barriers"] <= 6 for c in counters), counters
    # Invariant 3 at every barrier: a running digest of each rank's weights right after each barrier.
    assert len({c["barrier_digest"] for c in counters}) == 1, counters
    assert all(c["barriers_at_bound"] == 0 for c in counters), counters   # a straggler: every barrier by ZipLine


def test_zipline_with_equal_speeds_places_barriers_at_the_bound(tmp_path):
    """While every rank is a peer of every other (engine/table.py still_peers: nobody is a straggler), ZipLine's
    windows all predict the same wait and its tie went to the earliest: a barrier every ~2.7 iterations, each one
    splitting rounds of pushes (docs/benchmarks.md, twenty-third session). Such barriers go to the bound instead, at
    one clock for every rank: R steps after the least superstep start. Asserted: nearly every barrier at the bound,
    the bound reached and never exceeded, the same barriers and weights at each of them on every rank."""
    # 10 ms steps: at 4 ms one descheduling made a rank 1.5x slower than its peers (still_peers failed), and a full
    # CI run on a loaded machine placed 10 of 39 barriers by ZipLine's windows (at the bound 29 / 39 < 0.8)
    env = {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_LOOKAHEAD": "6", "HVD_ELASTIC_EMULATE_DELAY": "*:0.01"}
    reports = _common_invariants(_run("mpirun", env, tmp_path), "zipline")
    counters = [rep["counters"] for rep in reports]
    assert len({(c["barriers"], c["barriers_at_bound"], c["barrier_digest"]) for c in counters}) == 1, counters
    barriers, at_bound = counters[0]["barriers"], counters[0]["barriers_at_bound"]
    assert barriers >= 5 and at_bound >= 0.8 * barriers, (barriers, at_bound)
    assert all(c["max_iterations_between_barriers"] == 6 for c in counters), counters


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_wbsp_downloads_only_models_that_include_the_slowest_upload(overlap, tmp_path):
    env = {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": overlap, **STRAGGLER}
    reports = _common_invariants(_run("horovodrun" if overlap == "0" else "mpirun", env, tmp_path), "wbsp")
    for rep in reports:
        c = rep["counters"]
        assert c["wbsp_slowest_rank"] == 3, c                 # measured, not configured
        assert c["wbsp_stale_downloads"] == 0, c              # invariant 7
        assert c["downloads"] > 0, c
        assert rep["wait_share"] < 0.1, rep                   # nobody waits for the straggler
    if overlap == "1":   # mpirun: fast ranks run ahead and download far less often than they step
        assert min(rep["steps"] for rep in reports[:3]) > 2 * reports[3]["steps"]
        assert all(rep["counters"]["downloads"] < rep["steps"] / 2 for rep in reports[:3])


@pytest.mark.parametrize("policy", ["asp", "zipline"])
def test_join_pacing_keeps_the_invariants_with_every_tick_full(policy, tmp_path):
    """HVD_ELASTIC_TICK_PACING=join (engine/pacing.py): no probes, every tick carries the payload, and
    each rank's thread decides when to join. Every push applied once everywhere, identical replicas, zipline's
    barriers identical on every rank (a poll counted from "now" instead of from the tick hung zipline at its first
    barrier: this run would time out), and fewer ticks than probes would take: measured per push of the fastest
    rank, 1.9-2.1 ticks with join pacing, 3.9-4.0 with the default probes (this worker's 2 ms steps are shorter than
    a tick, so a round of pushes often takes two)."""
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_TICK_PACING": "join", "HVD_ELASTIC_LOOKAHEAD": "6",
           **STRAGGLER}
    reports = _common_invariants(_run("mpirun", env, tmp_path), policy)
    counters = [rep["counters"] for rep in reports]
    assert all(c["payload_collectives"] == c["ticks"] for c in counters), counters   # no probes
    assert len({c["ticks"] for c in counters}) == 1
    fastest = max(c["pushed"] for c in counters)
    assert counters[0]["ticks"] < 3 * fastest, (counters[0]["ticks"], fastest)
    if policy == "zipline":
        assert counters[0]["barriers"] >= 5 and len({c["barrier_digest"] for c in counters}) == 1, counters


@pytest.mark.parametrize("policy,speeds", [("asp", "equal"), ("asp", "straggler"), ("zipline", "straggler")])
def test_auto_pacing_joins_ticks_once_pushes_are_predictable(policy, speeds, tmp_path):
    """HVD_ELASTIC_TICK_PACING=auto (engine/pacing.py): probe pacing until a table shows every live rank's push period
    measured and nothing pending, join pacing from then on, with or without a straggler -- a decision every rank
    takes from the same tables, so both modes mix in one run without the ranks' collectives ever differing (a
    mismatch fails the run: "ranks are out of step"). While ticks are joined, a rank that waits for its own push
    (HVD_ELASTIC_MAX_INFLIGHT=0) sends that tick itself (Ticker.run_inline) unless its tick thread got there first:
    the invariants hold whichever thread issued a tick. Rank 3 ten times slower: the fast ranks' pushes are joined
    by group (join_wait_s). zipline (Policy.joins_stragglers = False) joins only while every rank is a peer: under
    the straggler its ticks stay probe-paced until the fast ranks have finished (the straggler, alone, may join)."""
    delay = {"HVD_ELASTIC_EMULATE_DELAY": "*:0.004"} if speeds == "equal" else STRAGGLER
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_TICK_PACING": "auto", **delay}
    reports = _common_invariants(_run("mpirun", env, tmp_path), policy)
    counters = [rep["counters"] for rep in reports]
    assert len({(c["ticks"], c["join_ticks"]) for c in counters}) == 1, counters   # the same decisions everywhere
    ticks, joined = counters[0]["ticks"], counters[0]["join_ticks"]
    if policy == "zipline":
        assert joined < 0.2 * ticks, (joined, ticks)
        return
    assert joined > 0.8 * ticks, (joined, ticks)       # the first ticks, before the periods are measured, probe
    fast = counters if speeds == "equal" else counters[:3]
    # each fast rank waits for its own push's tick and mostly sends it itself
    assert all(c["inline_ticks"] > 0.5 * c["pushed"] for c in fast), counters
