// DSSP credit rule and SyncController (docs/algorithms.md, "DSSP").
#include "hvd_elastic/dssp.h"

#include <algorithm>
#include <limits>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {


namespace {

void check_range(int s_lower, int s_upper, const char* where) {
  HVD_REQUIRE(s_lower >= 0, where, "s_lower (s_L) must be >= 0, got " + std::to_string(s_lower));
  HVD_REQUIRE(s_upper >= s_lower, where,
              "s_upper (s_U) must be >= s_lower (s_L), got [" + std::to_string(s_lower) + ", " +
                  std::to_string(s_upper) + "]");
  HVD_REQUIRE(static_cast<int64_t>(s_upper) - s_lower <= checks::kMaxRange, where,
              "r_max = s_U - s_L must be <= " + std::to_string(checks::kMaxRange));
}

// |a - b| for non-negative int64 values (cannot overflow).
inline int64_t dist(int64_t a, int64_t b) { return a > b ? a - b : b - a; }

}  // namespace

int dssp_sync_controller(int64_t last_p, int64_t interval_p, int64_t last_s, int64_t interval_s, int r_max) {
  const char* where = "dssp_sync_controller";
  HVD_REQUIRE(r_max >= 0 && r_max <= checks::kMaxRange, where,
              "r_max must be in [0, " + std::to_string(checks::kMaxRange) + "], got " + std::to_string(r_max));
  HVD_REQUIRE(last_p >= 0 && last_s >= 0, where,
              "push times must be >= 0 ns, got last_p = " + std::to_string(last_p) + ", last_s = " +
                  std::to_string(last_s));
  HVD_REQUIRE(interval_p >= 0 && interval_s >= 0, where,
              "intervals must be >= 0 ns, got I_p = " + std::to_string(interval_p) + ", I_s = " +
                  std::to_string(interval_s));
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t steps = static_cast<int64_t>(r_max) + 1;
  HVD_REQUIRE(interval_p == 0 || interval_p <= (kMax - last_p) / steps, where, "last_p + r_max * I_p overflows int64");
  HVD_REQUIRE(interval_s == 0 || interval_s <= (kMax - last_s) / steps, where,
              "last_s + (r_max + 1) * I_s overflows int64");

  // Sim_p[i] = last_p + i*I_p, Sim_s[k] = last_s + (k+1)*I_s (docs/algorithms.md, "DSSP"). Both ascend, so
  // the first k with Sim_s[k] >= Sim_p[i] only moves forward as i grows: two pointers, O(r_max).
  int best_i = 0;
  int64_t best_d = kMax;
  int k = 0;
  for (int i = 0; i <= r_max; ++i) {
    const int64_t sim_p = last_p + static_cast<int64_t>(i) * interval_p;
    while (k < r_max && last_s + static_cast<int64_t>(k + 1) * interval_s < sim_p) ++k;
    int64_t d = dist(last_s + static_cast<int64_t>(k + 1) * interval_s, sim_p);
    if (k > 0) d = std::min(d, dist(last_s + static_cast<int64_t>(k) * interval_s, sim_p));
    if (d < best_d) {  // strict: ties keep the smaller i
      best_d = d;
      best_i = i;
    }
  }
  return best_i;
}

DsspDecision dssp_credit(const WorkerClocks& clocks, int p, int credit_p, int s_lower, int s_upper) {
  const char* where = "dssp_credit";
  check_range(s_lower, s_upper, where);
  checks::worker_index(p, clocks.size(), where);
  const int r_max = s_upper - s_lower;  // r_max = s_U - s_L
  HVD_REQUIRE(credit_p >= 0 && credit_p <= r_max, where,
              "credit r_p must be in [0, r_max = " + std::to_string(r_max) + "], got " + std::to_string(credit_p));

  DsspDecision d;
  const int64_t gap = clocks.clock(p) - clocks.min_clock();  // t_p - t_slowest
  if (credit_p > 0) {
    d.proceed = true;
    d.credit = credit_p - 1;
    return d;
  }
  if (gap <= s_lower) {
    d.proceed = true;
    return d;
  }
  if (clocks.clock(p) == clocks.max_clock()) {
    const int s = clocks.slowest_by_clock();
    const int64_t I_p = clocks.last_interval_ns(p), I_s = clocks.last_interval_ns(s);
    int r = 0;
    if (I_p >= 0 && I_s >= 0)
      r = dssp_sync_controller(clocks.last_push_ns(p), I_p, clocks.last_push_ns(s), I_s, r_max);
    // Credits admit staleness gap, gap+1, ..., gap+r-1; capping r at s_U - gap + 1 keeps all of them <= s_U.
    const int64_t cap = std::max<int64_t>(0, static_cast<int64_t>(s_upper) - gap + 1);
    r = static_cast<int>(std::min<int64_t>(r, cap));
    d.granted = r;
    if (r > 0) {
      d.proceed = true;
      d.credit = r - 1;
    }
  }
  return d;
}

bool dssp_may_resume(const WorkerClocks& clocks, int p, int s_lower) {
  const char* where = "dssp_may_resume";
  HVD_REQUIRE(s_lower >= 0, where, "s_lower (s_L) must be >= 0, got " + std::to_string(s_lower));
  checks::worker_index(p, clocks.size(), where);
  return clocks.clock(p) - clocks.min_clock() <= s_lower;  // back within s_L
}

DsspState::DsspState(int n, int s_lower, int s_upper) : s_lower_(s_lower), s_upper_(s_upper) {
  HVD_REQUIRE(n >= 1 && n <= checks::kMaxWorkers, "DsspState",
              "n must be in [1, " + std::to_string(checks::kMaxWorkers) + "], got " + std::to_string(n));
  check_range(s_lower, s_upper, "DsspState");
  credit_.assign(n, 0);
}

void DsspState::check_clocks(const WorkerClocks& clocks, int p, const char* where) const {
  checks::same_length(credit_.size(), static_cast<size_t>(clocks.size()), where, "DsspState", "clocks");
  checks::worker_index(p, credit_.size(), where);
}

bool DsspState::on_push(const WorkerClocks& clocks, int p) {
  check_clocks(clocks, p, "DsspState.on_push");
  const DsspDecision d = dssp_credit(clocks, p, credit_[p], s_lower_, s_upper_);
  credit_[p] = d.credit;
  if (d.granted > 0) ++grants_;
  if (d.proceed)
    max_admitted_ = std::max(max_admitted_, clocks.clock(p) - clocks.min_clock());
  else
    ++refusals_;
  return d.proceed;
}

bool DsspState::may_resume(const WorkerClocks& clocks, int p) const {
  check_clocks(clocks, p, "DsspState.may_resume");
  return dssp_may_resume(clocks, p, s_lower_);
}

int DsspState::credit(int p) const {
  checks::worker_index(p, credit_.size(), "DsspState.credit");
  return credit_[p];
}

}  // namespace hvd_elastic
