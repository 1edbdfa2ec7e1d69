"""Horovod compatibility (docs/horovod-compat.md): the properties Horovod's own test_torch.py optimizer tests check,
under bsp and the relaxed policies, with the swap by assignment ``hvd.DistributedOptimizer =
hvde.DistributedOptimizer``: asp stands for the gradient policies without barriers (ssp and dssp take the same
frontend and engine path, plus a staleness gate: tests/test_engine.py), zipline for barriers (no collective of the
script's own mid-training), wbsp for deltas.

One 2-rank job per launcher runs every check under two policies, one after the other in one process
(tests/workers/compat_torch.py lists the checks): several live optimizers, broadcast_optimizer_state and a checkpoint
resumed mid-training, a parameter without gradient on one rank, Horovod's named_parameters errors and default names,
clipping between synchronize() and step() and Horovod's warning, backward_passes_per_step, sparse gradients, a
refused argument, and optimizers the script never finishes: bsp's is left alone at exit, the last relaxed policy's
is finished at exit with one line naming finish(), exit status 0.
"""
import re

import pytest

from launch import launch

# Gloo for one relaxed policy (slower ticks), MPI for the rest; the last policy of a job leaves its optimizer for
# the exit handler.
JOBS = {"horovodrun": ("bsp", "asp"), "mpirun": ("zipline", "wbsp")}
CHECKS = ("two_optimizers", "wbsp_second_optimizer_while_first_lives", "broadcast_state_and_checkpoint",
          "force_allreduce", "named_parameters", "clipping_and_synchronize_warning", "backward_passes_per_step",
          "sparse_gradients", "refused_arguments")
BOUND_S = 150


@pytest.mark.parametrize("launcher", sorted(JOBS))
def test_horovod_optimizer_properties(launcher):
    policies = JOBS[launcher]
    res = launch(launcher, 2, "tests/workers/compat_torch.py", ["--policies", ",".join(policies)], timeout=BOUND_S)
    out = res.output
    assert not res.timed_out, "hang:\n" + out[-4000:]
    assert res.returncode == 0, out[-4000:]
    for policy in policies:
        for check in CHECKS:
            assert res.lines_with(f"check {policy} {check}: ok"), (policy, check, out[-4000:])
    assert res.lines_with("end of script"), out[-3000:]
    # Every rank says it once, in one line, for the one relaxed optimizer left (bsp's is Horovod's own: nothing to
    # finish), and the exit is clean.
    at_exit = [ln for ln in res.rank_lines() if "without hvd_elastic.torch.finish(opt)" in ln]
    assert len(at_exit) == 2 and all(f"policy {policies[-1]}" in ln and "finishing 1 optimizer(s)" in ln
                                     for ln in at_exit), out[-3000:]
    assert "Horovod has been shut down" not in out and "Traceback" not in out, out[-4000:]
    assert not re.search(r"RecursionError|same name as another tensor", out), out[-3000:]


def test_a_script_that_raises_leaves_its_relaxed_optimizer_unfinished_with_one_line():
    res = launch("mpirun", 2, "tests/workers/compat_torch.py", ["none"],
                 env={"HVD_ELASTIC_POLICY": "asp", "COMPAT_RAISE_AT_END": "1"}, timeout=BOUND_S)
    assert not res.timed_out, res.output[-3000:]
    assert res.returncode != 0
    lines = [ln for ln in res.rank_lines() if "ended with RuntimeError before finish(opt)" in ln]
    # The rank that raised says so; a rank still training then loses its peer (Horovod shuts down: its own line).
    assert len(lines) >= 1, res.output[-3000:]


def test_keras_accepts_horovod_arguments_under_bsp_and_refuses_them_elsewhere():
    res = launch("mpirun", 2, "tests/workers/compat_keras.py", timeout=BOUND_S)
    assert not res.timed_out and res.returncode == 0, res.output[-4000:]
    assert res.lines_with("compat keras: ok"), res.output[-3000:]
