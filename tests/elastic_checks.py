"""Checks of the elastic test workers' final lines (tests/workers/elastic_torch.py, elastic_keras.py), shared by the
one-host jobs (tests/test_elastic.py) and the cross-host ones (tests/test_multihost.py)."""
import re


def check_replica_loads(rank0: str, kind: str):
    """Rank 0's final line of a tick-policy job through four resets (`kind`: the policy). The resets at which the
    survivor's replica was loaded and broadcast: each of the four under wbsp (its replica is the global model W, not
    the model Horovod's sync broadcast); under a gradient policy the kill's (the commit was restored), not a change of
    the rank set without a restore, where rank 0's replica is its model and Horovod's sync has just broadcast it
    (auto: its mode at a reset decides). The state's sync leaves out rank 0's parameters and optimizer state where the
    replica's broadcast replaces them: at each load at the sync (the kill's at least)."""
    loads = int(re.search(r" loads=(\d+)", rank0).group(1))
    if kind == "wbsp":
        assert loads == 4, rank0
    elif kind != "auto":
        assert 1 <= loads < 4, rank0
    assert 1 <= int(re.search(r" replaced=(\d+)", rank0).group(1)) <= loads, rank0
