"""Configuration: every knob is an ``HVD_ELASTIC_<NAME>`` environment variable or a keyword argument (which wins).

The table ``KNOBS`` below is the single source of truth: parsing, validation, the error messages, the fields and
defaults of :class:`Config` and the README's knobs table (hvd_elastic/knobs.py; ``python -m hvd_elastic.knobs
--readme`` rewrites it) all come from it. Settings are parsed once at start-up; a bad value raises
:class:`ConfigError` whose message is one line naming the setting, the value and what is accepted.

Example::

    cfg = Config.from_env(staleness=2)         # HVD_ELASTIC_POLICY etc. from os.environ, staleness from the kwarg
    cfg.policy, cfg.staleness
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from typing import Any, Callable, Dict, Mapping, Optional

from . import horovod_env, registry
from .engine.pacing import SMALL_WORDS, TICK_PACINGS
from .engine.policies.base import Policy as _Rule
from .engine.pacing.rules import AUTO_EXIT_SPEED, HOLD_FRACTION, PEER_SPEED
from .engine.table import CHUNK_WORDS
from .errors import ConfigError, install_excepthook
from .heap import MMAP_THRESHOLD, TRIM_THRESHOLD

PREFIX = "HVD_ELASTIC_"
POLICIES = registry.NAMES     # the accepted names; what each policy is: hvd_elastic/registry.py
PREDICTORS = ("last", "median", "ewma", "arx")
LBBSP_MODES = ("cpu", "gpu")
SUMMARY_MAX = 100   # characters of a Knob's summary: one short line of the README's table
# Variables with the prefix that configure tooling (ci/bootstrap.sh), not a run; accepted and ignored here.
TOOLING_VARIABLES = ("CACHE", "VENV")


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str            # keyword-argument name; the variable is PREFIX + name.upper()
    default: Any
    parse: Callable[[str, "Knob"], Any]
    accepted: str        # how the accepted values are described in errors and in the README
    summary: str         # the README's knobs table: one short line (<= SUMMARY_MAX characters), what it does now
    doc: str = ""        # the full description, where the summary is not all there is to say

    @property
    def variable(self) -> str:
        return PREFIX + self.name.upper()

    @property
    def used_by(self) -> tuple:
        """The policies that read this knob (each policy declares its knobs in the registry); empty: every policy."""
        return registry.readers(self.name)


def _choice(values):
    def parse(raw: str, knob: Knob):
        v = raw.strip().lower()
        if v not in values:
            raise ValueError
        return v
    return parse


def _int(minimum):
    def parse(raw: str, knob: Knob):
        v = int(str(raw).strip(), 10)
        if v < minimum:
            raise ValueError
        return v
    return parse


def _float(minimum, exclusive=False, below=math.inf):
    def parse(raw: str, knob: Knob):
        v = float(str(raw).strip())
        if math.isnan(v) or math.isinf(v) or v < minimum or (exclusive and v == minimum) or v >= below:
            raise ValueError
        return v
    return parse


def _int_or_auto(minimum):
    as_int = _int(minimum)

    def parse(raw: str, knob: Knob):
        v = str(raw).strip().lower()
        return "auto" if v == "auto" else as_int(v, knob)
    return parse


def _bool(raw: str, knob: Knob):
    v = str(raw).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _text(raw: str, knob: Knob):
    return str(raw).strip()


def _per_rank(minimum):
    """'*:v,3:w' -> {'*': v, 3: w}: a value for every rank, overridden for named ranks. Empty means none."""
    def parse(raw: str, knob: Knob):
        out: Dict[Any, float] = {}
        text = str(raw).strip()
        if not text:
            return {}
        for item in text.split(","):
            who, sep, val = item.partition(":")
            if not sep:
                raise ValueError
            who = who.strip()
            key: Any = "*" if who == "*" else int(who, 10)
            if key != "*" and key < 0:
                raise ValueError
            v = float(val)
            if math.isnan(v) or math.isinf(v) or v < minimum:
                raise ValueError
            out[key] = v
        return out
    return parse


def _per_rank_int(minimum):
    """Like _per_rank, with whole numbers: '*:64,3:16' -> {'*': 64, 3: 16}."""
    floats = _per_rank(minimum)

    def parse(raw: str, knob: Knob):
        out = {}
        for key, v in floats(raw, knob).items():
            if v != int(v):
                raise ValueError
            out[key] = int(v)
        return out
    return parse


KNOBS = (
    Knob("policy", registry.DEFAULT, _choice(POLICIES), "|".join(POLICIES),
         "Synchronization model; bsp is exactly Horovod's behaviour."),
    Knob("staleness", 3, _int(0), "integer >= 0",
         "Staleness bound s: a rank may lead the slowest by at most s clocks; 0 is bsp."),
    Knob("dssp_lower", 3, _int(0), "integer >= 0",
         "Lower staleness bound s_L."),
    Knob("dssp_upper", 15, _int(0), "integer >= HVD_ELASTIC_DSSP_LOWER",
         "Upper staleness bound s_U (r_max = s_U - s_L)."),
    Knob("lookahead", 15, _int(1), "integer >= 1",
         "Lookahead R: the most iterations between two barriers; 1 is bsp."),
    Knob("predictor", "last", _choice(PREDICTORS), "|".join(PREDICTORS),
         "Iteration-time predictor of zipline's barriers, dssp's credits and lbbsp's batch sizes.",
         doc="last (the papers' latest interval), median (of the newest 8), ewma, arx."),
    Knob("lbbsp_mode", "cpu", _choice(LBBSP_MODES), "|".join(LBBSP_MODES),
         "cpu: batch sizes proportional to throughput; gpu: the step moves within memory caps."),
    Knob("lbbsp_tolerance", 0.05, _float(0.0, below=1.0), "number in [0, 1)",
         "Dead band: the batch sizes stay while the finish times differ by at most this fraction.",
         doc="The test: max - min <= tolerance x max over the ranks' (predicted) finish times, in cpu and gpu mode."),
    Knob("global_batch", 0, _int(1), "integer >= the number of ranks",
         "Global batch B, the fixed sum of the per-rank batch sizes; lbbsp requires it (0: unset)."),
    Knob("lbbsp_caps", {}, _per_rank_int(1), "'*:SAMPLES,RANK:SAMPLES,...' with whole SAMPLES >= 1",
         "Most samples a rank may take per step (memory), for every rank and/or named ranks."),
    Knob("wbsp_overlap", False, _bool, "0|1",
         "Upload each step from a communication thread while the next step computes."),
    Knob("wbsp_lockstep", False, _bool, "0|1",
         "wbsp: the lock-step fallback of HVD_ELASTIC_RELAX_MIN_GAIN (off: wbsp's own rule always).",
         doc="In lock-step a rank uploads once a round and downloads the global model once every rank's upload of "
             "the round is in it (BSP's step on SGD). Off by default: at equal speeds on the benchmark's MNIST-1D "
             "task wbsp with overlap reached the target sooner relaxed than in lock-step (docs/benchmarks.md, "
             "\"wbsp in lock-step\"). Policy auto runs wbsp with overlap and this fallback on."),
    Knob("tick_ms", 1.0, _float(0.0, exclusive=True), "number > 0",
         "Minimum interval between two partial-allreduce ticks, in milliseconds."),
    Knob("tick_pacing", "auto", _choice(TICK_PACINGS), "|".join(TICK_PACINGS),
         f"How ticks are paced: probe, join (models under {SMALL_WORDS >> 10}K parameters), or auto (chosen per "
         f"policy).",
         doc="probe: a metadata-only probe shows who has pushed, then a full tick carries the pushes; join: every "
             "tick is full and each rank's tick thread joins it when its own push or its peers' predicted pushes are "
             "due -- one collective per round of pushes; auto (default): join for asp, ssp and dssp once every "
             "rank's push period is measured (probe before), for zipline only while every rank's step time is within "
             f"{PEER_SPEED}x of every other's (until one is {AUTO_EXIT_SPEED}x slower), probe for wbsp; for models of "
             f"{SMALL_WORDS >> 10}K parameters and "
             "more, probe except in lock-step, where each round is a joined probe and full tick (docs/design.md, "
             "docs/benchmarks.md)."),
    Knob("max_inflight", 0, _int_or_auto(0), "integer >= 0|auto",
         "Own pushes a rank may have in flight when it starts a step; auto: the fewest that hide their ticks.",
         doc="In flight: pushed, not yet back in a tick. 0 (default): a rank computes on weights that hold its own "
             "last update (staleness ~1 instead of ~n); auto: the fewest that hide the measured push-to-delivery "
             f"time behind the step (1 to {_Rule.AUTO_MAX_INFLIGHT}): faster steps, staler gradients "
             "(docs/design.md)."),
    Knob("peer_wait", HOLD_FRACTION, _float(0.0), "number >= 0 (fraction of a step; 0: off)",
         "Fraction of a step a rank waits for equally fast peers, and a tick holds pushes for them.",
         doc="After its update is in, a rank waits at most this fraction of its step time for peers (ranks about as "
             "fast as it is) that are behind, so equally fast ranks compute on the same weights; slower ranks are "
             "never waited for. Also bounds how long a tick holds pending pushes (that fraction of the pushers' "
             "step) for ranks due to push within it, so equally fast ranks share one payload."),
    Knob("relax_min_gain", 1.25, _float(0.0), "number >= 0 (0: always relaxed)",
         "Lock-step (BSP's pace) while relaxing is predicted to give under this many times its pushes/s.",
         doc="Measured at run time: each rank's step compute time and push period, lock-step's cost per round, the "
             "relaxed rule's cost per step; the ranks relax while the predicted relaxed/lock-step ratio of pushes "
             "per second is at least this (5% hysteresis), otherwise a rank starts a step only once every rank has "
             "pushed as many updates (staleness 0, as BSP; wbsp with HVD_ELASTIC_WBSP_LOCKSTEP=1 only). 1.25: "
             "relaxing must promise a quarter more pushes to pay for its stale gradients; 0: the policy's own rule "
             "always (docs/design.md)."),
    Knob("push_at_backward", True, _bool, "0|1",
         "PyTorch: push a step's gradient as soon as backward has produced it, not at step().",
         doc="As Horovod starts its allreduce from backward hooks, so the tick runs while the rank still computes "
             "before step(). A script that changes gradients after backward (optimizer.synchronize() then "
             "clipping, several backward passes per step) is recognised in its first step and pushes at step() "
             f"instead; changing them after a push in a later step is a one-line error. Models of "
             f"{2 * CHUNK_WORDS >> 20}M parameters or "
             "more stream it: the tick reduces it in chunks while backward still runs (docs/design.md)."),
    Knob("keep_heap", True, _bool, "0|1",
         "glibc: keep heap memory the process frees for reuse instead of returning it every step.",
         doc=f"mallopt: trim above {TRIM_THRESHOLD >> 30} GiB, mmap above {MMAP_THRESHOLD >> 20} MiB, once per "
             "process; without it the freed top of the heap goes back to the system and the next step faults its "
             "pages back in (hvd_elastic/heap.py). Peak memory is unchanged; 0 leaves the allocator as it is."),
    Knob("staleness_compensation", "none", _choice(("none", "inverse", "damped")), "none|inverse|damped",
         "Scale each update by its predicted staleness s: inverse min(1, n/s), damped n/(n+s), or none.",
         doc="The weight is predicted when the update is pushed; inverse: min(1, n / staleness) (Zhang et al. 2016, "
             "lr / staleness), damped: n / (n + staleness), none: unscaled (hvd_elastic/engine/staleness.py)."),
    Knob("momentum_per", "round", _choice(("round", "share", "tick")), "round|share|tick",
         "PyTorch momentum: once per n gradients as Horovod (round), by a tick's share (share), or per tick.",
         doc="PyTorch optimizers with a momentum setting. round: once per n gradients, as under Horovod -- SGD: "
             "the tick in which a round starts takes SGD's step, a tick continuing the round adds its gradient "
             "without decaying the momentum (a split round is exactly one SGD step); other optimizers (RMSprop): "
             "as share; share: a tick carrying k of the n gradients runs the step with momentum^(k/n); tick: a "
             "whole step per tick. Keras/TF: always per tick."),
    Knob("emulate_delay", {}, _per_rank(0.0), "'*:SECONDS,RANK:SECONDS,...' with SECONDS >= 0",
         "Emulated straggler: extra sleep per step, for every rank and/or named ranks."),
    Knob("emulate_slowdown", {}, _per_rank(1.0), "'*:FACTOR,RANK:FACTOR,...' with FACTOR >= 1",
         "Emulated straggler: a rank's compute takes FACTOR times as long (the extra is slept)."),
    Knob("emulate_sample_delay", {}, _per_rank(0.0), "'*:SECONDS,RANK:SECONDS,...' with SECONDS >= 0",
         "Emulated straggler: extra sleep per sample of the rank's batch."),
    Knob("emulate_jitter", {}, _per_rank(0.0), "'*:J,RANK:J,...' with J >= 0",
         "Emulated noise: each step's emulated sleep is scaled by a factor drawn in [1 - J, 1 + J].",
         doc="The factor is drawn uniformly in [1 - J, 1 + J] (at least 0)."),
    Knob("emulate_vary_period", 0.0, _float(0.0), "number >= 0 (seconds; 0: off)",
         "Emulated non-dedicated machines: every this many seconds each rank redraws its speed."),
    Knob("emulate_vary_factor", {}, _per_rank(1.0), "'*:FACTOR,RANK:FACTOR,...' with FACTOR >= 1",
         "Emulated non-dedicated machines: the emulated sleep is scaled by a factor redrawn in [1, FACTOR].",
         doc="The factor is redrawn uniformly in [1, FACTOR] every HVD_ELASTIC_EMULATE_VARY_PERIOD seconds (seeded "
             "by rank: reproducible)."),
    Knob("stall_timeout", 120.0, _float(0.0, exclusive=True), "number > 0 (seconds)",
         "After this long without progress of any rank, every rank names the stopped ones and the job exits.",
         doc="Progress: a completed training step, or the end of finish(); only a rank waiting inside the plugin "
             "(a step, finish(), a collective of the script's own) is judged, never one running the script's own "
             "code. Every live rank prints one line naming the rank(s) that stopped and where (hvd_elastic/stall.py) "
             "and the job exits non-zero; a rank whose heartbeat connection closes mid-training is named at once. "
             "Must exceed the longest step and any pause of some ranks while the others wait for them (an "
             "evaluation or a checkpoint on rank 0 only)."),
    Knob("report", True, _bool, "0|1",
         "Rank 0 prints the per-rank time breakdown at the end of the run."),
    Knob("report_json", "", _text, "a file path, or empty",
         "Rank 0 also writes the end-of-run report as JSON to this path."),
)
KNOBS_BY_NAME = {k.name: k for k in KNOBS}


class _ConfigMethods:
    """The methods of :class:`Config` (its fields are generated from KNOBS below)."""

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides) -> "Config":
        """Parse the environment (default ``os.environ``) and keyword overrides; raise ConfigError on bad input."""
        return parse_settings(raw_settings(environ, overrides))

    @property
    def spec(self) -> registry.Policy:
        """What the configured policy is (hvd_elastic/registry.py): ask it, never the policy's name."""
        return registry.policy(self.policy)

    def per_rank(self, name: str, rank: int, size: int, default: Optional[float] = None) -> float:
        """Value of a per-rank knob (emulate_delay / emulate_slowdown / ...) for `rank`; checks ranks exist."""
        spec = getattr(self, name)
        knob = KNOBS_BY_NAME[name]
        for key in spec:
            if key != "*" and key >= size:
                raise ConfigError(f"{knob.variable} names rank {key} but the job has {size} ranks (0..{size - 1})")
        if default is None:
            default = 1.0 if name in ("emulate_slowdown", "emulate_vary_factor") else 0.0
        return spec.get(rank, spec.get("*", default))

    def describe(self) -> Dict[str, Any]:
        """JSON-friendly view of the effective settings."""
        out = {}
        for k in KNOBS:
            v = getattr(self, k.name)
            out[k.name] = {str(kk): vv for kk, vv in v.items()} if isinstance(v, Mapping) else v
        return out


