"""Across hosts: a cluster of 4 hosts on this machine (ci/cluster.sh: network namespaces on a bridge, each with its
own address, host name and sshd), launched as on a real cluster (ssh in, TCP between hosts, no loopback shortcut).

Every policy under both launchers (PyTorch), Keras model.fit under bsp and asp (horovodrun), elastic Horovod under
every PyTorch policy, Keras model.fit under bsp, zipline, wbsp with overlap and lbbsp and a TensorFlow custom loop
under auto (a worker killed, a host removed, a host added), and the fault paths: a rank stopped (SIGSTOP) on another
host and a host's link cut mid-run are named by the watchdog and end the job on every live rank (the two fault jobs
run side by side). Needs root and `ip netns` (CI runs as root); skipped with the reason elsewhere.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time

import pytest

from elastic_checks import check_replica_loads
from launch import BIN, ROOT, Result, job_env, run, selected, side_by_side

HOSTS = [f"hvde-h{k}" for k in range(1, 5)]
NET = "10.213.0"
CLUSTER = os.path.join(ROOT, "ci", "cluster.sh")
STALL_S = 10


def _cluster(*args, check=True):
    return subprocess.run(["bash", CLUSTER, *args], capture_output=True, text=True, check=check, timeout=300)


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("multi-host tests need root and iproute2 (network namespaces): ci/cluster.sh up cannot run here")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"multi-host tests need `ip netns`: {probe.stderr.strip()[:100]}")
    autogroup_before = _autogroup()
    up = _cluster("up", str(len(HOSTS)), "--rate", "1gbit", "--venv", os.path.dirname(BIN), check=False)
    if up.returncode != 0:
        _cluster("down", check=False)
        pytest.fail(f"ci/cluster.sh up failed: {up.stderr[-2000:]}")
    # what `down` puts back: the value the first `up` found (status says it; a cluster left up by an interrupted run
    # had already changed it), else the one seen here
    restores = re.search(r"down restores (\d+)\)", _cluster("status").stdout)
    autogroup_after = restores.group(1) if restores else autogroup_before
    # one scheduler for all hosts while the cluster is up (ci/cluster.sh, "One scheduler for all hosts")
    assert _autogroup() in (None, "0")
    yield HOSTS
    _cluster("down")
    assert _autogroup() == autogroup_after, "ci/cluster.sh down did not restore kernel.sched_autogroup_enabled"


def _autogroup():
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip()
    except OSError:
        return None


def _command(launcher, script, args, np=4, env=None):
    py = os.path.join(BIN, "python")
    script = os.path.join(ROOT, script)
    if launcher == "horovodrun":
        return [os.path.join(BIN, "horovodrun"), "-np", str(np), "-H", ",".join(f"{h}:1" for h in HOSTS[:np]),
                "--gloo", "--network-interface", "hvde0", "--disable-cache", py, script, *map(str, args)]
    exports = [x for name in ["PATH", "PYTHONPATH", *sorted(env or {})] for x in ("-x", name)]
    return ["mpirun", "--allow-run-as-root", "--tag-output", "-np", str(np), "-H", ",".join(HOSTS[:np]),
            "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", f"{NET}.0/24",
            "--mca", "oob_tcp_if_include", f"{NET}.0/24",
            # the cluster's hosts share this machine's cores: a rank waiting in MPI yields instead of spinning
            "--mca", "mpi_yield_when_idle", "1", *exports, py, script, *map(str, args)]


def _launch(launcher, script, args, env=None, timeout=240, np=4):
    return run(_command(launcher, script, args, np, env), job_env(env), timeout)


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_every_policy_runs_across_hosts(cluster, launcher, tmp_path):
    res = _launch(launcher, "tests/workers/multihost.py", [tmp_path], env={"HVD_ELASTIC_STALL_TIMEOUT": "60"})
    assert res.returncode == 0 and not res.timed_out, res.output[-5000:]
    ranks = json.load(open(tmp_path / "multihost.json"))
    assert sorted(r["host"] for r in ranks) == HOSTS, [r["host"] for r in ranks]   # one rank per host
    for policy in ranks[0]["policies"]:
        runs = [r["policies"][policy] for r in ranks]
        assert len({r["weights"] for r in runs}) == 1, (policy, runs)               # identical replicas
        if policy not in ("bsp", "lbbsp"):
            pushed = sum(r["counters"]["pushed"] for r in runs)
            assert pushed == 4 * 30 and all(r["counters"]["applied_contributions"] == pushed for r in runs), policy


def test_keras_fit_runs_across_hosts(cluster, tmp_path):
    # One launcher: what the launcher does across hosts (ssh, TCP between hosts) is the same for both frontends and
    # is tested with each launcher above; this checks the Keras frontend's own collectives across hosts.
    res = _launch("horovodrun", "tests/workers/keras_fit.py",
                  [tmp_path, "--mode", "policies", "--policies", "bsp,asp", "--target", 200])
    assert res.returncode == 0 and not res.timed_out, res.output[-5000:]


def _fault_time(res):
    m = re.search(r"fault: \w+ on rank \d+ at \w+ \d+ \(time ([\d.]+)\)", res.output)
    assert m, "the fault was never injected:\n" + res.output[-3000:]
    return float(m.group(1))


def _stopped_rank_job():
    """mpirun on hvde-h1..h3: rank 2 (on hvde-h3) is stopped (SIGSTOP) at its step 30."""
    env = {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_STALL_TIMEOUT": str(STALL_S), "HVD_ELASTIC_REPORT": "0",
           "HVD_ELASTIC_EMULATE_DELAY": "*:0.01", "TEST_FAULT": "stop", "TEST_FAULT_RANK": "2",
           "TEST_FAULT_STEP": "30"}
    return _launch("mpirun", "tests/workers/relaxed_train.py", ["/tmp", "--mode", "train", "--target", 100000],
                   env=env, timeout=120, np=3)


def _cut_link_job():
    """horovodrun on the 4 hosts: hvde-h4's link goes down once rank 3 has trained 30 steps (Horovod's start-up
    over Gloo's rendezvous is over). A Result whose `elapsed` is the time from the cut to the job's end (-1: no
    cut, or the job outlived it by the bound)."""
    env = {"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_STALL_TIMEOUT": str(STALL_S), "HVD_ELASTIC_REPORT": "0",
           "HVD_ELASTIC_EMULATE_DELAY": "*:0.01", "TEST_FAULT": "slow", "TEST_FAULT_RANK": "3",
           "TEST_FAULT_STEP": "30", "TEST_FAULT_SECONDS": "0"}     # "slow" for 0 s: only the line that says "now"
    proc = subprocess.Popen(_command("horovodrun", "tests/workers/relaxed_train.py",
                                     ["/tmp", "--mode", "train", "--target", 100000], env=env),
                            env=job_env(env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, marked = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "fault: slow on rank 3" in line:
                marked.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ended, timed_out = -1.0, False
    try:
        if marked.wait(120):
            cut = time.time()
            subprocess.run(["ip", "link", "set", "hvde-h4-br", "down"], check=True)
            try:
                proc.wait(timeout=STALL_S + 60)
                ended = time.time() - cut
            except subprocess.TimeoutExpired:
                timed_out = True
        reader.join(10)
    finally:
        subprocess.run(["ip", "link", "set", "hvde-h4-br", "up"], check=False)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    out = "".join(lines)
    if not marked.is_set():
        out = "rank 3 never reached step 30:\n" + out
    return Result(proc.returncode, out, ended, timed_out)


FAULT_JOBS = {"test_a_stopped_rank_on_another_host_is_named": _stopped_rank_job,
              "test_a_cut_link_is_named_and_the_job_ends": _cut_link_job}


@pytest.fixture(scope="module")
def fault_jobs(cluster, request):
    """The two fault jobs, side by side (both mostly wait for the stall timeout; the link cut is hvde-h4's, a host
    the stopped-rank job does not use): test name -> future of (Result, time.time() when the job ended)."""
    runs = {name: FAULT_JOBS[name] for name in selected(request, FAULT_JOBS)}
    with side_by_side(runs, len(FAULT_JOBS)) as futures:
        yield futures


def test_a_stopped_rank_on_another_host_is_named(fault_jobs):
    res, end = fault_jobs["test_a_stopped_rank_on_another_host_is_named"].result()
    assert not res.timed_out and res.returncode != 0, res.output[-3000:]
    named = [ln for ln in res.output.splitlines() if "hvd_elastic: error" in ln and "rank 2" in ln
             and "no heartbeat" in ln]
    assert named, res.output[-3000:]
    assert end - _fault_time(res) < STALL_S + 15, end - _fault_time(res)


def test_a_cut_link_is_named_and_the_job_ends(fault_jobs):
    """Its heartbeats stop reaching rank 0's hub, the watchdog names rank 3 and every live rank ends."""
    res, _ = fault_jobs["test_a_cut_link_is_named_and_the_job_ends"].result()
    assert not res.timed_out, res.output[-3000:]
    assert res.returncode != 0, res.output[-3000:]
    assert [ln for ln in res.output.splitlines() if "hvd_elastic: error" in ln and "rank 3" in ln], \
        res.output[-3000:]
    assert res.elapsed < STALL_S + 30, res.elapsed


