"""Faults (docs/design.md, "Faults"): a rank stopped (SIGSTOP) or killed ends the job under every policy, bsp
included, within HVD_ELASTIC_STALL_TIMEOUT plus a few seconds, non-zero, with the plugin's own line naming the rank,
printed by the live rank (hvd_elastic/watchdog.py). Faults come from tests/workers/faults.py (TEST_FAULT*), on real
launchers: each place a live rank can wait in (Horovod's allreduce under bsp and lbbsp, the engine under the relaxed
policies, finish, a collective of the script's own, Keras' compiled train step) once, under one launcher or the
other.

These jobs spend most of their time waiting for the stall timeout, so the module runs them side by side (at most
PARALLEL at once, the jobs of the selected tests only); each test then reads its own job's result."""
import functools
import re

import pytest

from launch import launch, selected, side_by_side

TIMEOUT_S = 10          # HVD_ELASTIC_STALL_TIMEOUT of these jobs
# After the fault the job must end within the timeout plus this: the stall check runs every 0.2 s, a frozen rank on
# the same host is resumed (SIGCONT) by the rank that aborts, so it reads the abort (or the launcher's SIGTERM) at
# once (typically within 1-2 s); without that, horovodrun would wait about 10 s more before it SIGKILLs it.
SLACK_S = 6
PARALLEL = 3            # jobs at once: 2 ranks each, idle while they wait for the timeout


def _fault_job(launcher, policy, fault, step, target=100000, delay=0.02, extra=None):
    env = {"HVD_ELASTIC_POLICY": policy, "HVD_ELASTIC_STALL_TIMEOUT": str(TIMEOUT_S),
           "HVD_ELASTIC_EMULATE_DELAY": f"*:{delay}", "HVD_ELASTIC_REPORT": "0",
           "TEST_FAULT": fault, "TEST_FAULT_RANK": "1", "TEST_FAULT_STEP": str(step), **(extra or {})}
    if policy == "lbbsp":     # its own worker: batches from LbbspSampler, sized per rank by the policy
        env["HVD_ELASTIC_GLOBAL_BATCH"] = "64"
        script, args = "tests/workers/lbbsp_train.py", ["/tmp", "--mode", "train", "--steps", target]
    else:
        script, args = "tests/workers/relaxed_train.py", ["/tmp", "--mode", "train", "--target", target]
    return launcher, script, args, env, 120


RELAXED = "tests/workers/relaxed_train.py"
STOPPED = "test_a_stopped_rank_is_named_and_the_job_ends_within_the_timeout"
# each test's job, under the test's name: launcher, script, args, env, timeout
JOBS = {
    f"{STOPPED}[mpirun-bsp]": _fault_job("mpirun", "bsp", "stop", step=40),
    f"{STOPPED}[horovodrun-asp]": _fault_job("horovodrun", "asp", "stop", step=40),
    "test_a_stopped_rank_is_named_under_lbbsp": _fault_job("mpirun", "lbbsp", "stop", step=40),
    "test_a_rank_killed_during_finish_is_named_at_once": _fault_job(
        "mpirun", "asp", "kill", step="finish", target=60,
        extra={"TEST_FAULT_DELAY": "1", "HVD_ELASTIC_STALL_TIMEOUT": "60"}),
    "test_a_user_collective_under_zipline_runs_or_is_named": (
        "mpirun", RELAXED, ["/tmp", "--mode", "train", "--target", 60],
        {"HVD_ELASTIC_POLICY": "zipline", "HVD_ELASTIC_STALL_TIMEOUT": str(TIMEOUT_S), "HVD_ELASTIC_REPORT": "0",
         "HVD_ELASTIC_EMULATE_DELAY": "0:0.2,1:0.01", "HVD_ELASTIC_LOOKAHEAD": "2",
         "TEST_FAULT": "collective", "TEST_FAULT_RANK": "*", "TEST_FAULT_STEP": "5"}, 120),
    "test_a_pause_shorter_than_the_timeout_is_not_a_stall": (
        "mpirun", RELAXED, ["/tmp", "--mode", "train", "--target", 60],
        {"HVD_ELASTIC_POLICY": "bsp", "HVD_ELASTIC_STALL_TIMEOUT": "6", "HVD_ELASTIC_REPORT": "0",
         "TEST_FAULT": "slow", "TEST_FAULT_RANK": "1", "TEST_FAULT_STEP": "10", "TEST_FAULT_SECONDS": "4"}, 120),
    "test_a_stopped_rank_under_keras_fit_bsp_is_named": (
        "mpirun", "tests/workers/keras_fit.py", ["/tmp", "--mode", "policies", "--policies", "bsp", "--target", 2000],
        {"HVD_ELASTIC_STALL_TIMEOUT": str(TIMEOUT_S), "HVD_ELASTIC_REPORT": "0",
         "TEST_FAULT": "stop", "TEST_FAULT_RANK": "1", "TEST_FAULT_STEP": "20"}, 150),
}


@pytest.fixture(scope="module")
def jobs(request):
    """The jobs of this module's selected tests, started side by side: test name -> future of (Result, end time)."""
    names = selected(request, JOBS)
    runs = {n: functools.partial(launch, JOBS[n][0], 2, *JOBS[n][1:]) for n in names}
    with side_by_side(runs, PARALLEL) as futures:
        yield futures


@pytest.fixture
def job(request, jobs):
    """This test's job, once it has ended: (Result, time.time() when it ended)."""
    return jobs[request.node.name].result()


def _ended_after_fault(job):
    """A fault job that must fail: its result and how long after the fault it ended."""
    res, end = job
    assert not res.timed_out, "the job hung after the fault:\n" + res.output[-3000:]
    assert res.returncode != 0, res.output[-3000:]
    after_fault = end - _fault_time(res)
    print(f"job ended {after_fault:.1f} s after the fault ({res.elapsed:.1f} s in all)")
    return res, after_fault


