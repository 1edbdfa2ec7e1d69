"""LB-BSP batch sizing: CPU mode (proportional apportionment under caps) and the GPU-mode step controller."""
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N


def water_filled_target(v, batch, caps):
    """Continuous target x_p = clamp(lam * v_p, 1, cap_p) with sum x_p = B, by bisection on lam (test oracle)."""
    lo, hi = 0.0, 1.0
    while sum(min(max(hi * x, 1.0), c) for x, c in zip(v, caps)) < batch:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(min(max(mid * x, 1.0), c) for x, c in zip(v, caps)) < batch:
            lo = mid
        else:
            hi = mid
    return [min(max(hi * x, 1.0), c) for x, c in zip(v, caps)]


@st.composite
def cpu_cases(draw):
    n = draw(st.integers(1, 12))
    v = draw(st.lists(st.floats(1e-3, 1e3), min_size=n, max_size=n))
    batch = draw(st.integers(n, 2000))
    if draw(st.booleans()):
        caps = draw(st.lists(st.integers(1, 600), min_size=n, max_size=n))
        assume(sum(caps) >= batch)
    else:
        caps = None
    return v, batch, caps


@settings(max_examples=300, deadline=None)
@given(cpu_cases())
def test_lbbsp_cpu_sizes_sum_to_global_batch_and_respect_caps(case):
    v, batch, caps = case
    sizes = N.lbbsp_batch_sizes_cpu(v, batch, caps)
    assert sum(sizes) == batch
    assert all(1 <= b <= (c if caps else batch) for b, c in zip(sizes, caps or [batch] * len(v)))


@settings(max_examples=300, deadline=None)
@given(cpu_cases())
def test_lbbsp_cpu_sizes_are_within_one_sample_of_the_proportional_target(case):
    v, batch, caps = case
    sizes = N.lbbsp_batch_sizes_cpu(v, batch, caps)
    target = water_filled_target(v, batch, caps or [batch] * len(v))
    for b, x in zip(sizes, target):
        assert abs(b - x) < 1 + 1e-6


def test_lbbsp_cpu_sizes_are_proportional_to_throughput():
    assert N.lbbsp_batch_sizes_cpu([1.0, 2.0, 5.0], 80) == [10, 20, 50]
    # Largest remainders: 100 * [1, 1, 1] / 3 = 33.33 each; the extra sample goes to the lowest rank.
    assert N.lbbsp_batch_sizes_cpu([1.0, 1.0, 1.0], 100) == [34, 33, 33]


def test_lbbsp_cpu_caps_move_the_excess_to_the_others():
    # Worker 2 would get 50 of 80 but is capped at 30: the other 50 split 1:2 between workers 0 and 1.
    sizes = N.lbbsp_batch_sizes_cpu([1.0, 2.0, 5.0], 80, [100, 100, 30])
    assert sizes[2] == 30 and sum(sizes) == 80 and sizes[1] in (33, 34)


def test_lbbsp_cpu_every_worker_keeps_at_least_one_sample():
    # 9 samples left for two equal workers: 4.5 each, the tie goes to the lower rank.
    assert N.lbbsp_batch_sizes_cpu([1e-9, 1.0, 1.0], 10) == [1, 5, 4]
    assert N.lbbsp_batch_sizes_cpu([1.0] * 4, 4) == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "args, message",
    [
        (([], 10), "must not be empty"),
        (([1.0, 1.0], 1), "smaller than the number of workers"),
        (([1.0, 0.0], 10), "> 0"),
        (([1.0, -1.0], 10), "> 0"),
        (([1.0, math.nan], 10), "finite"),
        (([1.0, math.inf], 10), "finite"),
        (([1.0, 1.0], 10, [5]), "mismatched lengths"),
        (([1.0, 1.0], 10, [4, 5]), "cannot fit"),
        (([1.0, 1.0], 10, [0, 50]), "caps\\[0\\] must be >= 1"),
    ],
)
def test_bad_cpu_inputs_raise_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        N.lbbsp_batch_sizes_cpu(*args)


@settings(max_examples=300, deadline=None)
@given(cpu_cases(), st.floats(0.0, 0.5), st.randoms(use_true_random=False))
def test_lbbsp_resize_cpu_keeps_sizes_exactly_while_finish_times_are_within_the_tolerance(case, tolerance, rnd):
    v, batch, caps = case
    # Any valid current split: the proportional one for shuffled speeds.
    current = N.lbbsp_batch_sizes_cpu(rnd.sample(v, len(v)), batch, caps)
    out = N.lbbsp_resize_cpu(v, current, batch, caps, tolerance)
    times = [b / x for b, x in zip(current, v)]
    balanced = max(times) - min(times) <= tolerance * max(times)
    assert out == (current if balanced else N.lbbsp_batch_sizes_cpu(v, batch, caps))


def test_lbbsp_resize_cpu_ignores_noise_between_equal_workers_and_follows_a_real_straggler():
    even = [64, 64, 64, 64]
    noisy = [1.0, 1.02, 0.98, 1.01]          # equal workers measured with a few percent of noise (times: 3.9% apart)
    assert N.lbbsp_resize_cpu(noisy, even, 256) == even
    assert N.lbbsp_resize_cpu(noisy, even, 256, tolerance=0.0) != even   # without the band it would re-size
    assert N.lbbsp_resize_cpu([1.0, 1.0, 1.0, 1 / 3], even, 256) == [77, 77, 77, 25]
    # A split that is off by a few samples among equal workers is still corrected (times differ by > 5%).
    assert N.lbbsp_resize_cpu([1.0] * 4, [80, 70, 70, 36], 256) == even


