"""Horovod's synthetic benchmarks as examples of this repository:
examples/torch_synthetic_benchmark.py and examples/keras_synthetic_benchmark.py run on 2 ranks with real launchers
(mpirun and horovodrun alternate), print positive finite img/sec figures, take the steps asked, and end with the
plugin's report; Horovod's --fp16-allreduce works under bsp and is refused with one line elsewhere.

Each script runs under each kind of policy: bsp, lbbsp (its own sampler and batch sizes), and for PyTorch a gradient
policy (asp), barriers (zipline) and deltas (wbsp). ssp and dssp take asp's frontend path with a staleness gate
(tests/test_engine.py); the Keras frontend under asp and zipline is tested on model.fit in tests/test_keras.py, so
the Keras script runs the policies with a path of their own: bsp, lbbsp and wbsp.
"""
import json
import math
import re

import pytest

from launch import launch

RELAXED = ("asp", "ssp", "dssp", "zipline", "wbsp")
CASES = [("torch", "bsp"), ("torch", "lbbsp"), ("torch", "asp"), ("torch", "zipline"), ("torch", "wbsp"),
         ("keras", "bsp"), ("keras", "lbbsp"), ("keras", "wbsp")]
NP = 2
BATCH = 16
TORCH = {"script": "examples/torch_synthetic_benchmark.py", "warmup": 2, "per_iter": 5, "iters": 3}
KERAS = {"script": "examples/keras_synthetic_benchmark.py", "warmup": 0, "per_iter": 5, "iters": 3}
NUMBER = r"([-+0-9.eEinfa]+)"


def args_of(job, *extra):
    out = ["--batch-size", BATCH, "--num-batches-per-iter", job["per_iter"], "--num-iters", job["iters"], *extra]
    if job["warmup"]:
        out += ["--num-warmup-batches", job["warmup"]]
    return out


def positive_finite(text):
    value = float(text)
    assert math.isfinite(value) and value > 0, text
    return value


def check_benchmark_output(res, job, policy):
    # Per iteration (rank 0's rate): every iteration printed, each a positive finite number.
    iters = [re.search(r"Iter #(\d+): " + NUMBER + " img/sec per rank", ln)
             for ln in res.lines_with("img/sec per rank")]
    iters = [m for m in iters if m]
    assert [int(m.group(1)) for m in iters] == list(range(job["iters"])), res.output[-3000:]
    for m in iters:
        positive_finite(m.group(2))
    per_rank = [re.search(r"Img/sec per rank: " + NUMBER + r" \+-" + NUMBER, ln)
                for ln in res.lines_with("Img/sec per rank:")]
    total = [re.search(r"Total img/sec on 2 ranks: " + NUMBER + r" \+-" + NUMBER, ln)
             for ln in res.lines_with("Total img/sec on")]
    assert len(per_rank) == 1 and per_rank[0] and len(total) == 1 and total[0], res.output[-3000:]
    mean, tot = positive_finite(per_rank[0].group(1)), positive_finite(total[0].group(1))
    assert math.isfinite(float(per_rank[0].group(2))) and float(per_rank[0].group(2)) >= 0
    assert abs(tot - NP * mean) <= 0.15, (mean, tot)        # the total is the sum of the 2 ranks' means
    # The plugin's end-of-run report, printed once by rank 0.
    assert len(res.lines_with(f"hvd_elastic report: policy={policy}, {NP} ranks")) == 1, res.output[-3000:]
    assert not [ln for ln in res.rank_lines() if "Traceback" in ln], res.output[-3000:]


def check_report(path, job, policy):
    report = json.loads(path.read_text())
    assert report["policy"] == policy and [r["rank"] for r in report["ranks"]] == list(range(NP))
    # Every rank takes the steps the script asks for (a fixed count per rank, as in Horovod's benchmark).
    steps = job["warmup"] + job["per_iter"] * job["iters"]
    assert [r["steps"] for r in report["ranks"]] == [steps] * NP, [r["steps"] for r in report["ranks"]]
    if policy in RELAXED:
        counters = [r["counters"] for r in report["ranks"]]
        pushed = sum(c["pushed"] for c in counters)
        assert pushed == NP * steps, counters
        assert all(c["applied_contributions"] == pushed for c in counters), counters   # nothing lost


def check_lbbsp(res, job):
    line = res.lines_with("last batch sizes")
    assert len(line) == 1, res.output[-3000:]
    m = re.search(r"global batch (\d+), last batch sizes \[([0-9, ]+)\], images taken \[([0-9, ]+)\]", line[0])
    assert m, line
    sizes = [int(s) for s in m.group(2).split(",")]
    taken = [int(s) for s in m.group(3).split(",")]
    assert int(m.group(1)) == NP * BATCH and len(sizes) == NP and sum(sizes) == NP * BATCH and min(sizes) >= 1, line
    # The images the ranks counted for img/sec are their shares of the global batch: B a step, all ranks together.
    steps = job["warmup"] + job["per_iter"] * job["iters"]
    assert len(taken) == NP and sum(taken) == steps * NP * BATCH, (line, steps)


@pytest.mark.parametrize("framework,policy", CASES)
def test_synthetic_benchmark_runs_under_every_kind_of_policy(framework, policy, tmp_path):
    job = TORCH if framework == "torch" else KERAS
    # the launchers alternate across the cases (bsp and lbbsp get both, one per framework)
    launcher = ("mpirun", "horovodrun")[CASES.index((framework, policy)) % 2]
    report_path = tmp_path / "report.json"
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_REPORT_JSON": str(report_path)}
    # Under bsp both cases pass Horovod's --fp16-allreduce: Horovod's compression, which bsp honours.
    extra = ("--fp16-allreduce",) if policy == "bsp" else ()
    res = launch(launcher, NP, job["script"], args_of(job, *extra), env=env, timeout=150)
    assert res.returncode == 0 and not res.timed_out, (launcher, res.output[-4000:])
    check_benchmark_output(res, job, policy)
    check_report(report_path, job, policy)
    if policy == "lbbsp":
        check_lbbsp(res, job)


def test_fp16_allreduce_is_refused_with_one_line_under_a_relaxed_policy():
    # One script, one relaxed policy: each frontend's refusal of compression is checked under every relaxed policy
    # family by tests/test_horovod_compat.py (check_refused_arguments, compat_keras.py).
    framework, policy, launcher = "keras", "zipline", "mpirun"
    job = TORCH if framework == "torch" else KERAS
    res = launch(launcher, NP, job["script"], args_of(job, "--fp16-allreduce"), env={"HVD_ELASTIC_POLICY": policy},
                 timeout=120)
    assert res.returncode != 0 and not res.timed_out, res.output[-3000:]
    errors = res.lines_with("hvd_elastic: error:")
    # One line per rank, naming the argument and the policy that supports it; no traceback, no benchmark figures.
    assert len(errors) == NP, res.output[-3000:]
    for line in errors:
        assert f"policy {policy}" in line and "compression" in line and "policy bsp" in line, line
    # (horovodrun itself prints its own traceback when a rank fails: only the ranks' lines count here.)
    assert not [ln for ln in res.rank_lines() if "Traceback" in ln or "img/sec" in ln], res.output[-3000:]
