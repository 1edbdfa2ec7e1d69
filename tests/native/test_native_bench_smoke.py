"""The decision benchmark runs end to end on tiny inputs (figures only; nothing here is timed)."""
import numpy as np
import pytest

from benchmarks import decisions as D


def test_barrier_benchmark_checks_zipline_against_fullgridscan_and_skips_over_budget():
    results, checks = D.barrier_decision_costs((10, 40), (15,), budget_s=5.0, log=lambda s: None)
    assert checks and all(ok for _, _, ok in checks)
    assert results[("ZipLine", 40, 15)] > 0
    table = D.barrier_table(results, (10, 40), (15,))
    assert "149.0 us" in table  # the paper's ZipLine n=10, R=15 figure sits beside ours
    results, _ = D.barrier_decision_costs((10, 400), (150,), budget_s=1e-4, log=lambda s: None)
    assert results[("FullGridScan", 400, 150)][0] == "skipped"


@pytest.mark.parametrize("kind", D.TRACES)
def test_predictor_error_report_covers_every_predictor(kind):
    trace, exo = D.generate_trace(kind, steps=120, seed=3)
    assert trace.dtype == np.int64 and (trace > 0).all()
    errors = D.predictor_errors(trace, exo, warmup=40, horizon=5)
    assert len(errors) == (4 if kind == "co-tenant load" else 3)
    for e in errors.values():
        assert e["mae_ms"] >= 0 and 0 <= e["mape_pct"] < 100 and e["push_mape_pct"] >= 0


def test_unknown_trace_kind_is_a_value_error():
    with pytest.raises(ValueError, match="unknown trace kind"):
        D.generate_trace("bursty")
