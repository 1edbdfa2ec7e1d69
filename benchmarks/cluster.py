"""Launch commands for the benchmarks, on this host or across the hosts of ci/cluster.sh, and the hosts' link byte
counters (what really crossed the links). A development tool: not part of the installed package."""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

CLUSTER_NET = os.environ.get("HVDE_CLUSTER_NET", "10.213.0")   # ci/cluster.sh's subnet
# OpenMPI across the cluster: TCP only, pinned to the cluster's subnet (ci/cluster.sh, "Launcher options"); a rank
# waiting in MPI yields its core instead of spinning, since the cluster's hosts share this machine's cores (one slot
# per host is not oversubscribed in OpenMPI's eyes, so it would spin, which real hosts' own cores would absorb)
MPI_CLUSTER_OPTIONS = ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include",
                       f"{CLUSTER_NET}.0/24", "--mca", "oob_tcp_if_include", f"{CLUSTER_NET}.0/24",
                       "--mca", "mpi_yield_when_idle", "1"]


def launch_command(launcher: str, np_: int, program: Sequence[str], hosts: Optional[Sequence[str]] = None,
                   exports: Sequence[str] = ()) -> List[str]:
    """`program` (an argv starting with the interpreter) on np_ ranks: on this host, or one rank per host of `hosts`
    (a cluster of ci/cluster.sh). `exports`: environment variables mpirun must pass to remote ranks (horovodrun
    passes the whole environment)."""
    py_bin = os.path.dirname(sys.executable)
    if launcher == "horovodrun":
        where = ",".join(f"{h}:1" for h in hosts[:np_]) if hosts else f"localhost:{np_}"
        extra = ["--network-interface", "hvde0", "--disable-cache"] if hosts else []
        return [os.path.join(py_bin, "horovodrun"), "-np", str(np_), "-H", where, "--gloo", *extra, *program]
    cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", str(np_)]
    if hosts:
        names = ["PATH", "PYTHONPATH", *exports]
        cmd += ["-H", ",".join(hosts[:np_]), *MPI_CLUSTER_OPTIONS] + [x for n in names for x in ("-x", n)]
    else:
        cmd += ["--oversubscribe"]
    return cmd + list(program)


def link_bytes(hosts: Sequence[str]) -> Dict[str, int]:
    """Bytes each host's link has carried so far, both directions (its bridge port's counters)."""
    out = {}
    for h in hosts:
        base = f"/sys/class/net/{h}-br/statistics"
        out[h] = sum(int(open(os.path.join(base, f)).read()) for f in ("rx_bytes", "tx_bytes"))
    return out
