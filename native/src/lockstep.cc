// Lock-step fallback of the gradient policies (lockstep.h).
#include "hvd_elastic/lockstep.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hvd_elastic/checks.h"
#include "hvd_elastic/predictors.h"

namespace hvd_elastic {

LockstepRule::LockstepRule(int n, double min_gain, int64_t settle, int64_t sample, int64_t relaxed_sample,
                           bool spread_only)
    : min_gain_(min_gain), settle_(settle), sample_(sample), relaxed_sample_(relaxed_sample),
      spread_only_(spread_only), clocks_(n, 0),
      compute_(n, -1.0), recent_(n), last_push_(n, -1), since_(n, 0), origin_(n, 0), finished_(n, false) {
  const char* where = "LockstepRule";
  HVD_REQUIRE(n >= 1 && n <= checks::kMaxWorkers, where,
              "n must be in [1, " + std::to_string(checks::kMaxWorkers) + "], got " + std::to_string(n));
  HVD_REQUIRE(std::isfinite(min_gain) && min_gain > 0, where,
              "min_gain must be a finite number > 0, got " + std::to_string(min_gain));
  HVD_REQUIRE(settle >= 1 && sample >= 1 && relaxed_sample >= 1, where,
              "settle, sample and relaxed_sample must be >= 1 push, got " + std::to_string(settle) + ", " +
                  std::to_string(sample) + " and " + std::to_string(relaxed_sample));
}

bool LockstepRule::observe(const std::vector<int64_t>& clocks, const std::vector<int64_t>& interval_ns,
                           const std::vector<int64_t>& last_push_ns, const std::vector<bool>& finished,
                           const std::vector<bool>& outside) {
  const char* where = "LockstepRule.observe";
  const size_t n = compute_.size();
  HVD_REQUIRE(clocks.size() == n && interval_ns.size() == n && last_push_ns.size() == n && finished.size() == n &&
                  (outside.empty() || outside.size() == n),
              where, "every column needs one entry per rank (" + std::to_string(n) + ")");
  std::vector<int64_t> pushed(n, 0);
  std::vector<double> gap(n, -1.0);  // this observation's gap between consecutive pushes of each rank that pushed
  int64_t delivered = 0;
  for (size_t q = 0; q < n; ++q) {
    HVD_REQUIRE(clocks[q] >= clocks_[q], where,
                "rank " + std::to_string(q) + "'s clock went back from " + std::to_string(clocks_[q]) + " to " +
                    std::to_string(clocks[q]));
    pushed[q] = clocks[q] - clocks_[q];
    if (pushed[q] == 0) continue;
    delivered += pushed[q];
    clocks_[q] = clocks[q];
    if (last_push_[q] > 0 && last_push_ns[q] > last_push_[q])
      gap[q] = static_cast<double>(last_push_ns[q] - last_push_[q]) / static_cast<double>(pushed[q]);
    if (last_push_ns[q] > 0) last_push_[q] = last_push_ns[q];
    if (interval_ns[q] > 0) {   // c_q: the median of the rank's last kWindow compute times (predictors.h)
      std::vector<int64_t>& recent = recent_[q];
      if (recent.size() == static_cast<size_t>(kWindow)) recent.erase(recent.begin());
      recent.push_back(interval_ns[q]);
      compute_[q] = static_cast<double>(predict_median_interval(recent, kWindow));
    }
  }
  pushes_ += delivered;
  if (lockstep_) lockstep_pushes_ += delivered;
  finished_ = finished;
  bool in_call = false;   // a live rank waits in a collective of the script's own
  for (size_t q = 0; q < outside.size(); ++q) in_call = in_call || (outside[q] && !finished[q]);
  const int64_t in_mode = pushes_since_switch();
  if (delivered > 0) {
    const bool round = complete_round(pushed);
    if (in_mode >= settle_) sample_overhead(gap, pushed, interval_ns, round && round_before_);
    round_before_ = round;
  }
  if (in_call) {  // the script's collective lines the ranks up: rounds count from here, and the next one holds it
    origin_ = clocks_;
    round_before_ = false;
  }
  if (in_mode < settle_ || measured_ranks() < 2) return lockstep_;
  // At the start, where the ranks' compute times alone promise the switch (lock-step's cost could only add to the
  // gain), lock-step's cost cannot change the choice: relaxed is measured at once.
  const bool compute_clears = lockstep_ && !explored_ && gain_at(0, 0) >= min_gain_ * (1 + kHysteresis);
  if (!explored_ && !compute_clears) {  // one measurement of each mode first: lock-step, then relaxed where it can pay
    if (spread_only_ && lockstep_) {   // ... where the compute times alone promise it (compute_clears), and only there
      gain_ = gain_at(0, 0);
      return lockstep_;
    }
    if (in_mode < settle_ + sample_ || (lockstep_ ? lock_mean_ : relax_mean_).value() < 0) return lockstep_;
    // relaxed: `sample` pushes settle a clear loss (fewer pushes per second than lock-step); a gain near the switch
    // takes `relaxed_sample`, so that one stall cannot decide it
    if (!lockstep_ && in_mode < settle_ + relaxed_sample_ && gain_at(relax_mean_.value()) >= 1.0) return lockstep_;
    explored_ = !lockstep_;
  }
  // Until relaxed is measured, the gain's ceiling decides whether measuring it can pay.
  gain_ = gain_at(explored_ ? relax_mean_.value() : 0);
  if (lockstep_ && gain_ >= min_gain_ * (1 + kHysteresis))
    switch_to(false);
  else if (!lockstep_ && gain_ < min_gain_ * (1 - kHysteresis))
    switch_to(true);
  return lockstep_;
}

void LockstepRule::switch_to(bool lockstep) {
  lockstep_ = lockstep;
  since_ = origin_ = clocks_;
  round_before_ = false;
  ++switches_;
  switch_pushes_.push_back(pushes_);
}

int64_t LockstepRule::pushes_since_switch() const {
  int64_t fewest = -1;
  for (size_t q = 0; q < clocks_.size(); ++q)
    if (!finished_[q] && (fewest < 0 || clocks_[q] - since_[q] < fewest)) fewest = clocks_[q] - since_[q];
  return fewest < 0 ? 0 : fewest;
}

// A round at a lock-step point: every live rank pushed exactly once in this observation and every live rank has
// pushed as many times since origin() after it (so each rank's gap since its previous push is one round, when the
// observation before was one too).
bool LockstepRule::complete_round(const std::vector<int64_t>& pushed) const {
  int64_t ran = -1;
  for (size_t q = 0; q < pushed.size(); ++q) {
    if (finished_[q]) continue;
    if (pushed[q] != 1 || (ran >= 0 && clocks_[q] - origin_[q] != ran)) return false;
    ran = clocks_[q] - origin_[q];
  }
  return ran >= 0;
}

// One sample of the current mode's overhead, where this observation holds one: lock-step, a round between two
// lock-step points (mean gap of the live ranks - the slowest live rank's compute in it); relaxed, each push's gap
// beyond its step's compute, weighted by the pushes (a rank that pushed k times since the last observation adds
// k pushes of its mean gap).
void LockstepRule::sample_overhead(const std::vector<double>& gap, const std::vector<int64_t>& pushed,
                                   const std::vector<int64_t>& interval_ns, bool lockstep_round) {
  double sum = 0, max_c = 0;
  int64_t k = 0, weight = 0;
  for (size_t q = 0; q < gap.size(); ++q) {
    if (finished_[q] || pushed[q] == 0) continue;
    if (gap[q] < 0 || compute_[q] <= 0) {
      if (lockstep_) return;  // a round counts only with every live rank's gap
      continue;
    }
    const double c = pushed[q] == 1 && interval_ns[q] > 0 ? static_cast<double>(interval_ns[q]) : compute_[q];
    sum += lockstep_ ? gap[q] : static_cast<double>(pushed[q]) * (gap[q] - c);
    max_c = std::max(max_c, c);
    ++k;
    weight += pushed[q];
  }
  if (k == 0 || (lockstep_ && (!lockstep_round || k < 2))) return;
  if (lockstep_)
    lock_mean_.add(sum / static_cast<double>(k) - max_c, 1, kLockstepAlpha);
  else
    relax_mean_.add(sum, static_cast<double>(weight), kRelaxedAlpha);
}

void LockstepRule::Mean::add(double total, double weight, double alpha) {
  const double keep = std::pow(1.0 - alpha, weight);
  num = keep * num + total;
  den = keep * den + weight;
}

double LockstepRule::Mean::value() const { return den > 0 ? std::max(0.0, num / den) : -1.0; }

// Live ranks whose compute time is measured (fewer than two: nothing to choose between).
int LockstepRule::measured_ranks() const {
  int k = 0;
  for (size_t q = 0; q < compute_.size(); ++q)
    if (!finished_[q] && compute_[q] > 0) ++k;
  return k;
}

// The model's gain with the relaxed rule costing o_relax per step beyond a rank's compute. gain_at(0) is its ceiling:
// no measurement of o_R can predict more, so below the switch relaxed is not worth measuring. Before lock-step's cost
// is measured it counts as 0: the gain is then understated, never overstated.
double LockstepRule::gain_at(double o_relax) const { return gain_at(o_relax, std::max(0.0, lock_mean_.value())); }

double LockstepRule::gain_at(double o_relax, double o_lock) const {
  double relaxed = 0, max_c = 0;
  int k = 0;
  for (size_t q = 0; q < compute_.size(); ++q) {
    if (finished_[q] || compute_[q] <= 0) continue;
    relaxed += 1.0 / (compute_[q] + o_relax);
    max_c = std::max(max_c, compute_[q]);
    ++k;
  }
  if (k < 2) return gain_;
  return relaxed / (k / (max_c + o_lock));
}

}  // namespace hvd_elastic
