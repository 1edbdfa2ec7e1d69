// Iteration-interval predictors: last interval (the papers' I_p), EWMA, and a windowed least-squares ARX model.
#include "hvd_elastic/predictors.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {


namespace {

void check_history(const std::vector<int64_t>& h, const char* where) {
  checks::nonempty_size(h.size(), where, "history");
  checks::nonnegative_all(h, where, "history");
}

// Solves A x = b (P x P, row-major) by Gaussian elimination with partial pivoting; false if (near) singular.
bool solve(std::vector<double>& A, std::vector<double>& b, int P) {
  double scale = 0.0;
  for (double a : A) scale = std::max(scale, std::fabs(a));
  if (!(scale > 0.0)) return false;
  for (int c = 0; c < P; ++c) {
    int piv = c;
    for (int r = c + 1; r < P; ++r)
      if (std::fabs(A[r * P + c]) > std::fabs(A[piv * P + c])) piv = r;
    if (std::fabs(A[piv * P + c]) <= 1e-12 * scale) return false;
    if (piv != c) {
      for (int j = 0; j < P; ++j) std::swap(A[c * P + j], A[piv * P + j]);
      std::swap(b[c], b[piv]);
    }
    for (int r = c + 1; r < P; ++r) {
      const double f = A[r * P + c] / A[c * P + c];
      if (f == 0.0) continue;
      for (int j = c; j < P; ++j) A[r * P + j] -= f * A[c * P + j];
      b[r] -= f * b[c];
    }
  }
  for (int c = P - 1; c >= 0; --c) {
    double s = b[c];
    for (int j = c + 1; j < P; ++j) s -= A[c * P + j] * b[j];
    b[c] = s / A[c * P + c];
  }
  for (double x : b)
    if (!std::isfinite(x)) return false;
  return true;
}

int64_t to_ns(double x) {
  if (!(x > 0.0)) return 0;
  if (x >= 9.2e18) return INT64_MAX;
  return static_cast<int64_t>(std::llround(x));
}

}  // namespace

int64_t predict_last_interval(const std::vector<int64_t>& history) {
  check_history(history, "predict_last_interval");
  return history.back();  // I_p (docs/algorithms.md, "Predictors")
}

int64_t predict_median_interval(const std::vector<int64_t>& history, int window) {
  const char* where = "predict_median_interval";
  HVD_REQUIRE(window >= 1, where, "window must be >= 1, got " + std::to_string(window));
  check_history(history, where);
  // The lower middle of the newest `window` intervals: one descheduled or interrupted iteration moves it by at
  // most one rank in the order, where it moves the last interval (and an EWMA) by its whole excess.
  const size_t k = std::min(history.size(), static_cast<size_t>(window));
  std::vector<int64_t> v(history.end() - static_cast<std::ptrdiff_t>(k), history.end());
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>((k - 1) / 2), v.end());
  return v[(k - 1) / 2];
}

int64_t predict_ewma_interval(const std::vector<int64_t>& history, double alpha) {
  const char* where = "predict_ewma_interval";
  HVD_REQUIRE(std::isfinite(alpha) && alpha > 0.0 && alpha <= 1.0, where,
              "alpha must be in (0, 1], got " + checks::num(alpha));
  check_history(history, where);
  double m = static_cast<double>(history[0]);
  for (size_t i = 1; i < history.size(); ++i) m = alpha * static_cast<double>(history[i]) + (1.0 - alpha) * m;
  return to_ns(m);
}

