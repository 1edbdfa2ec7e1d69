"""Iteration-interval predictors: last interval (the papers' I_p), windowed median, EWMA, and the windowed
least-squares ARX model."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N

histories = st.lists(st.integers(0, 10**12), min_size=1, max_size=80)


@given(histories)
def test_last_interval_predicts_the_latest_interval(h):
    assert N.predict_last_interval(h) == h[-1]


@settings(deadline=None)
@given(histories, st.floats(0.01, 1.0))
def test_ewma_matches_its_recurrence(h, alpha):
    m = float(h[0])
    for x in h[1:]:
        m = alpha * x + (1 - alpha) * m
    assert abs(N.predict_ewma_interval(h, alpha) - m) <= 1 + 1e-9 * m


def test_ewma_with_alpha_one_is_the_last_interval():
    assert N.predict_ewma_interval([5, 9, 7], 1.0) == 7


@given(histories, st.integers(1, 20))
def test_median_is_the_lower_middle_of_the_newest_window(h, window):
    newest = sorted(h[-window:])
    assert N.predict_median_interval(h, window) == newest[(len(newest) - 1) // 2]


def test_median_ignores_one_outlier_that_moves_the_last_interval_and_the_ewma():
    h = [24_000_000] * 7 + [36_000_000]     # one interrupted iteration
    assert N.predict_median_interval(h) == 24_000_000
    assert N.predict_last_interval(h) == 36_000_000 and N.predict_ewma_interval(h, 0.3) > 27_000_000


@settings(max_examples=200, deadline=None)
@given(histories, st.integers(1, 20), st.integers(1, 4), st.integers(2, 40))
def test_arx_forecasts_stay_within_the_clamp_and_are_non_negative(h, horizon, order, window):
    out = N.predict_arx_intervals(h, horizon=horizon, order=order, window=window)
    assert len(out) == horizon
    lo = min(h[-(window + order):])
    hi = max(h[-(window + order):])
    for x in out:  # each step is clamped to [min/2, 2 max] of the window (or is the last interval)
        assert 0 <= x and lo / 2 - 1 <= x <= 2 * hi + 1


def test_arx_falls_back_to_the_last_interval_with_short_history():
    assert N.predict_arx_interval([100, 200, 300]) == 300
    assert N.predict_arx_intervals([100, 200, 300], horizon=3) == [300, 300, 300]


def test_arx_recovers_a_noise_free_autoregressive_process():
    # x_t = 20 + 0.5 x_{t-1} + 0.3 x_{t-2}: fixed point 100.
    x = [150.0, 60.0]
    for _ in range(60):
        x.append(20 + 0.5 * x[-1] + 0.3 * x[-2])
    h = [int(round(v * 1e6)) for v in x]
    nxt = 20 + 0.5 * x[-1] + 0.3 * x[-2]
    pred = N.predict_arx_interval(h, order=2, window=40, ridge=0.0, trend=False, shift_threshold=0.0)
    assert abs(pred - nxt * 1e6) < 1e-3 * nxt * 1e6


def test_arx_follows_a_linear_drift_better_than_last_interval_and_ewma():
    rng = np.random.default_rng(0)
    t = np.arange(400)
    trace = (100e6 + 0.25e6 * t) * (1 + 0.01 * rng.standard_normal(t.size))
    trace = [int(v) for v in trace]
    err = {"last": [], "ewma": [], "arx": []}
    for i in range(64, len(trace)):
        h = trace[i - 64 : i]
        err["last"].append(abs(N.predict_last_interval(h) - trace[i]))
        err["ewma"].append(abs(N.predict_ewma_interval(h, 0.3) - trace[i]))
        err["arx"].append(abs(N.predict_arx_interval(h) - trace[i]))
    mae = {k: float(np.mean(v)) for k, v in err.items()}
    assert mae["arx"] < mae["last"] and mae["arx"] < mae["ewma"], mae


def test_arx_with_an_exogenous_load_signal_predicts_load_driven_slowdowns():
    # A co-tenant's CPU load u_t (observed) stretches the interval: x_t = 100 ms * (1 + 1.5 u_t).
    rng = np.random.default_rng(1)
    load = (rng.random(300) < 0.3).astype(float)
    x = [int(100e6 * (1 + 1.5 * u) * (1 + 0.005 * rng.standard_normal())) for u in load]
    errs_exo, errs_plain = [], []
    for i in range(64, len(x)):
        h = x[i - 64 : i]
        u = list(load[i - 64 : i + 1])  # past readings plus the one for the iteration being predicted
        errs_exo.append(abs(N.predict_arx_interval(h, exo=u) - x[i]) / x[i])
        errs_plain.append(abs(N.predict_arx_interval(h) - x[i]) / x[i])
    assert np.mean(errs_exo) < 0.02 < np.mean(errs_plain)


def test_predictors_are_deterministic():
    rng = np.random.default_rng(2)
    h = [int(v) for v in rng.integers(50e6, 150e6, 100)]
    assert len({tuple(N.predict_arx_intervals(h, horizon=10)) for _ in range(5)}) == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: N.predict_last_interval([]), "must not be empty"),
        (lambda: N.predict_last_interval([5, -1]), ">= 0"),
        (lambda: N.predict_ewma_interval([], 0.3), "must not be empty"),
        (lambda: N.predict_median_interval([]), "must not be empty"),
        (lambda: N.predict_median_interval([1, 2], 0), "window"),
        (lambda: N.predict_ewma_interval([1], math.nan), "alpha"),
        (lambda: N.predict_ewma_interval([1], 0.0), "alpha"),
        (lambda: N.predict_ewma_interval([1], 1.5), "alpha"),
        (lambda: N.predict_arx_interval([]), "must not be empty"),
        (lambda: N.predict_arx_interval([1, -2, 3]), ">= 0"),
        (lambda: N.predict_arx_interval([1, 2, 3], order=0), "order"),
        (lambda: N.predict_arx_interval([1, 2, 3], window=1), "window"),
        (lambda: N.predict_arx_interval([1, 2, 3], ridge=math.nan), "ridge"),
        (lambda: N.predict_arx_interval([1, 2, 3], exo=[0.0, 1.0]), "mismatched lengths"),
        (lambda: N.predict_arx_interval([1, 2, 3], exo=[0.0, 1.0, math.nan, 2.0]), "finite"),
        (lambda: N.predict_arx_interval([1, 2, 3], exo=[0.0] * 4, exo_order=0), "exo_order"),
        (lambda: N.predict_arx_intervals([1, 2, 3], horizon=0), "horizon"),
        (lambda: N.predict_arx_interval([1, 2, 3], shift_threshold=math.inf), "shift_threshold"),
    ],
)
def test_bad_predictor_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("history_len", [None, 8])
@pytest.mark.parametrize("predictor", ["last", "median", "ewma", "arx"])
def test_policies_predict_from_the_tick_stream_with_the_configured_predictor(predictor, history_len):
    # zipline's barrier and dssp's credits read each rank's intervals through engine.policies.Intervals: the history
    # the ticks deliver (a new entry per new clock only), predicted by HVD_ELASTIC_PREDICTOR; wbsp's slowest-rank
    # estimate reads a shorter history (8) through the same class.
    from hvd_elastic.engine.policies import Intervals
    from hvd_elastic.engine.view import GlobalView
    from hvd_elastic.predictors import predict_interval

    rng = np.random.default_rng(3)
    kept_len = history_len or Intervals.HISTORY
    view = GlobalView(2)
    intervals = Intervals(2, predictor) if history_len is None else Intervals(2, predictor, history=history_len)
    assert intervals.predicted() == [-1, -1]
    history = [[], []]
    for tick in range(30):
        for q in range(2):
            if rng.random() < 0.6:          # rank q pushed in this tick
                view.clocks[q] += 1
                view.interval_ns[q] = int(rng.integers(20e6, 40e6))
                history[q].append(int(view.interval_ns[q]))
        intervals.observe(view)             # the same view again (a tick without a push) adds nothing
        intervals.observe(view)
    for q in range(2):
        kept = history[q][-kept_len:]
        assert intervals.clocks.intervals(q) == kept
        assert intervals.predict(q) == predict_interval(predictor, kept)
    if predictor == "median":
        assert intervals.predict(0) == sorted(history[0][-8:])[3]


def test_unknown_predictor_names_the_setting():
    from hvd_elastic.predictors import predict_interval
    with pytest.raises(ValueError, match="HVD_ELASTIC_PREDICTOR='oracle'"):
        predict_interval("oracle", [1])
