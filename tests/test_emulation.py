"""Emulated heterogeneity (hvd_elastic.emulation.Straggler): the noise knobs the benchmarks' profiles use."""
import time

import numpy as np
import pytest

from hvd_elastic.config import Config
from hvd_elastic.emulation import Straggler


def test_jitter_stays_in_its_band_and_is_reproducible_by_rank():
    a = [Straggler(jitter=0.3, seed=1).factor() for _ in range(1)]
    s1, s2, other = Straggler(jitter=0.3, seed=1), Straggler(jitter=0.3, seed=1), Straggler(jitter=0.3, seed=2)
    f1 = np.array([s1.factor() for _ in range(500)])
    assert f1.min() >= 0.7 and f1.max() <= 1.3 and f1.std() > 0.1
    assert list(f1[:20]) == [s2.factor() for _ in range(20)]
    assert list(f1[:20]) != [other.factor() for _ in range(20)]
    assert a[0] == f1[0]


def test_non_dedicated_factor_is_constant_within_a_period_and_redrawn_after():
    s = Straggler(vary_period_s=0.05, vary_factor=4.0, seed=3)
    first = [s.factor() for _ in range(5)]
    assert len(set(first)) == 1 and 1.0 <= first[0] <= 4.0
    seen = set(first)
    for _ in range(6):
        time.sleep(0.06)
        seen.add(s.factor())
    assert len(seen) >= 4 and all(1.0 <= f <= 4.0 for f in seen)


def test_pause_scales_the_emulated_extra_and_config_reads_the_knobs():
    cfg = Config.from_env({"HVD_ELASTIC_EMULATE_DELAY": "*:0.001", "HVD_ELASTIC_EMULATE_JITTER": "3:0.5",
                           "HVD_ELASTIC_EMULATE_VARY_PERIOD": "2", "HVD_ELASTIC_EMULATE_VARY_FACTOR": "*:2,1:3"})
    s0, s3 = Straggler.from_config(cfg, 0, 4), Straggler.from_config(cfg, 3, 4)
    assert (s0.jitter, s3.jitter, s0.vary_factor, Straggler.from_config(cfg, 1, 4).vary_factor) == (0, 0.5, 2, 3)
    slept = s0.pause(0.0)
    assert 0.001 <= slept <= 0.002
    assert Straggler(jitter=0.5).pause(0.0) == 0.0          # no extra configured: nothing to scale
    with pytest.raises(Exception, match="HVD_ELASTIC_EMULATE_VARY_FACTOR='\\*:0.5' is not valid"):
        Config.from_env({"HVD_ELASTIC_EMULATE_VARY_FACTOR": "*:0.5"})
