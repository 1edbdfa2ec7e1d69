"""hvd-elastic: free Horovod jobs from their slowest worker.

Policies (``HVD_ELASTIC_POLICY``): bsp (Horovod's behaviour, the default), asp, ssp, dssp, zipline (ElasticBSP),
lbbsp, wbsp. Frontends: :mod:`hvd_elastic.torch`, :mod:`hvd_elastic.keras` (``model.fit``) and
:mod:`hvd_elastic.tensorflow` (custom loops). The decision rules live in the native scheduler,
:mod:`hvd_elastic._native` (C++17). See README.md.

Importing it in a worker of an elastic Horovod job under a tick policy turns Horovod's response cache off unless the
job sets it (:mod:`hvd_elastic.horovod_env`).
"""
from .config import KNOBS, POLICIES, Config
from .errors import ConfigError, HvdElasticError
from .horovod_env import default_cache_off

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "HvdElasticError", "KNOBS", "POLICIES", "__version__"]

default_cache_off()
