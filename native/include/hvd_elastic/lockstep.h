// Lock-step fallback of the gradient policies (docs/design.md, "When relaxing does not pay").
//
// A relaxed rule buys throughput (fast ranks stop waiting for slow ones) and pays for it twice: its own machinery
// (the round trip of a rank's own push, peer alignment, the rule's waits) and stale gradients. Where the first
// purchase is smaller than the two costs -- equal speeds, or speeds that change faster than predictions follow --
// BSP's pace is the better choice. This rule makes that choice at run time, from measurements only:
//
//   c_q  each live rank's step compute time: the median of the tick stream's INTERVAL over q's last kWindow observed
//        pushes, so one slow step (a page fault, a preempted core, a collector's pause) moves no decision, while a
//        rank that stays slower counts as slower after kWindow / 2 + 1 pushes (predictors.h predict_median_interval),
//   g_q  the gap between two consecutive pushes of q (the tick stream's LAST_PUSH, per push; the mean gap where a
//        tick delivers several pushes of q),
//   o_L  lock-step's cost per round beyond the slowest rank's compute: mean_q g_q - max_q INTERVAL_q over one round,
//        sampled only from a round that starts and ends at a lock-step point (every live rank pushed exactly once in
//        the tick before and in this one, and as many times since origin() after each), so neither the first,
//        uneven round after a switch nor a round that holds a collective of the script's own is counted as
//        lock-step's cost,
//   o_R  the relaxed rule's cost per step beyond a rank's compute: g_q - INTERVAL_q, sampled per push while relaxed
//        and averaged over pushes (a tick that delivers three pushes weighs three times one that delivers the
//        straggler's alone), so sum_q 1 / (c_q + o_R) is the pushes per second the ranks really made,
//   gain = [sum_q 1 / (c_q + o_R)] / [n / (max_q c_q + o_L)]   (predicted pushes per second, relaxed / lock-step).
//
// The ranks relax while gain >= min_gain: from lock-step once gain >= min_gain * (1 + kHysteresis), back to
// lock-step once gain < min_gain * (1 - kHysteresis). min_gain is the throughput a relaxed rule must promise to pay
// for its stale gradients (1.25: a quarter more pushes). The first pushes after a switch still carry the previous
// mode (a rank's first gap in relaxed mode may end a lock-step wait), so the overheads are sampled once every live
// rank has pushed `settle` times since the switch. Start: lock-step until o_L is measured (every live rank `settle` +
// `sample` pushes) -- or only `settle` pushes where the compute times alone (o_L = 0, o_R = 0) already predict the
// switch, as a persistent straggler does: o_L could only add to that gain -- then relaxed until o_R is measured
// (`settle` + `relaxed_sample`, or + `sample` where relaxing loses outright), then the model decides at every
// observation (o_L counted as 0 until lock-step is measured: the gain understated, never overstated). Relaxed is
// measured only once its gain can reach the switch: while even o_R = 0 (the ceiling) predicts less, as with equal
// speeds, the ranks stay in lock-step and the ceiling is checked at every observation instead. With `spread_only`,
// only the compute times start that first measurement (the ceiling at o_L = 0: a spread of the ranks' speeds, ranks
// that wait for another), not lock-step's own cost: for the delta policies, whose first relaxed phase takes the ranks
// off the lock-step arithmetic for the rest of the run (docs/design.md, "auto"). Every input
// comes from the tick stream, which every rank observes identically in the same order: every rank holds the same
// state at the same tick, so the ranks switch together.
#pragma once

#include <cstdint>
#include <vector>

namespace hvd_elastic {

class LockstepRule {
 public:
  static constexpr double kHysteresis = 0.05;
  static constexpr int kWindow = 7;   // pushes whose compute times' median is a rank's c_q
  // o_L and o_R: exponentially weighted means of their samples past settle (bias-corrected: close to the plain mean
  // while the samples are few, so no single first sample stands for the ones after it). o_R remembers a few seconds
  // of pushes: across hosts, stalls of a few hundred ms every few seconds are part of a relaxed rule's cost, and a
  // memory of a few ticks reads each one as the rule's new cost and sends the ranks back to lock-step for good.
  static constexpr double kLockstepAlpha = 0.05;   // per lock-step round
  static constexpr double kRelaxedAlpha = 0.005;   // per relaxed push

