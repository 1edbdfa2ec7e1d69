// SSP gate (docs/algorithms.md, "SSP"): p may start iteration t_p + 1 iff t_p - min_q t_q <= s.
#include "hvd_elastic/ssp.h"

#include <algorithm>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {

namespace {

int64_t staleness(const std::vector<int64_t>& clocks, int p, const char* where) {
  checks::nonempty_size(clocks.size(), where, "clocks");
  checks::worker_index(p, clocks.size(), where);
  checks::nonnegative_all(clocks, where, "clocks");
  return clocks[p] - *std::min_element(clocks.begin(), clocks.end());
}

int64_t staleness(const WorkerClocks& clocks, int p, const char* where) {
  checks::worker_index(p, clocks.size(), where);
  return clocks.clock(p) - clocks.min_clock();
}

void check_s(int64_t s, const char* where) {
  HVD_REQUIRE(s >= 0, where, "staleness bound s must be >= 0, got " + std::to_string(s));
}

}  // namespace

int64_t ssp_staleness(const std::vector<int64_t>& clocks, int p) { return staleness(clocks, p, "ssp_staleness"); }
int64_t ssp_staleness(const WorkerClocks& clocks, int p) { return staleness(clocks, p, "ssp_staleness"); }

bool ssp_may_proceed(const std::vector<int64_t>& clocks, int p, int64_t s) {
  check_s(s, "ssp_may_proceed");
  return staleness(clocks, p, "ssp_may_proceed") <= s;  // t_p - min_q t_q <= s (SSP(s); s = 0 is BSP)
}

bool ssp_may_proceed(const WorkerClocks& clocks, int p, int64_t s) {
  check_s(s, "ssp_may_proceed");
  return staleness(clocks, p, "ssp_may_proceed") <= s;  // t_p - min_q t_q <= s (SSP(s); s = 0 is BSP)
}

}  // namespace hvd_elastic