def _field(knob: Knob):
    """(name, type, default) of the Config field of `knob`; a mutable default is copied for each Config."""
    if isinstance(knob.default, (dict, list, set)):
        return knob.name, Any, dataclasses.field(default_factory=functools.partial(copy.deepcopy, knob.default))
    return knob.name, Any, knob.default


# The settings of a run, frozen: one field per Knob in KNOBS, same name and default (cfg.policy, cfg.staleness, ...),
# so that each default is written once, in KNOBS.
Config = dataclasses.make_dataclass(
    "Config", [_field(k) for k in KNOBS], bases=(_ConfigMethods,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "The settings of a run (Config.from_env()): one field per Knob."})


def raw_settings(environ: Optional[Mapping[str, str]] = None, overrides: Optional[Mapping[str, Any]] = None) -> Dict:
    """Collect the settings as given, without validating (never raises): {name: [source, raw]}.

    Ranks exchange this before validation, so that ranks given different settings are told so rather than
    failing on different errors (or one failing while the others wait for it)."""
    environ = os.environ if environ is None else environ
    raw: Dict[str, list] = {}
    for var, val in sorted(environ.items()):
        if var.startswith(PREFIX) and var[len(PREFIX):] not in TOOLING_VARIABLES:
            raw[var[len(PREFIX):].lower()] = ["env", str(val)]
    for name, val in sorted((overrides or {}).items()):
        if val is None:
            continue
        raw[name] = ["kwarg", val if isinstance(val, (str, int, float, bool)) else json.dumps(val, default=str)]
    return raw


