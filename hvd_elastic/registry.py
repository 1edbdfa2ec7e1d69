"""The policies, each declared once: what it is, what it reads, what it refuses and where it runs.

Every other part of the package asks this registry about a policy -- configuration (the accepted names, which knobs a
policy reads), the frontends (lock-step or ticks, gradients or deltas, the Horovod arguments to refuse), the sync
engine (the rule class), the watchdog, the report and the benchmarks -- and never tests a policy's name. Adding a
relaxed policy is its rule module under ``engine/policies/``, its native rule under ``native/`` and one entry here
(docs/design.md, "Adding a policy").

Framework-free and import-light: configuration imports it, and the rule classes are named by path, imported only
when an engine is built.

Example::

    from hvd_elastic.registry import policy
    policy("ssp").lockstep, policy("ssp").knobs       # False, ('staleness', 'tick_ms', ...)
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, Tuple

# Knobs every policy reads (emulation, faults, the report); they are not listed in the entries below.
COMMON_KNOBS = ("policy", "emulate_delay", "emulate_slowdown", "emulate_jitter", "emulate_vary_period",
                "emulate_vary_factor", "stall_timeout", "report", "report_json")
# Knobs of every policy that runs ticks (the sync engine), and of those among them that push gradients.
TICK_KNOBS = ("tick_ms", "tick_pacing", "keep_heap", "staleness_compensation")
GRADIENT_TICK_KNOBS = TICK_KNOBS + ("max_inflight", "peer_wait", "relax_min_gain", "push_at_backward",
                                    "momentum_per")

# horovod.torch.DistributedOptimizer's arguments a policy may refuse (each named in the refusal's one line).
HOROVOD_ARGUMENTS = ("compression", "op", "gradient_predivide_factor", "sparse_as_dense", "process_set",
                     "backward_passes_per_step")
_TICK_REFUSES = ("compression", "op", "gradient_predivide_factor", "sparse_as_dense", "process_set")

FRONTENDS = ("PyTorch", "Keras", "TensorFlow")


@dataclasses.dataclass(frozen=True)
class Policy:
    """One policy's declaration.

    lockstep: every rank takes every step together through one allreduce per step (bsp, lbbsp); otherwise the
    policy runs the sync engine's ticks and ``rule`` names its rule class (``module:Class``).
    deltas: the rank takes a local optimizer step and pushes the model delta (wbsp); otherwise it pushes gradients.
    lockstep_gradients: a delta policy whose ranks push gradients while they go in lock-step from the start, deltas
    from its first relaxed round on (auto: engine/updates.py GradientsThenDeltas).
    horovod_optimizer: the optimizer is Horovod's own, with every Horovod argument (bsp).
    balances_batches: per-rank batch sizes re-sized every step under a fixed global batch (lbbsp).
    knobs: the knobs it reads besides COMMON_KNOBS; knobs_when: (knob, switch) pairs, a knob of `knobs` read only
    while the boolean knob `switch` is on. refuses: Horovod's DistributedOptimizer arguments it cannot honour
    at other than their defaults. frontends: where it runs. elastic: the frontends where it runs under elastic Horovod
    (horovodrun --elastic). presets: (knob, value) pairs the policy runs with whatever the settings say (another
    policy's rule with its switches set: auto); a preset knob is not among `knobs`, so setting it draws the warning
    that the policy does not read it.
    """

    name: str
    model: str
    lockstep: bool
    rule: str = ""
    deltas: bool = False
    lockstep_gradients: bool = False
    horovod_optimizer: bool = False
    balances_batches: bool = False
    knobs: Tuple[str, ...] = ()
    knobs_when: Tuple[Tuple[str, str], ...] = ()
    refuses: Tuple[str, ...] = ()
    frontends: Tuple[str, ...] = FRONTENDS
    elastic: Tuple[str, ...] = ()
    presets: Tuple[Tuple[str, object], ...] = ()

    @property
    def ticks(self) -> bool:
        """Runs the sync engine (the relaxed policies)."""
        return not self.lockstep

    @property
    def pushes_gradients(self) -> bool:
        """A tick policy whose pushes are gradients (the gradient policies: asp, ssp, dssp, zipline)."""
        return self.ticks and not self.deltas

    def reads(self, knob: str) -> bool:
        return knob in COMMON_KNOBS or knob in self.knobs

    def reads_under(self, knob: str, cfg) -> bool:
        """reads(knob) with the settings `cfg`: a knob of knobs_when only while its switch is on."""
        switch = dict(self.knobs_when).get(knob)
        return self.reads(knob) and (switch is None or bool(getattr(cfg, switch)))

    def rule_class(self):
        """The engine's rule class of a tick policy (imported on first use)."""
        module, _, cls = self.rule.partition(":")
        return getattr(importlib.import_module(module), cls)


_RULES = "hvd_elastic.engine.policies."
REGISTRY: Dict[str, Policy] = {p.name: p for p in (
    Policy("bsp", "bulk synchronous: Horovod's own optimizer and arithmetic", lockstep=True, horovod_optimizer=True,
           elastic=FRONTENDS),
    Policy("asp", "asynchronous: push every step, never wait for another rank", lockstep=False,
           rule=_RULES + "asp:Asp", knobs=GRADIENT_TICK_KNOBS, refuses=_TICK_REFUSES, elastic=FRONTENDS),
    Policy("ssp", "stale synchronous: lead the slowest by at most s clocks", lockstep=False,
           rule=_RULES + "ssp:Ssp", knobs=("staleness",) + GRADIENT_TICK_KNOBS, refuses=_TICK_REFUSES,
           elastic=FRONTENDS),
    Policy("dssp", "dynamic stale synchronous: s in [s_L, s_U], credits where waiting would not pay", lockstep=False,
           rule=_RULES + "ssp:Dssp", knobs=("dssp_lower", "dssp_upper", "predictor") + GRADIENT_TICK_KNOBS,
           refuses=_TICK_REFUSES, elastic=FRONTENDS),
    Policy("zipline", "ElasticBSP: barriers where the predicted wait is least, at most R steps apart",
           lockstep=False, rule=_RULES + "zipline:Zipline", knobs=("lookahead", "predictor") + GRADIENT_TICK_KNOBS,
           refuses=_TICK_REFUSES, elastic=FRONTENDS),
    Policy("lbbsp", "load-balanced bulk synchronous: per-rank batch sizes re-sized every step", lockstep=True,
           balances_batches=True,
           knobs=("predictor", "lbbsp_mode", "lbbsp_tolerance", "global_batch", "lbbsp_caps", "emulate_sample_delay"),
           refuses=HOROVOD_ARGUMENTS, frontends=("PyTorch", "Keras"), elastic=("PyTorch", "Keras")),
    Policy("wbsp", "worker-busy synchronous: fast ranks never wait, asymmetric upload and download",
           lockstep=False, rule=_RULES + "wbsp:Wbsp", deltas=True,
           knobs=("wbsp_overlap", "wbsp_lockstep", "relax_min_gain") + TICK_KNOBS,
           knobs_when=(("relax_min_gain", "wbsp_lockstep"),),
           refuses=_TICK_REFUSES, elastic=FRONTENDS),
    Policy("auto", "lock-step at BSP's pace where no rank waits, wbsp with overlap where ranks would: the lock-step "
           "fallback chooses from measurements", lockstep=False, rule=_RULES + "wbsp:Wbsp", deltas=True,
           lockstep_gradients=True, knobs=("relax_min_gain",) + TICK_KNOBS, refuses=_TICK_REFUSES, elastic=FRONTENDS,
           presets=(("wbsp_overlap", True), ("wbsp_lockstep", True))),
)}
NAMES: Tuple[str, ...] = tuple(REGISTRY)
DEFAULT = "bsp"


def policy(name: str) -> Policy:
    """The registered policy `name` (KeyError for an unknown name: configuration has refused it before)."""
    return REGISTRY[name]


def readers(knob: str) -> Tuple[str, ...]:
    """The policies that read `knob`; empty for a knob every policy reads."""
    if knob in COMMON_KNOBS:
        return ()
    return tuple(p.name for p in REGISTRY.values() if knob in p.knobs)


def available(frontend: str) -> Tuple[str, ...]:
    return tuple(p.name for p in REGISTRY.values() if frontend in p.frontends)
