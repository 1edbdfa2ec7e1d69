"""The one stall rule of every policy (docs/design.md, "Faults"): from what a rank knows of every rank (the
watchdog's heartbeat table), whether the job must stop, and the one line that names why. A pure function of that
table and the time, so every case can be tested in one process; the watchdog (watchdog.py) applies it a few times
a second and carries out the verdict.

In order: a rank lost mid-training (its connection closed without a goodbye) is named at once, one that exited with
an error after ERROR_GRACE_S (time for this rank to print its own error first). Then, when this rank is inside the
plugin and neither it nor any live rank has made progress (a completed step, or the end of finish()) for the
timeout, the job is stalled, and the line names: the ranks whose heartbeat fell silent (a stopped process, a host cut
off), else the ranks whose script ended without finishing training, else the ranks blocked in a collective of the
script's own (calls that do not match, or a policy holding a rank before the call), else the ranks blocked in their
own code, else the ranks with the fewest steps. A rank in the script's own code is never judged, and a rank waiting
in its own collective for a rank still in the script's own code is not stalled.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

from . import registry

SILENT_S = 3.0        # a heartbeat older than this (three missed) means the rank's process is not running
ERROR_GRACE_S = 5.0   # after another rank exited with an error, time left for this rank to fail with its own

USER = ""             # `where` of a rank running the script's own code (between steps, or outside training)
UNKNOWN = "?"         # frontends that cannot tell (TF custom loops): counts as inside the plugin
COLLECTIVE = "collective:"   # + Horovod name: the training thread waits in a collective of the script's own

_WHERE_TEXT = {"step": "a training step", "finish": "finish()", USER: "the script's own code",
               UNKNOWN: "its training loop"}


def collective(name: str) -> str:
    """`where` of a rank waiting in the script's own collective `name` (hvd_elastic/torch/collectives.py)."""
    return COLLECTIVE + name


def where_text(where: str) -> str:
    if where.startswith(COLLECTIVE):
        return f"a Horovod collective of the script's own ({where[len(COLLECTIVE):]!r})"
    return _WHERE_TEXT.get(where, where)


def _ranks(qs: Sequence[int]) -> str:
    return ("rank " if len(qs) == 1 else "ranks ") + ", ".join(map(str, qs))


class RankState:
    """What this rank knows about one rank (times are this process's time.monotonic())."""

    __slots__ = ("steps", "where", "armed", "state", "heard", "progress", "error", "host", "pid")

    def __init__(self, now: float):
        self.steps, self.where, self.armed = 0, USER, False
        self.state = "up"            # up | exited (said goodbye) | lost (connection closed without goodbye)
        self.heard = now             # last heartbeat
        self.progress = now          # last progress
        self.error = ""              # exception that ended its script, if any
        self.host, self.pid = "", 0  # where its process runs


@dataclasses.dataclass
class Verdict:
    text: str                      # the one line every live rank prints
    wake: Sequence[int] = ()       # silent ranks to resume (SIGCONT) where they run on this host


