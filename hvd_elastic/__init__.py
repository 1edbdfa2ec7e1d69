"""hvd-elastic: free Horovod jobs from their slowest worker.

Policies (``HVD_ELASTIC_POLICY``): bsp (Horovod's behaviour, the default), asp, ssp, dssp, zipline (ElasticBSP),
lbbsp, wbsp. Frontends: :mod:`hvd_elastic.torch`, :mod:`hvd_elastic.keras` (``model.fit``) and
:mod:`hvd_elastic.tensorflow` (custom loops). The decision rules live in the native scheduler,
:mod:`hvd_elastic._native` (C++17). See README.md.
"""
from .config import KNOBS, POLICIES, Config
from .errors import ConfigError, HvdElasticError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "HvdElasticError", "KNOBS", "POLICIES", "__version__"]
