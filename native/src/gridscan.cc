// GridScan and FullGridScan (docs/algorithms.md, "ElasticBSP and ZipLine": the papers' reference variants), kept
// deliberately naive so their decision cost matches the complexity the papers report.
#include <algorithm>
#include <limits>

#include "hvd_elastic/zipline.h"

namespace hvd_elastic {

namespace {

// Latest point of row p not after c, by a linear scan (the papers' grid walk); -1 if every point is after c.
inline int64_t latest_not_after(const PushTimeGrid& g, int p, int64_t c) {
  const int64_t* row = g.data + static_cast<size_t>(p) * g.R;
  int64_t found = -1;
  for (int i = 0; i < g.R && row[i] <= c; ++i) found = row[i];
  return found;
}

// min(Z) when max(Z) is the candidate c and every worker takes its latest point <= c; -1 if infeasible.
inline int64_t window_low_for(const PushTimeGrid& g, int64_t c) {
  int64_t lo = c;
  for (int q = 0; q < g.n; ++q) {
    const int64_t t = latest_not_after(g, q, c);
    if (t < 0) return -1;
    if (t < lo) lo = t;
  }
  return lo;
}

}  // namespace

Barrier gridscan_barrier(const PushTimeGrid& g) {
  validate_push_time_grid(g, "gridscan_barrier");
  // The slowest worker is the one whose R-th predicted push is latest: its last point covers every other row, so
  // at least one candidate is feasible.
  int slow = 0;
  for (int p = 1; p < g.n; ++p)
    if (g.at(p, g.R - 1) > g.at(slow, g.R - 1)) slow = p;
  int64_t best_spread = std::numeric_limits<int64_t>::max(), best_hi = 0;
  for (int i = 0; i < g.R; ++i) {
    const int64_t c = g.at(slow, i);
    const int64_t lo = window_low_for(g, c);
    if (lo < 0) continue;
    const int64_t d_Z = c - lo;  // d_Z = max(Z) - min(Z) with max(Z) = c
    if (d_Z < best_spread || (d_Z == best_spread && c < best_hi)) {
      best_spread = d_Z;
      best_hi = c;
    }
  }
  // A heuristic window need not be tight, so report the choice GridScan made: each worker's latest point <= max(Z)
  // (its first occurrence, the fewest iterations), rather than barrier_for_window's rule for optimal windows.
  Barrier b;
  b.iterations.resize(g.n);
  b.barrier_ns = best_hi;
  b.earliest_ns = best_hi - best_spread;
  b.spread_ns = best_spread;
  for (int p = 0; p < g.n; ++p) {
    const int64_t* row = g.data + static_cast<size_t>(p) * g.R;
    b.iterations[p] = static_cast<int>(std::lower_bound(row, row + g.R, latest_not_after(g, p, best_hi)) - row) + 1;
  }
  return b;
}

Barrier fullgridscan_barrier(const PushTimeGrid& g) {
  validate_push_time_grid(g, "fullgridscan_barrier");
  // Exact: the optimal max(Z) is some worker's point c, and for that c taking each worker's latest point <= c
  // maximizes min(Z), so trying every c finds the optimal (d_Z, max(Z)).
  int64_t best_spread = std::numeric_limits<int64_t>::max(), best_hi = 0;
  for (int p = 0; p < g.n; ++p) {
    for (int i = 0; i < g.R; ++i) {
      const int64_t c = g.at(p, i);
      const int64_t lo = window_low_for(g, c);
      if (lo < 0) continue;
      const int64_t d_Z = c - lo;
      if (d_Z < best_spread || (d_Z == best_spread && c < best_hi)) {
        best_spread = d_Z;
        best_hi = c;
      }
    }
  }
  return barrier_for_window(g, best_hi - best_spread, best_hi);
}

}  // namespace hvd_elastic
