// WBSP download gate (docs/algorithms.md, "WBSP"): download only after the slowest worker's upload is in.
#include "hvd_elastic/wbsp.h"

#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {

bool wbsp_may_download(const std::vector<bool>& uploaded, int slowest) {
  const char* where = "wbsp_may_download";
  checks::nonempty_size(uploaded.size(), where, "uploaded_since_last_download");
  HVD_REQUIRE(slowest >= -1 && slowest < static_cast<int>(uploaded.size()), where,
              "slowest " + std::to_string(slowest) + " out of range [-1, " + std::to_string(uploaded.size()) +
                  ") (-1 = not measured yet)");
  if (slowest >= 0) return uploaded[slowest];
  for (bool u : uploaded)  // slowest unknown: wait for everyone, as BSP would
    if (!u) return false;
  return true;
}

WbspState::WbspState(int n) {
  HVD_REQUIRE(n >= 1 && n <= checks::kMaxWorkers, "WbspState",
              "n must be in [1, " + std::to_string(checks::kMaxWorkers) + "], got " + std::to_string(n));
  last_upload_.assign(n, 0);
  last_download_.assign(n, 0);
  uploads_.assign(n, 0);
  downloads_.assign(n, 0);
}

void WbspState::check(int p, const char* where) const { checks::worker_index(p, last_upload_.size(), where); }

void WbspState::on_upload(int q) {
  check(q, "WbspState.on_upload");
  last_upload_[q] = ++seq_;
  ++uploads_[q];
}

void WbspState::on_download(int p) {
  check(p, "WbspState.on_download");
  last_download_[p] = ++seq_;
  ++downloads_[p];
}

std::vector<bool> WbspState::uploaded_since_last_download(int p) const {
  check(p, "WbspState.uploaded_since_last_download");
  std::vector<bool> out(last_upload_.size());
  for (size_t q = 0; q < out.size(); ++q) out[q] = last_upload_[q] > last_download_[p];
  return out;
}

bool WbspState::may_download(int p, int slowest) const {
  check(p, "WbspState.may_download");
  HVD_REQUIRE(slowest >= -1 && slowest < size(), "WbspState.may_download",
              "slowest " + std::to_string(slowest) + " out of range [-1, " + std::to_string(size()) +
                  ") (-1 = not measured yet)");
  if (slowest >= 0) return last_upload_[slowest] > last_download_[p];  // O(1) on the hot path
  return wbsp_may_download(uploaded_since_last_download(p), slowest);
}

int64_t WbspState::uploads(int q) const {
  check(q, "WbspState.uploads");
  return uploads_[q];
}

int64_t WbspState::downloads(int p) const {
  check(p, "WbspState.downloads");
  return downloads_[p];
}

}  // namespace hvd_elastic
