"""Invariant 1: bsp through the plugin equals plain Horovod (same weights after k steps), under both launchers."""
import json
import os

import numpy as np
import pytest

from launch import LAUNCHERS, launch


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_bsp_gives_the_same_weights_as_horovod_distributed_optimizer(launcher, tmp_path):
    res = launch(launcher, 2, "tests/workers/bsp_equivalence.py", [tmp_path], timeout=180)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(2)]
    for r in ranks:
        w_hvd, w_plugin, w_init = (np.asarray(r[k]) for k in ("w_hvd", "w_plugin", "w_init"))
        assert np.abs(w_hvd - w_init).max() > 1e-3, "training did not move the weights"
        np.testing.assert_allclose(w_plugin, w_hvd, rtol=0, atol=1e-6)
        assert r["report_steps"] == [12, 12]
    # Replica consistency under bsp: both ranks end bit-identical.
    assert ranks[0]["w_plugin"] == ranks[1]["w_plugin"]
