// ZipLine (docs/algorithms.md, "ElasticBSP and ZipLine"): choose Z = {e_p[j_p]} minimizing d_Z = max(Z) - min(Z).
#include "hvd_elastic/zipline.h"

#include <algorithm>
#include <limits>
#include <string>

#include "hvd_elastic/checks.h"

namespace hvd_elastic {

using checks::fail;

void validate_push_time_grid(const PushTimeGrid& g, const char* where) {
  HVD_REQUIRE(g.n >= 1, where, "need at least one worker (n >= 1), got n = " + std::to_string(g.n));
  HVD_REQUIRE(g.R >= 1, where, "need at least one predicted push per worker (R >= 1), got R = " + std::to_string(g.R));
  for (int p = 0; p < g.n; ++p) {
    const int64_t first = g.at(p, 0);
    if (first < 0)
      fail(where, "predicted push times must be >= 0 ns: worker " + std::to_string(p) + " has " +
                      std::to_string(first) + " at i = 1");
    for (int i = 1; i < g.R; ++i) {
      if (g.at(p, i) < g.at(p, i - 1))
        fail(where, "predicted push times of worker " + std::to_string(p) + " must be non-decreasing: e[" +
                        std::to_string(i + 1) + "] = " + std::to_string(g.at(p, i)) + " < e[" + std::to_string(i) +
                        "] = " + std::to_string(g.at(p, i - 1)));
    }
  }
}

Barrier barrier_for_window(const PushTimeGrid& g, int64_t lo, int64_t hi) {
  Barrier b;
  b.iterations.resize(g.n);
  b.barrier_ns = hi;
  b.earliest_ns = lo;
  b.spread_ns = hi - lo;
  for (int p = 0; p < g.n; ++p) {
    // Rule 3 (zipline.h): the first point >= lo is the fewest iterations that still land inside the window.
    const int64_t* row = g.data + static_cast<size_t>(p) * g.R;
    b.iterations[p] = static_cast<int>(std::lower_bound(row, row + g.R, lo) - row) + 1;
  }
  return b;
}

namespace {

// Heap entry: a worker's current candidate point. Only the time orders the heap: the answer depends on the popped
// values alone (see the sweep below), never on which of two equal heads pops first.
struct Head {
  int64_t t;
  int p;
};

// The root's key grew: Floyd's bottom-up repair. Walk the hole down to a leaf along the smaller child (branch-free
// child choice), then sift the new entry up from there; the new head usually lands low, so this does about
// log2(n) + 1 comparisons instead of the 2 log2(n) of a top-down sift.
void replace_top(std::vector<Head>& h, Head x) {
  const size_t n = h.size();
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c + 1 < n) {
      c += static_cast<size_t>(h[c + 1].t < h[c].t);
    } else if (c >= n) {
      break;
    }
    h[i] = h[c];
    i = c;
  }
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!(x.t < h[parent].t)) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = x;
}

void build_heap(std::vector<Head>& h) {
  std::make_heap(h.begin(), h.end(), [](const Head& a, const Head& b) { return b.t < a.t; });
}

}  // namespace

Barrier zipline_barrier(const PushTimeGrid& g) {
  validate_push_time_grid(g, "zipline_barrier");
  const int n = g.n, R = g.R;
  std::vector<int> pos(n, 0);
  std::vector<Head> heap(n);
  int64_t hi = std::numeric_limits<int64_t>::min();
  for (int p = 0; p < n; ++p) {
    heap[p] = {g.at(p, 0), p};
    hi = std::max(hi, heap[p].t);
  }
  build_heap(heap);

  // Sweep: the window [heap top, hi] always holds one point per worker. At the first pop of each distinct value v
  // every head is that worker's first point >= v, so hi is the smallest feasible max(Z) for min(Z) = v; scanning
  // all v therefore finds the optimal (d_Z, max(Z)). Later pops of an equal v only yield equal-or-worse windows.
  int64_t best_spread = std::numeric_limits<int64_t>::max();
  int64_t best_hi = std::numeric_limits<int64_t>::max();
  for (;;) {
    const Head top = heap[0];
    const int64_t d_Z = hi - top.t;
    if (d_Z < best_spread || (d_Z == best_spread && hi < best_hi)) {
      best_spread = d_Z;
      best_hi = hi;
      if (d_Z == 0) break;  // hi never decreases, so no later window can beat (0, hi)
    }
    if (++pos[top.p] == R) break;  // that worker has no point >= any larger min(Z)
    const int64_t next = g.at(top.p, pos[top.p]);
    hi = std::max(hi, next);
    replace_top(heap, Head{next, top.p});
  }
  return barrier_for_window(g, best_hi - best_spread, best_hi);
}

std::vector<int64_t> predict_push_times(const std::vector<int64_t>& last_ns, const std::vector<int64_t>& interval_ns,
                                        int R) {
  const char* where = "predict_push_times";
  checks::nonempty_size(last_ns.size(), where, "last_ns");
  checks::same_length(last_ns.size(), interval_ns.size(), where, "last_ns", "interval_ns");
  HVD_REQUIRE(R >= 1, where, "lookahead R must be >= 1, got " + std::to_string(R));
  const size_t n = last_ns.size();
  HVD_REQUIRE(static_cast<int64_t>(n) * R <= checks::kMaxGridPoints, where,
              "n * R = " + std::to_string(n) + " * " + std::to_string(R) + " predicted pushes is too many (limit " +
                  std::to_string(checks::kMaxGridPoints) + ")");
  std::vector<int64_t> out(n * static_cast<size_t>(R));
  for (size_t p = 0; p < n; ++p) {
    const int64_t last = last_ns[p], I_p = interval_ns[p];
    if (I_p < 0)
      fail(where, "iteration interval I_p of worker " + std::to_string(p) + " must be >= 0 ns, got " +
                      std::to_string(I_p) + " (fewer than two pushes since the last barrier?)");
    if (last < 0)
      fail(where, "last push time of worker " + std::to_string(p) + " must be >= 0 ns, got " + std::to_string(last) +
                      " (no push recorded?)");
    if (I_p > 0 && I_p > (std::numeric_limits<int64_t>::max() - last) / R)
      fail(where, "last_p + R * I_p overflows int64 for worker " + std::to_string(p));
    // e_p[i] = last_p + i * I_p, i = 1..R (docs/algorithms.md, "ElasticBSP and ZipLine")
    for (int i = 1; i <= R; ++i) out[p * R + (i - 1)] = last + static_cast<int64_t>(i) * I_p;
  }
  return out;
}

Barrier zipline_barrier_from_intervals(const std::vector<int64_t>& last_ns, const std::vector<int64_t>& interval_ns,
                                       int R) {
  const std::vector<int64_t> e = predict_push_times(last_ns, interval_ns, R);
  return zipline_barrier(PushTimeGrid{e.data(), static_cast<int>(last_ns.size()), R});
}

}  // namespace hvd_elastic
