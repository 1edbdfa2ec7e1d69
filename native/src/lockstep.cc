// Lock-step fallback of the gradient policies (lockstep.h).
#include "hvd_elastic/lockstep.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {

LockstepRule::LockstepRule(int n, double min_gain, int64_t settle, int64_t sample)
    : min_gain_(min_gain), settle_(settle), sample_(sample), clocks_(n, 0), compute_(n, -1.0), since_(n, 0),
      finished_(n, false) {
  const char* where = "LockstepRule";
  HVD_REQUIRE(n >= 1 && n <= checks::kMaxWorkers, where,
              "n must be in [1, " + std::to_string(checks::kMaxWorkers) + "], got " + std::to_string(n));
  HVD_REQUIRE(std::isfinite(min_gain) && min_gain > 0, where,
              "min_gain must be a finite number > 0, got " + std::to_string(min_gain));
  HVD_REQUIRE(settle >= 1 && sample >= 1, where,
              "settle and sample must be >= 1 push, got " + std::to_string(settle) + " and " + std::to_string(sample));
}

bool LockstepRule::observe(const std::vector<int64_t>& clocks, const std::vector<int64_t>& interval_ns,
                           const std::vector<int64_t>& period_ns, const std::vector<bool>& finished) {
  const char* where = "LockstepRule.observe";
  const size_t n = compute_.size();
  HVD_REQUIRE(clocks.size() == n && interval_ns.size() == n && period_ns.size() == n && finished.size() == n, where,
              "every column needs one entry per rank (" + std::to_string(n) + ")");
  for (size_t q = 0; q < n; ++q) {
    HVD_REQUIRE(clocks[q] >= clocks_[q], where,
                "rank " + std::to_string(q) + "'s clock went back from " + std::to_string(clocks_[q]) + " to " +
                    std::to_string(clocks[q]));
    const int64_t pushed = clocks[q] - clocks_[q];
    if (pushed == 0) continue;
    clocks_[q] = clocks[q];
    pushes_ += pushed;
    if (lockstep_) lockstep_pushes_ += pushed;
    if (interval_ns[q] > 0) {
      const double c = static_cast<double>(interval_ns[q]);
      compute_[q] = compute_[q] < 0 ? c : compute_[q] + kAlpha * (c - compute_[q]);
    }
  }
  finished_ = finished;
  const int64_t in_mode = pushes_since_switch();
  if (in_mode < settle_ || !sample_overheads(period_ns)) return lockstep_;
  if (!explored_) {  // one measurement of each mode first: lock-step, then relaxed
    if (in_mode >= settle_ + sample_) {
      if (lockstep_)
        switch_to(false);
      else
        explored_ = true;
    }
    if (!explored_) return lockstep_;
  }
  gain_ = predicted_gain();
  if (lockstep_ && gain_ >= min_gain_ * (1 + kHysteresis))
    switch_to(false);
  else if (!lockstep_ && gain_ < min_gain_ * (1 - kHysteresis))
    switch_to(true);
  return lockstep_;
}

void LockstepRule::switch_to(bool lockstep) {
  lockstep_ = lockstep;
  since_ = clocks_;
  ++switches_;
}

int64_t LockstepRule::pushes_since_switch() const {
  int64_t fewest = -1;
  for (size_t q = 0; q < clocks_.size(); ++q)
    if (!finished_[q] && (fewest < 0 || clocks_[q] - since_[q] < fewest)) fewest = clocks_[q] - since_[q];
  return fewest < 0 ? 0 : fewest;
}

// One sample of the current mode's overhead (o_L or o_R) from the live ranks whose compute time and period are
// measured; false when fewer than two such ranks remain (nothing to choose between).
bool LockstepRule::sample_overheads(const std::vector<int64_t>& period_ns) {
  double period_sum = 0, excess_sum = 0, max_c = 0;
  int k = 0;
  for (size_t q = 0; q < compute_.size(); ++q) {
    if (finished_[q] || compute_[q] <= 0 || period_ns[q] <= 0) continue;
    const double p = static_cast<double>(period_ns[q]);
    period_sum += p;
    excess_sum += p - compute_[q];
    max_c = std::max(max_c, compute_[q]);
    ++k;
  }
  if (k < 2) return false;
  const double sample = std::max(0.0, lockstep_ ? period_sum / k - max_c : excess_sum / k);
  double& o = lockstep_ ? o_lock_ : o_relax_;
  o = o < 0 ? sample : o + kOverheadAlpha * (sample - o);
  return true;
}

double LockstepRule::predicted_gain() const {
  double relaxed = 0, max_c = 0;
  int k = 0;
  for (size_t q = 0; q < compute_.size(); ++q) {
    if (finished_[q] || compute_[q] <= 0) continue;
    relaxed += 1.0 / (compute_[q] + o_relax_);
    max_c = std::max(max_c, compute_[q]);
    ++k;
  }
  if (k < 2) return gain_;
  return relaxed / (k / (max_c + o_lock_));
}

}  // namespace hvd_elastic
