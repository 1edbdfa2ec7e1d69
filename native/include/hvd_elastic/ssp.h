// SSP gate (docs/algorithms.md, "SSP"; Ho et al., NIPS 2013).
//
// Clocks t_q count completed pushes. Worker p, having pushed t_p updates, asks whether it may START iteration
// t_p + 1. It may iff its staleness t_p - min_q t_q <= s: the model it reads then misses at most s of the slowest
// worker's updates. So every iteration starts with staleness <= s (the gap the gate admits never exceeds s), and
// s = 0 is BSP: nobody starts iteration k+1 before every worker has pushed k. The completed-push gap
// max_q t_q - min_q t_q can momentarily read s + 1 (an admitted worker's push lands before the slowest's), after
// which that worker waits; that is BSP's own transient at s = 0.
#pragma once

#include <cstdint>
#include <vector>

#include "hvd_elastic/worker_clocks.h"

namespace hvd_elastic {

// t_p - min_q t_q: how many of the slowest worker's updates p's next iteration would miss.
int64_t ssp_staleness(const std::vector<int64_t>& clocks, int p);
int64_t ssp_staleness(const WorkerClocks& clocks, int p);

// May worker p start its next iteration under SSP(s)? (t_p - min_q t_q) <= s.
bool ssp_may_proceed(const std::vector<int64_t>& clocks, int p, int64_t s);
bool ssp_may_proceed(const WorkerClocks& clocks, int p, int64_t s);

}  // namespace hvd_elastic
