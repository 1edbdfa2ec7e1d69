// Python bindings: hvd_elastic._native. Thin: argument conversion only, every rule lives in native/src.
// C++ std::invalid_argument surfaces in Python as ValueError (pybind11's standard translation); arguments of the
// wrong type are TypeError. Long decisions release the GIL so the engine's communication thread keeps running.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "hvd_elastic/dssp.h"
#include "hvd_elastic/lbbsp.h"
#include "hvd_elastic/lockstep.h"
#include "hvd_elastic/predictors.h"
#include "hvd_elastic/ssp.h"
#include "hvd_elastic/wbsp.h"
#include "hvd_elastic/worker_clocks.h"
#include "hvd_elastic/zipline.h"

namespace py = pybind11;
using namespace hvd_elastic;

namespace {

using Int64Grid = py::array_t<int64_t, py::array::c_style>;
using BarrierFn = Barrier (*)(const PushTimeGrid&);

// A C-contiguous int64 (n, R) array, used in place (no copy).
Barrier barrier_from_array(BarrierFn fn, const Int64Grid& a, const char* where) {
  if (a.ndim() != 2)
    throw std::invalid_argument(std::string(where) + ": predicted push times must be 2-D (n workers, R points), got " +
                                std::to_string(a.ndim()) + "-D");
  if (a.shape(0) > INT32_MAX || a.shape(1) > INT32_MAX)
    throw std::invalid_argument(std::string(where) + ": too many workers or points");
  const PushTimeGrid g{a.data(), static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1))};
  py::gil_scoped_release release;
  return fn(g);
}

// A list of n lists of R ints, flattened after checking that every row has the same length R.
Barrier barrier_from_rows(BarrierFn fn, const std::vector<std::vector<int64_t>>& rows, const char* where) {
  if (rows.size() > INT32_MAX) throw std::invalid_argument(std::string(where) + ": too many workers");
  const size_t R = rows.empty() ? 0 : rows[0].size();
  if (R > INT32_MAX) throw std::invalid_argument(std::string(where) + ": too many points per worker");
  for (size_t p = 1; p < rows.size(); ++p)
    if (rows[p].size() != R)
      throw std::invalid_argument(std::string(where) + ": mismatched lengths: every worker needs the same number R " +
                                  "of predicted pushes, worker 0 has " + std::to_string(R) + ", worker " +
                                  std::to_string(p) + " has " + std::to_string(rows[p].size()));
  std::vector<int64_t> flat;
  flat.reserve(rows.size() * R);
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const PushTimeGrid g{flat.data(), static_cast<int>(rows.size()), static_cast<int>(R)};
  py::gil_scoped_release release;
  return fn(g);
}

std::string barrier_repr(const Barrier& b) {
  std::ostringstream os;
  os << "Barrier(iterations=[";
  const size_t shown = b.iterations.size() <= 16 ? b.iterations.size() : 16;
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << b.iterations[i];
  if (shown < b.iterations.size()) os << ", ... (" << b.iterations.size() << " workers)";
  os << "], barrier_ns=" << b.barrier_ns << ", earliest_ns=" << b.earliest_ns << ", spread_ns=" << b.spread_ns << ")";
  return os.str();
}

void def_barrier_variant(py::module_& m, const char* name, BarrierFn fn, const char* doc) {
  m.def(
      name, [fn, name](const Int64Grid& a) { return barrier_from_array(fn, a, name); },
      py::arg("predicted").noconvert(), doc);
  m.def(
      name, [fn, name](const std::vector<std::vector<int64_t>>& rows) { return barrier_from_rows(fn, rows, name); },
      py::arg("predicted"), doc);
}

