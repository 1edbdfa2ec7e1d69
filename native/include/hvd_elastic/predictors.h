// Predictors of a worker's next iteration interval(s) from its history (docs/algorithms.md, "Predictors": ElasticBSP
// and DSSP use the latest interval I_p; LB-BSP predicts throughput with a NARX model). History: intervals in ns,
// oldest first, >= 0.
// Every predictor is a pure function of the history, so all ranks predict the same value.
#pragma once

#include <cstdint>
#include <vector>

namespace hvd_elastic {

// The papers' rule: the next interval equals the latest one, I_p.
int64_t predict_last_interval(const std::vector<int64_t>& history);

// Median of the newest `window` intervals (the lower middle for an even count): robust to a single outlier.
int64_t predict_median_interval(const std::vector<int64_t>& history, int window);

// Exponentially weighted mean: m_1 = h_1, m_i = alpha * h_i + (1 - alpha) * m_{i-1}; alpha in (0, 1].
int64_t predict_ewma_interval(const std::vector<int64_t>& history, double alpha);

// Autoregressive model with optional exogenous input, fitted by least squares on a sliding window, which follows a
// speed that drifts (the shape of LB-BSP's NARX, kept linear and small):
//   x_t = c + d * (t - T) / window + sum_{i=1..order} a_i x_{t-i} + sum_{j=0..exo_order-1} b_j u_{t-j} + noise
// x = intervals normalised by their mean, u = the exogenous series standardised over the window (e.g. the co-tenant
// CPU load measured during each iteration); the trend term d is optional. Fitted over the last `window` targets
// with a ridge penalty ridge * rows * var(regressor) on the lag coefficients (not on c, d).
// A sudden slowdown is a level shift: the data restart at the most significant mean shift in the window (two-sample
// t statistic above shift_threshold, and two means fit clearly better than a line; 0 disables), repeatedly, so the
// newest regime is kept; with exo the test runs on what u does not explain. Until the new regime has enough points
// the forecast is its mean. Multi-step forecasts iterate the recursion; exogenous values past the
// given ones are held at the last one. Each step is clamped to [min/2, 2*max] of the data (an unstable fit cannot
// explode). With too little history (rows < coefficients + 2) or a singular fit: the last interval.
struct ArxOptions {
  int order = 2;                 // k: autoregressive lags, 1..16
  int window = 32;               // regression rows (targets) at most, >= 2
  int exo_order = 1;             // m: exogenous lags when exo is given, 1..16
  double ridge = 1e-3;           // >= 0, relative to each regressor's variance
  bool trend = true;             // include the local linear trend term d
  double shift_threshold = 5.0;  // level-shift detection, t statistic; 0 disables
};

// exo: empty, or at least history.size() + 1 readings (u_1..u_T for the past iterations, u_{T+1} for the next one,
// then optionally known future readings). Returns `horizon` predicted intervals (>= 1), in ns.
std::vector<int64_t> predict_arx_intervals(const std::vector<int64_t>& history, int horizon, const ArxOptions& opt,
                                           const std::vector<double>& exo);

}  // namespace hvd_elastic
