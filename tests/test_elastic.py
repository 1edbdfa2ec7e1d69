"""Elastic Horovod: ``horovodrun --elastic`` with a host discovery script on localhost, the rank set changed mid-run
(a worker removed then one added back, or a worker SIGKILLed and replaced), tests/workers/elastic_torch.py, a
Horovod elastic script (TorchState, ``@hvd.elastic.run``, ``state.commit()`` every step) with the optimizer swapped.

- bsp (Horovod's own optimizer, instrumented) and the tick policies (asp, ssp, dssp, zipline, wbsp; PyTorch): the
  job recovers from each change, every final rank ends at the same step with identical weights, the final ranks'
  pushes since the last reset are all applied, exactly once, on every rank, and the plugin's report comes from the
  final rank 0 (its watchdog is off: the elastic driver owns lost ranks).
- a policy that does not run elastic (lbbsp; every policy but bsp on Keras) is refused at DistributedOptimizer()
  with one line naming the setting and the policies that do, on every rank, and the job ends non-zero.

A killed worker is recovered from here only (tests/test_multihost.py removes a host and adds it back, on a cluster
of network namespaces, where root is available)."""
import os
import re
import stat
import sys

import pytest

from hvd_elastic import registry
from hvd_elastic.config import POLICIES, elastic_policies, load
from hvd_elastic.errors import ConfigError
from launch import BIN, ROOT, job_env, run


def _elastic_command(tmp_path, hosts_text, np, min_np, extra=()):
    hosts = tmp_path / "hosts"
    hosts.write_text(hosts_text)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IEXEC)
    # --network-interface: with one machine Horovod cannot compare the hosts' interfaces; --blacklist-cooldown-range:
    # a host whose worker crashed is taken back after 1-2 s (else never).
    return [os.path.join(BIN, "horovodrun"), "-np", str(np), "--min-np", str(min_np), "--max-np", str(np),
            "--host-discovery-script", str(discover), "--gloo", "--elastic-timeout", "60",
            "--network-interface", "lo", "--blacklist-cooldown-range", "1", "2",
            os.path.join(BIN, "python"), os.path.join(ROOT, "tests", "workers", "elastic_torch.py"),
            "--hosts-file", str(hosts), "--np", str(np), *map(str, extra)]


def _finals(res, np, steps, policy="bsp"):
    out = res.output
    assert not res.timed_out, out[-4000:]
    assert res.returncode == 0, out[-4000:]
    finals = [dict(kv.split("=", 1) for kv in line.split("ELASTIC ", 1)[1].split())
              for line in out.splitlines() if "ELASTIC rank=" in line]
    assert len(finals) == np, out[-4000:]                       # the rank set is whole again at the end
    assert sorted(int(f["rank"]) for f in finals) == list(range(np))
    assert {f["size"] for f in finals} == {str(np)}
    assert {f["batch"] for f in finals} == {str(steps)}, finals    # every rank at the same committed step
    assert len({f["digest"] for f in finals}) == 1, finals      # identical weights on every rank
    # The plugin's report, printed once, by the final rank 0, over the final ranks; no plugin error.
    reports = [line for line in out.splitlines() if f"hvd_elastic report: policy={policy}" in line]
    assert len(reports) == 1 and f"{np} ranks" in reports[0], out[-4000:]
    assert not [line for line in out.splitlines() if "hvd_elastic: error" in line], out[-4000:]
    if policy != "bsp":
        # nothing lost or applied twice since the last reset: every final rank applied every final rank's pushes
        assert {f["applied"] for f in finals} == {finals[0]["pushed"]} and int(finals[0]["pushed"]) > 0, finals
        assert {f["resets"] for f in finals} <= {"0", "1", "2"}, finals
    return finals[0]["sizes"].split(",")


def test_bsp_recovers_when_a_rank_is_removed_and_added_back(tmp_path):
    cmd = _elastic_command(tmp_path, "localhost:3\n", np=3, min_np=2,
                           extra=["--steps", 80, "--remove-at", 20, "--wait", "20:2", "--add-at", 40, "--wait", "40:3"])
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": "bsp"}), timeout=240)
    assert _finals(res, 3, 80) == ["3", "2", "3"]
    print(f"removed and added back: {res.elapsed:.1f} s")


def test_bsp_recovers_when_a_rank_is_killed_and_its_host_comes_back(tmp_path):
    cmd = _elastic_command(tmp_path, "localhost:1\n127.0.0.1:1\n", np=2, min_np=1,
                           extra=["--steps", 60, "--kill-at", 15, "--wait", "25:2"])
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": "bsp"}), timeout=240)
    assert len(res.lines_with("KILLED rank=")) == 1, res.output[-4000:]
    assert _finals(res, 2, 60) == ["2", "1", "2"]
    print(f"killed and replaced: {res.elapsed:.1f} s")


