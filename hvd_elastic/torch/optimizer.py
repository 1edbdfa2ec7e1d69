"""PyTorch frontend: builds the optimizer for the configured policy and instruments it.

bsp: the optimizer *is* Horovod's ``horovod.torch.DistributedOptimizer`` (same arguments, same arithmetic); the
plugin only times it (compute vs time blocked in the gradient allreduce) and injects emulated straggler delay.
"""
from __future__ import annotations

import contextlib
import time
import types
from typing import Any, Dict

import horovod.torch as hvd

from .. import config as _config
from ..emulation import Straggler
from ..errors import ConfigError, install_excepthook
from ..telemetry import Telemetry, finish_report

# Policies this frontend can run; the others are recognised by the configuration but not built yet.
IMPLEMENTED_POLICIES = ("bsp",)


class _Session:
    """Per-optimizer state of the plugin: configuration, telemetry, emulation, end-of-run report."""

    def __init__(self, cfg: _config.Config):
        self.cfg = cfg
        self.rank, self.size = hvd.rank(), hvd.size()
        self.telemetry = Telemetry(self.rank, self.size, cfg.policy)
        self.straggler = Straggler.from_config(cfg, self.rank, self.size)
        self.last_step_end = time.perf_counter()
        self.report = None

    def finish(self) -> Dict[str, Any]:
        """Collective: end-of-run report (idempotent)."""
        if self.report is None:
            self.report = finish_report(self.telemetry, hvd.allgather_object, self.cfg.describe(),
                                        print_on_rank0=self.cfg.report, json_path=self.cfg.report_json)
        return self.report


def _load_config(policy_kwargs: Dict[str, Any]) -> _config.Config:
    install_excepthook()
    raw = _config.raw_settings(None, policy_kwargs)
    _config.check_ranks_agree(raw, hvd.allgather_object)
    cfg = _config.parse_settings(raw)
    unused = _config.unused_settings(raw, cfg)
    if unused and hvd.rank() == 0:
        print(f"hvd_elastic: warning: policy {cfg.policy} does not use {', '.join(unused)}", flush=True)
    if cfg.policy not in IMPLEMENTED_POLICIES:
        src = "keyword argument policy" if raw.get("policy", ["env"])[0] == "kwarg" else "HVD_ELASTIC_POLICY"
        raise ConfigError(f"{src}={cfg.policy!r} is recognised but not implemented yet for PyTorch in this "
                          f"version; available: {'|'.join(IMPLEMENTED_POLICIES)}")
    return cfg


def _instrument_bsp(opt, session: _Session):
    """Wrap Horovod's optimizer instance: time compute, inject emulated delay, time the blocking synchronize."""
    hvd_step, hvd_synchronize = opt.step, opt.synchronize
    state = {"blocked": 0.0}

    def synchronize(self):
        t0 = time.perf_counter()
        hvd_synchronize()
        state["blocked"] += time.perf_counter() - t0

    def step(self, closure=None):
        t_call = time.perf_counter()
        compute = t_call - session.last_step_end
        slept = session.straggler.pause(compute)
        session.telemetry.emulated_s += slept
        state["blocked"] = 0.0
        t_before = time.perf_counter()
        out = hvd_step(closure)
        t_end = time.perf_counter()
        blocked = state["blocked"]
        # Applying the update is computation; the blocking wait inside synchronize() is not.
        session.telemetry.add_step(compute + slept + (t_end - t_before - blocked), blocked)
        session.last_step_end = t_end
        return out

    opt.synchronize = types.MethodType(synchronize, opt)
    opt.step = types.MethodType(step, opt)
    return opt


def DistributedOptimizer(optimizer, named_parameters=None, compression=hvd.Compression.none,
                         backward_passes_per_step=1, op=hvd.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=hvd.global_process_set,
                         **policy_kwargs):
    """A drop-in for ``horovod.torch.DistributedOptimizer`` that runs under the configured policy.

    Takes Horovod's arguments unchanged; any hvd-elastic knob may be passed as a keyword (``policy="bsp"``,
    ``staleness=3``, ...) and wins over its ``HVD_ELASTIC_*`` variable. Collective: call it on every rank.
    Raises ConfigError (one line, on every rank) for bad settings or ranks that disagree.

    Example::

        opt = hvd_elastic.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                                     named_parameters=model.named_parameters())
    """
    cfg = _load_config(policy_kwargs)
    session = _Session(cfg)
    opt = hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters, compression=compression,
                                   backward_passes_per_step=backward_passes_per_step, op=op,
                                   gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                                   groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set)
    opt = _instrument_bsp(opt, session)
    opt._hvd_elastic = session
    opt.finish = session.finish
    return opt


def finish(optimizer) -> Dict[str, Any]:
    """Collective end of training: flush pending updates, leave all ranks with identical weights, and report.

    Returns the report (a dict) on every rank; rank 0 prints it unless HVD_ELASTIC_REPORT=0."""
    session = getattr(optimizer, "_hvd_elastic", None)
    if session is None:
        raise TypeError("finish() takes an optimizer made by hvd_elastic.torch.DistributedOptimizer")
    return session.finish()


@contextlib.contextmanager
def training(optimizer):
    """Context manager around the training loop: calls :func:`finish` when the loop ends normally."""
    yield optimizer
    finish(optimizer)