namespace {

// Offset of the newest regime in z: the split with the largest two-sample t statistic (pooled variance, at least
// 3 points before and 2 after), if that statistic exceeds `threshold` and two means explain the data clearly better
// than a straight line (residual SS below 0.7x the line's), else 0. A sudden slowdown is a mean shift, and fitting
// across it would drag the forecast back toward the old speed; a steady drift is not one.
int level_shift_offset(const std::vector<double>& z, double threshold) {
  const int n = static_cast<int>(z.size());
  if (threshold <= 0.0 || n < 5) return 0;
  std::vector<double> s1(n + 1, 0.0), s2(n + 1, 0.0);  // prefix sums of z and z^2
  double sxt = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = z[i];
    s1[i + 1] = s1[i] + x;
    s2[i + 1] = s2[i] + x * x;
    sxt += x * (i - 0.5 * (n - 1));
  }
  const double ss_total = std::max(0.0, s2[n] - s1[n] * s1[n] / n);
  const double stt = static_cast<double>(n) * (static_cast<double>(n) * n - 1.0) / 12.0;  // sum (i - mean i)^2
  const double ss_line = std::max(0.0, ss_total - sxt * sxt / stt);
  double best_t = 0.0, best_ss = 0.0;
  int best = 0;
  for (int a = 3; a <= n - 2; ++a) {
    const int b = n - a;
    const double ma = s1[a] / a, mb = (s1[n] - s1[a]) / b;
    const double ss = std::max(0.0, s2[a] - a * ma * ma) + std::max(0.0, (s2[n] - s2[a]) - b * mb * mb);
    const double diff = std::fabs(mb - ma);
    const double se = std::sqrt(ss / (n - 2)) * std::sqrt(1.0 / a + 1.0 / b);
    const double t = se > 1e-12 ? diff / se : (diff > 1e-9 ? INFINITY : 0.0);
    if (t > best_t) {
      best_t = t;
      best_ss = ss;
      best = a;
    }
  }
  return best_t > threshold && best_ss < 0.7 * ss_line ? best : 0;
}

// The series the shift test looks at over [lo, T): x / scale, or, with an exogenous input, the residual of x / scale
// regressed on u (shifts the input explains, such as a co-tenant's load switching on, are part of the model).
std::vector<double> shift_test_series(const std::vector<int64_t>& h, const std::vector<double>& exo, int lo,
                                      double scale) {
  const int T = static_cast<int>(h.size()), n = T - lo;
  std::vector<double> z(n);
  for (int i = 0; i < n; ++i) z[i] = static_cast<double>(h[lo + i]) / scale;
  if (exo.empty() || n < 3) return z;
  double mu = 0.0, mz = 0.0;
  for (int i = 0; i < n; ++i) {
    mu += exo[lo + i];
    mz += z[i];
  }
  mu /= n;
  mz /= n;
  double suu = 0.0, suz = 0.0;
  for (int i = 0; i < n; ++i) {
    suu += (exo[lo + i] - mu) * (exo[lo + i] - mu);
    suz += (exo[lo + i] - mu) * (z[i] - mz);
  }
  const double beta = suu > 1e-12 ? suz / suu : 0.0;
  for (int i = 0; i < n; ++i) z[i] -= beta * (exo[lo + i] - mu);
  return z;
}

}  // namespace

