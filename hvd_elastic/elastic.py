"""Elastic Horovod (``horovodrun --elastic``, ``hvd.elastic.run``) under the tick policies, framework-free: what a
relaxed optimizer does around a reset of the rank set. The frontends plug it into Horovod's elastic loop
(hvd_elastic/torch/elastic.py: TorchState and ``horovod.torch.elastic``; hvd_elastic/keras/elastic.py: KerasState and
its own ``run``) and hand it a :class:`Replica` (how to copy, load and broadcast their model and optimizer state).

Horovod re-forms the job when the rank set changes: a collective fails (HorovodInternalError: every rank restores
its last ``state.commit()``) or the driver reports new or removed hosts at a commit (HostsUpdatedInterrupt), then
the elastic loop shuts Horovod down, initialises it again and syncs the state from rank 0. A tick policy's engine
is sized for one rank set, so around that reset:

- a failed tick surfaces as HorovodInternalError on the training thread (:meth:`ElasticRun.failed`: the engine's
  TickerError carries Horovod's error), so Horovod's elastic loop handles it as it handles its own collectives';
- every live engine's tick thread stops before Horovod shuts down, without a collective (:func:`stop_engines`),
  and the reset waits for those threads after the shutdown (:func:`join_stopped`); pushes not in a completed tick
  are dropped on every rank alike;
- the most advanced replica is kept: when Horovod is about to restore the last commit after a failure
  (:func:`keep_replicas`), or at a reset without a failure, each survivor snapshots its model -- the gradient
  policies' replica after the ticks it applied (every rank applies the same ticks in the same order, so each survivor
  holds a valid state), wbsp's global model W -- with the count of updates in it, and its optimizer state;
- ``state.commit()`` is local: Horovod's ``check_host_updates`` broadcasts rank 0's view of the rank set at every
  commit, a barrier that would hold every rank to the same number of commits, and so of steps; while a tick engine
  runs, the ranks agree on the driver's announcements through the ticks instead (each rank's latest in its row of
  the tick table, engine/table.py HOSTS): every rank's tick thread stops after the tick that carries a change (the
  same tick on every rank, so that no rank waits in a later tick -- for Gloo's timeout -- on a rank that has gone
  to the reset), and each raises HostsUpdatedInterrupt at its first commit after it, or at its first call that
  needs a tick before that commit (engine/loop.py RankSetChanged), always with Horovod's sync after the reset
  (:func:`check_host_updates`);
- at the state's sync (TorchState.sync: :func:`plan_resumes` before Horovod's, :func:`resume` after it;
  KerasState.sync: :meth:`ElasticRun.plan_resume` and :meth:`ElasticRun.resume` of its optimizer), every rank takes
  the snapshot of the survivor that applied the most updates (its weights and optimizer state broadcast to every
  rank; the sync leaves out the broadcast of rank 0's that this one replaces), or keeps the state Horovod synced
  where no survivor has one,
  so the script's first step after the reset computes its gradient on the weights it is applied to (a worker that
  joins makes its ElasticRun there: PyTorch with its DistributedOptimizer, TensorFlow at the sync, from the model's
  trained variables);
- a new engine is built at that first step (collective: every rank, new ones included, is there), for the new
  ranks, from that state. The engine's clocks, gates, barriers and tick table start afresh over the new ranks.

So a reset loses at most the updates in flight when it happened, not the steps since the last commit. The rest of
what the script's state holds (buffers, the script's own counters such as ``state.batch``) comes back from the
commit, as under Horovod. docs/horovod-compat.md, "Elastic Horovod".
"""
from __future__ import annotations

import time
from typing import Any, List, NamedTuple, Optional

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from .engine.loop import RankSetChanged
from .engine.ticker import TickerError
from .lbbsp import LbbspController

STOP_WAIT_S = 10.0   # how long a reset waits for a stopped tick thread to end after Horovod's shutdown


class Replica:
    """What a frontend gives :class:`ElasticRun`: its model and optimizer state, copied, loaded and broadcast."""

    def allgather(self, obj: Any, name: str) -> list:
        """Collective: every rank's `obj`, in rank order."""
        raise NotImplementedError

    def capture(self, global_model) -> tuple:
        """Copies of (the replica's flat weights, the optimizer state). global_model: the update kind's global model
        W where it keeps one (wbsp: the replica's weights are W), else None (they are the model's own)."""
        raise NotImplementedError

    def load(self, weights, optimizer_state):
        """Make a captured model and optimizer state this rank's."""
        raise NotImplementedError

    def broadcast(self, root_rank: int):
        """Collective: the model and optimizer state of `root_rank` on every rank."""
        raise NotImplementedError

    def synced_by(self, objects) -> bool:
        """Whether Horovod's sync of a state holding `objects` (its models and optimizers) broadcasts this model and
        optimizer state from rank 0."""
        return False


