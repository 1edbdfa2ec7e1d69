"""LB-BSP for Keras 3 model.fit on real multi-rank runs (docs/design.md, "Invariants", 6).

- every step's batch sizes sum to the global batch B and are the same on every rank; the tf.data pipeline of
  hvd_elastic.keras.lbbsp_dataset gives each rank exactly the size decided for it;
- within an epoch every sample is trained on exactly once across ranks (the train step records the indices it saw);
- the applied gradient equals one process's gradient over the same global batch (rank 0 recomputes it), clipped
  by the optimizer's global_clipnorm where it has one;
- under a 3x straggler (per-sample emulated delay) the sizes approach the speed ratio and the fast ranks' wait
  share falls well below bsp's with the same straggler;
- a pipeline that reads ahead (prefetch) is refused; the Keras frontend's bad input stops every rank with one line.
"""
import json
import os

import numpy as np
import pytest

from launch import launch
from test_bad_input import _assert_every_rank_failed_with
from test_lbbsp import CHECK, run_check_case

WORKER = "tests/workers/keras_lbbsp.py"


def _run(launcher, np_, args, env, tmp_path, timeout=240):
    res = launch(launcher, np_, WORKER, [tmp_path, *args], env=env, timeout=timeout)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    return [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(np_)]


@pytest.mark.parametrize("case", sorted(CHECK))
def test_keras_sizes_sum_to_B_each_sample_once_per_epoch_and_gradient_is_the_global_batch_gradient(case, tmp_path):
    # The same cases and invariant checks as the PyTorch frontend's; the applied update is read back as
    # (w_before - w_after) / lr in float32, hence the looser tolerance.
    ranks = run_check_case(_run, case, tmp_path, grad_atol=1e-5)
    assert all("lbbsp_dataset" in r["prefetch_error"] for r in ranks)


def test_keras_clipnorm_clips_the_global_batch_gradient(tmp_path):
    # The optimizer's own clipping (global_clipnorm) applies to the gradient over the global batch, as Horovod's
    # Keras optimizer clips the averaged gradient: the lbbsp step hands the global gradient to the optimizer's apply.
    env = {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "48",
           "HVD_ELASTIC_EMULATE_SAMPLE_DELAY": "*:0.0003,2:0.0015"}
    ranks = _run("mpirun", 3, ["--mode", "check", "--samples", 480, "--epochs", 1, "--clipnorm", 0.05], env, tmp_path)
    r0 = ranks[0]
    assert len({tuple(s["sizes"]) for s in r0["steps"]}) > 1, "the sizes never changed"
    assert r0["grad_checked"] == 10 and r0["clipped_steps"] >= 8, r0["clipped_steps"]
    assert r0["grad_err"] < 1e-5, r0["grad_err"]
    assert len({r["weights_sha256"] for r in ranks}) == 1


STEPS = 200
FAST, SLOW = 0.001, 0.003            # seconds per sample: rank 3 is 3x slower


def test_keras_straggler_sizes_follow_speed_ratio_and_fast_ranks_stop_waiting(tmp_path):
    # One job: lbbsp, then the bsp baseline -- the same per-sample costs at the even split (16 samples a rank), as
    # per-step delays; its wait share is the same from the first step on, so fewer steps measure it.
    runs = [{"policy": "lbbsp", "global_batch": 64, "predictor": "ewma",
             "emulate_sample_delay": f"*:{FAST},3:{SLOW}"},
            {"policy": "bsp", "global_batch": 64, "steps": 80, "emulate_delay": f"*:{16 * FAST},3:{16 * SLOW}"}]
    res = launch("mpirun", 4, WORKER, [tmp_path, "--mode", "train", "--steps", STEPS, "--runs", json.dumps(runs)],
                 timeout=360)
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    lb, bsp = ([json.load(open(os.path.join(tmp_path, f"rank{r}.{p}.json"))) for r in range(4)]
               for p in ("lbbsp", "bsp"))
    sizes = np.array(lb[0]["sizes"])
    assert all(r["sizes"] == lb[0]["sizes"] for r in lb)
    assert (sizes.sum(axis=1) == 64).all()
    assert len({r["weights_sha256"] for r in lb}) == 1
    # Speed ratio 3:3:3:1 means 19.2 / 6.4 samples; the fixed per-step costs pull towards the even 16. The sizes
    # follow the measured speeds, and on a loaded machine one fast rank can be measured slower than its emulated
    # cost (16.6 samples seen, against 20-22 for the other two): the fast ranks take the ratio's share on average,
    # each well above the straggler.
    late = sizes[-60:].mean(axis=0)
    assert late[3] < 11 and late[:3].mean() > 17 and late[:3].min() > late[3] + 5, late
    lb_wait = [r["wait_share"] for r in lb[0]["report"]["ranks"]]
    bsp_wait = [r["wait_share"] for r in bsp[0]["report"]["ranks"]]
    assert max(lb_wait[:3]) < 0.6 * min(bsp_wait[:3]), (lb_wait, bsp_wait)
    assert lb[0]["accuracy"] > 0.85, lb[0]["accuracy"]
    counters = lb[0]["report"]["ranks"][3]["counters"]
    assert counters["lbbsp_size_min"] < 11 and counters["lbbsp_resizes"] > 0


# The Keras frontend's own refusals. Settings that do not fit the job (B below the number of ranks, a dataset smaller
# than B) are checked by hvd_elastic/lbbsp.py for both frontends: tests/test_lbbsp.py.
BAD = {
    # The last rank gets there 3.5 s after the first raised: longer than Horovod's shutdown holds that rank, and
    # mpirun ends a job within milliseconds of a non-zero exit, so it waits for the others to exit (watchdog.py).
    "dataset_under_another_policy": ({"HVD_ELASTIC_POLICY": "ssp"}, ["--last-rank-late-s", "3.5"],
                                     ["lbbsp_dataset() needs policy lbbsp", "this optimizer runs policy ssp"]),
    "custom_loop_frontend": ({"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "64"},
                             ["--frontend", "tensorflow"],
                             ["HVD_ELASTIC_POLICY='lbbsp' is not available for TensorFlow yet"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_keras_lbbsp_input_stops_every_rank_with_one_line(case, tmp_path):
    env, args, needles = BAD[case]
    res = launch("mpirun", 2, WORKER, [tmp_path, "--mode", "bad", *args], env=env, timeout=120)
    _assert_every_rank_failed_with(res, 2, *needles)
