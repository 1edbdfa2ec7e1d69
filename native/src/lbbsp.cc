// LB-BSP batch sizing (docs/algorithms.md, "LB-BSP"): CPU mode (proportional to throughput) and GPU mode (step search).
#include "hvd_elastic/lbbsp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {


namespace {

// Caps clipped to B (empty = B each), after checking 1 <= cap_p and sum(caps) >= B >= n.
std::vector<int64_t> checked_caps(size_t n, int64_t B, const std::vector<int64_t>& caps, const char* where) {
  HVD_REQUIRE(B <= checks::kMaxBatch, where,
              "global batch B = " + std::to_string(B) + " is too large (limit " +
                  std::to_string(checks::kMaxBatch) + ")");
  HVD_REQUIRE(B >= static_cast<int64_t>(n), where,
              "global batch B = " + std::to_string(B) + " is smaller than the number of workers n = " +
                  std::to_string(n) + " (every worker needs at least one sample)");
  if (caps.empty()) return std::vector<int64_t>(n, B);
  checks::same_length(n, caps.size(), where, "throughput/sizes", "caps");
  std::vector<int64_t> clipped(n);
  int64_t total = 0;
  for (size_t p = 0; p < n; ++p) {
    HVD_REQUIRE(caps[p] >= 1, where, "caps[" + std::to_string(p) + "] must be >= 1, got " + std::to_string(caps[p]));
    clipped[p] = std::min(caps[p], B);  // a cap above B never binds; clipping also keeps the sum from overflowing
    total += clipped[p];
  }
  HVD_REQUIRE(total >= B, where,
              "caps sum to " + std::to_string(total) + " < global batch B = " + std::to_string(B) +
                  ": the batch cannot fit");
  return clipped;
}

// lambda such that sum_p clamp(lambda * v_p, 1, cap_p) = B: walk the sorted breakpoints 1/v_p (p starts growing)
// and cap_p/v_p (p is capped); between them the sum is affine in lambda.
double water_level(const std::vector<double>& v, int64_t B, const std::vector<int64_t>& caps) {
  const size_t n = v.size();
  struct Event {
    double lambda;
    int kind;  // 0: starts growing, 1: reaches its cap
    size_t p;
  };
  std::vector<Event> ev;
  ev.reserve(2 * n);
  for (size_t p = 0; p < n; ++p) {
    ev.push_back({1.0 / v[p], 0, p});
    ev.push_back({static_cast<double>(caps[p]) / v[p], 1, p});
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
    return a.lambda < b.lambda || (a.lambda == b.lambda && (a.kind < b.kind || (a.kind == b.kind && a.p < b.p)));
  });
  double fixed = static_cast<double>(n);  // sum of the workers pinned at 1 or at their cap
  double slope = 0.0;                     // sum of v_p of the growing workers
  const double target = static_cast<double>(B);
  for (const Event& e : ev) {
    if (slope > 0.0 && fixed + e.lambda * slope >= target) return (target - fixed) / slope;
    if (e.kind == 0) {
      fixed -= 1.0;
      slope += v[e.p];
    } else {
      slope -= v[e.p];
      fixed += static_cast<double>(caps[e.p]);
    }
  }
  return ev.back().lambda;  // sum(caps) == B: everyone at its cap
}

}  // namespace