class StallRule:
    """The rule for rank `me` of a job under `policy`, with HVD_ELASTIC_STALL_TIMEOUT `timeout_s`."""

    def __init__(self, me: int, timeout_s: float, policy: str = ""):
        self.me, self.timeout_s, self.policy = me, timeout_s, policy
        self._failed_seen: Optional[float] = None   # when another rank was first seen exited with an error

    def verdict(self, ranks: List[RankState], now: float, hub_gone: bool = False) -> Optional[Verdict]:
        """None while the job may go on; else why it must stop."""
        gone = self._gone(ranks, now)
        if gone is not None or self._failed_seen is not None:
            return gone
        me = ranks[self.me]
        if me.where == USER or (me.where == UNKNOWN and me.steps == 0) or now - me.progress < self.timeout_s:
            return None   # the script's own code (or, unmarked, before the first step: loading data) is not judged
        live = [q for q, r in enumerate(ranks) if q == self.me or
                (r.state == "up" and (hub_gone or now - r.heard < SILENT_S))]
        others = [q for q in live if q != self.me and ranks[q].armed]
        if any(now - ranks[q].progress < self.timeout_s for q in others):
            return None   # someone is still making progress: not a stall (yet)
        if me.where.startswith(COLLECTIVE) and any(ranks[q].where == USER for q in others):
            return None   # waiting in the script's own collective for a rank still in the script's own code
        return self._stalled(ranks, live, now, hub_gone)

    def _gone(self, ranks: List[RankState], now: float) -> Optional[Verdict]:
        """A rank lost, or one whose script raised, during training."""
        others = [q for q in range(len(ranks)) if q != self.me and ranks[q].armed]
        lost = [q for q in others if ranks[q].state == "lost"]
        if lost:
            r, me = ranks[lost[0]], ranks[self.me]
            return Verdict(f"{_ranks(lost)} lost (its heartbeat connection closed without a goodbye: killed or "
                           f"crashed; last step {r.steps}, in {where_text(r.where)}) while {_ranks([self.me])} is in "
                           f"{where_text(me.where)}; stopping the job")
        failed = [q for q in others if ranks[q].state == "exited" and ranks[q].error]
        if not failed:
            return None
        # Bad input fails every rank alike, each with its own one-line error: give this rank the time to reach and
        # print its own before stopping it on the other's account.
        if self._failed_seen is None:
            self._failed_seen = now
        if now - self._failed_seen < ERROR_GRACE_S:
            return None
        r = ranks[failed[0]]
        return Verdict(f"{_ranks(failed)} exited with {r.error} during training (step {r.steps}); stopping the job")

    def _stalled(self, ranks: List[RankState], live: List[int], now: float, hub_gone: bool) -> Verdict:
        suffix = f"; aborting after HVD_ELASTIC_STALL_TIMEOUT={self.timeout_s:g} s"
        others = [q for q in range(len(ranks)) if q != self.me]
        silent = [] if hub_gone else [q for q in others if ranks[q].state == "up" and q not in live]
        if self.me != 0 and 0 in silent:
            silent = [0]      # the hub is silent: what we know of the others is as old as its last table
        if silent:
            parts = [f"no heartbeat for {now - ranks[q].heard:.0f} s, last step {ranks[q].steps}" for q in silent]
            return Verdict(f"{_ranks(silent)} stopped making progress ({'; '.join(parts)})" + suffix, wake=silent)
        ended = [q for q in others if ranks[q].state == "exited" and ranks[q].armed]
        if ended:
            return Verdict(f"{_ranks(ended)} ended without finishing training (last step {ranks[ended[0]].steps}) "
                           f"while {_ranks([self.me])} waits in {where_text(ranks[self.me].where)}: call "
                           f"finish(opt) on every rank" + suffix)
        armed = [q for q in live if ranks[q].armed or q == self.me]
        blocked = [q for q in armed if ranks[q].where.startswith(COLLECTIVE)]
        if blocked:
            return Verdict(self._in_collectives(ranks, armed, blocked) + suffix)
        outside = [q for q in armed if q != self.me and ranks[q].where == USER]
        if outside:
            return Verdict(self._in_own_code(ranks, outside, now) + suffix)
        fewest = min(ranks[q].steps for q in armed)
        behind = [q for q in armed if ranks[q].steps == fewest]
        r = ranks[behind[0]]
        return Verdict(f"{_ranks(behind)} stopped making progress (heartbeat alive, in {where_text(r.where)} for "
                       f"{now - r.progress:.0f} s, last step {r.steps})" + suffix)

    def _in_collectives(self, ranks: List[RankState], armed: List[int], blocked: List[int]) -> str:
        waits = "; ".join(f"rank {q} in {ranks[q].where[len(COLLECTIVE):]!r} after step {ranks[q].steps}"
                          for q in blocked)
        where_others = "; ".join(f"rank {q} in {where_text(ranks[q].where)}" for q in armed if q not in blocked)
        return (f"{_ranks(blocked)} blocked in a Horovod collective of the script's own ({waits})"
                + (f" while {where_others}" if where_others else "")
                + ", no rank making progress: the ranks' calls do not match (the same collectives, in the same order, "
                  "with the same names, on every rank)"
                + ("" if self.policy and registry.policy(self.policy).lockstep else
                   f", or the {self.policy} policy holds a rank before the call (docs/horovod-compat.md)"))

    def _in_own_code(self, ranks: List[RankState], outside: List[int], now: float) -> str:
        r = ranks[outside[0]]
        hint = ("a pause longer than the timeout while the others wait for it (evaluation or checkpointing on some "
                "ranks only: raise HVD_ELASTIC_STALL_TIMEOUT), a wait outside Horovod on another rank, or code that "
                "does not return")
        return (f"{_ranks(outside)} stopped making progress: blocked in the script's own code for "
                f"{now - r.progress:.0f} s after step {r.steps} (heartbeat alive) while {_ranks([self.me])} waits in "
                f"{where_text(ranks[self.me].where)}: {hint}")
