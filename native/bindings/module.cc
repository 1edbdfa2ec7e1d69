// Python bindings: hvd_elastic._native. Thin: argument conversion only, every rule lives in native/src.
// C++ std::invalid_argument surfaces in Python as ValueError (pybind11's standard translation).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hvd_elastic/worker_clocks.h"

namespace py = pybind11;
using hvd_elastic::WorkerClocks;

PYBIND11_MODULE(_native, m) {
  m.doc() = "hvd-elastic native scheduler: clocks, predictors and every policy's decision rule (C++17).";

  py::class_<WorkerClocks>(m, "WorkerClocks",
                           "Per-worker clocks (pushes so far) and recent iteration intervals, in integer ns.")
      .def(py::init<int, int>(), py::arg("n"), py::arg("history") = 16)
      .def("record_push", &WorkerClocks::record_push, py::arg("worker"), py::arg("t_ns"),
           "Worker pushed an update at t_ns: its clock advances; the interval since its last push is recorded.")
      .def("reset_timing", &WorkerClocks::reset_timing,
           "Forget last push times and intervals (clocks kept): the next interval starts fresh.")
      .def_property_readonly("size", &WorkerClocks::size)
      .def("clock", &WorkerClocks::clock, py::arg("worker"))
      .def_property_readonly("clocks", &WorkerClocks::clocks)
      .def("last_push_ns", &WorkerClocks::last_push_ns, py::arg("worker"))
      .def("last_interval_ns", &WorkerClocks::last_interval_ns, py::arg("worker"))
      .def("intervals", &WorkerClocks::intervals, py::arg("worker"))
      .def_property_readonly("min_clock", &WorkerClocks::min_clock)
      .def_property_readonly("max_clock", &WorkerClocks::max_clock)
      .def_property_readonly("gap", &WorkerClocks::gap)
      .def("slowest_by_clock", &WorkerClocks::slowest_by_clock)
      .def("fastest_by_clock", &WorkerClocks::fastest_by_clock)
      .def("slowest_by_interval", &WorkerClocks::slowest_by_interval);
}