@pytest.mark.parametrize("policy", ["asp", "zipline"])
def test_a_tick_policy_recovers_when_a_rank_is_removed_and_added_back(tmp_path, policy):
    cmd = _elastic_command(tmp_path, "localhost:3\n", np=3, min_np=2,
                           extra=["--steps", 80, "--remove-at", 20, "--wait", "20:2", "--add-at", 40, "--wait", "40:3"])
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": policy}), timeout=240)
    assert _finals(res, 3, 80, policy) == ["3", "2", "3"]
    # a survivor's replica, not the last commit, is what the job resumed from after each reset
    resumed = [f for f in res.lines_with("ELASTIC rank=0 ")][0].split("resumed=")[1].split(",")
    assert len(resumed) == 2 and all(int(r) > 0 for r in resumed), resumed
    print(f"{policy}: removed and added back: {res.elapsed:.1f} s")


@pytest.mark.parametrize("policy,extra_env", [("wbsp", {"HVD_ELASTIC_WBSP_OVERLAP": "1"}), ("ssp", {})])
def test_a_tick_policy_recovers_when_a_rank_is_killed_and_its_host_comes_back(tmp_path, policy, extra_env):
    cmd = _elastic_command(tmp_path, "localhost:1\n127.0.0.1:1\n", np=2, min_np=1,
                           extra=["--steps", 60, "--kill-at", 15, "--wait", "25:2"])
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": policy, **extra_env}), timeout=240)
    assert len(res.lines_with("KILLED rank=")) == 1, res.output[-4000:]
    assert _finals(res, 2, 60, policy) == ["2", "1", "2"]
    print(f"{policy}: killed and replaced: {res.elapsed:.1f} s")


def test_a_policy_without_elastic_support_is_refused_with_one_line_per_rank(tmp_path):
    policy = "lbbsp"
    cmd = _elastic_command(tmp_path, "localhost:2\n", np=2, min_np=1)
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_GLOBAL_BATCH": "32"}), timeout=180)
    out = res.output
    assert not res.timed_out, out[-4000:]
    assert res.returncode != 0, out[-4000:]
    lines = [line for line in out.splitlines() if "hvd_elastic: error:" in line]
    text = f"HVD_ELASTIC_POLICY='{policy}' does not support elastic Horovod"
    accepted = "|".join(elastic_policies("PyTorch"))
    assert lines and all(text in line and f"elastic jobs there run policy {accepted}" in line for line in lines), \
        out[-4000:]
    # one line per rank that started (the launcher prefixes the rank), no traceback
    ranks = {re.match(r"^\[(\d+)\]", line).group(1) for line in lines if re.match(r"^\[\d+\]", line)}
    assert ranks >= {"0", "1"}, out[-4000:]
    # no traceback from the ranks (horovodrun's own RuntimeError about the failed workers is the launcher's)
    tracebacks = [line for line in out.splitlines() if re.match(r"^\[\d+\]<std", line) and "Traceback" in line]
    assert not tracebacks, out[-4000:]
    print(f"{policy}: refused, job ended in {res.elapsed:.1f} s")


@pytest.mark.parametrize("frontend,policy", [(f, p) for f in ("PyTorch", "Keras") for p in POLICIES
                                             if p not in elastic_policies(f) and f in registry.policy(p).frontends])
def test_a_policy_without_elastic_support_is_refused_under_elastic_horovod_in_one_line(frontend, policy, monkeypatch):
    for var in [v for v in os.environ if v.startswith("HVD_ELASTIC_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)   # load() installs the plugin's one-line hook

    def allgather(obj):
        raise AssertionError("an elastic start-up must not be collective")

    with pytest.raises(ConfigError) as e:
        load({"policy": policy, "global_batch": 8}, allgather, 0, frontend)
    msg = str(e.value)
    assert "\n" not in msg and f"keyword argument policy={policy!r} does not support elastic Horovod" in msg, msg
    assert f"elastic jobs there run policy {'|'.join(elastic_policies(frontend))}" in msg, msg
    monkeypatch.delenv("HOROVOD_ELASTIC")
    assert load({"policy": policy, "global_batch": 8}, lambda obj: [obj], 0, frontend).policy == policy


def test_every_tick_policy_and_bsp_run_under_elastic_horovod_on_pytorch(monkeypatch):
    for var in [v for v in os.environ if v.startswith("HVD_ELASTIC_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    expected = [p for p in POLICIES if registry.policy(p).ticks or registry.policy(p).horovod_optimizer]
    assert list(elastic_policies("PyTorch")) == expected
    for policy in expected:
        assert load({"policy": policy}, None, 0, "PyTorch").policy == policy