# Every policy of the PyTorch frontend (tests/workers/elastic_torch.py); keras-: Keras 3 model.fit (bsp, a gradient
# policy with gates and barriers, wbsp, lbbsp), tensorflow-: a TensorFlow custom loop (tests/workers/elastic_keras.py).
# The TensorFlow jobs (the heaviest start-ups) come last.
ELASTIC_POLICIES = ("bsp", "asp", "ssp", "dssp", "zipline", "wbsp", "auto", "lbbsp", "keras-bsp", "keras-zipline",
                    "keras-wbsp", "keras-lbbsp", "tensorflow-auto")
ELASTIC_PARALLEL = 6   # side by side on two cores: each mostly waits for Horovod's driver between a worker's start-ups
# model.fit under a tick policy trains on while a wait is not met, each step slowed to this (tests/workers/
# elastic_keras.py): the last wait's 20 steps give the re-added worker 120 s to join; beside 5 other jobs a reset
# took 91 s, more than the worker's default 20 x 3 s
KERAS_WAIT_SLEEP_S = 6
# The rank set's changes, each at a known step (--wait: every rank commits until the job has that many ranks): at step
# 15 the worker on hvde-h3 SIGKILLs itself (the host comes back after the blacklist cooldown and a new worker joins), at
# step 30 hvde-h3 leaves the discovery file (its worker is removed), at step 40 it is listed again (one is added).
ELASTIC_CHURN = ["--steps", 60, "--kill-at", 15, "--wait", "22:3", "--remove-at", 30, "--wait", "30:2",
                 "--add-at", 40, "--wait", "40:3"]


