"""Elastic Horovod: ``horovodrun --elastic`` with a host discovery script on localhost, the rank set changed mid-run
(a worker removed then one added back, or a worker SIGKILLed and replaced), tests/workers/elastic_torch.py, a
Horovod elastic script (TorchState, ``@hvd.elastic.run``, ``state.commit()`` every step) with the optimizer swapped.

- bsp (Horovod's own optimizer, instrumented) and the tick policies (asp, ssp, dssp, zipline, wbsp, auto; PyTorch): the
  job recovers from each change, every final rank ends at the same step with identical weights, the final ranks'
  pushes since the last reset are all applied, exactly once, on every rank, and the plugin's report comes from the
  final rank 0 (its watchdog is off: the elastic driver owns lost ranks).
- lbbsp (PyTorch, LbbspSampler in the TorchState): the same, and every sample of the epoch is in the final weights
  exactly once over the changes (the worker's audit).
- Keras 3 model.fit (tests/workers/elastic_keras.py, hvd_elastic.keras.elastic) under bsp and every tick policy (asp,
  ssp, dssp, zipline, auto, wbsp with overlap): the same checks as their PyTorch jobs.
- a TensorFlow custom loop (hvd_elastic.tensorflow, the same worker with --custom-loop) under auto: the same, and
  after the kill it restarts on the survivor's replica, not on the commit.
- Keras 3 model.fit under lbbsp (hvd_elastic.keras.lbbsp_dataset, its batch plan in the KerasState): the same, with
  the worker's audit over each epoch.
- SyncCallback(global_steps=...) under bsp in an elastic Keras job, and under lbbsp a dataset made again after a
  reset: refused with one line, no hang.
- every policy runs elastic on every frontend it runs on; a policy declared without it would be refused at load()
  with one line naming the setting and the policies that do.

tests/test_multihost.py kills a worker, then removes and adds its host, across the hosts of a cluster of network
namespaces (where root is available) under every PyTorch policy, Keras model.fit under wbsp with overlap and lbbsp,
and the TensorFlow custom loop under auto."""
import dataclasses
import os
import re
import stat
import subprocess
import sys

import pytest

from hvd_elastic import registry
from hvd_elastic.config import POLICIES, elastic_policies, load
from hvd_elastic.errors import ConfigError
from hvd_elastic.horovod_env import ELASTIC_CACHE_NOTICE, ELASTIC_CACHE_WARNING
from elastic_checks import check_replica_loads
from launch import BIN, ROOT, job_env, run, side_by_side


def _elastic_command(tmp_path, hosts_text, np, min_np, extra=(), worker=("elastic_torch.py", "--hosts-file", "{hosts}",
                                                                       "--np", "{np}")):
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
            os.path.join(BIN, "python"), os.path.join(ROOT, "tests", "workers", worker[0]),
            *(a.format(hosts=hosts, np=np) for a in worker[1:]), *map(str, extra)]


def sizes_seen(finals):
    """The job's sizes over the run, as rank 0's state recorded them (one change per reset)."""
    return finals[0]["sizes"].split(",")


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
    # Horovod's pattern of a reset callback that sets the learning rate for the ranks of the moment: every step of
    # every rank trained at that rate (a survivor's replica brings its optimizer state, not its old learning rate)
    assert {f["lr_off"] for f in finals} == {"0"}, finals
    for line in out.splitlines():
        if "ELASTIC rank=" in line or "elastic Horovod:" in line:
            print(line)
    if policy == "lbbsp":
        # every sample of the epoch in the weights exactly once, over the resets (the worker's audit)
        assert {f["audit_off"] for f in finals} == {"0"}, finals
        assert max(int(f["resets"]) for f in finals) == len(sizes_seen(finals)) - 1, finals
    elif policy != "bsp":
        # nothing lost or applied twice since the last reset: every final rank applied every final rank's pushes
        assert {f["applied"] for f in finals} == {finals[0]["pushed"]} and int(finals[0]["pushed"]) > 0, finals
        # the job's global steps over every reset: one count on every final rank, the joiners' included, above
        # the last engine's pushes
        assert len({f["global"] for f in finals}) == 1 and int(finals[0]["global"]) > int(finals[0]["pushed"]), \
            finals
        assert max(int(f["resets"]) for f in finals) == len(sizes_seen(finals)) - 1, finals
    return finals[0]["sizes"].split(",")