def _fault_time(res):
    m = re.search(r"fault: \w+ on rank \d+ at \w+ \d+ \(time ([\d.]+)\)", res.output)
    assert m, "the fault was never injected:\n" + res.output[-3000:]
    return float(m.group(1))


def _plugin_line_of_rank0(res, *needles, traceback_ok=False):
    """The plugin's line printed by the live rank 0 (launcher prefix '[0]<stderr>:' or '[1,0]<stderr>:')."""
    lines = [ln for ln in res.stderr_of(0) if "hvd_elastic: error:" in ln]
    lines = [ln for ln in lines if all(n in ln for n in needles)]
    assert len(lines) == 1, f"expected one line from rank 0 with {needles}:\n" + res.output[-3000:]
    assert traceback_ok or not [ln for ln in res.rank_lines() if "Traceback" in ln], res.output[-3000:]
    return lines[0]


# A frozen rank (alive, heartbeat silent): under bsp the others hang inside Horovod's own allreduce, under asp in the
# engine; both are caught by the watchdog thread.
@pytest.mark.parametrize("launcher,policy", [("mpirun", "bsp"), ("horovodrun", "asp")])
def test_a_stopped_rank_is_named_and_the_job_ends_within_the_timeout(job, launcher, policy):
    res, after_fault = _ended_after_fault(job)
    line = _plugin_line_of_rank0(res, "rank 1 stopped making progress", "no heartbeat for",
                                 f"HVD_ELASTIC_STALL_TIMEOUT={TIMEOUT_S} s")
    # The last step rank 0 heard of is at most the step at which rank 1 froze (steps 0..39 done).
    last = int(re.search(r"last step (\d+)", line).group(1))
    assert last <= 40, line
    # Not before the timeout (rank 0's last progress was before the fault), and not long after it.
    assert TIMEOUT_S - 1.5 <= after_fault < TIMEOUT_S + SLACK_S, after_fault


# One rule for every policy: the watchdog names a frozen rank from heartbeats wherever the live ranks wait. lbbsp
# waits in a place of its own (Horovod's allreduce of the weighted gradients, submitted during backward); the relaxed
# policies all wait in the engine, as asp above.
def test_a_stopped_rank_is_named_under_lbbsp(job):
    res, after_fault = _ended_after_fault(job)
    _plugin_line_of_rank0(res, "rank 1 stopped making progress", "no heartbeat for",
                          f"HVD_ELASTIC_STALL_TIMEOUT={TIMEOUT_S} s")
    assert TIMEOUT_S - 1.5 <= after_fault < TIMEOUT_S + SLACK_S, after_fault


# A rank killed while the other is inside finish(): its heartbeat connection closes without a goodbye, so it is
# named at once, long before the timeout.
def test_a_rank_killed_during_finish_is_named_at_once(job):
    res, after_fault = _ended_after_fault(job)
    # Horovod may notice the closed connection as fast as the watchdog: its error (a traceback) can then come before
    # the plugin's exit; the plugin's line is there either way. Rank 0 is named where it is inside finish(): the
    # watchdog's phase ("in finish()") or, when the engine's own wait notices first, the wait it is in ("the asp final
    # barrier", the last part of finish()).
    line = _plugin_line_of_rank0(res, "rank 1 lost", "killed or crashed", "while rank 0 is in", traceback_ok=True)
    assert "rank 0 is in finish()" in line or "rank 0 is in the asp final barrier" in line, line
    assert after_fault < 1 + SLACK_S, after_fault


# A collective of the script's own inside a zipline loop. Rank 0 (slow) reaches a barrier that needs more pushes from
# rank 1, which waits in the script's hvd.allreduce at its step 5 for rank 0. The barrier yields while a rank waits
# in such a call (its tick row says so), within the lookahead R: rank 0 then reaches the same call and the job runs
# on; where R holds rank 0 first, no rank progresses while both heartbeats are alive, and both ranks print one line
# naming the collective and the zipline gate. Lookahead 2 makes the hold near-certain (rank 1 passes a barrier at
# most every 2 steps).
def test_a_user_collective_under_zipline_runs_or_is_named(job):
    res, end = job
    assert not res.timed_out, "the job hung:\n" + res.output[-3000:]
    if res.returncode == 0:   # both ranks made the call and trained on
        assert res.output.count("fault: collective") == 2 and "hvd_elastic: error" not in res.output, \
            res.output[-3000:]
        return
    needles = ("blocked in a Horovod collective of the script's own", "'allreduce.test.user_collective'",
               "zipline gate")
    _plugin_line_of_rank0(res, *needles)
    assert TIMEOUT_S - 1.5 <= end - _fault_time(res) < TIMEOUT_S + SLACK_S, end - _fault_time(res)


# No false alarm: a rank that pauses for less than the timeout (bsp: the other waits inside Horovod's allreduce
# meanwhile) delays the job and nothing else.
def test_a_pause_shorter_than_the_timeout_is_not_a_stall(job):
    res, _ = job
    assert res.returncode == 0, res.output[-3000:]
    assert "fault: slow on rank 1" in res.output and "hvd_elastic: error" not in res.output, res.output[-3000:]


# Keras model.fit under bsp: the gradient allreduce runs inside the compiled train step, where no code of ours runs;
# the batch callbacks tell the watchdog when a step is on.
def test_a_stopped_rank_under_keras_fit_bsp_is_named(job):
    res, after_fault = _ended_after_fault(job)
    _plugin_line_of_rank0(res, "rank 1 stopped making progress", "no heartbeat for")
    assert TIMEOUT_S - 1.5 <= after_fault < TIMEOUT_S + SLACK_S, after_fault