def _where(knob_name: str, source: str) -> str:
    knob = KNOBS_BY_NAME.get(knob_name)
    if source == "kwarg":
        return f"keyword argument {knob_name}"
    return knob.variable if knob else PREFIX + knob_name.upper()


def parse_settings(raw: Mapping[str, list]) -> Config:
    """Validate raw settings into a Config; every problem is a one-line ConfigError."""
    values: Dict[str, Any] = {}
    for name, (source, value) in raw.items():
        knob = KNOBS_BY_NAME.get(name)
        if knob is None:
            known = ", ".join(k.variable if source == "env" else k.name for k in KNOBS)
            raise ConfigError(f"unknown setting {_where(name, source)}; accepted: {known}")
        if isinstance(value, bool) and knob.parse is not _bool:
            value = str(int(value))
        try:
            values[name] = knob.parse(value if isinstance(value, str) else str(value), knob)
        except (ValueError, TypeError):
            raise ConfigError(f"{_where(name, source)}={value!r} is not valid; accepted: {knob.accepted}") from None
    cfg = Config(**values)
    presets = dict(registry.policy(cfg.policy).presets)
    if presets:
        cfg = dataclasses.replace(cfg, **presets)
    if cfg.dssp_upper < cfg.dssp_lower:
        src = raw.get("dssp_upper", ["env"])[0]
        raise ConfigError(f"{_where('dssp_upper', src)}={cfg.dssp_upper} is below HVD_ELASTIC_DSSP_LOWER="
                          f"{cfg.dssp_lower}; accepted: {KNOBS_BY_NAME['dssp_upper'].accepted}")
    return cfg


