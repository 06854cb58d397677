// sync, no_grad, metrics: the runtime's switches. sync releases the GIL while it compiles
// and runs.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "common.h"

namespace loom::py {
namespace {

// `with loom.no_grad():` holds a NoGradGuard between __enter__ and __exit__.
struct NoGrad {
  std::unique_ptr<NoGradGuard> guard;
};

}  // namespace

void register_transforms(nb::module_& m) {
  m.def(
      "sync", [] { loom::sync(std::source_location::current()); },
      nb::call_guard<nb::gil_scoped_release>(),
      "Compiles (cached) and runs all pending work of this thread.");
  m.def("pending_graph_size", &pending_graph_size);
  m.def("is_grad_enabled", &grad_enabled);

  nb::class_<NoGrad>(m, "no_grad", "Context manager: nothing inside records gradients.")
      .def(nb::init<>())
      .def("__enter__",
           [](NoGrad& g) {
             if (!g.guard) g.guard = std::make_unique<NoGradGuard>();
           })
      .def("__exit__", [](NoGrad& g, nb::args) { g.guard.reset(); });

  nb::class_<Metrics> metrics_cls(m, "Metrics", "Counters and timers since reset_metrics().");
#define LOOM_FIELD(f) metrics_cls.def_ro(#f, &Metrics::f)
  LOOM_FIELD(compiles);
  LOOM_FIELD(cache_hits);
  LOOM_FIELD(executions);
  LOOM_FIELD(trace_seconds);
  LOOM_FIELD(compile_seconds);
  LOOM_FIELD(execute_seconds);
  LOOM_FIELD(ops_traced);
  LOOM_FIELD(syncs);
  LOOM_FIELD(sync_nodes);
  LOOM_FIELD(cache_evictions);
  LOOM_FIELD(cache_entries);
  LOOM_FIELD(pending_compactions);
  LOOM_FIELD(host_scalars);
  LOOM_FIELD(donated_buffers);
  LOOM_FIELD(bodies_traced);
  LOOM_FIELD(pure_hits);
  LOOM_FIELD(sync_seconds);
  LOOM_FIELD(recompiles);
  LOOM_FIELD(disk_cache_hits);
#undef LOOM_FIELD
  // grad / value_and_grad (python/loom/_autograd.py flattens the pytrees)
  m.def("_fresh_leaf", &detail::fresh_leaf);
  m.def("_functional_gradients", [](const Tensor& out, const std::vector<Tensor>& wrt) {
    nb::list r;  // None where out does not depend on a leaf
    for (const Tensor& g : detail::functional_gradients(out, wrt))
      r.append(g.defined() ? nb::cast(g) : nb::none());
    return r;
  });
  m.def("metrics", &metrics);
  m.def("reset_metrics", &reset_metrics);
  m.def("metrics_report", &metrics_report);
}

}  // namespace loom::py