std::vector<int64_t> lbbsp_batch_sizes_cpu(const std::vector<double>& throughput, int64_t batch_size,
                                           const std::vector<int64_t>& caps_in) {
  const char* where = "lbbsp_batch_sizes_cpu";
  checks::nonempty_size(throughput.size(), where, "throughput");
  const size_t n = throughput.size();
  for (size_t p = 0; p < n; ++p)
    HVD_REQUIRE(std::isfinite(throughput[p]) && throughput[p] > 0.0, where,
                "throughput[" + std::to_string(p) + "] must be finite and > 0, got " + checks::num(throughput[p]));
  const std::vector<int64_t> caps = checked_caps(n, batch_size, caps_in, where);
  const int64_t B = batch_size;

  // Scale v to max 1 so 1/v_p stays finite for tiny throughputs; proportions are unchanged.
  const double vmax = *std::max_element(throughput.begin(), throughput.end());
  std::vector<double> v(n);
  for (size_t p = 0; p < n; ++p) v[p] = std::max(throughput[p] / vmax, 1e-300);

  // b_p = B v_p / sum v, bounded to [1, cap_p] (docs/algorithms.md, "LB-BSP", cpu mode).
  const double lambda = water_level(v, B, caps);
  std::vector<int64_t> b(n);
  std::vector<double> frac(n);
  int64_t sum = 0;
  for (size_t p = 0; p < n; ++p) {
    const double x = std::min(std::max(lambda * v[p], 1.0), static_cast<double>(caps[p]));
    const double fl = std::floor(x);
    b[p] = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(fl), 1), caps[p]);
    frac[p] = x - fl;
    sum += b[p];
  }
  // Largest remainders first, ties to the lowest rank; loops again only if rounding error left more than one pass.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t k = B - sum;
  if (k > 0) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return frac[a] > frac[c]; });
    while (k > 0)
      for (size_t p : order)
        if (k > 0 && b[p] < caps[p]) { ++b[p]; --k; }
  } else if (k < 0) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return frac[a] < frac[c]; });
    while (k < 0)
      for (size_t p : order)
        if (k < 0 && b[p] > 1) { --b[p]; ++k; }
  }
  return b;
}

std::vector<int64_t> lbbsp_resize_cpu(const std::vector<double>& throughput, const std::vector<int64_t>& current,
                                      int64_t batch_size, const std::vector<int64_t>& caps_in, double tolerance) {
  const char* where = "lbbsp_resize_cpu";
  HVD_REQUIRE(std::isfinite(tolerance) && tolerance >= 0.0 && tolerance < 1.0, where,
              "tolerance must be in [0, 1), got " + checks::num(tolerance));
  std::vector<int64_t> next = lbbsp_batch_sizes_cpu(throughput, batch_size, caps_in);  // validates throughput, B
  const size_t n = throughput.size();
  checks::same_length(n, current.size(), where, "throughput", "current");
  const std::vector<int64_t> caps = checked_caps(n, batch_size, caps_in, where);
  int64_t sum = 0;
  for (size_t p = 0; p < n; ++p) {
    HVD_REQUIRE(current[p] >= 1 && current[p] <= caps[p], where,
                "current[" + std::to_string(p) + "] = " + std::to_string(current[p]) + " must be in [1, cap = " +
                    std::to_string(caps[p]) + "]");
    sum += current[p];
  }
  HVD_REQUIRE(sum == batch_size, where,
              "current sizes sum to " + std::to_string(sum) + ", not the global batch B = " +
                  std::to_string(batch_size));
  // Predicted finish times at the current sizes, b_p / v_p: balanced when max - min <= tolerance * max (the GPU
  // mode's criterion). Comparing predicted step times of the two splits instead would understate the gain when a
  // fixed per-step cost dominates (per-sample time c / b + s then favours whoever has more samples) and freeze an
  // unbalanced split.
  double t_max = 0.0, t_min = std::numeric_limits<double>::infinity();
  for (size_t p = 0; p < n; ++p) {
    const double t = static_cast<double>(current[p]) / throughput[p];
    t_max = std::max(t_max, t);
    t_min = std::min(t_min, t);
  }
  return t_max - t_min <= tolerance * t_max ? current : next;
}