def unused_settings(raw: Mapping[str, list], cfg: Config) -> list:
    """Names of knobs that were set but that the chosen policy does not read (worth a warning, not an error)."""
    spec = registry.policy(cfg.policy)
    return [_where(name, raw[name][0]) for name in raw if name in KNOBS_BY_NAME and not spec.reads_under(name, cfg)]


def elastic_policies(frontend: str) -> tuple:
    """The policies that run under elastic Horovod on `frontend` (the registry's elastic entry)."""
    return tuple(name for name in POLICIES if frontend in registry.policy(name).elastic)


def load(policy_kwargs: Mapping[str, Any], allgather_object: Callable[[Any], list], rank: int,
         frontend: str) -> Config:
    """Start-up of a frontend: compare the ranks' raw settings (collective), parse them, refuse a policy the frontend
    cannot run, and warn (rank 0) about knobs the policy does not read. Every problem is a one-line ConfigError.

    Under elastic Horovod nothing here is collective (a worker that joins builds its optimizer before the others
    reach it, as with Horovod's own DistributedOptimizer), only the registry's elastic policies are accepted, and rank
    0 says what it knows of Horovod's response cache (horovod_env.cache_line: a warning under a tick policy while the
    cache is on)."""
    install_excepthook()
    raw = raw_settings(None, policy_kwargs)
    elastic = horovod_env.horovod_elastic()
    if not elastic:
        check_ranks_agree(raw, allgather_object)
    cfg = parse_settings(raw)
    src = _where("policy", raw.get("policy", ["env"])[0])
    spec = registry.policy(cfg.policy)
    if frontend not in spec.frontends:
        raise ConfigError(f"{src}={cfg.policy!r} is not available for {frontend} yet; "
                          f"available: {'|'.join(registry.available(frontend))}")
    if elastic and frontend not in spec.elastic:
        raise ConfigError(f"{src}={cfg.policy!r} does not support elastic Horovod (HOROVOD_ELASTIC=1, horovodrun "
                          f"--elastic) on {frontend}; elastic jobs there run policy "
                          f"{'|'.join(elastic_policies(frontend))}")
    cache_line = horovod_env.cache_line(spec.ticks) if elastic and rank == 0 else ""
    if cache_line:
        print(cache_line, flush=True)
    unused = unused_settings(raw, cfg)
    if unused and rank == 0:
        print(f"hvd_elastic: warning: policy {cfg.policy} does not use {', '.join(unused)}", flush=True)
    return cfg


def check_ranks_agree(raw: Mapping[str, list], allgather_object: Callable[[Any], list]) -> None:
    """Collective: every rank calls it; raises ConfigError on every rank if the ranks' settings differ.

    Per-run outputs (report_json) may differ between ranks; everything else must match."""
    mine = {k: v[1] for k, v in raw.items() if k != "report_json"}
    everyone = allgather_object(mine)
    if all(s == everyone[0] for s in everyone):
        return
    names = sorted({k for s in everyone for k in s})
    diffs = []
    for name in names:
        seen: Dict[str, list] = {}
        for rank, s in enumerate(everyone):
            seen.setdefault(repr(s.get(name, "<unset>")), []).append(rank)
        if len(seen) > 1:
            parts = "; ".join(f"ranks {','.join(map(str, r))}: {v}" for v, r in seen.items())
            diffs.append(f"{PREFIX + name.upper()} differs across ranks ({parts})")
    raise ConfigError(" | ".join(diffs))