class Standing(NamedTuple):
    """What each rank tells the others at a new engine's start (ElasticRun._recover's allgather)."""
    progress: int            # the updates in its snapshot, -1: none (a joiner, or no engine ran)
    epoch_ns: int            # its clock's epoch proposal (rank 0's is taken)
    engine_id: int           # its engine count (the largest is taken)
    handled_s: int           # the latest change of the rank set it has reset for
    account: Optional[tuple]  # Snapshot.account(), None without a snapshot
    committed: int           # the updates in its model at its latest commit
    base: int                # the job's steps in its model when its last engine started


def most_advanced(progress: List[int]) -> int:
    """The rank whose snapshot holds the most updates (`progress`, per rank; -1: none), the lowest among equals."""
    return max(range(len(progress)), key=lambda r: (progress[r], -r))


class Snapshot:
    """A survivor's model at a reset: flat weights (gradient policies: the replica; wbsp: the global model W), the
    optimizer state and `progress`, the updates of all ranks applied into it; for the reset's accounting, the rank
    it had, its own pushes and `clocks`, each rank's pushes in those updates. `current`: the rank's model and
    optimizer state are still the snapshot (taken at a reset without a restore, of the replica itself)."""

    def __init__(self, weights, optimizer_state, progress: int, rank: int, pushed: int, clocks: List[int],
                 current: bool = False):
        self.weights, self.optimizer_state, self.progress = weights, optimizer_state, progress
        self.rank, self.pushed, self.clocks, self.current = rank, pushed, clocks, current

    def account(self) -> tuple:
        """What the others need to count the reset's loss: (rank, own pushes, each rank's pushes in the model)."""
        return self.rank, self.pushed, self.clocks


class Resume(NamedTuple):
    """What every rank takes at the sync after a reset (ElasticRun.plan_resume): the survivor `best`, the updates in
    its replica (`progress`, -1: none has one), and whether that replica is loaded and broadcast."""
    best: int
    progress: int
    load: bool


