#include "hvd_elastic/worker_clocks.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {

WorkerClocks::WorkerClocks(int n, int history) : n_(n), history_(history) {
  if (n < 1) throw std::invalid_argument("WorkerClocks: n must be >= 1, got " + std::to_string(n));
  if (n > checks::kMaxWorkers)
    throw std::invalid_argument("WorkerClocks: n must be <= " + std::to_string(checks::kMaxWorkers) + ", got " +
                                std::to_string(n));
  if (history < 1) throw std::invalid_argument("WorkerClocks: history must be >= 1, got " + std::to_string(history));
  clock_.assign(n, 0);
  last_.assign(n, -1);
  intervals_.assign(n, {});
}

void WorkerClocks::check_worker(int p) const {
  if (p < 0 || p >= n_)
    throw std::invalid_argument("worker " + std::to_string(p) + " out of range [0, " + std::to_string(n_) + ")");
}

void WorkerClocks::record_push(int p, int64_t t_ns) {
  check_worker(p);
  if (t_ns < 0) throw std::invalid_argument("push time must be >= 0 ns, got " + std::to_string(t_ns));
  if (last_[p] >= 0) {
    if (t_ns < last_[p])
      throw std::invalid_argument("push times of worker " + std::to_string(p) + " must not decrease: " +
                                  std::to_string(t_ns) + " < " + std::to_string(last_[p]));
    intervals_[p].push_back(t_ns - last_[p]);
    if (static_cast<int>(intervals_[p].size()) > history_) intervals_[p].pop_front();
  }
  last_[p] = t_ns;
  ++clock_[p];
}

void WorkerClocks::observe(int p, int64_t clock, int64_t last_push_ns, int64_t interval_ns) {
  check_worker(p);
  if (clock < clock_[p])
    throw std::invalid_argument("observe: clock of worker " + std::to_string(p) + " must not decrease: " +
                                std::to_string(clock) + " < " + std::to_string(clock_[p]));
  if (last_push_ns < -1 || (last_[p] >= 0 && last_push_ns >= 0 && last_push_ns < last_[p]))
    throw std::invalid_argument("observe: last push time of worker " + std::to_string(p) +
                                " must be -1 or not before the previous one, got " + std::to_string(last_push_ns));
  if (interval_ns < -1)
    throw std::invalid_argument("observe: interval must be >= 0 ns or -1 (unknown), got " +
                                std::to_string(interval_ns));
  const bool new_push = clock > clock_[p];  // the same summary seen twice must not duplicate history
  clock_[p] = clock;
  if (last_push_ns >= 0) last_[p] = last_push_ns;
  if (interval_ns >= 0 && (new_push || intervals_[p].empty())) {
    intervals_[p].push_back(interval_ns);
    if (static_cast<int>(intervals_[p].size()) > history_) intervals_[p].pop_front();
  }
}

void WorkerClocks::reset_timing() {
  std::fill(last_.begin(), last_.end(), -1);
  for (auto& h : intervals_) h.clear();
}

int64_t WorkerClocks::clock(int p) const { check_worker(p); return clock_[p]; }
int64_t WorkerClocks::last_push_ns(int p) const { check_worker(p); return last_[p]; }

int64_t WorkerClocks::last_interval_ns(int p) const {
  check_worker(p);
  return intervals_[p].empty() ? -1 : intervals_[p].back();
}

std::vector<int64_t> WorkerClocks::intervals(int p) const {
  check_worker(p);
  return {intervals_[p].begin(), intervals_[p].end()};
}

std::vector<int64_t> WorkerClocks::last_intervals() const {
  std::vector<int64_t> out(n_);
  for (int p = 0; p < n_; ++p) out[p] = intervals_[p].empty() ? -1 : intervals_[p].back();
  return out;
}

int64_t WorkerClocks::min_clock() const { return *std::min_element(clock_.begin(), clock_.end()); }
int64_t WorkerClocks::max_clock() const { return *std::max_element(clock_.begin(), clock_.end()); }

int WorkerClocks::slowest_by_clock() const {
  return static_cast<int>(std::min_element(clock_.begin(), clock_.end()) - clock_.begin());
}
int WorkerClocks::fastest_by_clock() const {
  return static_cast<int>(std::max_element(clock_.begin(), clock_.end()) - clock_.begin());
}

int WorkerClocks::slowest_by_interval() const {
  int best = -1;
  int64_t best_i = -1;
  for (int p = 0; p < n_; ++p) {
    int64_t i = intervals_[p].empty() ? -1 : intervals_[p].back();
    if (i > best_i) { best_i = i; best = p; }
  }
  return best;
}

int64_t WorkerClocks::median_interval_ns(int p) const {
  check_worker(p);
  if (intervals_[p].empty()) return -1;
  std::vector<int64_t> v(intervals_[p].begin(), intervals_[p].end());
  const auto mid = v.begin() + (v.size() - 1) / 2;  // lower middle
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

int WorkerClocks::slowest_by_median_interval() const {
  int best = -1;
  int64_t best_i = -1;
  for (int p = 0; p < n_; ++p) {
    const int64_t i = median_interval_ns(p);
    if (i > best_i) { best_i = i; best = p; }
  }
  return best;
}

}  // namespace hvd_elastic
