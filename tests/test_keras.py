"""Keras 3 / TensorFlow frontend on real 2-rank runs: model.fit and custom loops through the same sync engine as
PyTorch, with the invariants of docs/design.md ("Invariants") that apply to them.

- bsp: model.fit (graph mode) and a GradientTape loop give the weights of a single-process run over the combined
  batch (plain SGD), identical on both ranks, from different initial weights (the broadcast fixes them);
- relaxed policies under model.fit (policy= keyword: asp for the gradient policies, zipline for barriers; in the
  bsp checks' launch, after them), plus a custom loop under wbsp with Adam (deltas, per-rank optimizer state):
  identical weights on every rank, nothing lost (applied_contributions == sum of pushed), the policy's bound holds,
  and the model learns digits with rank 1 an emulated straggler (the staleness bounds of ssp and dssp are the
  engine's, the same for every frontend: tests/test_engine.py, tests/test_engine_pacing.py);
- torch then Keras in one process (horovodrun, ssp);
- bad input: one clear line on every rank, no hang (the messages themselves: tests/test_config.py, test_lbbsp.py).
TF start-up costs ~10 s per rank here, so each launch checks several properties.
"""
import json
import os

import numpy as np
import pytest

from launch import launch

STRAGGLER = {"HVD_ELASTIC_EMULATE_DELAY": "*:0.002,1:0.02"}
WORKER = "tests/workers/keras_fit.py"


def _run(launcher, tmp_path, args, env=None, timeout=300):
    res = launch(launcher, 2, WORKER, [tmp_path, *args], env=env or {}, timeout=timeout)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return res, [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(2)]


FIT = ("asp", "zipline")


@pytest.fixture(scope="module")
def fit_job(tmp_path_factory):
    """One mpirun job: the bsp checks, then the relaxed policies under model.fit and wbsp's custom loop, with rank 1
    a straggler (sleep: bsp's weights do not depend on it). The relaxed policies run their own rules: the lock-step
    fallback is off (HVD_ELASTIC_RELAX_MIN_GAIN=0; tests/test_lockstep.py tests it)."""
    out = tmp_path_factory.mktemp("keras_fit")
    env = {**STRAGGLER, "HVD_ELASTIC_LOOKAHEAD": "6", "HVD_ELASTIC_RELAX_MIN_GAIN": "0"}
    return _run("mpirun", out, ["--mode", "bsp,policies", "--steps", "12", "--batch", "16",
                                "--policies", ",".join(FIT), "--custom-loop", "wbsp", "--target", "300"], env=env)


def test_bsp_fit_and_custom_loop_equal_single_process_sgd_on_combined_batch(fit_job):
    res, (r0, r1) = fit_job
    w_ref = np.asarray(r0["w_ref"])
    for key in ("w_fit", "w_loop"):
        np.testing.assert_allclose(np.asarray(r0[key]), w_ref, rtol=0, atol=2e-6, err_msg=key)
        assert r0[key] == r1[key], key                      # bit-identical replicas
    # The epoch-end metric average: both ranks report the same loss, the mean of their own.
    assert r0["fit_loss"] == r1["fit_loss"]
    rep = r0["fit_report"]
    assert rep["policy"] == "bsp" and [r["steps"] for r in rep["ranks"]] == [12, 12]
    assert len(res.lines_with("hvd_elastic report: policy=bsp, 2 ranks")) == 2   # fit, then the custom loop


