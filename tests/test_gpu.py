"""Every policy on CUDA tensors (PyTorch): 2-rank jobs with both ranks on cuda:0 (docs/design.md, "CUDA").

On a GPU host with one GPU, Horovod runs without GPU collectives (NCCL refuses two ranks on one device): it stages
CUDA tensors through host memory. Each policy's job must leave identical replicas after finish(), apply every pushed
update exactly once, lower the loss, make no synchronizing CUDA call of the plugin's own during the steps (PyTorch's
sync debug mode), and under bsp give plain Horovod's weights bit for bit. Run on a GPU host with
`bash ci/gpu/run_tests.sh` (builds Horovod there first: ci/gpu/build_horovod.sh); skipped where CUDA is absent.
"""
import json
import os

import pytest
import torch

from launch import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU tests run on a GPU host "
                                                                      "(bash ci/gpu/run_tests.sh)")

POLICIES = {"bsp": {}, "asp": {}, "ssp": {}, "dssp": {}, "zipline": {}, "lbbsp": {"HVD_ELASTIC_GLOBAL_BATCH": "128"},
            "wbsp": {}, "wbsp-overlap": {"HVD_ELASTIC_WBSP_OVERLAP": "1"}, "auto": {}}


def _run(name, tmp_path, hidden, steps=60):
    policy = name.split("-")[0]
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_STALL_TIMEOUT": "60", **POLICIES[name]}
    res = launch("horovodrun", 2, "tests/workers/gpu_train.py",
                 [tmp_path, "--hidden", hidden, "--steps", steps], env=env, timeout=300)
    assert not res.timed_out and res.returncode == 0, res.output[-5000:]
    return [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(2)]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_runs_on_cuda_tensors(name, tmp_path):
    ranks = _run(name, tmp_path, hidden=896)
    assert all(r["device"].startswith("cuda") for r in ranks), [r["device"] for r in ranks]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], "replicas differ after finish()"
    for r in ranks:
        losses = r["losses"]
        assert sum(losses[-10:]) < 0.8 * sum(losses[:10]), losses
        plugin_syncs = [c for c in r["syncs"] if c["plugin"]]
        assert not plugin_syncs, plugin_syncs[:5]
    counters = [r["report"]["ranks"][r["rank"]]["counters"] for r in ranks]
    if name == "bsp":
        assert all(r["weights_sha256"] == r["reference_sha256"] for r in ranks), "bsp differs from plain Horovod"
    elif name != "lbbsp":
        pushed = sum(c["pushed"] for c in counters)
        assert pushed == 120 and all(c["applied_contributions"] == pushed for c in counters), counters


@pytest.mark.parametrize("name", ["bsp", "asp", "wbsp-overlap"])
def test_policy_at_19m_parameters_on_cuda(name, tmp_path):
    ranks = _run(name, tmp_path, hidden=4352, steps=30)
    assert ranks[0]["numel"] > 19_000_000
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    if name == "bsp":
        assert all(r["weights_sha256"] == r["reference_sha256"] for r in ranks)
