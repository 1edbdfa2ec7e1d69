// DSSP: Dynamic Stale Synchronous Parallel (docs/algorithms.md, "DSSP"; Zhao et al., ICDCS 2019).
//
// The user gives [s_L, s_U]; r_max = s_U - s_L. Each worker carries a credit r_p of extra iterations it may run
// beyond s_L. Staleness is SSP's: t_p - min_q t_q at the moment p would start its next iteration (ssp.h).
// Guarantee: no iteration ever starts with staleness above s_U (credits are capped so that the last one is spent at
// staleness s_U at most); s_L = s_U = 0 is BSP.
#pragma once

#include <cstdint>
#include <vector>

#include "hvd_elastic/worker_clocks.h"

namespace hvd_elastic {

// SyncController: Sim_p[i] = last_p + i*I_p and Sim_s[k] = last_s + (k+1)*I_s for i, k in [0, r_max];
// returns r* = argmin_i min_k |Sim_s[k] - Sim_p[i]|, ties to the smallest i (fewest extra iterations).
// O(r_max) with two pointers. All times in ns, >= 0.
int dssp_sync_controller(int64_t last_p, int64_t interval_p, int64_t last_s, int64_t interval_s, int r_max);

struct DsspDecision {
  bool proceed = false;  // may p start its next iteration now
  int credit = 0;        // r_p after this decision
  int granted = -1;      // extra iterations granted by the SyncController at this push; -1 if it did not run
};

// The credit rule, applied when p has just pushed (clocks already record the push), p holding credit r_p:
//   r_p > 0                      -> spend one, proceed;
//   t_p - t_min <= s_L           -> proceed;
//   p is a fastest worker        -> r* = SyncController(p, slowest), capped at s_U - (t_p - t_min) + 1; if r* > 0
//                                   proceed now (the first extra iteration) and keep r* - 1 credits;
//   otherwise                    -> wait until t_p - t_min <= s_L again (dssp_may_resume).
// The slowest worker is the one with the smallest clock (ties to the lowest rank). If either worker's interval is
// not measured yet the controller cannot simulate, and p waits.
DsspDecision dssp_credit(const WorkerClocks& clocks, int p, int credit_p, int s_lower, int s_upper);

// A worker refused by dssp_credit may resume once its staleness is back within s_L.
bool dssp_may_resume(const WorkerClocks& clocks, int p, int s_lower);

// Per-worker credits for a whole job; every rank feeds the same pushes and holds the same state.
class DsspState {
 public:
  DsspState(int n, int s_lower, int s_upper);

  // p has just pushed (record it in `clocks` first): may it start its next iteration now?
  bool on_push(const WorkerClocks& clocks, int p);
  // p is waiting after a refused push: may it start now?
  bool may_resume(const WorkerClocks& clocks, int p) const;

  int size() const { return static_cast<int>(credit_.size()); }
  int s_lower() const { return s_lower_; }
  int s_upper() const { return s_upper_; }
  int r_max() const { return s_upper_ - s_lower_; }
  int credit(int p) const;
  const std::vector<int>& credits() const { return credit_; }
  int64_t grants() const { return grants_; }                  // pushes at which the SyncController granted r* > 0
  int64_t refusals() const { return refusals_; }              // pushes after which the worker had to wait
  int64_t max_staleness_admitted() const { return max_admitted_; }  // largest t_p - t_min on_push let through

 private:
  void check_clocks(const WorkerClocks& clocks, int p, const char* where) const;
  int s_lower_, s_upper_;
  std::vector<int> credit_;
  int64_t grants_ = 0, refusals_ = 0, max_admitted_ = 0;
};

}  // namespace hvd_elastic
