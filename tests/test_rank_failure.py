"""Invariant 8 (docs/design.md, "Invariants"), run-time part: a rank killed mid-run ends the job everywhere,
non-zero, named, within a bound.

Under horovodrun, where the live ranks outlive the dead one long enough to name it (mpirun may kill them first); a
rank killed under mpirun, while the other is in finish(), is named in tests/test_faults.py."""
import re

from launch import launch

BOUND_S = 120   # the job is killed, and the test fails, if it has not ended by then (the training never ends by itself)


def test_a_killed_rank_stops_every_rank_with_a_message_naming_it(tmp_path):
    res = launch("horovodrun", 3, "tests/workers/relaxed_train.py",
                 [tmp_path, "--mode", "train", "--target", "100000"],
                 env={"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_EMULATE_DELAY": "*:0.002",
                      "TEST_FAULT": "kill", "TEST_FAULT_STEP": "30"}, timeout=BOUND_S)
    assert not res.timed_out, "the job hung after a rank died:\n" + res.output[-3000:]
    assert res.returncode != 0
    # The launcher names the dead rank (rank 2 of 3 was killed by signal 9): horovodrun's own line, not the worker's
    # (which prints "rank 2" itself when it injects the fault).
    named = re.search(r"^Process 2 exit with status code (137|-9)\b", res.output, re.MULTILINE)
    assert named, res.output[-3000:]
    # The plugin's own line names it too (its heartbeat connection closed: hvd_elastic/watchdog.py), printed by a
    # live rank; more fault cases in tests/test_faults.py.
    plugin = [ln for ln in res.stderr_of(0, 1) if "hvd_elastic: error: rank 2 lost" in ln]
    # Gloo's own reaction (a reset connection shuts Horovod down) can also beat the heartbeat: the live rank then
    # stops on its tick thread's error, a line of the plugin too.
    horovod_first = [ln for ln in res.rank_lines() if "hvd_elastic: error: tick thread failed: Horovod has been shut "
                     "down" in ln]
    assert plugin or horovod_first, res.output[-3000:]
    # No rank but 2 is ever named lost. (Under Gloo, Horovod's own reaction to the lost peer can reach a live
    # rank's tick thread before the watchdog's line, which then also reports "tick thread failed: Horovod has been
    # shut down" and the unfinished optimizer: consequences, not wrong names.)
    named_lost = {int(m) for ln in res.rank_lines() for m in re.findall(r"hvd_elastic: error: rank (\d+) lost", ln)}
    assert named_lost <= {2}, res.output[-3000:]