def test_relaxed_policies_under_fit_keep_replicas_identical_and_lose_nothing(fit_job):
    _, ranks = fit_job
    runs = list(zip(ranks[0]["runs"], ranks[1]["runs"]))
    assert [a["policy"] for a, _ in runs] == list(FIT) + ["wbsp"]
    for a, b in runs:
        policy = a["policy"]
        reports = [a["report"]["ranks"][0], b["report"]["ranks"][1]]
        counters = [rep["counters"] for rep in reports]
        pushed = sum(c["pushed"] for c in counters)
        assert pushed >= 300, (policy, counters)                      # the global budget was reached
        for r, c, rep in zip((a, b), counters, reports):
            assert c["applied_contributions"] == pushed, (policy, c)   # invariant 4
            # The time breakdown accounts each second once (nothing counted twice).
            assert rep["compute_s"] + rep["wait_s"] + rep["comm_s"] <= rep["wall_s"] + 0.05, (policy, rep)
            assert c["pushed"] == r["local_steps"], (policy, c)
            assert r["accuracy"] > 0.8, (policy, r["accuracy"])        # learned, straggler and all (300 steps)
        assert a["weights_sha256"] == b["weights_sha256"], policy      # invariant 3
        assert a["accuracy"] == b["accuracy"]
        if policy in FIT:   # MetricAverageCallback: the epoch's loss averaged over the ranks after the final sync
            assert a["fit_loss"] == b["fit_loss"] and len(a["fit_loss"]) == 1, (policy, a["fit_loss"], b["fit_loss"])
        if policy == "zipline":
            assert counters[0]["barriers"] >= 3 and counters[0]["barriers"] == counters[1]["barriers"]
            assert all(c["max_iterations_between_barriers"] <= 6 for c in counters), counters
            assert counters[0]["barrier_digest"] == counters[1]["barrier_digest"]
        if policy == "wbsp":
            assert all(c["wbsp_slowest_rank"] == 1 and c["wbsp_stale_downloads"] == 0 for c in counters), counters
        if policy in ("asp", "wbsp"):     # nobody waits for the straggler; the fast rank takes more steps
            assert reports[0]["steps"] > reports[1]["steps"], (policy, [r["steps"] for r in reports])
            assert all(rep["wait_share"] < 0.1 for rep in reports), policy


def test_auto_under_fit_and_horovodrun_keeps_replicas_identical_and_loses_nothing(tmp_path):
    """Policy auto (wbsp with overlap and the lock-step fallback) under model.fit, horovodrun --gloo, rank 1 ten
    times slower: both ranks make the same switches between lock-step and wbsp with overlap (at least the one out of
    lock-step once its cost is measured; gradients before it, deltas after), every upload is in the final model
    once, and both ranks end on it."""
    _, ranks = _run("horovodrun", tmp_path, ["--mode", "policies", "--policies", "auto", "--target", "600"],
                    env=STRAGGLER)
    runs = [r["runs"][0] for r in ranks]
    counters = [run["report"]["ranks"][rank]["counters"] for rank, run in enumerate(runs)]
    assert {run["policy"] for run in runs} == {"auto"}
    assert counters[0]["lockstep_switches"] >= 1, counters[0]
    assert len({(c["lockstep_switches"], tuple(c["lockstep_switch_pushes"])) for c in counters}) == 1, counters
    # gradients while in lock-step from the start, then deltas from one tick on (model.fit in defer mode throughout)
    assert len({c["deltas_from_tick"] for c in counters}) == 1 and counters[0]["deltas_from_tick"] > 0, counters
    assert all(0 < c["gradient_pushes"] < c["pushed"] for c in counters), counters
    pushed = sum(c["pushed"] for c in counters)
    assert pushed >= 600 and all(c["applied_contributions"] == pushed for c in counters), counters
    assert runs[0]["weights_sha256"] == runs[1]["weights_sha256"] and runs[0]["accuracy"] > 0.8, runs[0]["accuracy"]


def test_torch_then_keras_in_one_process(tmp_path):
    env = {"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_EMULATE_DELAY": "1:0.01"}
    res, (r0, r1) = _run("horovodrun", tmp_path, ["--mode", "mixed", "--target", "200"], env=env)
    for job in ("torch", "keras"):
        a, b = r0[job], r1[job]
        assert a["weights_sha256"] == b["weights_sha256"], job
        counters = [a["report"]["ranks"][0]["counters"], b["report"]["ranks"][1]["counters"]]
        pushed = sum(c["pushed"] for c in counters)
        assert pushed >= 200 and all(c["applied_contributions"] == pushed for c in counters), (job, counters)
        assert a["report"]["policy"] == "ssp" and a["accuracy"] > 0.8, (job, a["accuracy"])
    assert len(res.lines_with("hvd_elastic report: policy=ssp, 2 ranks")) == 2


def test_bad_input_stops_every_rank_with_one_line(tmp_path):
    needles = ["HVD_ELASTIC_POLICY='nope' is not valid", "bsp|asp|ssp|dssp|zipline|lbbsp|wbsp|auto"]
    res = launch("horovodrun", 2, WORKER, [tmp_path, "--mode", "config"], env={"HVD_ELASTIC_POLICY": "nope"},
                 timeout=120)
    assert not res.timed_out, res.output[-3000:]
    assert res.returncode != 0
    errors = res.lines_with("hvd_elastic: error:")
    for needle in needles:
        errors = [ln for ln in errors if needle in ln]
    assert len(errors) >= 2, res.output[-3000:]
    assert not [ln for ln in res.rank_lines() if "Traceback" in ln], res.output[-3000:]
    assert not res.lines_with("config ok on rank")
