// sync, no_grad, metrics: the runtime's switches. sync releases the GIL while it compiles
// and runs.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "common.h"
#include "tree.h"

namespace loom::py {
namespace {

// `with loom.no_grad():` holds a NoGradGuard between __enter__ and __exit__.
struct NoGrad {
  std::unique_ptr<NoGradGuard> guard;
};

struct Named {
  explicit Named(std::string n) : name(std::move(n)) {}
  std::string name;
  std::unique_ptr<GraphName> guard;
};

// sync, pending_graph_size, is_grad_enabled and no_grad.
void register_sync_and_grad(nb::module_& m) {
  m.def(
      "sync",
      [] {
        const CallSite site = python_site();  // names the graph by the Python caller
        nb::gil_scoped_release release;
        loom::sync(site);
      },
      "Compiles (cached) and runs all pending work of this thread.");
  m.def("pending_graph_size", &pending_graph_size,
        "The number of nodes in this thread's pending graph (0 after a sync, and after a read in "
        "a steady loop: a read computes the state updated in place). A number that grows step "
        "after step means a tensor updated every step is never read or synced.");
  m.def("is_grad_enabled", &grad_enabled);

  nb::class_<NoGrad>(m, "no_grad", "Context manager: nothing inside records gradients.")
      .def(nb::init<>())
      .def("__enter__",
           [](NoGrad& g) {
             if (!g.guard) g.guard = std::make_unique<NoGradGuard>();
           })
      .def("__exit__", [](NoGrad& g, nb::args) { g.guard.reset(); });
}

// loom.Metrics, grad's raw forms, recompile reasons and per-graph metrics.
void register_metrics(nb::module_& m) {
  nb::class_<Metrics> metrics_cls(m, "Metrics", "Counters and timers since reset_metrics().");
#define LOOM_METRIC_COUNT(name, doc) metrics_cls.def_ro(#name, &Metrics::name, doc);
#define LOOM_METRIC_TIME(name, doc) \
  metrics_cls.def_ro(#name "_seconds", &Metrics::name##_seconds, doc);
#define LOOM_METRIC_READ(name, doc) metrics_cls.def_ro(#name, &Metrics::name, doc);
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
  // grad / value_and_grad (python/loom/_autograd.py flattens the pytrees)
  m.def("_fresh_leaf", &detail::fresh_leaf);
  m.def("_functional_gradients", [](const Tensor& out, const std::vector<Tensor>& wrt) {
    nb::list r;  // None where out does not depend on a leaf
    for (const Tensor& g : detail::functional_gradients(out, wrt))
      r.append(g.defined() ? nb::cast(g) : nb::none());
    return r;
  });
  nb::class_<RecompileReason>(m, "RecompileReason",
                              "Why a graph name compiled again (loom.recompile_reasons()).")
      .def_ro("graph", &RecompileReason::graph)
      .def_ro("compile", &RecompileReason::compile)
      .def_prop_ro("kind", [](const RecompileReason& r) { return to_string(r.kind); })
      .def_ro("message", &RecompileReason::message)
      .def_ro("input", &RecompileReason::input)
      .def_ro("path", &RecompileReason::path)
      .def_ro("before", &RecompileReason::before)
      .def_ro("after", &RecompileReason::after)
      .def("__repr__", [](const RecompileReason& r) {
        return detail::str_cat("RecompileReason(graph='", r.graph, "', compile=", r.compile,
                               ", kind='", to_string(r.kind), "', message='", r.message, "')");
      });
  m.def("recompile_reasons", &recompile_reasons,
        "Every recompile explanation since reset_metrics() (at most the latest 1000).");
  nb::class_<GraphMetrics>(m, "GraphMetrics", "Counters of one graph name (loom.graph_metrics()).")
      .def_ro("name", &GraphMetrics::name)
      .def_ro("syncs", &GraphMetrics::syncs)
      .def_ro("compiles", &GraphMetrics::compiles)
      .def_ro("cache_hits", &GraphMetrics::cache_hits)
      .def_ro("disk_hits", &GraphMetrics::disk_hits)
      .def_ro("compile_seconds", &GraphMetrics::compile_seconds)
      .def_ro("execute_seconds", &GraphMetrics::execute_seconds)
      .def_ro("bytes_in", &GraphMetrics::bytes_in)
      .def_ro("bytes_out", &GraphMetrics::bytes_out)
      .def_ro("recompiling", &GraphMetrics::recompiling);
  m.def("graph_metrics", &graph_metrics, "One entry per graph name since reset_metrics().");
}

// The runtime's settings (denormals, IR dumps, the cache directory), the profiler, graph_name
// and the metrics' report.
void register_settings(nb::module_& m) {
  m.def("set_explain_recompiles", &set_explain_recompiles, nb::arg("on"),
        "Prints each recompile explanation to stderr (default: LOOM_EXPLAIN_RECOMPILES).");
  m.def("set_flush_denormal", &set_flush_denormal, nb::arg("mode"),
        "Whether runs read and write denormal floats as zero (x86's DAZ and FTZ, as XLA runs;\n"
        "default on, LOOM_FLUSH_DENORMAL=0 turns it off). Returns the previous setting\n"
        "(torch.set_flush_denormal returns whether the mode is supported).");
  m.def("flush_denormal", &flush_denormal, "Whether runs flush denormal floats to zero.");
  m.def("set_dump_ir_dir", &runtime::set_dump_ir_dir, nb::arg("dir"),
        "Writes each compiled graph's IR (before, after every pass, .dot) into dir; '' stops.");
  m.def("set_cache_dir", &runtime::set_cache_dir, nb::arg("dir"),
        "The persistent compile cache directory ('' turns it off; default LOOM_CACHE_DIR).");
  m.def("cache_dir", &runtime::cache_dir);
  m.def("_profile_start", &profile::start, nb::arg("path"));
  m.def("_profile_flush", &profile::flush);
  m.def("_profile_stop", &profile::stop);
  m.def("_profile_path", &profile::path);

  // `with loom.graph_name("train_step"):` names the graphs synced inside.
  nb::class_<Named>(m, "graph_name", "Context manager: names the graphs synced inside it.")
      .def(nb::init<std::string>(), nb::arg("name"))
      .def("__enter__",
           [](Named& g) {
             if (!g.guard) g.guard = std::make_unique<GraphName>(g.name);
           })
      .def("__exit__", [](Named& g, nb::args) { g.guard.reset(); });
  m.def("metrics", &metrics,
        "The process's counters since reset_metrics(): compiles, cache hits, syncs, executions, "
        "ops traced and the seconds spent tracing, compiling and running (metrics_report() "
        "prints them with the per-graph table).");
  m.def("reset_metrics", &reset_metrics);
  m.def("metrics_report", &metrics_report);
}

}  // namespace

void register_transforms(nb::module_& m) {
  register_sync_and_grad(m);
  register_metrics(m);
  register_settings(m);
}

}  // namespace loom::py