  // min_gain > 0; settle, sample, relaxed_sample >= 1 (pushes of every live rank): the first measurement of lock-step
  // samples `sample` pushes, the first of the relaxed rule `sample` where it shows a clear loss (gain < 1: fewer
  // pushes per second than lock-step) and `relaxed_sample` otherwise (longer: a relaxed rule's cost moves more, e.g.
  // with the network's stalls, and its first measurement decides whether relaxing is measured again).
  LockstepRule(int n, double min_gain, int64_t settle, int64_t sample, int64_t relaxed_sample,
               bool spread_only = false);

  // One tick's table: per rank the pushes delivered (clock), the latest push's step compute time and the time of the
  // latest push (ns on one clock per rank; <= 0: not measured yet), finished flags, and (optional: empty = none)
  // whether the rank waits in a collective of the script's own. Returns lockstep() after it.
  bool observe(const std::vector<int64_t>& clocks, const std::vector<int64_t>& interval_ns,
               const std::vector<int64_t>& last_push_ns, const std::vector<bool>& finished,
               const std::vector<bool>& outside = {});

  bool lockstep() const { return lockstep_; }
  // the latest prediction (its ceiling until o_R is measured; with spread_only, the compute times' alone until
  // then); 0 until o_L is
  double gain() const { return gain_; }
  double overhead_lockstep_ns() const { return lock_mean_.value(); }  // o_L; -1 until measured
  double overhead_relaxed_ns() const { return relax_mean_.value(); }  // o_R; -1 until measured
  int64_t switches() const { return switches_; }
  const std::vector<int64_t>& switch_pushes() const { return switch_pushes_; }  // pushes() at each switch
  int64_t lockstep_pushes() const { return lockstep_pushes_; }  // pushes delivered while in lock-step
  int64_t pushes() const { return pushes_; }
  // Where lock-step rounds count from: each rank's clock (pushes delivered) at the last switch, or at the latest tick
  // that showed a live rank waiting in a collective of the script's own (the script lines the ranks up there); 0
  // before either. So a rank that ran ahead while relaxed keeps its lead instead of waiting for the others to catch
  // up with it -- unless the script's own collective makes it wait for them, and then the rounds start after it.
  const std::vector<int64_t>& origin() const { return origin_; }
  int size() const { return static_cast<int>(compute_.size()); }
  double min_gain() const { return min_gain_; }

 private:
  void switch_to(bool lockstep);
  bool complete_round(const std::vector<int64_t>& pushed) const;
  void sample_overhead(const std::vector<double>& gap, const std::vector<int64_t>& pushed,
                       const std::vector<int64_t>& interval_ns, bool lockstep_round);
  int measured_ranks() const;
  double gain_at(double o_relax) const;  // the model's gain at that o_R (0: its ceiling) and the measured o_L
  double gain_at(double o_relax, double o_lock) const;  // ... at that o_R and o_L (both 0: the compute times' alone)

  double min_gain_;
  int64_t settle_, sample_, relaxed_sample_;
  bool spread_only_;
  std::vector<int64_t> clocks_;
  std::vector<double> compute_;   // c_q, -1 until measured
  std::vector<std::vector<int64_t>> recent_;   // each rank's latest compute times (ns), up to kWindow, oldest first
  std::vector<int64_t> last_push_;  // each rank's latest push time as of the last observation, -1 until known
  bool round_before_ = false;     // the last observation that delivered pushes was a complete round
  bool lockstep_ = true;
  bool explored_ = false;         // both modes measured once: the model decides
  int64_t pushes_since_switch() const;  // the fewest pushes of a live rank since the last switch
  std::vector<int64_t> since_;    // each rank's clock at the last switch
  std::vector<int64_t> origin_;   // origin()
  std::vector<bool> finished_;   // as of the last observation
  int64_t pushes_ = 0, lockstep_pushes_ = 0, switches_ = 0;
  std::vector<int64_t> switch_pushes_;
  double gain_ = 0;
  struct Mean {   // exponentially weighted, bias-corrected: sum(w_i x_i) / sum(w_i) with w_i = (1 - alpha)^age
    double num = 0, den = 0;
    void add(double total, double weight, double alpha);   // `weight` samples summing to `total`
    double value() const;   // the mean, clamped at 0 (an overhead); -1 before any sample
  };
  Mean lock_mean_, relax_mean_;
};

}  // namespace hvd_elastic
