"""CPU guard for a defect class that only a GPU shows (docs/design.md, "CUDA"): no tensor that requires grad may reach
one of horovod.torch's collectives as its output. Horovod without GPU collectives copies each result back into a
CUDA tensor with autograd on, so such a call aborts the process on a GPU host and writes raw memory on the CPU.

tests/guards/sitecustomize.py enforces it in every job the tests launch (tests/launch.py), so every multi-rank test
of every policy (tests/test_user_collectives.py runs each one, with helpers such as broadcast_optimizer_state) fails
on such a call. This module checks that the guard is in force in launched jobs and tells the two cases apart.
"""
from launch import launch


def test_the_guard_refuses_a_parameter_handed_to_an_inplace_broadcast():
    res = launch("mpirun", 2, "tests/workers/guard_probe.py", timeout=60)
    assert res.returncode != 0 and not res.timed_out, res.output[-2000:]
    assert res.lines_with("test guard: a tensor that requires grad"), res.output[-2000:]
    assert "broadcast done" not in res.output, res.output[-2000:]


def test_the_guard_lets_a_detached_parameter_through():
    res = launch("mpirun", 2, "tests/workers/guard_probe.py", ["--detached"], timeout=60)
    assert res.returncode == 0, res.output[-2000:]
    assert res.output.count("broadcast done") == 2, res.output[-2000:]   # mpirun may join the two lines
