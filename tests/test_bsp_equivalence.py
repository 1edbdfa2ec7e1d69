"""Invariant 1 (docs/design.md, "Invariants"): bsp through the plugin equals plain Horovod (same weights after k
steps). The plugin's bsp is Horovod's own optimizer, so the launcher (MPI or Gloo collectives) is the same on both
sides of the comparison: one launcher here; bsp under horovodrun runs in tests/test_faults.py,
test_synthetic_examples.py and test_elastic.py."""
import json
import os

import numpy as np

from launch import launch


def test_bsp_gives_the_same_weights_as_horovod_distributed_optimizer(tmp_path):
    res = launch("mpirun", 2, "tests/workers/bsp_equivalence.py", [tmp_path], timeout=180)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(2)]
    for r in ranks:
        w_hvd, w_plugin, w_init = (np.asarray(r[k]) for k in ("w_hvd", "w_plugin", "w_init"))
        assert np.abs(w_hvd - w_init).max() > 1e-3, "training did not move the weights"
        np.testing.assert_allclose(w_plugin, w_hvd, rtol=0, atol=1e-6)
        assert r["report_steps"] == [12, 12]
    # Replica consistency under bsp: both ranks end bit-identical.
    assert ranks[0]["w_plugin"] == ranks[1]["w_plugin"]


def test_lbbsp_at_equal_sizes_gives_horovods_weights_bit_for_bit(tmp_path):
    """lbbsp with every rank at the same batch size (a tolerance that never re-sizes) trains exactly the model plain
    Horovod trains on torch's DistributedSampler with the same seed: LbbspSampler deals each global batch to the
    ranks as that sampler splits it, and b_p-weighted sums divided by B equal Horovod's average to the last bit
    (scaling by powers of two is exact). 4 ranks, so the reduction's order matters too; two epochs."""
    env = {"HVD_ELASTIC_LBBSP_TOLERANCE": "0.99"}
    res = launch("mpirun", 4, "tests/workers/lbbsp_equivalence.py", [tmp_path], env=env, timeout=240)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    ranks = [json.load(open(os.path.join(tmp_path, f"rank{r}.json"))) for r in range(4)]
    for r in ranks:
        assert r["moved"] > 1e-2, "training did not move the weights"
        assert r["counters"]["lbbsp_resizes"] == 0 and r["counters"]["lbbsp_sizes"] == [16] * 4, r["counters"]
        assert r["w_lbbsp"] == r["w_hvd"], (r["rank"], "lbbsp's weights differ from Horovod's")
    assert len({r["w_lbbsp"] for r in ranks}) == 1
