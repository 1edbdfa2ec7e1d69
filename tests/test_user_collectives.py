"""The script's own Horovod collectives between steps, under every policy, with a straggler and the CPU busy with
another job (docs/horovod-compat.md, "Collectives of the script's own").

Horovod names an unnamed collective after a per-process counter of the handles it issued; a relaxed policy's tick
thread issues collectives of its own at moments that differ between ranks, so without the plugin's naming
(hvd_elastic/torch/collectives.py) the unnamed calls below got different names on each rank and hung every relaxed
policy. Where a policy's gate holds a rank that another rank waits for in such a call, zipline's barrier yields; a
wait that cannot end is named by the watchdog within HVD_ELASTIC_STALL_TIMEOUT.
"""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from launch import launch

POLICIES = ("bsp", "asp", "ssp", "dssp", "zipline", "wbsp", "lbbsp")
# One job per launcher, its policies one after the other in one process (tests/workers/user_collectives.py): a
# process that has run a policy's engine and finished it starts the next with Horovod's handle counter running on.
JOBS = {"horovodrun": ("asp", "zipline", "lbbsp"), "mpirun": ("bsp", "ssp", "dssp", "wbsp")}
assert sorted(p for job in JOBS.values() for p in job) == sorted(POLICIES)
STRAGGLER = "*:0.002,1:0.02"
STEPS, EVERY = 30, 10     # each rank's steps; a round of the script's collectives (7 calls, twice) every EVERY


@contextlib.contextmanager
def cpu_hog():
    """Another job keeping one core busy meanwhile."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("launcher", sorted(JOBS))
def test_named_and_unnamed_collectives_of_the_script_run_under_every_policy(launcher, tmp_path):
    policies = JOBS[launcher]
    env = {"HVD_ELASTIC_EMULATE_DELAY": STRAGGLER, "HVD_ELASTIC_STALL_TIMEOUT": "30"}
    with cpu_hog():
        res = launch(launcher, 2, "tests/workers/user_collectives.py",
                     [tmp_path, "--policies", ",".join(policies), "--steps", STEPS, "--every", EVERY], env=env,
                     timeout=60 + 30 * len(policies))
    done = [p for p in policies if len(res.lines_with(f": {p} done")) == 2]
    assert not res.timed_out, f"hang after {done}:\n" + res.output[-4000:]
    assert res.returncode == 0, f"failed after {done}:\n" + res.output[-4000:]
    for policy in policies:
        ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.{policy}.json"))) for r in range(2)]
        assert all(r["checked"] == STEPS // EVERY * 2 * 7 for r in ranks), (policy, [r["checked"] for r in ranks])
        assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], policy
        reports = [r["report"] for r in ranks]
        assert all(rep["policy"] == policy for rep in reports), (policy, [rep["policy"] for rep in reports])
        counters = [rep["ranks"][r["rank"]]["counters"] for rep, r in zip(reports, ranks)]
        if policy not in ("bsp", "lbbsp"):
            pushed = sum(c["pushed"] for c in counters)
            assert pushed == 2 * STEPS and all(c["applied_contributions"] == pushed for c in counters), \
                (policy, counters)
