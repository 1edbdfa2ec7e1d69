"""The elastic workers' host discovery file (printed by the job's discovery script): rank 0 rewrites it to remove or
add a worker mid-run."""
import os


def write_hosts(path: str, slots: int, host_names: str = ""):
    """List `slots` slots: the first `slots` hosts of the comma list `host_names` with one slot each (a cluster), or
    ``localhost:<slots>``; written whole (a rename), so the driver never reads half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        names = [h for h in host_names.split(",") if h]
        f.write("".join(f"{h}:1\n" for h in names[:slots]) if names else f"localhost:{slots}\n")
    os.replace(tmp, path)


def is_kill_host(host_names: str, kill_host: str = "") -> bool:
    """Whether this worker runs on the host whose worker --kill-at SIGKILLs: `kill_host` (--kill-host) if given, else
    the last of the comma list `host_names` (one machine: ``localhost,127.0.0.1``, the kill on 127.0.0.1), 127.0.0.1
    when no list is given."""
    names = [h for h in host_names.split(",") if h] or ["127.0.0.1"]
    return os.environ.get("HOROVOD_HOSTNAME") == (kill_host or names[-1])


def listed(values) -> str:
    """Per-reset figures as the workers' ELASTIC lines print them: comma separated, '-' for none."""
    return ",".join(map(str, values)) or "-"


class Commits:
    """The weights' digest (`digest()`) at this rank's last commit, and per entry of the elastic function after a
    reset whether the weights it starts with are those (``entry_is_commit``: 1 or 0)."""

    def __init__(self, state, digest):
        self.state, self.digest = state, digest
        self.last = None
        self.entry_is_commit = []

    def commit(self):
        self.last = self.digest()    # before commit(): it saves, then may raise HostsUpdatedInterrupt
        self.state.commit()

    def entered(self):
        """At the elastic function's entry: after a reset (not the job's start, nor a joiner's), compare."""
        if self.last is not None:
            self.entry_is_commit.append(int(self.digest() == self.last))
