// Lock-step fallback of the gradient policies (docs/design.md, "When relaxing does not pay").
//
// A relaxed rule buys throughput (fast ranks stop waiting for slow ones) and pays for it twice: its own machinery
// (the round trip of a rank's own push, peer alignment, the rule's waits) and stale gradients. Where the first
// purchase is smaller than the two costs -- equal speeds, or speeds that change faster than predictions follow --
// BSP's pace is the better choice. This rule makes that choice at run time, from measurements only:
//
//   c_q  each live rank's step compute time (a moving average of the tick stream's INTERVAL, per push of q),
//   P_q  each live rank's push period (the tick stream's PERIOD, itself a moving average),
//   o_L  lock-step's cost per round beyond the slowest rank's compute: mean_q P_q - max_q c_q, measured while the
//        ranks go in lock-step,
//   o_R  the relaxed rule's cost per step beyond a rank's compute: mean_q (P_q - c_q), measured while relaxed,
//   gain = [sum_q 1 / (c_q + o_R)] / [n / (max_q c_q + o_L)]   (predicted pushes per second, relaxed / lock-step).
//
// The ranks relax while gain >= min_gain: from lock-step once gain >= min_gain * (1 + kHysteresis), back to
// lock-step once gain < min_gain * (1 - kHysteresis). min_gain is the throughput a relaxed rule must promise to pay
// for its stale gradients (1.25: a quarter more pushes). A period reflects a new mode only after a few pushes of its
// rank (and the first period after a switch to lock-step holds the wait for the slowest rank to catch up), so the
// overheads are sampled once every live rank has pushed `settle` times since the switch. Start: lock-step until o_L
// is measured (every live rank `settle` + `sample` pushes), then relaxed until o_R is (the same), then the model
// decides at every observation. Every input comes from the tick stream, which every rank observes identically in
// the same order: every rank holds the same state at the same tick, so the ranks switch together.
#pragma once

#include <cstdint>
#include <vector>

namespace hvd_elastic {

class LockstepRule {
 public:
  static constexpr double kHysteresis = 0.05;
  static constexpr double kAlpha = 0.2;          // moving average of a rank's compute time, per push of the rank
  static constexpr double kOverheadAlpha = 0.05;  // moving average of o_L / o_R, per observation past settle

  // min_gain > 0; settle, sample >= 1 (pushes of every live rank).
  LockstepRule(int n, double min_gain, int64_t settle, int64_t sample);

  // One tick's table: per rank the pushes delivered (clock), the latest step compute time and the push period (ns;
  // <= 0: not measured yet), finished flags. Returns lockstep() after the observation.
  bool observe(const std::vector<int64_t>& clocks, const std::vector<int64_t>& interval_ns,
               const std::vector<int64_t>& period_ns, const std::vector<bool>& finished);

  bool lockstep() const { return lockstep_; }
  double gain() const { return gain_; }                  // the latest prediction; 0 until both overheads are measured
  double overhead_lockstep_ns() const { return o_lock_; }  // o_L; -1 until measured
  double overhead_relaxed_ns() const { return o_relax_; }  // o_R; -1 until measured
  int64_t switches() const { return switches_; }
  int64_t lockstep_pushes() const { return lockstep_pushes_; }  // pushes delivered while in lock-step
  int64_t pushes() const { return pushes_; }
  int size() const { return static_cast<int>(compute_.size()); }
  double min_gain() const { return min_gain_; }

 private:
  void switch_to(bool lockstep);
  bool sample_overheads(const std::vector<int64_t>& period_ns);
  double predicted_gain() const;

  double min_gain_;
  int64_t settle_, sample_;
  std::vector<int64_t> clocks_;
  std::vector<double> compute_;   // c_q, -1 until measured
  bool lockstep_ = true;
  bool explored_ = false;         // both modes measured once: the model decides
  int64_t pushes_since_switch() const;  // the fewest pushes of a live rank since the last switch
  std::vector<int64_t> since_;    // each rank's clock at the last switch
  std::vector<bool> finished_;   // as of the last observation
  int64_t pushes_ = 0, lockstep_pushes_ = 0, switches_ = 0;
  double o_lock_ = -1, o_relax_ = -1, gain_ = 0;
};

}  // namespace hvd_elastic