std::vector<int64_t> predict_arx_intervals(const std::vector<int64_t>& history, int horizon, const ArxOptions& opt,
                                           const std::vector<double>& exo) {
  const char* where = "predict_arx_intervals";
  check_history(history, where);
  HVD_REQUIRE(horizon >= 1 && horizon <= checks::kMaxHorizon, where,
              "horizon must be in [1, " + std::to_string(checks::kMaxHorizon) + "], got " + std::to_string(horizon));
  HVD_REQUIRE(opt.order >= 1 && opt.order <= 16, where, "order must be in [1, 16], got " + std::to_string(opt.order));
  HVD_REQUIRE(opt.window >= 2, where, "window must be >= 2, got " + std::to_string(opt.window));
  HVD_REQUIRE(std::isfinite(opt.ridge) && opt.ridge >= 0.0, where,
              "ridge must be finite and >= 0, got " + checks::num(opt.ridge));
  HVD_REQUIRE(std::isfinite(opt.shift_threshold), where,
              "shift_threshold must be finite (0 disables), got " + checks::num(opt.shift_threshold));
  const int T = static_cast<int>(history.size());
  const bool has_exo = !exo.empty();
  if (has_exo) {
    HVD_REQUIRE(opt.exo_order >= 1 && opt.exo_order <= 16, where,
                "exo_order must be in [1, 16], got " + std::to_string(opt.exo_order));
    HVD_REQUIRE(exo.size() >= history.size() + 1, where,
                "mismatched lengths: exo needs len(history) + 1 = " + std::to_string(T + 1) +
                    " readings (one per past iteration plus the next one), got " + std::to_string(exo.size()));
    for (size_t i = 0; i < exo.size(); ++i)
      HVD_REQUIRE(std::isfinite(exo[i]), where,
                  "exo[" + std::to_string(i) + "] must be finite, got " + checks::num(exo[i]));
  }
  const int k = opt.order, m = has_exo ? opt.exo_order : 0, tr = opt.trend ? 1 : 0;
  const int P = 1 + tr + k + m;  // c, [d], a_1..a_k, b_0..b_{m-1}

  // The data the model sees: the last window + k intervals, or fewer after a level shift.
  int lo = std::max(0, T - opt.window - k);
  double scale = 0.0;
  for (int t = lo; t < T; ++t) scale += static_cast<double>(history[t]);
  scale /= (T - lo);
  if (!(scale > 0.0)) return std::vector<int64_t>(horizon, 0);
  // Keep the newest regime: a window can hold several shifts (a slowdown that began and ended), so search again
  // inside the part after each one found.
  bool shifted = false;
  for (;;) {
    const int offset = level_shift_offset(shift_test_series(history, exo, lo, scale), opt.shift_threshold);
    if (offset == 0) break;
    shifted = true;
    lo += offset;
    scale = 0.0;
    for (int t = lo; t < T; ++t) scale += static_cast<double>(history[t]);
    scale /= (T - lo);
  }
  const int start = std::max({lo + k, m - 1, T - opt.window});
  const int N = T - start;  // regression rows: targets x_start .. x_{T-1}
  if (N < P + 2)  // too little to fit: the papers' last interval, or the new regime's mean after a shift
    return std::vector<int64_t>(horizon, shifted ? to_ns(scale) : history.back());

  // Normalise x by its mean and u to zero mean / unit variance, for conditioning.
  double xmin = INFINITY, xmax = 0.0;
  for (int t = lo; t < T; ++t) {
    xmin = std::min(xmin, static_cast<double>(history[t]));
    xmax = std::max(xmax, static_cast<double>(history[t]));
  }
  std::vector<double> y(T + horizon);
  for (int t = 0; t < T; ++t) y[t] = static_cast<double>(history[t]) / scale;
  const double ymin = 0.5 * xmin / scale, ymax = 2.0 * xmax / scale;
  std::vector<double> u;
  if (has_exo) {
    double mu = 0.0, var = 0.0;
    const int ulo = start - m + 1;
    for (int t = ulo; t < T; ++t) mu += exo[t];
    mu /= (T - ulo);
    for (int t = ulo; t < T; ++t) var += (exo[t] - mu) * (exo[t] - mu);
    const double sd = var > 0.0 ? std::sqrt(var / (T - ulo)) : 1.0;
    u.resize(exo.size());
    for (size_t t = 0; t < exo.size(); ++t) u[t] = (exo[t] - mu) / sd;
  }
  auto u_at = [&](int t) { return u[std::min<size_t>(static_cast<size_t>(t), u.size() - 1)]; };
  const double wlen = static_cast<double>(opt.window);
  auto regressors = [&](int t, double* row) {
    int c = 0;
    row[c++] = 1.0;
    if (tr) row[c++] = static_cast<double>(t - T) / wlen;  // local linear trend: follows a drifting speed
    for (int i = 1; i <= k; ++i) row[c++] = y[t - i];
    for (int j = 0; j < m; ++j) row[c++] = u_at(t - j);
  };

  // Least squares with a ridge on the lag coefficients, relative to each regressor's variance:
  // (X'X + ridge * N * diag(0, [0], var_1, ..., var_{k+m})) theta = X'y.
  std::vector<double> A(P * P, 0.0), b(P, 0.0), row(P), mean(P, 0.0), sq(P, 0.0);
  for (int t = start; t < T; ++t) {
    regressors(t, row.data());
    for (int i = 0; i < P; ++i) {
      mean[i] += row[i];
      sq[i] += row[i] * row[i];
      b[i] += row[i] * y[t];
      for (int j = 0; j < P; ++j) A[i * P + j] += row[i] * row[j];
    }
  }
  for (int i = 1 + tr; i < P; ++i) {
    const double var = std::max(sq[i] / N - (mean[i] / N) * (mean[i] / N), 1e-12);
    A[i * P + i] += opt.ridge * N * var;
  }
  if (!solve(A, b, P)) return std::vector<int64_t>(horizon, history.back());

  // Iterate x_t = c + d*t + sum a_i x_{t-i} + sum b_j u_{t-j} forward, clamped to the data's range.
  std::vector<int64_t> out(horizon);
  for (int h = 0; h < horizon; ++h) {
    const int t = T + h;
    regressors(t, row.data());
    double pred = 0.0;
    for (int i = 0; i < P; ++i) pred += b[i] * row[i];
    if (!std::isfinite(pred)) pred = y[t - 1];
    y[t] = std::min(std::max(pred, ymin), ymax);
    out[h] = to_ns(y[t] * scale);
  }
  return out;
}

}  // namespace hvd_elastic