def _elastic_job(folder, policy):
    hosts = folder / "hosts"
    hosts.write_text("".join(f"{h}:1\n" for h in HOSTS[:3]))
    discover = folder / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IEXEC)
    frontend, policy = policy.split("-", 1) if "-" in policy else ("torch", policy)
    worker = "elastic_torch.py" if frontend == "torch" else "elastic_keras.py"
    # A reset's rendezvous waits for every worker of the new round for Gloo's timeout only, and a worker started in it
    # on these shared cores (launch, imports, hvd.init()) can take longer than Horovod's 30 s (docs/horovod-compat.md,
    # "Elastic Horovod"): the timeout is 60 s, 120 s for the jobs importing TensorFlow (5 CPU-s of imports a worker;
    # beside 5 other jobs one such worker of a reset missed 60 s), and the killed worker's host is taken back after
    # 15-16 s, so the kill's reset re-forms the survivors alone and the host's new worker joins in a reset of its own.
    # Horovod's response cache is off (docs/horovod-compat.md advises it under the tick policies: with it, a kill can
    # abort a survivor).
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(discover), "--gloo", "--elastic-timeout", "60",
           "--gloo-timeout-seconds", "60" if frontend == "torch" else "120",
           "--blacklist-cooldown-range", "15", "16", "--cache-capacity", "0",
           "--network-interface", "hvde0", os.path.join(BIN, "python"),
           os.path.join(ROOT, "tests", "workers", worker), "--hosts-file", str(hosts), "--np", "3",
           "--host-names", ",".join(HOSTS[:3]), *map(str, ELASTIC_CHURN),
           *({"torch": [], "keras": ["--steps-per-epoch", "20", "--wait-sleep", str(KERAS_WAIT_SLEEP_S)],
              "tensorflow": ["--custom-loop"]}[frontend])]
    env = {"HVD_ELASTIC_POLICY": policy, **({"HVD_ELASTIC_WBSP_OVERLAP": "1"} if policy == "wbsp" else {})}
    return lambda: run(cmd, job_env(env), timeout=600)