# Every job goes through four changes of the rank set, each landing at a known step (--wait: every rank commits until
# the job has that many ranks): at step 15 the worker on host 127.0.0.1 SIGKILLs itself (the survivor goes on alone,
# the host comes back after the blacklist cooldown and a new worker joins), at step 30 the discovery script drops
# 127.0.0.1 (its worker is removed), at step 40 lists it again (a new worker is added).
CHURN = ["--host-names", "localhost,127.0.0.1", "--steps", 60, "--kill-at", 15, "--wait", "22:2",
         "--remove-at", 30, "--wait", "30:1", "--add-at", 40, "--wait", "40:2"]
SIZES = ["2", "1", "2", "1", "2"]
# test name -> policy settings and worker arguments: bsp (Horovod's own optimizer) and every tick policy. zipline
# and the TensorFlow custom loop commit every 10 steps: killed at step 15, the job must resume from the survivor's
# replica (14 steps of both ranks at least), not from the commit at step 10.
JOBS = {
    "test_bsp_survives_a_killed_a_removed_and_two_added_workers": ({"HVD_ELASTIC_POLICY": "bsp"}, []),
    "test_asp_survives_a_killed_a_removed_and_two_added_workers": ({"HVD_ELASTIC_POLICY": "asp"}, []),
    "test_ssp_survives_a_killed_a_removed_and_two_added_workers": ({"HVD_ELASTIC_POLICY": "ssp"}, []),
    "test_dssp_survives_a_killed_a_removed_and_two_added_workers": ({"HVD_ELASTIC_POLICY": "dssp"}, []),
    "test_wbsp_with_overlap_survives_a_killed_a_removed_and_two_added_workers": (
        {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"}, []),
    "test_auto_survives_a_killed_a_removed_and_two_added_workers": ({"HVD_ELASTIC_POLICY": "auto"}, []),
    "test_zipline_resumes_from_the_survivors_replica_not_the_last_commit": (
        {"HVD_ELASTIC_POLICY": "zipline"}, ["--commit-every", 10]),
    "test_lbbsp_survives_and_takes_every_sample_of_the_epoch_once": ({"HVD_ELASTIC_POLICY": "lbbsp"}, []),
    "test_keras_fit_under_bsp_survives_a_killed_a_removed_and_two_added_workers": (
        {"HVD_ELASTIC_POLICY": "bsp"}, ["--steps-per-epoch", 20]),
    **{f"test_keras_fit_under_{p}_survives_and_resumes_from_a_survivors_replica": (
        {"HVD_ELASTIC_POLICY": p}, ["--steps-per-epoch", 20]) for p in ("asp", "ssp", "dssp", "zipline", "auto")},
    "test_keras_fit_under_wbsp_with_overlap_survives_and_resumes_from_a_survivors_replica": (
        {"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_WBSP_OVERLAP": "1"}, ["--steps-per-epoch", 20]),
    "test_keras_fit_under_lbbsp_survives_and_takes_every_sample_of_each_epoch_once": (
        {"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "32"}, ["--steps-per-epoch", 20]),
    "test_a_tensorflow_custom_loop_under_auto_survives_and_resumes_from_a_survivors_replica": (
        {"HVD_ELASTIC_POLICY": "auto"}, ["--custom-loop", "--commit-every", 10]),
}
KERAS = ("elastic_keras.py", "--hosts-file", "{hosts}", "--np", "{np}")   # the Keras worker, for the jobs named keras
PARALLEL = 2   # two side by side: each mostly waits for Horovod's driver between a worker's start-ups


def _job(tmp_path_factory, name):
    env, extra = JOBS[name]
    worker = {"worker": KERAS} if "keras" in name or "tensorflow" in name else {}
    cmd = _elastic_command(tmp_path_factory.mktemp("elastic"), "localhost:1\n127.0.0.1:1\n", 2, 1,
                           extra=[*CHURN, *extra], **worker)
    return lambda: run(cmd, job_env(env), timeout=300)


@pytest.fixture(scope="module")
def elastic_jobs(tmp_path_factory, request):
    """The elastic jobs of the selected tests, PARALLEL at a time: test name -> future of (Result, end time)."""
    chosen = [getattr(item, "callspec", None) and item.callspec.params.get("name") or item.name
              for item in request.session.items if item.module is request.module]
    names = [n for n in JOBS if n in chosen]
    with side_by_side({n: _job(tmp_path_factory, n) for n in names}, PARALLEL) as futures:
        yield futures


def _per_reset(res, key, kind=int):
    """Rank 0's per-reset figures `key` (resumed: the updates in the state it resumed from, -1: the last commit;
    lost, in_flight, beyond_commit: the reset's accounting; before_reset, step_to_reset_end: seconds, kind=float)."""
    line = res.lines_with("ELASTIC rank=0 ")[0]
    text = re.search(rf" {key}=(\S+)", line).group(1)
    return [] if text == "-" else [kind(v) for v in text.split(",")]


def _before_reset_within_the_workers_own_gaps(res):
    """The report's time from rank 0's last step to each reset's start is one figure per reset, no longer than the
    worker's own from its last opt.step() to that reset's end (a reset callback)."""
    before, gaps = (_per_reset(res, key, float) for key in ("before_reset", "step_to_reset_end"))
    assert len(before) == len(gaps) == 4 and all(0 <= b <= g + 0.25 for b, g in zip(before, gaps)), (before, gaps)


def _resumed(res):
    resumed = _per_reset(res, "resumed")
    # the work lost per reset: the survivors' pushes missing from the state resumed from are at most those they had
    # in flight (not yet in a tick they had applied), never the steps since a commit
    lost, in_flight = _per_reset(res, "lost"), _per_reset(res, "in_flight")
    assert len(lost) == len(in_flight) == len(resumed), (resumed, lost, in_flight)
    assert all(0 <= lo <= fl for lo, fl in zip(lost, in_flight)), (lost, in_flight)
    return resumed


def _restarted_on_the_replica(res):
    """PyTorch and a TensorFlow custom loop: at the kill (the first reset), where the survivor's replica holds updates
    beyond rank 0's last commit, the elastic function starts again on that replica, before its first step computes a
    gradient -- not on the commit Horovod restored."""
    if _per_reset(res, "beyond_commit")[0] > 0:
        assert _per_reset(res, "entry_is_commit")[0] == 0, res.lines_with("ELASTIC rank=0 ")


def _survived(elastic_jobs, name):
    res, _ = elastic_jobs[name].result()
    policy = JOBS[name][0]["HVD_ELASTIC_POLICY"]
    assert len(res.lines_with("KILLED rank=")) == 1, res.output[-4000:]
    assert _finals(res, 2, 60, policy) == SIZES
    # the workers import hvd_elastic before hvd.init(): under a tick policy Horovod's response cache is off, said once
    assert bool(res.lines_with(ELASTIC_CACHE_NOTICE)) == registry.policy(policy).ticks, res.output[-4000:]
    assert not res.lines_with(ELASTIC_CACHE_WARNING), res.output[-4000:]
    print(f"{name}: {res.elapsed:.1f} s")
    return res, policy


def test_bsp_survives_a_killed_a_removed_and_two_added_workers(elastic_jobs):
    _survived(elastic_jobs, "test_bsp_survives_a_killed_a_removed_and_two_added_workers")


@pytest.mark.parametrize("name", [n for n in JOBS if "bsp_survives" not in n and "zipline" not in n
                                  and "lbbsp" not in n and "keras" not in n and "tensorflow" not in n],
                         ids=lambda n: n.split("_")[1])
def test_a_tick_policy_survives_and_resumes_from_a_survivors_replica(elastic_jobs, name):
    res, policy = _survived(elastic_jobs, name)
    # each of the four resets resumed from a survivor's replica (the updates it applied), none from a commit
    resumed = _resumed(res)
    assert len(resumed) == 4 and all(r > 0 for r in resumed), resumed
    check_replica_loads(res.lines_with("ELASTIC rank=0 ")[0], policy)
    _restarted_on_the_replica(res)
    _before_reset_within_the_workers_own_gaps(res)


def test_zipline_resumes_from_the_survivors_replica_not_the_last_commit(elastic_jobs):
    res, _ = _survived(elastic_jobs, "test_zipline_resumes_from_the_survivors_replica_not_the_last_commit")
    resumed = _resumed(res)
    # the kill at step 15: the commit at step 10 holds 2 x 10 updates, the survivor's replica those of the 14 steps
    # both ranks completed (their ticks applied), at least: 8 updates or more kept beyond the commit
    assert len(resumed) == 4 and resumed[0] >= 2 * 14 and all(r > 0 for r in resumed), resumed
    assert _per_reset(res, "beyond_commit")[0] >= 2 * 4, res.lines_with("ELASTIC rank=0 ")
    check_replica_loads(res.lines_with("ELASTIC rank=0 ")[0], "zipline")
    _restarted_on_the_replica(res)
    _before_reset_within_the_workers_own_gaps(res)


def test_lbbsp_survives_and_takes_every_sample_of_the_epoch_once(elastic_jobs):
    """lbbsp's sampler in the TorchState: one epoch of 60 global batches over the four changes; every rank ends with
    identical weights in which each sample's gradient is counted once (a step lost with the killed worker is taken
    again over the survivor, none twice), and rank 0's report counts the resets."""
    res, _ = _survived(elastic_jobs, "test_lbbsp_survives_and_takes_every_sample_of_the_epoch_once")
    assert res.lines_with("elastic Horovod: 4 reset(s) of the rank set"), res.output[-4000:]
    _before_reset_within_the_workers_own_gaps(res)


def test_keras_fit_under_bsp_survives_a_killed_a_removed_and_two_added_workers(elastic_jobs):
    """Keras 3 model.fit through hvd_elastic.keras.elastic (KerasState, run, fit): every final rank at global batch
    60 (3 epochs of 20: the epochs a reset cut short ran only the batches they still had) with identical weights."""
    _survived(elastic_jobs, "test_keras_fit_under_bsp_survives_a_killed_a_removed_and_two_added_workers")


@pytest.mark.parametrize("name", [n for n in JOBS if "keras" in n and "bsp_survives" not in n],
                         ids=lambda n: n.split("_under_")[1].split("_survives")[0])
def test_keras_fit_under_a_tick_policy_survives_and_resumes_from_a_survivors_replica(elastic_jobs, name):
    """Keras 3 model.fit under a tick policy (a gradient policy with a gate; wbsp with overlap, whose replica is the
    global model): the same four changes, every final rank at global batch 60 with identical weights, the final
    ranks' pushes all applied, each reset resumed from a survivor's replica with no more lost than was in flight."""
    res, policy = _survived(elastic_jobs, name)
    resumed = _resumed(res)
    assert len(resumed) == 4 and all(r > 0 for r in resumed), resumed
    check_replica_loads(res.lines_with("ELASTIC rank=0 ")[0], policy)


def test_keras_fit_under_lbbsp_survives_and_takes_every_sample_of_each_epoch_once(elastic_jobs):
    """Keras 3 model.fit on hvd_elastic.keras.lbbsp_dataset (its batch plan in the KerasState): three epochs of 20
    global batches of 32 over the four changes; every rank ends with identical weights in which each sample's
    gradient is counted once per epoch (the worker's audit), and rank 0's report counts the resets."""
    res, _ = _survived(elastic_jobs, "test_keras_fit_under_lbbsp_survives_and_takes_every_sample_of_each_epoch_once")
    assert res.lines_with("elastic Horovod: 4 reset(s) of the rank set"), res.output[-4000:]


def test_a_tensorflow_custom_loop_under_auto_survives_and_resumes_from_a_survivors_replica(elastic_jobs):
    """A TensorFlow custom loop (hvd_elastic.tensorflow's optimizer, apply_gradients eagerly, KerasState and run of
    hvd_elastic.keras.elastic) under auto (wbsp with overlap and the lock-step fallback), training on during a wait:
    the same four changes and checks as the Keras fit jobs; a commit every 10 steps, and after the kill train_loop()
    starts again on the survivor's replica, not on the commit."""
    res, _ = _survived(elastic_jobs, "test_a_tensorflow_custom_loop_under_auto_survives_and_resumes_from_a_survivors_"
                                     "replica")
    resumed = _resumed(res)
    assert len(resumed) == 4 and all(r > 0 for r in resumed), resumed
    _restarted_on_the_replica(res)


def test_a_global_steps_budget_under_a_lockstep_policy_in_elastic_keras_is_refused_with_one_line_per_rank(tmp_path):
    """SyncCallback(global_steps=...) under elastic Horovod with bsp: each rank would count the steps since its own
    start (a joiner fewer), so the ranks would stop at different steps and the others wait for them in the next
    allreduce; refused at fit's start with one line naming the setting and what to write, on every rank, no hang."""
    cmd = _elastic_command(tmp_path, "localhost:2\n", np=2, min_np=1, extra=["--steps", 20, "--budget", 40],
                           worker=KERAS)
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": "bsp"}), timeout=180)
    out = res.output
    assert not res.timed_out and res.returncode != 0, out[-4000:]
    lines = [line for line in out.splitlines() if "hvd_elastic: error:" in line
             and "SyncCallback(global_steps=40) under elastic Horovod with policy bsp" in line
             and "epochs x steps_per_epoch" in line]
    ranks = {re.match(r"^\[(\d+)\]", line).group(1) for line in lines if re.match(r"^\[\d+\]", line)}
    assert ranks >= {"0", "1"}, out[-4000:]
    assert not [line for line in out.splitlines() if re.match(r"^\[\d+\]<std", line) and "Traceback" in line], \
        out[-4000:]
    print(f"refused, job ended in {res.elapsed:.1f} s")


def test_an_lbbsp_dataset_made_again_after_a_reset_is_refused_with_one_line(tmp_path):
    """lbbsp on Keras with the dataset made inside the elastic function: after a reset (a worker SIGKILLed) the
    survivor makes a second dataset, which would start the epoch over; refused with one line saying where to make
    it, and the job ends non-zero without a hang."""
    cmd = _elastic_command(tmp_path, "localhost:1\n127.0.0.1:1\n", 2, 1, worker=KERAS,
                           extra=["--host-names", "localhost,127.0.0.1", "--steps", 40, "--kill-at", 5,
                                  "--steps-per-epoch", 20, "--dataset-inside"])
    res = run(cmd, job_env({"HVD_ELASTIC_POLICY": "lbbsp", "HVD_ELASTIC_GLOBAL_BATCH": "32"}), timeout=180)
    out = res.output
    assert not res.timed_out and res.returncode != 0, out[-4000:]
    assert len(res.lines_with("KILLED rank=")) == 1, out[-4000:]
    lines = [line for line in out.splitlines() if "hvd_elastic: error:" in line
             and "lbbsp_dataset() was called again" in line and "before the function of" in line]
    assert len(lines) == 1, out[-4000:]
    assert not [line for line in out.splitlines() if re.match(r"^\[\d+\]<std", line) and "Traceback" in line], \
        out[-4000:]


def test_a_policy_declared_without_elastic_support_is_refused_under_elastic_horovod_in_one_line(monkeypatch):
    """Every policy runs elastic wherever it runs; one declared without elastic support on a frontend (the registry's
    Policy.elastic; here asp on Keras, patched in) is refused at load() with one line naming the setting and the
    policies that do, before any collective, and loads as usual outside elastic Horovod."""
    for var in [v for v in os.environ if v.startswith("HVD_ELASTIC_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)   # load() installs the plugin's one-line hook
    monkeypatch.setitem(registry.REGISTRY, "asp", dataclasses.replace(registry.policy("asp"), elastic=("PyTorch",)))
    assert "asp" not in elastic_policies("Keras") and "asp" in elastic_policies("PyTorch")

    def allgather(obj):
        raise AssertionError("an elastic start-up must not be collective")

    with pytest.raises(ConfigError) as e:
        load({"policy": "asp"}, allgather, 0, "Keras")
    msg = str(e.value)
    assert "\n" not in msg and "keyword argument policy='asp' does not support elastic Horovod" in msg, msg
    assert f"elastic jobs there run policy {'|'.join(elastic_policies('Keras'))}" in msg, msg
    monkeypatch.delenv("HOROVOD_ELASTIC")
    assert load({"policy": "asp"}, lambda obj: [obj], 0, "Keras").policy == "asp"


@pytest.mark.parametrize("capacity, warned", [(None, True), ("1024", True), ("0", False), ("", False),
                                               ("off", False), ("-1", True)])
def test_rank_0_warns_once_under_elastic_horovod_while_horovods_response_cache_is_on(monkeypatch, capsys, capacity,
                                                                                    warned):
    """Under a tick policy a lost worker can abort a survivor in Gloo while Horovod's response cache is on
    (docs/horovod-compat.md): an elastic start-up says so in one line on rank 0, read as Horovod reads
    HOROVOD_CACHE_CAPACITY (unset: on; no leading number: 0, off); not on the other ranks, not under bsp or lbbsp,
    and not outside elastic Horovod."""
    for var in [v for v in os.environ if v.startswith("HVD_ELASTIC_")]:
        monkeypatch.delenv(var)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    if capacity is None:
        monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", capacity)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    for rank in (0, 1):
        load({"policy": "asp"}, None, rank, "PyTorch")
    for policy in ("bsp", "lbbsp"):   # lock-step through Horovod's own allreduce: no abort seen (the docs' figures)
        load({"policy": policy, **({"global_batch": 8} if policy == "lbbsp" else {})}, None, 0, "PyTorch")
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "response cache" in ln]
    assert lines == ([ELASTIC_CACHE_WARNING] if warned else []), out
    assert "horovodrun --cache-capacity 0" in ELASTIC_CACHE_WARNING and "\n" not in ELASTIC_CACHE_WARNING
    monkeypatch.delenv("HOROVOD_ELASTIC")
    load({"policy": "asp"}, lambda obj: [obj], 0, "PyTorch")
    assert "response cache" not in capsys.readouterr().out


IMPORT_THEN_LOAD = """
import os, sys
if sys.argv[1] == "init-first":
    import horovod.torch as hvd
    hvd.init()
os.environ["HOROVOD_ELASTIC"] = "1"
import hvd_elastic
from hvd_elastic.config import load
load({}, None, 0, "PyTorch")
print("CAPACITY", os.environ.get("HOROVOD_CACHE_CAPACITY"))
"""


@pytest.mark.parametrize("policy, capacity, order, expected, line", [
    ("asp", None, "import-first", "0", ELASTIC_CACHE_NOTICE),
    ("wbsp", None, "init-first", None, ELASTIC_CACHE_WARNING),
    ("bsp", None, "import-first", None, None),
    ("ssp", "1024", "import-first", "1024", ELASTIC_CACHE_WARNING)], ids=["tick", "init-first", "bsp", "set"])
def test_importing_hvd_elastic_turns_horovods_response_cache_off_in_an_elastic_worker_under_a_tick_policy(
        policy, capacity, order, expected, line):
    """In an elastic worker with HVD_ELASTIC_POLICY naming a tick policy and HOROVOD_CACHE_CAPACITY unset, importing
    hvd_elastic before hvd.init() sets it to 0 and rank 0's start-up says so; with Horovod already initialised
    (the ranks' settings would differ from those of a worker that joins later), under bsp, or with the job's own
    setting, nothing is set, and the warning stands where the cache stays on under a tick policy."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HVD_ELASTIC_") and k not in ("HOROVOD_CACHE_CAPACITY", "HOROVOD_ELASTIC")}
    env.update({"HVD_ELASTIC_POLICY": policy, **({"HOROVOD_CACHE_CAPACITY": capacity} if capacity else {}),
                "PYTHONPATH": os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])})
    res = subprocess.run([sys.executable, "-c", IMPORT_THEN_LOAD, order], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if "response cache" in ln]
    assert lines == ([line] if line else []), res.stdout
    assert f"CAPACITY {expected}" in res.stdout.splitlines(), res.stdout


@pytest.mark.parametrize("frontend", registry.FRONTENDS)
def test_every_policy_runs_under_elastic_horovod_wherever_it_runs(monkeypatch, frontend):
    for var in [v for v in os.environ if v.startswith("HVD_ELASTIC_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    runs_there = [p for p in POLICIES if frontend in registry.policy(p).frontends]
    assert list(elastic_policies(frontend)) == runs_there
    for policy in runs_there:
        knobs = {"global_batch": 8} if registry.policy(policy).balances_batches else {}
        assert load({"policy": policy, **knobs}, None, 0, frontend).policy == policy
