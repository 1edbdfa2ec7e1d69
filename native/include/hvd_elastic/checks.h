// Argument checks shared by the decision rules. Every violation throws std::invalid_argument (Python: ValueError)
// with a message naming the function, the argument and the offending value, so bad input never crashes a rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvd_elastic {
namespace checks {

// Size limits, far above any real job, that keep a malformed argument from allocating gigabytes or looping for
// minutes: they turn into a ValueError instead.
constexpr int kMaxWorkers = 1 << 17;               // n for the stateful classes
constexpr int64_t kMaxGridPoints = int64_t{1} << 27;  // n * R built by predict_push_times (1 GiB)
constexpr int kMaxHorizon = 1 << 20;               // predictor forecast steps
constexpr int kMaxRange = 1 << 20;                 // DSSP r_max = s_U - s_L
constexpr int64_t kMaxBatch = int64_t{1} << 40;    // LB-BSP global batch (exact in a double)

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

// Checks `cond`; only on failure is the message (often a string concatenation) evaluated, so checks inside loops
// and on per-step paths cost a comparison.
#define HVD_REQUIRE(cond, where, what)                             \
  do {                                                             \
    if (!(cond)) ::hvd_elastic::checks::fail((where), (what));     \
  } while (0)

inline std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = std::to_string(x);
  return s;
}

inline void nonempty_size(size_t n, const char* where, const char* name) {
  HVD_REQUIRE(n > 0, where, std::string(name) + " must not be empty");
  HVD_REQUIRE(n <= static_cast<size_t>(INT32_MAX), where,
              std::string(name) + " is too long (" + std::to_string(n) + ")");
}

inline void worker_index(int p, size_t n, const char* where, const char* name = "worker") {
  HVD_REQUIRE(p >= 0 && static_cast<size_t>(p) < n, where,
              std::string(name) + " " + std::to_string(p) + " out of range [0, " + std::to_string(n) + ")");
}

inline void nonnegative_all(const std::vector<int64_t>& v, const char* where, const char* name) {
  for (size_t i = 0; i < v.size(); ++i)
    HVD_REQUIRE(v[i] >= 0, where,
                std::string(name) + "[" + std::to_string(i) + "] must be >= 0, got " + std::to_string(v[i]));
}

inline void same_length(size_t a, size_t b, const char* where, const char* na, const char* nb) {
  HVD_REQUIRE(a == b, where,
              std::string("mismatched lengths: ") + na + " has " + std::to_string(a) + " entries, " + nb + " has " +
                  std::to_string(b));
}

}  // namespace checks
}  // namespace hvd_elastic