class ElasticRun:
    """One relaxed optimizer's side of elastic Horovod: what its engine was, and what the next one starts from."""

    def __init__(self, replica: Replica, session, start_engine):
        self.replica, self.session = replica, session
        self._start_engine = start_engine     # start_engine(recover): the engine for the current rank set
        self.snapshot: Optional[Snapshot] = None
        self.resets = 0
        self.reset_s = 0.0                    # from a reset's start to the new engine's first step
        self._reset_at: Optional[float] = None
        self.before_reset: List[float] = []   # per reset: from this rank's last completed step to the reset's start
        self.recovered_from: List[int] = []   # per reset: the updates in the state the job resumed from (-1: Horovod's)
        # per reset: the survivors' pushes not in the state resumed from (lost), those not yet in a tick each had
        # applied itself (in flight), and the updates that state holds beyond the last commit of the new rank 0
        # (what Horovod's restore of the commit would have lost besides)
        self.lost: List[int] = []
        self.in_flight: List[int] = []
        self.beyond_commit: List[int] = []
        self.committed = 0         # the updates in this rank's model at its latest commit
        self.base = 0              # the job's steps in the model when the current engine started (all resets)
        self.heard = 0             # the latest change of the rank set announced to this rank (timestamp x 4 + kind)
        self.handled_s = 0         # the timestamp of the latest change this rank has reset for
        self.baseline_s = 0        # ... the latest any rank of this engine had reset for (agreed at its start)
        self.preloaded = None      # (rank, updates) of the survivor replica loaded at the state's sync (resume)
        self.replica_loads = 0     # resets at which a survivor's replica was loaded and broadcast (_load_from)
        self.sync_replaced = 0     # ... at which the state's sync left out rank 0's model and optimizer state for it
        _LIVE.append(self)

    # ---- the training thread ---------------------------------------------------------------------------------
    def before_step(self):
        """At a step (PyTorch) or a fit's start (Keras): build the engine if there is none (the first, or the first
        after a reset)."""
        engine = self.session.engine
        if engine is not None and not engine.abandoned:
            return
        if engine is not None:                       # a reset happened: the old engine is dead
            self.session.engine = None
            self.resets += 1
        self._start_engine(self._recover)
        self.started()
        if self._reset_at is not None:
            self.reset_s += time.perf_counter() - self._reset_at
            self._reset_at = None

    @staticmethod
    def failed(error: TickerError) -> BaseException:
        """A step met the tick thread's end: the error Horovod's elastic loop expects -- HostsUpdatedInterrupt where
        the ticks stopped at a change of the rank set the ranks agreed on, HorovodInternalError where they failed."""
        if isinstance(error, RankSetChanged):
            return HostsUpdatedInterrupt(False)
        cause = error.__cause__ if error.__cause__ is not None else error
        return HorovodInternalError(f"hvd_elastic: the ticks failed: {cause}")

    def plan_resume(self, synced: bool) -> Optional["Resume"]:
        """Collective, at the sync of the script's state (the elastic loop's start, and after each reset) where no
        engine runs; None where one does. Every rank learns which survivor's replica it takes now, so that the first
        step after a reset computes its gradient on the weights the new engine starts from -- not on the commit
        Horovod restored, or rank 0's replica its sync broadcast -- and whether that replica is loaded and broadcast
        (`load`). `synced`: the sync broadcasts this optimizer's model and state from rank 0; where rank 0's own is
        the most advanced replica and still its model (a change of the rank set without a restore, the gradient
        policies: every rank applied the same ticks), the sync gives every rank that replica and nothing is loaded or
        broadcast besides. Where a replica is loaded, the sync leaves out what its broadcast replaces (rank 0's
        model and optimizer state: torch/elastic.py, keras/elastic.py)."""
        if self.ticking():
            return None
        self.session.follow_ranks()
        snap = self.snapshot
        standing = self.replica.allgather((snap.progress, snap.current) if snap is not None else (-1, False),
                                          "hvd_elastic.elastic.resume")
        progress = [p for p, _ in standing]
        best = most_advanced(progress)
        load = progress[best] >= 0 and not (synced and best == 0 and standing[0][1])
        return Resume(best, progress[best], load)

    def resume(self, plan: "Resume"):
        """Collective, after the sync: the plan's replica becomes every rank's weights and optimizer state where it
        is loaded (else the sync's are it, or no survivor has one). The engine's start (_recover) does the
        accounting and loads nothing again unless the rank set was reset in between."""
        if plan.load:
            self._load_from(plan.best, self.snapshot)
        self.preloaded = (plan.best, plan.progress)

    def _load_from(self, best: int, snap: Optional["Snapshot"]):
        """Collective: rank `best`'s snapshot becomes every rank's weights and optimizer state."""
        self.replica_loads += 1
        if self.session.rank == best:
            self.replica.load(snap.weights, snap.optimizer_state)
        self.replica.broadcast(best)

    def _recover(self, epoch_and_id):
        """Collective, at a new engine's start: every rank learns every survivor's progress; the most advanced
        snapshot (lowest rank among equals) becomes every rank's weights and optimizer state. Returns the job's
        common (epoch_ns, engine id)."""
        snap = self.snapshot
        mine = Standing(snap.progress if snap is not None else -1, *epoch_and_id, self.handled_s,
                        snap.account() if snap is not None else None, self.committed, self.base)
        everyone = [Standing(*e) for e in self.replica.allgather(tuple(mine), "hvd_elastic.elastic.start")]
        self.baseline_s = max(e.handled_s for e in everyone)
        self.session.rank_set_baseline = self.baseline_s   # the new engine's ticks stop at a later change
        best = most_advanced([e.progress for e in everyone])
        chosen = everyone[best]
        if chosen.progress >= 0 and self.preloaded != (best, chosen.progress):
            self._load_from(best, snap)
        self.preloaded = None
        if self.resets or snap is not None:
            self.recovered_from.append(int(chosen.progress))
            self._account(everyone, chosen)
        self.snapshot = None
        self.committed = max(chosen.progress, 0)
        # a survivor's count goes on from the state resumed from; a joiner's (base 0, no snapshot) takes it
        self.base = max(chosen.base + max(chosen.progress, 0), max(e.base for e in everyone))
        return everyone[0].epoch_ns, max(e.engine_id for e in everyone)

    def global_steps(self, engine_steps: int) -> int:
        """The job's steps over every reset: those in the state the current engine started from, plus the engine's
        (`engine_steps`)."""
        return self.base + engine_steps

    def _account(self, everyone: List["Standing"], chosen: "Standing"):
        """The reset's loss, from every survivor's snapshot: its pushes not in the state resumed from, against
        those it had in flight (not yet in a tick it had applied itself)."""
        if chosen.account is None:
            return
        clocks = chosen.account[2]
        survivors = [e.account for e in everyone if e.account is not None]
        self.lost.append(sum(max(pushed - clocks[rank], 0) for rank, pushed, _ in survivors))
        self.in_flight.append(sum(max(pushed - own[rank], 0) for rank, pushed, own in survivors))
        self.beyond_commit.append(int(chosen.progress) - int(everyone[0].committed))

    def started(self):
        """The new engine runs: it carries what this rank has heard of changes of the rank set (one heard just
        before a reset is not lost with the old engine; one every rank has reset for is below the baseline)."""
        self.session.engine.ticker.announce_hosts(self.heard)

    def hosts_changed(self, heard: int) -> int:
        """At a commit: announce the latest change of the rank set this rank has heard of (0: none new) and return
        the timestamp of a change the ranks agree on through the ticks and have not reset for, or 0. Every rank
        applies the same ticks, so each sees the change at its first commit after the tick that carries it."""
        engine = self.session.engine
        self.committed = engine.applied_contributions
        self.heard = max(self.heard, heard)
        engine.ticker.announce_hosts(self.heard)
        agreed_s = engine.ticker.handoff.hosts_announced() // 4
        if agreed_s > max(self.baseline_s, self.handled_s):
            self.handled_s = agreed_s
            return agreed_s
        return 0

    def ticking(self) -> bool:
        """This optimizer's engine runs: built, not stopped for a reset, not finished."""
        engine = self.session.engine
        return engine is not None and not engine.abandoned and not engine.finished

    # ---- the reset (hvd.elastic.run) ---------------------------------------------------------------------------
    def keep_replica(self):
        """Horovod is about to restore the last commit after a failure: keep this replica first."""
        self.preloaded = None
        if self.ticking():
            self._take_snapshot(current=False)

    def stop(self):
        """The reset: stop this optimizer's engine (returned, for the join after Horovod's shutdown), None if none
        runs."""
        self.preloaded = None
        if not self.ticking():
            return None
        engine = self.session.engine
        # every change announced so far is handled by this reset (also one the ticks stopped at before this rank's
        # commit raised for it), so that the next engine's ticks stop only at a later one
        self.handled_s = max(self.handled_s, engine.ticker.handoff.hosts_announced() // 4)
        self._reset_at = time.perf_counter()
        self.before_reset.append(since_last_step(self.session, self._reset_at))
        # HostsUpdatedInterrupt: nothing was restored, so the replica as it stands is kept, with the ticks completed
        # so far applied (unless the ticks failed: the replica as it stands). After a failure the replica was kept
        # before Horovod's restore (keep_replica): _take_snapshot keeps that one.
        engine.abandon(drain=True)
        self._take_snapshot(current=True)
        return engine

    def _take_snapshot(self, current: bool):
        """`current`: no restore follows, so the model stays the snapshot (wbsp's is W, not the model: never)."""
        engine = self.session.engine
        if engine is None or self.snapshot is not None:
            return
        global_model = engine.updates.global_model
        weights, optimizer_state = self.replica.capture(global_model)
        self.snapshot = Snapshot(weights, optimizer_state, engine.applied_contributions, engine.rank, engine.pushed,
                                 [int(c) for c in engine.view.clocks], current and global_model is None)

    def counters(self) -> dict:
        return {"elastic_resets": self.resets, "elastic_reset_s": round(self.reset_s, 3),
                "elastic_resumed_from_updates": list(self.recovered_from),
                "elastic_lost_updates": list(self.lost), "elastic_in_flight_updates": list(self.in_flight),
                "elastic_beyond_commit_updates": list(self.beyond_commit),
                "elastic_before_reset_s": list(self.before_reset), "elastic_replica_loads": self.replica_loads,
                "elastic_sync_replaced": self.sync_replaced}


def since_last_step(session, reset_at: float) -> float:
    """Seconds from `session`'s last completed step to a reset that began at `reset_at` (perf_counter): how long the
    rank trained on, or waited in a step, before the reset began. A lost worker shows when a collective fails,
    which under Gloo can take HOROVOD_GLOO_TIMEOUT_SECONDS (docs/horovod-compat.md, "Elastic Horovod")."""
    return round(max(0.0, reset_at - session.last_step_end), 3)


_LIVE: List[ElasticRun] = []
_RESETS = {"count": 0, "at": 0.0}   # Horovod resets in this process, and when the latest began (perf_counter)


def resets() -> int:
    """How many times the elastic loop has reset Horovod in this process (lbbsp rebuilds its plan when it moves)."""
    return _RESETS["count"]


def reset_began() -> float:
    """perf_counter() when the latest reset began."""
    return _RESETS["at"]


class LbbspResets:
    """lbbsp under elastic Horovod, either frontend: the steps are synchronous, so a reset is Horovod's (the last
    commit after a failure, rank 0's state at the sync); at the first use after it the controller is rebuilt for the
    ranks of the moment (B kept, split evenly until the new ranks' speeds are measured), and the batch plan, in the
    script's state, resumes the epoch at its first global batch not stepped (hvd_elastic.lbbsp.BatchPlan)."""

    def __init__(self):
        self.seen = resets()
        self.resets = 0
        self.reset_s = 0.0      # from each reset's start to the controller's rebuild for the new ranks
        self.before_reset: List[float] = []   # per reset: from this rank's last completed step to the reset's start

    def follow(self, session) -> bool:
        """Rebuild `session`'s controller if Horovod has reset the rank set since it was built; True if it did."""
        if resets() == self.seen:
            return False
        self.seen = resets()
        session.follow_ranks()
        session.lbbsp = LbbspController(session.cfg, session.rank, session.size, session.telemetry)
        self.resets += 1
        began = reset_began()
        self.reset_s += time.perf_counter() - began
        self.before_reset.append(since_last_step(session, began))
        return True

    def counters(self) -> dict:
        return {"elastic_resets": self.resets, "elastic_reset_s": round(self.reset_s, 3),
                "elastic_before_reset_s": list(self.before_reset)}


def live() -> List[ElasticRun]:
    """The elastic runs of optimizers not finished yet (finished ones are dropped)."""
    _LIVE[:] = [run for run in _LIVE if run.session.report is None]
    return _LIVE


def stop_engines() -> list:
    """A reset begins, before Horovod's shutdown: count it and stop every live engine's ticks (no collective).
    Returns the stopped engines, for :func:`join_stopped` after the shutdown (a tick under way fails there)."""
    _RESETS["count"] += 1
    _RESETS["at"] = time.perf_counter()
    return [e for e in (run.stop() for run in live()) if e is not None]


def plan_resumes(synced_objects=()) -> List[tuple]:
    """Collective, before Horovod's sync of a state holding `synced_objects` (its models and optimizers): per live
    optimizer without a running engine, (its ElasticRun, its Resume, whether that sync covers its model and
    optimizer state)."""
    plans = []
    for run in live():
        covered = run.replica.synced_by(synced_objects)
        plan = run.plan_resume(covered)
        if plan is not None:
            plans.append((run, plan, covered))
    return plans


def resume(plans: List[tuple]):
    """Collective, after Horovod's sync: each planned optimizer takes its survivor's replica (ElasticRun.resume)."""
    for run, plan, _ in plans:
        run.resume(plan)


def join_stopped(engines: list):
    """After Horovod's shutdown: wait for the stopped tick threads to end before Horovod is initialised again."""
    for engine in engines:
        engine.ticker.join(STOP_WAIT_S, check=False)


def keep_replicas():
    """Horovod is about to restore the last commit after a failure: every live engine's replica is kept first."""
    for run in live():
        run.keep_replica()


def check_host_updates(self, horovod_check):
    """``check_host_updates`` of a Horovod State (`self`; every commit), `horovod_check` Horovod's own bound to it:
    that one where no tick engine runs. Horovod's version broadcasts rank 0's view of the rank set at every commit
    (a barrier per commit); while an engine runs the ranks agree through the ticks instead, so a commit is local
    (save() alone). A change the ranks agree on raises HostsUpdatedInterrupt, always with Horovod's sync after the
    reset: the ranks raise at different steps, and the sync gives them rank 0's counters."""
    runs = [run for run in live() if run.ticking()]
    if not runs:
        return horovod_check()
    heard = 0
    while not self._host_messages.empty():
        timestamp, update = self._host_messages.get()
        heard = max(heard, int(timestamp) * 4 + int(update))
    agreed_s = max(run.hosts_changed(heard) for run in runs)
    if agreed_s > self._last_updated_timestamp:
        self._last_updated_timestamp = agreed_s
        raise HostsUpdatedInterrupt(False)
