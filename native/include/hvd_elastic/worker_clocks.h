// Per-worker clocks and iteration-time history: the state every decision rule reads.
//
// Every rank feeds the same pushes (worker, timestamp) in the same order, so every rank holds an identical
// WorkerClocks and every decision computed from it is identical, with no coordinator round-trip.
// Timestamps are integer nanoseconds (deterministic across ranks; no floating-point drift).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace hvd_elastic {

class WorkerClocks {
 public:
  // n workers; keep the latest `history` iteration intervals per worker (>= 1).
  WorkerClocks(int n, int history = 16);

  // Worker p pushed an update at time t_ns: its clock t_p advances by one and, from its second push on,
  // the interval since its previous push I_p = t_ns - last_p joins its history.
  // Throws std::invalid_argument for an unknown worker, a negative time or a time before p's last push.
  void record_push(int p, int64_t t_ns);

  // Start a new epoch of measurement (e.g. after a barrier) without touching clocks: the next push of each
  // worker does not produce an interval (the time across a barrier is not an iteration time).
  void reset_timing();

  // Set worker p's state from a summary (the sync engine's tick metadata carries clock, last push time and the
  // latest measured iteration time, not every push). Clock and last push must not go backwards; interval_ns = -1
  // means not measured yet (the history is left as is), otherwise it joins p's history when the clock advanced.
  void observe(int p, int64_t clock, int64_t last_push_ns, int64_t interval_ns);

  int size() const { return n_; }
  int64_t clock(int p) const;                  // t_p: pushes so far
  const std::vector<int64_t>& clocks() const { return clock_; }
  int64_t last_push_ns(int p) const;           // -1 before the first push (or after reset_timing)
  int64_t last_interval_ns(int p) const;       // I_p; -1 until two pushes since the last reset
  std::vector<int64_t> intervals(int p) const; // oldest first, at most `history`
  const std::vector<int64_t>& last_push_times() const { return last_; }  // last_p per worker (-1: none)
  std::vector<int64_t> last_intervals() const;  // I_p per worker (-1: not measured), the input ZipLine/DSSP read
  int history() const { return history_; }
  int64_t min_clock() const;
  int64_t max_clock() const;
  int64_t gap() const { return max_clock() - min_clock(); }
  int slowest_by_clock() const;     // min clock, ties to the lowest rank
  int fastest_by_clock() const;     // max clock, ties to the lowest rank
  int slowest_by_interval() const;  // longest last interval, ties to the lowest rank; -1 if none measured
  // Longest median of the kept history (the lower middle value for an even count): one descheduled iteration of a
  // fast worker does not make it "the slowest". Ties to the lowest rank; -1 if none measured.
  int slowest_by_median_interval() const;
  int64_t median_interval_ns(int p) const;  // -1 if p has no measured interval

 private:
  void check_worker(int p) const;
  int n_;
  int history_;
  std::vector<int64_t> clock_;
  std::vector<int64_t> last_;
  std::vector<std::deque<int64_t>> intervals_;
};

}  // namespace hvd_elastic