@pytest.mark.parametrize(
    "args, message",
    [
        (([1.0, 1.0], [5, 5], 10, None, 1.0), "tolerance must be in"),
        (([1.0, 1.0], [5, 5], 10, None, -0.1), "tolerance must be in"),
        (([1.0, 1.0], [5, 5], 10, None, math.nan), "tolerance must be in"),
        (([1.0, 1.0], [5, 4], 10, None, 0.05), "sum to 9"),
        (([1.0, 1.0], [10, 0], 10, None, 0.05), "current\\[1\\] = 0"),
        (([1.0, 1.0], [7, 3], 10, [6, 6], 0.05), "current\\[0\\] = 7"),
        (([1.0, 1.0], [10], 10, None, 0.05), "mismatched lengths"),
        (([1.0, 0.0], [5, 5], 10, None, 0.05), "> 0"),
    ],
)
def test_bad_resize_inputs_raise_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        N.lbbsp_resize_cpu(*args)


def step_times(sizes, per_sample, overhead, power=1.0):
    """A GPU-ish model: time grows super-linearly with the batch at different per-sample costs."""
    return [int(o + a * b**power) for b, a, o in zip(sizes, per_sample, overhead)]


@st.composite
def gpu_cases(draw):
    n = draw(st.integers(2, 8))
    per_sample = draw(st.lists(st.floats(1e4, 1e5), min_size=n, max_size=n))
    overhead = draw(st.lists(st.floats(0, 1e6), min_size=n, max_size=n))
    batch = draw(st.integers(4 * n, 1024))
    caps = draw(st.lists(st.integers(batch // n + 1, batch), min_size=n, max_size=n))
    return per_sample, overhead, batch, caps, draw(st.floats(1.0, 1.3))


@settings(max_examples=100, deadline=None)
@given(gpu_cases())
def test_lbbsp_gpu_sizes_always_sum_to_global_batch_and_respect_caps(case):
    per_sample, overhead, batch, caps, power = case
    ctl = N.LbbspGpuController(batch, caps, tolerance=0.05)
    for _ in range(300):
        sizes = ctl.update(step_times(ctl.sizes, per_sample, overhead, power))
        assert sum(sizes) == batch
        assert all(1 <= b <= c for b, c in zip(sizes, ctl.caps))
        assert ctl.step >= 1


def test_lbbsp_gpu_converges_to_equal_finish_times():
    per_sample = [1e5, 2e5, 4e5]  # worker 0 is 4x as fast as worker 2
    ctl = N.LbbspGpuController(700, [700, 700, 700], step=64, tolerance=0.05)
    for _ in range(200):
        ctl.update(step_times(ctl.sizes, per_sample, [0, 0, 0]))
        if ctl.converged:
            break
    assert ctl.converged
    t = step_times(ctl.sizes, per_sample, [0, 0, 0])
    assert max(t) - min(t) <= 0.05 * max(t)
    assert ctl.sizes[0] > ctl.sizes[1] > ctl.sizes[2]


def test_lbbsp_gpu_halves_the_step_when_the_direction_reverses():
    ctl = N.LbbspGpuController(200, [200, 200], step=80, tolerance=0.0, window=2)
    ctl.update([2_000_000, 1_000_000])  # worker 0 straggles: 80 samples to worker 1
    assert ctl.sizes == [20, 180] and ctl.last_move.from_worker == 0 and ctl.step == 80
    ctl.update([100_000, 1_800_000])  # overshoot: worker 1 now straggles; step 80 -> 40, window 2 -> 4
    assert ctl.last_move.reversed and ctl.step == 40 and ctl.window == 4 and ctl.sizes == [60, 140]


def test_lbbsp_gpu_moves_only_to_a_worker_with_headroom():
    ctl = N.LbbspGpuController(30, [10, 20, 20], step=5, tolerance=0.0, sizes=[10, 10, 10])
    ctl.update([1, 5, 9])  # fastest is worker 0 but it is at its cap: worker 1 takes the samples
    assert ctl.last_move.to_worker == 1 and ctl.sizes == [10, 15, 5]


def test_lbbsp_gpu_never_empties_a_worker():
    ctl = N.LbbspGpuController(4, [4, 4], step=100, tolerance=0.0)
    for _ in range(5):
        ctl.update([10, 1])
    assert ctl.sizes == [1, 3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=10, caps=[]), "caps must not be empty"),
        (dict(batch_size=1, caps=[5, 5]), "smaller than the number of workers"),
        (dict(batch_size=10, caps=[4, 5]), "cannot fit"),
        (dict(batch_size=10, caps=[5, 5], tolerance=math.nan), "tolerance"),
        (dict(batch_size=10, caps=[5, 5], tolerance=1.0), "tolerance"),
        (dict(batch_size=10, caps=[5, 5], window=0), "window"),
        (dict(batch_size=10, caps=[10, 10], sizes=[5, 4]), "sum to 9"),
        (dict(batch_size=10, caps=[10, 10], sizes=[10, 0]), "sizes\\[1\\]"),
        (dict(batch_size=10, caps=[10, 10], sizes=[5, 5, 0]), "mismatched lengths"),
    ],
)
def test_bad_gpu_controller_inputs_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        N.LbbspGpuController(**kwargs)


def test_bad_step_times_raise_value_error():
    ctl = N.LbbspGpuController(10, [10, 10])
    with pytest.raises(ValueError, match="mismatched lengths"):
        ctl.update([1, 2, 3])
    with pytest.raises(ValueError, match=">= 0"):
        ctl.update([1, -2])
    assert sum(ctl.sizes) == 10