ArxOptions arx_options(int order, int window, int exo_order, double ridge, bool trend, double shift_threshold) {
  ArxOptions o;
  o.order = order;
  o.window = window;
  o.exo_order = exo_order;
  o.ridge = ridge;
  o.trend = trend;
  o.shift_threshold = shift_threshold;
  return o;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "hvd-elastic native scheduler: clocks, predictors and every policy's decision rule (C++17).";

  // ---- Clocks ------------------------------------------------------------------------------------------------------
  py::class_<WorkerClocks>(m, "WorkerClocks",
                           "Per-worker clocks (pushes so far) and recent iteration intervals, in integer ns.")
      .def(py::init<int, int>(), py::arg("n"), py::arg("history") = 16)
      .def("record_push", &WorkerClocks::record_push, py::arg("worker"), py::arg("t_ns"),
           "Worker pushed an update at t_ns: its clock advances; the interval since its last push is recorded.")
      .def("observe", &WorkerClocks::observe, py::arg("worker"), py::arg("clock"), py::arg("last_push_ns"),
           py::arg("interval_ns"),
           "Set a worker's clock, last push time and latest iteration interval from a summary (e.g. tick metadata);"
           " interval_ns=-1 leaves the history unchanged.")
      .def("reset_timing", &WorkerClocks::reset_timing,
           "Forget last push times and intervals (clocks kept): the next interval starts fresh.")
      .def_property_readonly("size", &WorkerClocks::size)
      .def_property_readonly("history", &WorkerClocks::history, "Intervals kept per worker.")
      .def("clock", &WorkerClocks::clock, py::arg("worker"))
      .def_property_readonly("clocks", &WorkerClocks::clocks)
      .def("last_push_ns", &WorkerClocks::last_push_ns, py::arg("worker"))
      .def("last_interval_ns", &WorkerClocks::last_interval_ns, py::arg("worker"))
      .def("intervals", &WorkerClocks::intervals, py::arg("worker"))
      .def_property_readonly("last_push_times", &WorkerClocks::last_push_times,
                             "last_p of every worker in ns (-1: no push since the last reset_timing).")
      .def_property_readonly("last_intervals", &WorkerClocks::last_intervals,
                             "I_p of every worker in ns (-1: fewer than two pushes since the last reset_timing).")
      .def_property_readonly("min_clock", &WorkerClocks::min_clock)
      .def_property_readonly("max_clock", &WorkerClocks::max_clock)
      .def_property_readonly("gap", &WorkerClocks::gap)
      .def("slowest_by_clock", &WorkerClocks::slowest_by_clock)
      .def("fastest_by_clock", &WorkerClocks::fastest_by_clock)
      .def("slowest_by_interval", &WorkerClocks::slowest_by_interval)
      .def("median_interval_ns", &WorkerClocks::median_interval_ns, py::arg("worker"),
           "Median of the kept intervals of a worker (lower middle for an even count); -1 if none.")
      .def("slowest_by_median_interval", &WorkerClocks::slowest_by_median_interval,
           "Worker with the longest median interval (ties to the lowest rank); -1 if none measured.");

  // ---- ZipLine (ElasticBSP) ---------------------------------------------------------------------------------------
  py::class_<Barrier>(m, "Barrier",
                      "An ElasticBSP barrier: worker p runs iterations[p] (j_p, 1..R) more iterations, then waits.\n"
                      "barrier_ns = max(Z), earliest_ns = min(Z), spread_ns = d_Z = max(Z) - min(Z).")
      .def_readonly("iterations", &Barrier::iterations)
      .def_readonly("barrier_ns", &Barrier::barrier_ns)
      .def_readonly("earliest_ns", &Barrier::earliest_ns)
      .def_readonly("spread_ns", &Barrier::spread_ns)
      .def("__eq__",
           [](const Barrier& a, const Barrier& b) {
             return a.iterations == b.iterations && a.barrier_ns == b.barrier_ns && a.earliest_ns == b.earliest_ns &&
                    a.spread_ns == b.spread_ns;
           })
      .def("__repr__", &barrier_repr);

  const char* zipline_doc =
      "ElasticBSP barrier by ZipLine: exact, O(nR log n).\n\n"
      "predicted: n rows of R predicted push times (int ns, >= 0, non-decreasing per row), as a C-contiguous\n"
      "int64 numpy array of shape (n, R) (used in place) or a list of lists. Chooses one point per worker,\n"
      "minimizing d_Z = max(Z) - min(Z), then the earliest barrier max(Z); each worker then takes its first point\n"
      ">= max(Z) - d_Z (fewest iterations). Raises ValueError on n = 0, R = 0, ragged rows, negative or decreasing\n"
      "times.";
  def_barrier_variant(m, "zipline_barrier", &zipline_barrier, zipline_doc);
  def_barrier_variant(m, "gridscan_barrier", &gridscan_barrier,
                      "ElasticBSP barrier by GridScan, the papers' O(R^2 n) heuristic [reconstructed]: candidate\n"
                      "barriers are the slowest worker's points only (the row whose last point is latest); every\n"
                      "other worker takes its latest point not after the candidate. Same input, order and errors as\n"
                      "zipline_barrier; its d_Z is never smaller than ZipLine's.");
  def_barrier_variant(m, "fullgridscan_barrier", &fullgridscan_barrier,
                      "ElasticBSP barrier by FullGridScan: exact, O(R^2 n^2). Every point of every worker is a\n"
                      "candidate max(Z); every worker takes its latest point not after it. Same input, order and\n"
                      "errors as zipline_barrier, and the same answer.");

  m.def(
      "predict_push_times",
      [](const std::vector<int64_t>& last_ns, const std::vector<int64_t>& interval_ns, int R) {
        const std::vector<int64_t> e = predict_push_times(last_ns, interval_ns, R);
        Int64Grid out({static_cast<py::ssize_t>(last_ns.size()), static_cast<py::ssize_t>(R)});
        std::copy(e.begin(), e.end(), out.mutable_data());
        return out;
      },
      py::arg("last_ns"), py::arg("interval_ns"), py::arg("R"),
      "The papers' prediction e_p[i] = last_p + i * I_p, i = 1..R, as an int64 array of shape (n, R).\n"
      "Raises ValueError on empty or mismatched inputs, R < 1, negative times or intervals (-1 = not measured), or\n"
      "int64 overflow.");
  m.def("zipline_barrier_from_intervals", &zipline_barrier_from_intervals, py::arg("last_ns"), py::arg("interval_ns"),
        py::arg("R"), py::call_guard<py::gil_scoped_release>(),
        "zipline_barrier(predict_push_times(last_ns, interval_ns, R)) without the round trip through Python.");
  m.def(
      "zipline_barrier_from_clocks",
      [](const WorkerClocks& c, int R) {
        return zipline_barrier_from_intervals(c.last_push_times(), c.last_intervals(), R);
      },
      py::arg("clocks"), py::arg("R"),
      "ZipLine barrier from each worker's last push time and last interval in `clocks` (the papers' monitor\n"
      "phase: every worker must have pushed twice since reset_timing, else ValueError).");

  // ---- Predictors --------------------------------------------------------------------------------------------------
  m.def("predict_last_interval", &predict_last_interval, py::arg("history"),
        "The papers' rule: the next interval is the latest one (history: intervals in ns, oldest first, >= 0).");
  m.def("predict_median_interval", &predict_median_interval, py::arg("history"), py::arg("window") = 8,
        "Median of the newest `window` intervals (lower middle for an even count), window >= 1.");
  m.def("predict_ewma_interval", &predict_ewma_interval, py::arg("history"), py::arg("alpha") = 0.3,
        "Exponentially weighted mean of the intervals: m = alpha * h_i + (1 - alpha) * m, alpha in (0, 1].");
  m.def(
      "predict_arx_intervals",
      [](const std::vector<int64_t>& history, int horizon, int order, int window,
         std::optional<std::vector<double>> exo, int exo_order, double ridge, bool trend, double shift_threshold) {
        return predict_arx_intervals(history, horizon,
                                     arx_options(order, window, exo_order, ridge, trend, shift_threshold),
                                     exo ? *exo : std::vector<double>{});
      },
      py::arg("history"), py::arg("horizon") = 1, py::arg("order") = 2, py::arg("window") = 32,
      py::arg("exo") = py::none(), py::arg("exo_order") = 1, py::arg("ridge") = 1e-3, py::arg("trend") = true,
      py::arg("shift_threshold") = 5.0,
      "Forecast the next `horizon` intervals with an ARX model fitted by least squares on the last `window`\n"
      "intervals: x_t = c + d*t + sum_i a_i x_{t-i} + sum_j b_j u_{t-j} (trend term d optional). exo (optional):\n"
      "one exogenous reading per past iteration plus the next one (len(history) + 1 or more, e.g. co-tenant CPU\n"
      "load). A level shift (two-sample t statistic above shift_threshold; 0 disables) restarts the window.\n"
      "Falls back to the last interval with too little history. Raises ValueError on empty history, negative\n"
      "intervals, NaN exo, mismatched exo length or out-of-range options.");
  m.def(
      "predict_arx_interval",
      [](const std::vector<int64_t>& history, int order, int window, std::optional<std::vector<double>> exo,
         int exo_order, double ridge, bool trend, double shift_threshold) {
        return predict_arx_intervals(history, 1, arx_options(order, window, exo_order, ridge, trend, shift_threshold),
                                     exo ? *exo : std::vector<double>{})[0];
      },
      py::arg("history"), py::arg("order") = 2, py::arg("window") = 32, py::arg("exo") = py::none(),
      py::arg("exo_order") = 1, py::arg("ridge") = 1e-3, py::arg("trend") = true, py::arg("shift_threshold") = 5.0,
      "predict_arx_intervals(..., horizon=1)[0].");

  // ---- SSP ---------------------------------------------------------------------------------------------------------
  const char* ssp_doc =
      "SSP(s) gate: may `worker`, having pushed t_p updates, start its next iteration? True iff\n"
      "t_p - min_q t_q <= s, so every iteration starts at most s clocks ahead of the slowest worker; s = 0 is BSP.\n"
      "clocks: a WorkerClocks or a list of per-worker push counts (>= 0).";
  m.def("ssp_may_proceed", py::overload_cast<const WorkerClocks&, int, int64_t>(&ssp_may_proceed), py::arg("clocks"),
        py::arg("worker"), py::arg("s"), ssp_doc);
  m.def("ssp_may_proceed", py::overload_cast<const std::vector<int64_t>&, int, int64_t>(&ssp_may_proceed),
        py::arg("clocks"), py::arg("worker"), py::arg("s"), ssp_doc);
  const char* staleness_doc = "t_p - min_q t_q: how far `worker` is ahead of the slowest worker (SSP's staleness).";
  m.def("ssp_staleness", py::overload_cast<const WorkerClocks&, int>(&ssp_staleness), py::arg("clocks"),
        py::arg("worker"), staleness_doc);
  m.def("ssp_staleness", py::overload_cast<const std::vector<int64_t>&, int>(&ssp_staleness), py::arg("clocks"),
        py::arg("worker"), staleness_doc);

  // ---- DSSP --------------------------------------------------------------------------------------------------------
  m.def("dssp_sync_controller", &dssp_sync_controller, py::arg("last_p"), py::arg("interval_p"), py::arg("last_s"),
        py::arg("interval_s"), py::arg("r_max"),
        "DSSP SyncController: r* in [0, r_max] = argmin_i min_k |Sim_s[k] - Sim_p[i]| with\n"
        "Sim_p[i] = last_p + i*I_p, Sim_s[k] = last_s + (k+1)*I_s; ties to the smallest i. Times in ns, >= 0.");
  m.def(
      "dssp_credit",
      [](const WorkerClocks& c, int p, int credit, int s_lower, int s_upper) {
        const DsspDecision d = dssp_credit(c, p, credit, s_lower, s_upper);
        return std::make_tuple(d.proceed, d.credit, d.granted);
      },
      py::arg("clocks"), py::arg("worker"), py::arg("credit"), py::arg("s_lower"), py::arg("s_upper"),
      "DSSP credit rule for a worker that has just pushed (record the push in clocks first), holding `credit`\n"
      "(r_p). Returns (proceed, credit_after, granted): granted is the SyncController's r* (capped so staleness\n"
      "never exceeds s_upper) if it ran, else -1.");
  m.def("dssp_may_resume", &dssp_may_resume, py::arg("clocks"), py::arg("worker"), py::arg("s_lower"),
        "A worker refused by the DSSP credit rule may resume once t_p - min_q t_q <= s_lower.");
  py::class_<DsspState>(m, "DsspState",
                        "Per-worker DSSP credits r_p for a job with staleness range [s_lower, s_upper]\n"
                        "(r_max = s_upper - s_lower). No iteration starts with staleness above s_upper;\n"
                        "s_lower = s_upper = 0 is BSP.")
      .def(py::init<int, int, int>(), py::arg("n"), py::arg("s_lower"), py::arg("s_upper"))
      .def("on_push", &DsspState::on_push, py::arg("clocks"), py::arg("worker"),
           "The worker has just pushed (record it in clocks first): may it start its next iteration now?")
      .def("may_resume", &DsspState::may_resume, py::arg("clocks"), py::arg("worker"),
           "A worker refused by on_push: may it start now (staleness back within s_lower)?")
      .def("credit", &DsspState::credit, py::arg("worker"))
      .def_property_readonly("credits", &DsspState::credits)
      .def_property_readonly("size", &DsspState::size)
      .def_property_readonly("s_lower", &DsspState::s_lower)
      .def_property_readonly("s_upper", &DsspState::s_upper)
      .def_property_readonly("r_max", &DsspState::r_max)
      .def_property_readonly("grants", &DsspState::grants, "Pushes at which the SyncController granted r* > 0.")
      .def_property_readonly("refusals", &DsspState::refusals, "Pushes after which the worker had to wait.")
      .def_property_readonly("max_staleness_admitted", &DsspState::max_staleness_admitted,
                             "Largest t_p - min_q t_q at which on_push let a worker proceed.");

  // ---- Lock-step fallback -------------------------------------------------------------------------------------------
  py::class_<LockstepRule>(m, "LockstepRule",
                           "The gradient policies' lock-step fallback (lockstep.h): the ranks go at BSP's pace\n"
                           "while relaxing is predicted to deliver less than min_gain x lock-step's pushes per second.\n"
                           "Starts in lock-step; settle / sample / relaxed_sample: pushes of every live rank after a\n"
                           "switch before the overheads are sampled / sampled during the first measurement of\n"
                           "lock-step / of the relaxed rule.")
      .def(py::init<int, double, int64_t, int64_t, int64_t, bool>(), py::arg("n"), py::arg("min_gain"),
           py::arg("settle"), py::arg("sample"), py::arg("relaxed_sample"), py::arg("spread_only") = false,
           "spread_only: only a spread of the ranks' compute times (not lock-step's own cost) makes the ranks\n"
           "measure the relaxed rule for the first time.")
      .def("observe", &LockstepRule::observe, py::arg("clocks"), py::arg("interval_ns"), py::arg("last_push_ns"),
           py::arg("finished"), py::arg("outside") = std::vector<bool>(),
           "One tick's table (per rank: clock, the latest push's step compute time and time in ns, finished, and\n"
           "optionally whether it waits in a collective of the script's own). Returns lockstep.")
      .def_property_readonly("lockstep", &LockstepRule::lockstep)
      .def_property_readonly("gain", &LockstepRule::gain,
                             "Predicted pushes per second relaxed / lock-step (its ceiling, at o_R = 0, until the relaxed "
                             "rule is measured -- with spread_only, at o_L = 0 too; 0 until lock-step is).")
      .def_property_readonly("overhead_lockstep_ns", &LockstepRule::overhead_lockstep_ns)
      .def_property_readonly("overhead_relaxed_ns", &LockstepRule::overhead_relaxed_ns)
      .def_property_readonly("switches", &LockstepRule::switches)
      .def_property_readonly("switch_pushes", &LockstepRule::switch_pushes,
                             "Pushes delivered (all ranks) at each switch, in order: even entries into relaxed.")
      .def_property_readonly("lockstep_pushes", &LockstepRule::lockstep_pushes)
      .def_property_readonly("pushes", &LockstepRule::pushes)
      .def_property_readonly("origin", &LockstepRule::origin,
                             "Each rank's clock at the last switch or at the latest tick that showed a rank in a\n"
                             "collective of the script's own (0 before either): lock-step rounds count from it.")
      .def_property_readonly("size", &LockstepRule::size)
      .def_property_readonly("min_gain", &LockstepRule::min_gain);

  // ---- LB-BSP ------------------------------------------------------------------------------------------------------
  m.def(
      "lbbsp_batch_sizes_cpu",
      [](const std::vector<double>& throughput, int64_t batch_size, std::optional<std::vector<int64_t>> caps) {
        return lbbsp_batch_sizes_cpu(throughput, batch_size, caps ? *caps : std::vector<int64_t>{});
      },
      py::arg("throughput"), py::arg("batch_size"), py::arg("caps") = py::none(),
      "LB-BSP CPU mode: per-worker batch sizes proportional to predicted throughput v_p (samples/s), integers\n"
      "summing exactly to batch_size, each in [1, caps[p]] (largest-remainder apportionment, ties to the lowest\n"
      "rank). Raises ValueError if batch_size < n, caps sum below batch_size, or a throughput is not finite and > 0.");
  m.def(
      "lbbsp_resize_cpu",
      [](const std::vector<double>& throughput, const std::vector<int64_t>& current, int64_t batch_size,
         std::optional<std::vector<int64_t>> caps, double tolerance) {
        return lbbsp_resize_cpu(throughput, current, batch_size, caps ? *caps : std::vector<int64_t>{}, tolerance);
      },
      py::arg("throughput"), py::arg("current"), py::arg("batch_size"), py::arg("caps") = py::none(),
      py::arg("tolerance") = 0.05,
      "LB-BSP CPU mode with a dead band: `current` while its predicted finish times b_p / v_p are within\n"
      "`tolerance` of each other (max - min <= tolerance * max), else lbbsp_batch_sizes_cpu(throughput, ...).\n"
      "Raises ValueError for bad throughput/caps, current not in [1, cap] or not summing to\n"
      "batch_size, or tolerance outside [0, 1).");
  py::class_<LbbspMove>(m, "LbbspMove", "One LB-BSP GPU-mode adjustment.")
      .def_readonly("from_worker", &LbbspMove::from, "The straggler that gave samples (-1: no move).")
      .def_readonly("to_worker", &LbbspMove::to, "The fastest worker with headroom that took them (-1: no move).")
      .def_readonly("amount", &LbbspMove::amount)
      .def_readonly("reversed", &LbbspMove::reversed, "Direction reversed: step halved, window doubled.")
      .def_readonly("converged", &LbbspMove::converged, "Finish times within tolerance: nothing moved.")
      .def("__repr__", [](const LbbspMove& mv) {
        return "LbbspMove(from_worker=" + std::to_string(mv.from) + ", to_worker=" + std::to_string(mv.to) +
               ", amount=" + std::to_string(mv.amount) + ", reversed=" + (mv.reversed ? "True" : "False") +
               ", converged=" + (mv.converged ? "True" : "False") + ")";
      });
  py::class_<LbbspGpuController>(m, "LbbspGpuController",
                                 "LB-BSP GPU mode: moves `step` samples from the straggler to the fastest worker with\n"
                                 "headroom under its memory cap, halving the step when the direction reverses, until\n"
                                 "finish times are within `tolerance` (relative). Sizes always sum to batch_size.")
      .def(py::init([](int64_t batch_size, std::vector<int64_t> caps, std::optional<int64_t> step, double tolerance,
                       int window, std::optional<std::vector<int64_t>> sizes) {
             if (caps.empty()) throw std::invalid_argument("LbbspGpuController: caps must not be empty");
             return new LbbspGpuController(batch_size, std::move(caps), step ? *step : 0, tolerance, window,
                                           sizes ? *sizes : std::vector<int64_t>{});
           }),
           py::arg("batch_size"), py::arg("caps"), py::kw_only(), py::arg("step") = py::none(),
           py::arg("tolerance") = 0.05, py::arg("window") = 1, py::arg("sizes") = py::none(),
           "caps: per-worker memory caps (samples). step: samples per move (None: max(1, B // (4n))). window:\n"
           "iterations to average step times over (doubles on each reversal). sizes: start (None: even split).")
      .def("update", &LbbspGpuController::update, py::arg("step_times_ns"),
           "Feed per-worker step times (ns) measured at the current sizes; returns the sizes to use next.")
      .def_property_readonly("sizes", &LbbspGpuController::sizes)
      .def_property_readonly("caps", &LbbspGpuController::caps, "Memory caps (clipped to batch_size).")
      .def_property_readonly("batch_size", &LbbspGpuController::batch_size)
      .def_property_readonly("step", &LbbspGpuController::step)
      .def_property_readonly("window", &LbbspGpuController::window)
      .def_property_readonly("tolerance", &LbbspGpuController::tolerance)
      .def_property_readonly("converged", &LbbspGpuController::converged)
      .def_property_readonly("moves", &LbbspGpuController::moves, "Adjustments that moved samples so far.")
      .def_property_readonly("last_move", &LbbspGpuController::last_move);

  // ---- WBSP --------------------------------------------------------------------------------------------------------
  m.def("wbsp_may_download", &wbsp_may_download, py::arg("uploaded_since_last_download"), py::arg("slowest"),
        "WBSP download gate: True iff the slowest worker (longest measured iteration time, e.g.\n"
        "WorkerClocks.slowest_by_interval()) has uploaded since this worker's last download. Pass slowest = -1\n"
        "while some worker's iteration time is not measured yet: True only once every worker has uploaded.");
  py::class_<WbspState>(m, "WbspState",
                        "WBSP upload/download bookkeeping for n workers: which uploads each worker has not yet\n"
                        "downloaded, and the download gate.")
      .def(py::init<int>(), py::arg("n"))
      .def("on_upload", &WbspState::on_upload, py::arg("worker"), "The worker's model delta is in the global model.")
      .def("on_download", &WbspState::on_download, py::arg("worker"), "The worker pulled the global model.")
      .def("may_download", &WbspState::may_download, py::arg("worker"), py::arg("slowest"),
           "wbsp_may_download(uploaded_since_last_download(worker), slowest), in O(1).")
      .def("uploaded_since_last_download", &WbspState::uploaded_since_last_download, py::arg("worker"))
      .def("uploads", &WbspState::uploads, py::arg("worker"))
      .def("downloads", &WbspState::downloads, py::arg("worker"))
      .def_property_readonly("size", &WbspState::size);
}