LbbspMove lbbsp_gpu_step(LbbspGpuState& st, const std::vector<int64_t>& t, double tolerance) {
  const char* where = "lbbsp_gpu_step";
  const size_t n = st.sizes.size();
  HVD_REQUIRE(n >= 1 && st.caps.size() == n, where, "state must hold sizes and caps for n >= 1 workers");
  checks::same_length(n, t.size(), where, "sizes", "step_times_ns");
  checks::nonnegative_all(t, where, "step_times_ns");
  HVD_REQUIRE(std::isfinite(tolerance) && tolerance >= 0.0 && tolerance < 1.0, where,
              "tolerance must be in [0, 1), got " + checks::num(tolerance));

  LbbspMove m;
  const size_t s = static_cast<size_t>(std::max_element(t.begin(), t.end()) - t.begin());  // straggler
  const int64_t tmin = *std::min_element(t.begin(), t.end());
  // Stop when finish times are within the tolerance: max - min <= tolerance * max.
  if (static_cast<double>(t[s] - tmin) <= tolerance * static_cast<double>(t[s])) {
    st.converged = true;
    m.converged = true;
    return m;
  }
  st.converged = false;
  int f = -1;
  for (size_t r = 0; r < n; ++r)
    if (r != s && st.sizes[r] < st.caps[r] && (f < 0 || t[r] < t[f])) f = static_cast<int>(r);
  if (f < 0 || st.sizes[s] <= 1) return m;  // nobody can take samples, or the straggler has none to give

  // The straggler took samples last time: we overshot, so halve the step and watch a longer window.
  if (static_cast<int>(s) == st.last_to) {
    m.reversed = true;
    st.step = std::max<int64_t>(1, st.step / 2);
    st.window = std::min(st.max_window, st.window * 2);
  }
  const int64_t amount = std::min({st.step, st.sizes[s] - 1, st.caps[f] - st.sizes[f]});
  st.sizes[s] -= amount;
  st.sizes[f] += amount;
  st.last_from = static_cast<int>(s);
  st.last_to = f;
  m.from = static_cast<int>(s);
  m.to = f;
  m.amount = amount;
  return m;
}

LbbspGpuController::LbbspGpuController(int64_t batch_size, std::vector<int64_t> caps, int64_t step, double tolerance,
                                       int window, std::vector<int64_t> sizes)
    : batch_size_(batch_size), tolerance_(tolerance) {
  const char* where = "LbbspGpuController";
  size_t n = !sizes.empty() ? sizes.size() : caps.size();
  HVD_REQUIRE(n >= 1, where, "need the number of workers: pass caps or sizes (non-empty)");
  if (!sizes.empty() && !caps.empty()) checks::same_length(sizes.size(), caps.size(), where, "sizes", "caps");
  state_.caps = checked_caps(n, batch_size, caps, where);
  HVD_REQUIRE(std::isfinite(tolerance) && tolerance >= 0.0 && tolerance < 1.0, where,
              "tolerance must be in [0, 1), got " + checks::num(tolerance));
  HVD_REQUIRE(window >= 1, where, "window must be >= 1, got " + std::to_string(window));
  if (sizes.empty()) {
    state_.sizes = lbbsp_batch_sizes_cpu(std::vector<double>(n, 1.0), batch_size, state_.caps);
  } else {
    int64_t sum = 0;
    for (size_t p = 0; p < n; ++p) {
      HVD_REQUIRE(sizes[p] >= 1 && sizes[p] <= state_.caps[p], where,
                  "sizes[" + std::to_string(p) + "] = " + std::to_string(sizes[p]) + " must be in [1, cap = " +
                      std::to_string(state_.caps[p]) + "]");
      sum += sizes[p];
    }
    HVD_REQUIRE(sum == batch_size, where,
                "sizes sum to " + std::to_string(sum) + ", not the global batch B = " + std::to_string(batch_size));
    state_.sizes = std::move(sizes);
  }
  state_.step = step > 0 ? step : std::max<int64_t>(1, batch_size / (4 * static_cast<int64_t>(n)));
  state_.window = window;
  state_.max_window = std::max(window, 1024);
}

const std::vector<int64_t>& LbbspGpuController::update(const std::vector<int64_t>& step_times_ns) {
  last_move_ = lbbsp_gpu_step(state_, step_times_ns, tolerance_);
  if (last_move_.amount > 0) ++moves_;
  return state_.sizes;
}

}  // namespace hvd_elastic
