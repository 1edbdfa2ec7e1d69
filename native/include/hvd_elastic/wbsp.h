// WBSP download gate (docs/algorithms.md, "WBSP"; Yang et al., Parallel Computing 2024).
//
// Every worker uploads after every local step; worker p may download the global model only after the slowest worker
// (longest measured iteration time: WorkerClocks::slowest_by_interval) has uploaded since p's last download, so
// every download sees a model that includes the slowest worker's latest contribution.
#pragma once

#include <cstdint>
#include <vector>

namespace hvd_elastic {

// uploaded[q]: has worker q uploaded since p's last download. slowest: index of the slowest worker, or -1 while some
// worker's iteration time is not measured yet (an unmeasured worker may be the slowest), in which case p waits for
// every worker's upload (a BSP-like, safe start).
bool wbsp_may_download(const std::vector<bool>& uploaded_since_last_download, int slowest);

// Upload/download bookkeeping for a job: every upload gets a global sequence number; q has uploaded since p's last
// download iff q's latest upload is newer than p's latest download. O(n) memory, O(1) gate.
class WbspState {
 public:
  explicit WbspState(int n);

  void on_upload(int q);    // q's model delta is in the global model
  void on_download(int p);  // p pulled the global model
  bool may_download(int p, int slowest) const;
  std::vector<bool> uploaded_since_last_download(int p) const;

  int size() const { return static_cast<int>(last_upload_.size()); }
  int64_t uploads(int q) const;    // uploads by q so far
  int64_t downloads(int p) const;  // downloads by p so far

 private:
  void check(int p, const char* where) const;
  int64_t seq_ = 0;                  // global event counter
  std::vector<int64_t> last_upload_;    // sequence number of q's latest upload, 0 = never
  std::vector<int64_t> last_download_;  // sequence number at p's latest download, 0 = never
  std::vector<int64_t> uploads_, downloads_;
};

}  // namespace hvd_elastic
