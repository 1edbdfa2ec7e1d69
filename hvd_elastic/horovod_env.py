"""Horovod's environment as hvd_elastic reads it, and the one default hvd_elastic sets in it.

Elastic Horovod under a tick policy runs with Horovod's response cache off unless the job sets it: a worker lost
during a collective can abort a surviving rank in Gloo while the cache is on (docs/horovod-compat.md, "Elastic
Horovod"). Importing hvd_elastic sets ``HOROVOD_CACHE_CAPACITY=0`` when all of these hold: the process is a worker of
an elastic job (HOROVOD_ELASTIC=1), ``HVD_ELASTIC_POLICY`` names a policy that runs ticks, HOROVOD_CACHE_CAPACITY is
unset (``horovodrun --cache-capacity`` not given), and Horovod is not initialised yet in this process -- so every
worker, those that join later included, runs Horovod with the same setting from its first ``hvd.init()`` on.
Otherwise nothing is set, and the frontend's start-up warns where the cache stays on under a tick policy.
"""
from __future__ import annotations

import os
import re
import sys

from . import registry

CACHE_VARIABLE = "HOROVOD_CACHE_CAPACITY"
_SET_BY_US = {"cache": False}

ELASTIC_CACHE_WARNING = (
    "hvd_elastic: warning: elastic Horovod under a tick policy with Horovod's response cache on: a worker lost during "
    "a collective can abort a surviving rank in Gloo (pair.cc:510) and end the job; run horovodrun --cache-capacity 0, "
    "or choose the policy with HVD_ELASTIC_POLICY and import hvd_elastic before hvd.init() (docs/horovod-compat.md, "
    "\"Elastic Horovod\")")
ELASTIC_CACHE_NOTICE = (
    "hvd_elastic: elastic Horovod under a tick policy: Horovod's response cache is off (HOROVOD_CACHE_CAPACITY=0, "
    "hvd_elastic's default here; horovodrun --cache-capacity N keeps it on; docs/horovod-compat.md, \"Elastic Horovod\")")


def horovod_elastic() -> bool:
    """True in a worker of an elastic Horovod job (``horovodrun --elastic``: Horovod sets HOROVOD_ELASTIC=1), where
    ranks may leave and join between steps (``hvd.elastic.run``)."""
    return os.environ.get("HOROVOD_ELASTIC", "0").strip() not in ("", "0")


def horovod_cache_on() -> bool:
    """Horovod's response cache is on: HOROVOD_CACHE_CAPACITY (horovodrun --cache-capacity) unset or not 0, read as
    Horovod reads it (std::strtol into a uint32_t: no leading number is 0, off; a negative one wraps, on)."""
    value = os.environ.get(CACHE_VARIABLE)
    number = re.match(r"\s*[+-]?\d+", value or "")
    return value is None or (number is not None and int(number.group()) != 0)


def horovod_initialized() -> bool:
    """Horovod is initialised in this process, through a framework module already imported (none is imported here)."""
    for name in ("horovod.torch", "horovod.tensorflow"):
        is_initialized = getattr(sys.modules.get(name), "is_initialized", None)
        if is_initialized is not None and is_initialized():
            return True
    return False


def _env_policy_ticks() -> bool:
    name = os.environ.get("HVD_ELASTIC_POLICY", registry.DEFAULT).strip().lower()
    return name in registry.NAMES and registry.policy(name).ticks


def default_cache_off() -> bool:
    """At import: set HOROVOD_CACHE_CAPACITY=0 where the module docstring says so; True if it was set (now or
    earlier in this process)."""
    if (not _SET_BY_US["cache"] and horovod_elastic() and CACHE_VARIABLE not in os.environ and _env_policy_ticks()
            and not horovod_initialized()):
        os.environ[CACHE_VARIABLE] = "0"
        _SET_BY_US["cache"] = True
    return _SET_BY_US["cache"]


def cache_line(ticks: bool) -> str:
    """What rank 0 of an elastic job prints at start-up about Horovod's response cache ('' for nothing): the
    warning under a tick policy with the cache on, the notice where hvd_elastic turned it off."""
    if ticks and horovod_cache_on():
        return ELASTIC_CACHE_WARNING
    return ELASTIC_CACHE_NOTICE if _SET_BY_US["cache"] and os.environ.get(CACHE_VARIABLE) == "0" else ""
