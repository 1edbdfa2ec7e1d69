"""HVD_ELASTIC_PREDICTOR: a rank's next iteration time from its recent ones, for every rule that predicts (zipline's
barrier, dssp's credits, lbbsp's sizes). The predictors themselves are native (native/src/predictors.cc); a pure
function of the history, so every rank holding the same history predicts the same."""
from __future__ import annotations

from typing import Sequence

from . import _native


def predict_interval(predictor: str, history: Sequence[int]) -> int:
    """The next interval (ns) after `history` (oldest first, non-empty) under the named predictor."""
    if predictor == "median":
        return _native.predict_median_interval(history)
    if predictor == "ewma":
        return _native.predict_ewma_interval(history)
    if predictor == "arx":
        return _native.predict_arx_interval(history)
    if predictor == "last":
        return _native.predict_last_interval(history)
    raise ValueError(f"HVD_ELASTIC_PREDICTOR={predictor!r}: expected one of last, median, ewma, arx")
