// The examples runner: the project's main job. Runs each example, prints what it computed and
// the counts that show what was traced, compiled and cached, as a readable report.
#include <cstdio>
#include <functional>
#include <iostream>
#include <sstream>

#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;

void section(const char* title) { std::printf("\n== %s ==\n", title); }

void counts(const char* what) {
  loom::Metrics m = loom::metrics();
  std::printf("   [%s] compiles=%lld cache_hits=%lld executions=%lld ops_traced=%lld "
              "trace=%.2f ms compile=%.2f ms execute=%.2f ms\n",
              what, static_cast<long long>(m.compiles), static_cast<long long>(m.cache_hits),
              static_cast<long long>(m.executions), static_cast<long long>(m.ops_traced),
              m.trace_seconds * 1e3, m.compile_seconds * 1e3, m.execute_seconds * 1e3);
}

std::string str(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

void lazy_basics() {
  section("Lazy tensors: ops record, sync compiles and runs");
  loom::reset_metrics();
  Tensor a = loom::tensor(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor b = loom::matmul(a, a) + 1.0;
  Tensor c = loom::softmax(b, 1);
  std::printf("   before sync: b pending=%s, pending graph %lld nodes\n",
              b.is_pending() ? "yes" : "no", static_cast<long long>(loom::pending_graph_size()));
  loom::sync();
  std::printf("   b = a @ a + 1 = %s\n   softmax(b, 1) = %s\n", str(b).c_str(), str(c).c_str());
  counts("one sync");
}

void host_scalars() {
  section("A host scalar that changes every step compiles once");
  loom::reset_metrics();
  Tensor w = loom::full({4}, 1.0);
  loom::sync();
  loom::reset_metrics();
  for (int step = 0; step < 100; ++step) {
    double lr = 0.5 / (1 + step);  // a learning-rate schedule
    w = w - w * lr;
    loom::sync();
  }
  std::printf("   w after 100 decayed steps = %s\n", str(w).c_str());
  counts("100 steps");
}

void random_steps() {
  section("Random numbers: keys are graph inputs, so every step draws fresh numbers, compiled once");
  loom::reset_metrics();
  loom::manual_seed(0);
  for (int step = 0; step < 3; ++step) {
    Tensor d = loom::dropout(loom::ones({6}), 0.5);
    loom::sync();
    std::printf("   step %d dropout(ones(6), 0.5) = %s\n", step, str(d).c_str());
  }
  counts("3 steps");
}

void compile_time_unrolled() {
  section("Compile time of an unrolled decoder: graph size grows with depth, but identical\n"
          "   layer kernels compile once per process and are shared (run in order 1, 10, 50)");
  // The seed decoder's layer (Linear -> GELU -> residual), at a size the reference backend
  // runs quickly; compile time does not depend on the size, only on the graph.
  const int64_t dim = 32;
  for (int layers : {1, 10, 50}) {
    loom::runtime::clear_compile_cache();
    loom::reset_metrics();
    std::vector<Tensor> ws, bs;
    for (int l = 0; l < layers; ++l) {
      ws.push_back(loom::randn({dim, dim}) * 0.1);
      bs.push_back(loom::zeros({dim}));
    }
    loom::sync();
    loom::reset_metrics();
    Tensor x = loom::randn({4, 8, dim});
    for (int l = 0; l < layers; ++l)
      x = loom::gelu(loom::matmul(x, loom::transpose(ws[l], 0, 1)) + bs[l]) + x;
    x = loom::layer_norm(x, {dim});
    loom::sync();
    loom::Metrics m = loom::metrics();
    std::printf("   %2d layers: %4lld ops traced, trace %.2f ms, compile %.2f ms, execute %.2f ms, x[0,0,:2] %s\n",
                layers, static_cast<long long>(m.ops_traced), m.trace_seconds * 1e3,
                m.compile_seconds * 1e3, m.execute_seconds * 1e3,
                str(loom::slice(x[0][0], 0, 0, 2)).c_str());
  }
  std::printf("   backend: %s. scan_layers (one traced and compiled layer body for any depth)\n"
              "   lands with the control-flow work; this table is its baseline.\n",
              std::string(loom::runtime::current_backend().name()).c_str());
}

void seed_examples_status() {
  section("The seed's examples");
  std::printf("   assume_pure, scan, scan_layers and while_loop (seed examples 1-6) are not in\n"
              "   this build yet; the runner grows with them.\n");
}

}  // namespace

int main() {
  std::printf("loom examples report\n");
  int failures = 0;
  for (auto& [name, fn] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"lazy_basics", lazy_basics},
           {"host_scalars", host_scalars},
           {"random_steps", random_steps},
           {"compile_time_unrolled", compile_time_unrolled},
           {"seed_examples_status", seed_examples_status}}) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::printf("   FAILED %s: %s\n", name, e.what());
      ++failures;
    }
  }
  std::printf("\n%s", loom::metrics_report().c_str());
  return failures ? 1 : 0;
}
