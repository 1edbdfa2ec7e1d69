"""Faults: per-rank heartbeats over a side channel, and the one stall rule of every policy (docs/design.md, "Faults").

Once a rank is stuck, Horovod's collectives cannot carry anything, so the ranks watch each other over a side channel
of their own (hvd_elastic/sidechannel.py): at start-up, while collectives still work, two allgathers tell rank 0
where every rank runs (so that its heartbeat hub, a TCP server in a daemon thread, listens only where they need it:
127.0.0.1 when they all share its host) and hand every rank the hub's address and a fresh per-job secret; every
other rank connects and authenticates with it (HMAC-SHA256). Only the job's ranks hold the secret: whatever else
reaches the port is dropped as noise and counted (the end-of-run report's side_channel_dropped), never obeyed. Each
second a rank sends its heartbeat (steps done, where it is: a training step, finish(), the policy's gate, or the
script's own code, and how long ago it last made progress); the hub sends every rank the table of all ranks. A rank
that exits says goodbye first (at interpreter exit, before Horovod's shutdown), so an authenticated connection that
closes without one is a rank lost (killed or crashed).

The rule (hvd_elastic/stall.py, a pure function of the table of ranks) is checked by every rank's watchdog thread a
few times a second while a training session is open. The deciding rank tells the others through the hub; every live
rank prints one line and exits with status 1 (os._exit: never waiting on Horovod's shutdown of a dead collective).
The launcher then ends the job.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .horovod_env import horovod_elastic
from .errors import HvdElasticError
from .sidechannel import Channel, Link, host_info
from .stall import ERROR_GRACE_S, UNKNOWN, RankState, StallRule

HEARTBEAT_S = 1.0     # heartbeat (and hub table) period
CHECK_S = 0.2         # watchdog thread period
CONNECT_S = 20.0      # how long a rank keeps trying to reach the hub at start-up


class Watchdog:
    """One per process (see :func:`session_started`). The training thread calls enter()/step_done()/progress();
    everything else runs in the daemon thread."""

    def __init__(self, rank: int, size: int, timeout_s: float):
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        now = time.monotonic()
        self.ranks = [RankState(now) for _ in range(size)]
        self.me = self.ranks[rank]
        self.me.host, self.me.pid = socket.gethostname(), os.getpid()
        self.sessions = 0            # open training sessions in this process: armed while > 0
        self.hub_gone = False        # rank 0 said goodbye: the others' rows are no longer updated
        self.detached = False        # no side channel (could not reach the hub): own progress only
        self._stop = threading.Event()
        self.channel: Optional[Channel] = None   # the side channel (None: a single rank, or elastic Horovod)
        self._thread: Optional[threading.Thread] = None
        self._aborting = False
        self.rule = StallRule(rank, timeout_s)   # the latest session's timeout and policy (session_started)
        self.between = UNKNOWN       # `where` between two steps (see between_steps)

    # ---- start-up (collective) ---------------------------------------------------------------------------------
    def start(self, allgather_object: Callable[[Any], list]):
        """Collective (two allgathers, the same calls on every rank: Horovod names allgather_object by the object's
        type): where every rank runs, so that rank 0 listens only where the ranks need it; then the hub's endpoints
        and the job's secret, which only Horovod's own channel carries."""
        if self.size > 1:
            hosts = allgather_object(host_info())
            mine: Dict[str, Any] = {}
            if self.rank == 0:
                self.channel = Channel(0, self.size, secrets.token_bytes(32))
                mine = {"endpoints": self.channel.listen(hosts), "secret": self.channel.secret}
            hub = allgather_object(mine)[0]
            if self.rank != 0:
                self.channel = Channel(self.rank, self.size, hub["secret"])
                self._connect(hub["endpoints"])
        self._thread = threading.Thread(target=self._run, name=f"hvd_elastic-watchdog-{self.rank}", daemon=True)
        self._thread.start()
        atexit.register(self.goodbye)

    def _connect(self, endpoints: List[list]):
        link, err = self.channel.connect(endpoints, time.monotonic() + CONNECT_S)
        if link is not None:
            self._send_state()
            return
        self.detached = True
        where = ", ".join(f"{host}:{port}" for host, port in endpoints)
        sys.stderr.write(f"hvd_elastic: warning: rank {self.rank} cannot reach rank 0's heartbeat service at "
                         f"{where} ({err}); stall detection on this rank uses its own progress only\n")
        sys.stderr.flush()

    def side_channel_stats(self) -> Dict[str, Any]:
        """For the end-of-run report, when the side channel dropped noise: how much, and the longest gap between
        two messages of a rank (whether the noise delayed the heartbeats)."""
        if self.channel is None or not self.channel.dropped:
            return {}
        return {"side_channel_dropped": self.channel.dropped,
                "side_channel_max_gap_s": round(self.channel.max_gap, 2)}

    # ---- training thread ---------------------------------------------------------------------------------------
    def enter(self, where: str):
        self.me.where = where

    def between_steps(self, where: str):
        """What runs between two steps: USER where the frontend marks its steps (PyTorch, Keras callbacks), else
        UNKNOWN (TF custom loops: the allreduce may run inside the script's own tf.function)."""
        self.between = where
        self.me.where = where

    def step_done(self):
        self.me.steps += 1
        self.me.progress = time.monotonic()
        self.me.where = self.between

    def progress(self):
        self.me.progress = time.monotonic()

    def arm(self):
        if self.sessions == 0:
            self.me.progress = time.monotonic()
        self.sessions += 1
        self.me.armed = True

    def disarm(self):
        self.sessions = max(self.sessions - 1, 0)
        self.me.armed = self.sessions > 0
        self.me.progress = time.monotonic()
        self._send_state()

    def goodbye(self):
        """At interpreter exit (before Horovod's shutdown): tell the others this rank leaves on purpose. A rank that
        leaves mid-training (armed) gives Horovod's shutdown, which may wait on a dead collective, a bounded time."""
        if self._stop.is_set():
            return
        err = getattr(sys, "last_value", None)
        self.me.error = type(err).__name__ if err is not None else ""
        self.me.state = "exited"
        self._send_state()
        if isinstance(err, HvdElasticError):
            self._said = True             # its one line is out (errors.py); an abort from another rank adds none
            self._await_others(ERROR_GRACE_S)
        self._stop.set()
        if self.me.armed:
            grace = min(self.timeout_s, 30.0)

            def bounded_shutdown():
                time.sleep(grace)
                self._die(f"rank {self.rank}: the script ended during training and Horovod's shutdown did not "
                          f"complete within {grace:g} s (min(HVD_ELASTIC_STALL_TIMEOUT, 30)); exiting")

            threading.Thread(target=bounded_shutdown, name="hvd_elastic-exit", daemon=True).start()

    def _await_others(self, limit_s: float):
        """This rank ends with hvd-elastic's one-line error. Bad input fails every rank alike, but a launcher ends
        the job as soon as one rank exits non-zero (mpirun within milliseconds), which would cut off a slower rank
        before it prints its own line: wait, at most `limit_s`, until every other rank has exited too (the daemon
        thread keeps the table current; this rank's watchdog judges nothing more, see _check)."""
        if self.channel is None or self.detached or self._thread is None or not self._thread.is_alive():
            return
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not self.hub_gone:
            if all(r.state != "up" for q, r in enumerate(self.ranks) if q != self.rank):
                return
            time.sleep(CHECK_S / 4)

    def forked(self):
        """In a forked child (a DataLoader worker): drop the parent's connections, so that they close when the
        parent dies, and watch nothing (the daemon thread does not exist in the child)."""
        self._stop.set()
        if self.channel is not None:
            self.channel.close_all()

    # ---- messages ----------------------------------------------------------------------------------------------
    def _heartbeat(self) -> dict:
        m = self.me
        return {"t": "hb", "r": self.rank, "s": m.steps, "w": m.where, "a": m.armed, "st": m.state, "e": m.error,
                "pa": time.monotonic() - m.progress, "h": m.host, "p": m.pid}

    def _table(self) -> dict:
        now = time.monotonic()
        return {"t": "table", "rows": [[q.steps, q.where, q.armed, q.state, now - q.heard, now - q.progress, q.error,
                                        q.host, q.pid] for q in self.ranks]}

    def _send_state(self):
        """Send this rank's state now (also called at every heartbeat): the hub's table to every rank, or this
        rank's heartbeat to the hub. Also from the training thread: a state change that comes before an exit."""
        self.me.heard = time.monotonic()
        if self.channel is not None:
            self._send_all(self._table() if self.rank == 0 else self._heartbeat())

    def _send_all(self, msg: dict, but: Optional[Link] = None):
        for link in self.channel.links:      # the hub: every rank; a rank: the hub
            if link is not but:
                self.channel.send(link, msg)

    # ---- daemon thread -----------------------------------------------------------------------------------------
    def _run(self):
        next_beat = 0.0
        while not self._stop.is_set():
            if self.channel is None:
                time.sleep(CHECK_S)
            for link, msg in (self.channel.poll(CHECK_S) if self.channel is not None else []):
                if msg is None:
                    self._closed(link)
                    continue
                try:
                    self._message(link, msg)
                except (KeyError, TypeError, ValueError, IndexError):   # authenticated, yet malformed: dropped
                    self.channel.dropped += 1
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + HEARTBEAT_S
                self._send_state()
            if not self._stop.is_set():
                self._check()

    def _closed(self, link: Link):
        """An authenticated connection closed: without a goodbye, that rank is lost (killed, crashed, or its host
        went away)."""
        if self.rank != 0:      # the connection to the hub
            if self.ranks[0].state == "up":
                self.ranks[0].state = "lost"
            else:
                self.hub_gone = True
            return
        q = link.rank
        if link.seen == 0:        # closed before its first heartbeat: a handshake that gave up (the rank retries)
            return
        if self.ranks[q].state == "up":
            self.ranks[q].state = "lost"
            if self.me.armed:
                self._check()     # at once: under mpirun the launcher tears the job down within milliseconds
            self._send_state()

    def _message(self, link: Link, msg: dict):
        """A message of an authenticated rank (the channel passes only the types this side may receive)."""
        now = time.monotonic()
        kind = msg["t"]
        if kind == "abort":
            text = str(msg["msg"])
            if self.rank == 0:        # forward to everyone else first
                self._send_all({"t": "abort", "msg": text}, but=link)
            self._die(text)
        elif kind == "hb":            # the hub, from the rank that authenticated on this connection
            r = self.ranks[link.rank]
            r.steps, r.where, r.armed, r.error, r.heard = msg["s"], msg["w"], msg["a"], msg["e"], now
            r.host, r.pid = msg["h"], msg["p"]
            r.progress = now - float(msg["pa"])
            if msg["st"] == "exited" and r.state == "up":
                r.state = "exited"
                self._send_state()
        elif kind == "table":
            for q, (steps, where, armed, state, heard_age, progress_age, error, host, pid) in enumerate(msg["rows"]):
                if q == self.rank:
                    continue
                r = self.ranks[q]
                r.steps, r.where, r.armed, r.error, r.host, r.pid = steps, where, armed, error, host, pid
                r.heard, r.progress = now - heard_age, now - progress_age
                if r.state == "up":
                    r.state = state

    # ---- the rule (stall.py) -----------------------------------------------------------------------------------
    def _check(self):
        if not self.me.armed or self._aborting or self.me.state == "exited":
            return
        verdict = self.rule.verdict(self.ranks, time.monotonic(), self.hub_gone)
        if verdict is not None:
            self._abort(verdict.text, verdict.wake)

    def _abort(self, text: str, wake: List[int] = ()):
        self._aborting = True
        self._say(text)           # first: a launcher that saw a rank die may kill this process any moment
        if self.channel is not None:
            self._send_all({"t": "abort", "msg": f"{text} [seen by rank {self.rank}]"})
        # A silent rank on this host may be a stopped process (SIGSTOP): resume it, so that it reads the abort (or
        # the launcher's SIGTERM, which a stopped process does not act on) and the job ends now, not after the
        # launcher's kill grace (horovodrun: about 10 s). Ranks on other hosts are left to the launcher.
        for q in wake:
            r = self.ranks[q]
            if r.pid and r.host == self.me.host and r.pid != self.me.pid:
                with contextlib.suppress(OSError):
                    os.kill(r.pid, signal.SIGCONT)
        self._die(text)

    def _say(self, text: str):
        if getattr(self, "_said", False):
            return
        self._said = True
        with contextlib.suppress(Exception):
            os.write(2, f"hvd_elastic: error: {text}\n".encode())    # unbuffered, no lock: one write

    def _die(self, text: str):
        self._say(text)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(1)


# ---- the process's watchdog ----------------------------------------------------------------------------------------
_WATCHDOG: Optional[Watchdog] = None


def session_started(timeout_s: float, rank: int, size: int, allgather_object: Callable[[Any], list],
                    policy: str = "") -> Watchdog:
    """Called by every Session at construction (collective the first time in a process: the hub's address is
    exchanged); arms the watchdog until the session finishes."""
    global _WATCHDOG
    if _WATCHDOG is None:
        wd = Watchdog(rank, size, timeout_s)
        if horovod_elastic():
            # Elastic Horovod: ranks leave and join on purpose and the elastic driver handles lost ones (Horovod
            # raises HorovodInternalError and re-forms the job); a start-up collective would also deadlock a worker
            # that joins mid-run. The watchdog stays off: no hub, no thread, nothing checked.
            wd.detached = True
        else:
            wd.start(allgather_object)
        _WATCHDOG = wd
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=wd.forked)
    _WATCHDOG.timeout_s = _WATCHDOG.rule.timeout_s = timeout_s
    _WATCHDOG.rule.policy = policy
    _WATCHDOG.arm()
    return _WATCHDOG


def current() -> Optional[Watchdog]:
    return _WATCHDOG


def enter(where: str):
    """The training thread is now inside the plugin at `where` (a label used in messages)."""
    if _WATCHDOG is not None:
        _WATCHDOG.enter(where)


def progress():
    if _WATCHDOG is not None:
        _WATCHDOG.progress()