@pytest.fixture(scope="module")
def elastic_jobs(cluster, tmp_path_factory, request):
    """The elastic jobs of the selected tests, ELASTIC_PARALLEL at a time: policy -> future of (Result, time.time()
    when the job ended)."""
    chosen = [item.callspec.params["policy"] for item in request.session.items
              if item.module is request.module and item.originalname == "test_elastic_recovers_across_hosts"]
    jobs = {p: _elastic_job(tmp_path_factory.mktemp(f"elastic-{p}"), p) for p in ELASTIC_POLICIES if p in chosen}
    with side_by_side(jobs, ELASTIC_PARALLEL) as futures:
        yield futures


@pytest.mark.parametrize("policy", ELASTIC_POLICIES)
def test_elastic_recovers_across_hosts(elastic_jobs, policy):
    """horovodrun --elastic over the cluster's hosts: a worker killed, its host taken back, then removed from discovery
    and added back; every final rank at the same step with identical weights; under a tick policy every reset resumes
    from a survivor's replica and every push since the last one is applied; under lbbsp every sample of the epoch is
    in the weights once (the worker's audit; Keras: of each epoch)."""
    res, _ = elastic_jobs[policy].result()
    print(f"{policy}: {res.elapsed:.1f} s")
    assert res.returncode == 0 and not res.timed_out, res.output[-4000:]
    assert len(res.lines_with("KILLED rank=")) == 1, res.output[-4000:]
    finals = res.lines_with("ELASTIC rank=")
    assert len(finals) == 3, res.output[-4000:]
    assert len({re.search(r"digest=(\d+)", f).group(1) for f in finals}) == 1, finals
    assert all("batch=60" in f for f in finals), finals
    assert all("sizes=3,2,3,2,3" in f for f in finals if "rank=0 " in f), finals
    assert all(" lr_off=0" in f for f in finals), finals     # the reset callback's learning rate at every step
    kind = policy.split("-", 1)[-1]      # keras-wbsp: wbsp
    if kind == "lbbsp":
        assert all("audit_off=0" in f for f in finals), finals
    elif kind != "bsp":
        pushed = {re.search(r"pushed=(\d+)", f).group(1) for f in finals}
        applied = {re.search(r"applied=(\d+)", f).group(1) for f in finals}
        assert pushed == applied and len(pushed) == 1, finals
        rank0 = [f for f in finals if "rank=0 " in f][0]
        resumed = re.search(r"resumed=([-\d,]+)", rank0).group(1).split(",")
        assert len(resumed) == 4 and all(int(r) > 0 for r in resumed), finals
        check_replica_loads(rank0, kind)
