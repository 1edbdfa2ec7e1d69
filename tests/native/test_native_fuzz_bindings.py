"""Fuzz every binding of hvd_elastic._native with random and malformed arguments (small budget).

The contract: bad input raises ValueError (a rule's check) or TypeError (an argument of the wrong type), never
anything else, and never crashes or hangs the process.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N

ints = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64]),
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, -0.0, 1e-300]))
int_lists = st.lists(ints, max_size=8)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=3))
grid_like = st.one_of(
    st.lists(int_lists, max_size=5),
    st.lists(st.lists(st.integers(0, 100), min_size=3, max_size=3), max_size=5),
    st.builds(lambda a: np.sort(np.asarray(a, dtype=np.int64), axis=-1) if len(a) else np.zeros((0, 2), np.int64),
              st.lists(st.lists(st.integers(-5, 100), min_size=2, max_size=2), max_size=4)),
    st.builds(lambda r, c: np.full((r, c), 1.5), st.integers(0, 3), st.integers(0, 3)),
    st.builds(lambda r: np.arange(r, dtype=np.int64), st.integers(0, 4)),
)
args_any = st.one_of(scalars, int_lists, st.lists(floats, max_size=6), st.lists(st.booleans(), max_size=6), grid_like)

FUNCTIONS = [
    (N.zipline_barrier, 1),
    (N.gridscan_barrier, 1),
    (N.fullgridscan_barrier, 1),
    (N.predict_push_times, 3),
    (N.zipline_barrier_from_intervals, 3),
    (N.predict_last_interval, 1),
    (N.predict_ewma_interval, 2),
    (N.predict_arx_interval, 1),
    (N.predict_arx_intervals, 2),
    (N.ssp_may_proceed, 3),
    (N.ssp_staleness, 2),
    (N.dssp_sync_controller, 5),
    (N.lbbsp_batch_sizes_cpu, 2),
    (N.lbbsp_batch_sizes_cpu, 3),
    (N.lbbsp_resize_cpu, 3),
    (N.lbbsp_resize_cpu, 5),
    (N.wbsp_may_download, 2),
]


def call_expecting_only_value_or_type_errors(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError):
        return None


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.sampled_from(FUNCTIONS), st.lists(args_any, min_size=5, max_size=5))
def test_functions_raise_only_value_or_type_errors_on_random_arguments(spec, pool):
    fn, arity = spec
    call_expecting_only_value_or_type_errors(fn, *pool[:arity])


@FUZZ
@given(st.lists(args_any, min_size=6, max_size=6))
def test_arx_options_raise_only_value_or_type_errors(pool):
    history, order, window, exo, exo_order, ridge = pool
    call_expecting_only_value_or_type_errors(
        N.predict_arx_intervals, history, 3, order=order, window=window, exo=exo, exo_order=exo_order, ridge=ridge
    )


@FUZZ
@given(st.lists(st.one_of(ints, st.lists(ints, max_size=4)), min_size=12, max_size=12))
def test_stateful_classes_raise_only_value_or_type_errors(a):
    clocks = call_expecting_only_value_or_type_errors(N.WorkerClocks, a[0], a[1])
    if clocks is not None:
        call_expecting_only_value_or_type_errors(clocks.record_push, a[2], a[3])
        call_expecting_only_value_or_type_errors(clocks.observe, a[2], a[3], a[4], a[5])
        call_expecting_only_value_or_type_errors(clocks.intervals, a[4])
        call_expecting_only_value_or_type_errors(N.zipline_barrier_from_clocks, clocks, a[5])
        call_expecting_only_value_or_type_errors(N.ssp_may_proceed, clocks, a[6], a[7])
        call_expecting_only_value_or_type_errors(N.dssp_credit, clocks, a[8], a[9], a[10], a[11])
        call_expecting_only_value_or_type_errors(N.dssp_may_resume, clocks, a[8], a[9])
    dssp = call_expecting_only_value_or_type_errors(N.DsspState, a[2], a[3], a[4])
    if dssp is not None and clocks is not None:
        call_expecting_only_value_or_type_errors(dssp.on_push, clocks, a[5])
        call_expecting_only_value_or_type_errors(dssp.may_resume, clocks, a[6])
        call_expecting_only_value_or_type_errors(dssp.credit, a[7])
    wbsp = call_expecting_only_value_or_type_errors(N.WbspState, a[0])
    if wbsp is not None:
        call_expecting_only_value_or_type_errors(wbsp.on_upload, a[1])
        call_expecting_only_value_or_type_errors(wbsp.on_download, a[2])
        call_expecting_only_value_or_type_errors(wbsp.may_download, a[3], a[4])
        call_expecting_only_value_or_type_errors(wbsp.uploaded_since_last_download, a[5])
    ctl = call_expecting_only_value_or_type_errors(
        N.LbbspGpuController, a[0], a[1], step=a[2], tolerance=0.05, window=a[3], sizes=a[4]
    )
    if ctl is not None:
        for _ in range(3):
            call_expecting_only_value_or_type_errors(ctl.update, a[5])
        assert sum(ctl.sizes) == ctl.batch_size


@pytest.mark.parametrize(
    "call",
    [
        lambda: N.predict_push_times([0] * 8, [1] * 8, 2**27),  # 2^30 points: 8 GiB
        lambda: N.zipline_barrier_from_intervals([0, 0], [1, 1], 2**31 - 1),
        lambda: N.predict_arx_intervals([5, 6, 7], horizon=2**31 - 1),
        lambda: N.dssp_sync_controller(0, 1, 0, 1, 2**31 - 1),  # would loop 2^31 times
        lambda: N.DsspState(2, 0, 2**31 - 1),
        lambda: N.WorkerClocks(2**31 - 1),
        lambda: N.DsspState(2**31 - 1, 0, 1),
        lambda: N.WbspState(2**31 - 1),
        lambda: N.lbbsp_batch_sizes_cpu([1.0, 2.0], 2**62),
        lambda: N.LbbspGpuController(2**62, [2**62, 2**62]),
    ],
)
def test_huge_sizes_are_refused_with_value_error_before_allocating(call):
    with pytest.raises(ValueError, match="must be|too many|too large"):
        call()
