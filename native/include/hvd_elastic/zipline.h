// ElasticBSP barrier placement (docs/algorithms.md, "ElasticBSP and ZipLine"): ZipLine and the papers' reference
// variants GridScan and FullGridScan.
//
// Input: for each of n workers its next R predicted push times e_p[1..R] (integer ns, >= 0, non-decreasing).
// Output: one point per worker, Z = {e_p[j_p]}, and the barrier time max(Z).
//
// Order on solutions (every variant and the test oracle use the same one, so all ranks agree bit for bit):
//   1. smallest d_Z = max(Z) - min(Z)   (the fastest worker's wait, the paper's cost);
//   2. then the smallest max(Z)         ("ties go to the earliest barrier");
//   3. then, for that window [max(Z) - d_Z, max(Z)], each worker takes its FIRST point >= max(Z) - d_Z.
// Rule 3 is well defined because, once (d_Z, max(Z)) is optimal, every choice with all points inside the window has
// exactly that d_Z and max(Z); the first point is the fewest iterations, so the resulting j vector is the
// component-wise (hence lexicographically) smallest optimal one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvd_elastic {

// Read-only view of a row-major n x R matrix of predicted push times: row p is e_p[1..R].
struct PushTimeGrid {
  const int64_t* data;
  int n;
  int R;
  int64_t at(int p, int i) const { return data[static_cast<size_t>(p) * R + i]; }  // i is 0-based
};

// A barrier decision: worker p runs iterations[p] (= j_p, 1-based, 1..R) more iterations, then waits.
struct Barrier {
  std::vector<int> iterations;  // j_p
  int64_t barrier_ns = 0;       // max(Z): when the last worker arrives
  int64_t earliest_ns = 0;      // min(Z): when the first worker arrives and starts waiting
  int64_t spread_ns = 0;        // d_Z = max(Z) - min(Z)
};

// Throws std::invalid_argument unless n >= 1, R >= 1 and every row is non-negative and non-decreasing.
void validate_push_time_grid(const PushTimeGrid& g, const char* where);

// Exact, O(nR log n): min-heap sweep over the merged points ("smallest range covering all n lists").
Barrier zipline_barrier(const PushTimeGrid& g);

// The papers' O(R^2 n) heuristic [reconstructed]: candidate barriers are only the slowest worker's points (the row
// whose last point is latest, ties to the lowest index); each other worker takes its latest point not after the
// candidate (its first occurrence), found by a linear scan. Optimal whenever the best barrier is a point of that
// worker; never better than ZipLine. Its window need not be tight, so it reports the choice it made (not rule 3).
Barrier gridscan_barrier(const PushTimeGrid& g);

// Exact, O(R^2 n^2): every point of every worker is a candidate max(Z); each worker takes its latest point not
// after it (linear scan); the best candidate under the order above wins.
Barrier fullgridscan_barrier(const PushTimeGrid& g);

// e_p[i] = last_p + i * I_p for i = 1..R (the papers' last-interval prediction), row-major n x R.
// I_p may be 0; -1 (not yet measured) and overflow are errors.
std::vector<int64_t> predict_push_times(const std::vector<int64_t>& last_ns, const std::vector<int64_t>& interval_ns,
                                        int R);

// zipline_barrier over predict_push_times(last_ns, interval_ns, R).
Barrier zipline_barrier_from_intervals(const std::vector<int64_t>& last_ns, const std::vector<int64_t>& interval_ns,
                                       int R);

// Given an optimal window [lo, hi] that covers every row, apply rule 3 above.
Barrier barrier_for_window(const PushTimeGrid& g, int64_t lo, int64_t hi);

}  // namespace hvd_elastic
