// LB-BSP batch sizing (docs/algorithms.md, "LB-BSP"; Chen et al., SoCC 2020): re-size each worker's batch b_p so
// that all workers finish an iteration together while the global batch B = sum_p b_p stays constant.
#pragma once

#include <cstdint>
#include <vector>

namespace hvd_elastic {

// CPU mode: b_p proportional to the predicted sample throughput v_p (b_p = B v_p / sum v), as integers that sum to
// exactly B with 1 <= b_p <= cap_p. The continuous target is x_p = clamp(lambda * v_p, 1, cap_p) with lambda
// chosen so that sum x_p = B (water-filling around the caps); integers are floor(x_p) plus one more sample for the
// largest remainders x_p - floor(x_p), ties to the lowest rank (largest-remainder apportionment, deterministic).
// caps empty = no cap (a cap above B is the same as B). Throws unless n >= 1, every v_p is finite and > 0,
// n <= B <= 2^40, caps >= 1 and sum(caps) >= B. O(n log n).
std::vector<int64_t> lbbsp_batch_sizes_cpu(const std::vector<double>& throughput, int64_t batch_size,
                                           const std::vector<int64_t>& caps);

// CPU mode with a dead band: `current` while its predicted finish times b_p / v_p are within `tolerance` of each
// other (max - min <= tolerance * max, the GPU mode's criterion), else the sizes lbbsp_batch_sizes_cpu gives for
// `throughput`. Without the band, timing noise between equally fast workers re-sizes them every step and creates
// the imbalance the rule is meant to remove. Throws as lbbsp_batch_sizes_cpu, and unless current has n entries in
// [1, cap_p] summing to B and tolerance is in [0, 1).
std::vector<int64_t> lbbsp_resize_cpu(const std::vector<double>& throughput, const std::vector<int64_t>& current,
                                      int64_t batch_size, const std::vector<int64_t>& caps, double tolerance);

// GPU mode state: the current sizes and the search step (samples moved per adjustment).
struct LbbspGpuState {
  std::vector<int64_t> sizes;  // b_p, sum = B
  std::vector<int64_t> caps;   // memory caps, b_p <= cap_p
  int64_t step = 1;            // samples moved per adjustment; halves when the direction reverses (>= 1)
  int window = 1;              // iterations to average step times over before the next adjustment; doubles on reversal
  int max_window = 1024;
  int last_from = -1, last_to = -1;  // the previous move, to detect a reversal
  bool converged = false;
};

// What one adjustment did.
struct LbbspMove {
  int from = -1;          // the straggler that gave samples (-1: no move)
  int to = -1;            // the fastest rank with headroom that took them
  int64_t amount = 0;     // samples moved
  bool reversed = false;  // the straggler was the previous receiver: step halved, window doubled
  bool converged = false; // finish times within tolerance: nothing to do
};

// GPU mode, one adjustment from the measured per-rank step times (ns, at the current sizes): if
// max - min <= tolerance * max the sizes are balanced; otherwise move min(step, b_s - 1, cap_f - b_f) samples from
// the straggler s (longest time, ties to the lowest rank) to the fastest rank f != s with b_f < cap_f (ties to the
// lowest rank), halving step first when s received samples in the previous move (the direction reversed).
// sum b_p = B always.
LbbspMove lbbsp_gpu_step(LbbspGpuState& state, const std::vector<int64_t>& step_times_ns, double tolerance);

// The GPU-mode controller a job holds: validated configuration plus LbbspGpuState.
class LbbspGpuController {
 public:
  // step <= 0 picks max(1, B / (4n)); sizes empty = the even split (largest remainder under the caps).
  LbbspGpuController(int64_t batch_size, std::vector<int64_t> caps, int64_t step, double tolerance, int window,
                     std::vector<int64_t> sizes);

  // Feed the step times measured at the current sizes; returns the sizes to use next.
  const std::vector<int64_t>& update(const std::vector<int64_t>& step_times_ns);

  const std::vector<int64_t>& sizes() const { return state_.sizes; }
  const std::vector<int64_t>& caps() const { return state_.caps; }
  int64_t batch_size() const { return batch_size_; }
  int64_t step() const { return state_.step; }
  int window() const { return state_.window; }
  bool converged() const { return state_.converged; }
  double tolerance() const { return tolerance_; }
  const LbbspMove& last_move() const { return last_move_; }
  int64_t moves() const { return moves_; }

 private:
  int64_t batch_size_;
  double tolerance_;
  LbbspGpuState state_;
  LbbspMove last_move_;
  int64_t moves_ = 0;
};

}  // namespace hvd_elastic
