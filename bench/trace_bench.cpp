// trace_overhead and sync_hit: the cost of recording ops and of a sync that hits the cache.
#include <algorithm>
#include <array>
#include <memory>

#include "bench.h"
#include "loom/loom.h"

namespace loom::bench {
namespace {

// Baseline measured in the same run: one heap allocation of a 256-byte node, the least work
// a tracer that allocates its nodes can do per op.
double alloc_baseline_ns() {
  constexpr int kN = 200000;
  std::vector<std::shared_ptr<std::array<char, 256>>> keep(kN);
  double t = median_seconds(5, [&] {
    for (int i = 0; i < kN; ++i) keep[i] = std::make_shared<std::array<char, 256>>();
  });
  return t / kN * 1e9;
}

// A chain of `ops` binary ops on small tensors, traced into an empty pending graph; the
// median over reps, each followed by a sync that drops the (dead) graph untimed.
double chain_ns_per_op(int ops, int reps) {
  Tensor x0 = loom::ones({4}), y = loom::full({4}, 0.5);
  loom::sync();
  std::vector<double> t;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = seconds();
    {
      Tensor x = x0;
      for (int i = 0; i < ops / 2; ++i) x = x * y + y;
    }
    t.push_back(seconds() - t0);
    loom::sync();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] / ops * 1e9;
}

struct Decoder {
  std::vector<Tensor> w, b;
  Tensor ln_w, ln_b;
  explicit Decoder(int layers, int64_t dim) {
    for (int l = 0; l < layers; ++l) {
      w.push_back(loom::tensor(std::vector<float>(dim * dim, 0.01f), {dim, dim}));
      b.push_back(loom::tensor(std::vector<float>(dim, 0.0f), {dim}));
    }
    ln_w = loom::tensor(std::vector<float>(dim, 1.0f), {dim});
    ln_b = loom::tensor(std::vector<float>(dim, 0.0f), {dim});
  }
  Tensor forward(Tensor x) const {
    for (size_t l = 0; l < w.size(); ++l)
      x = loom::gelu(loom::matmul(x, loom::transpose(w[l], 0, 1)) + b[l]) + x;
    return loom::layer_norm(x, {x.size(-1)}, ln_w, ln_b);
  }
};

std::vector<Figure> trace_overhead() {
  std::vector<Figure> f;
  Decoder dec(50, 512);
  Tensor x = loom::tensor(std::vector<float>(4 * 512 * 512, 0.1f), {4, 512, 512});
  loom::sync();
  std::vector<double> times;
  int64_t ops = 0;
  for (int rep = 0; rep < 41; ++rep) {
    loom::reset_metrics();
    double t0 = seconds();
    {
      Tensor y = dec.forward(x);
      times.push_back(seconds() - t0);
      ops = loom::metrics().ops_traced;
    }
    loom::sync();  // y is dead: drops the pending graph without running it
    ops = loom::metrics().ops_traced;
  }
  std::sort(times.begin(), times.end());
  double dt = times[times.size() / 2];
  f.push_back({"decoder50_forward_trace_us", dt * 1e6, "us", "seed decoder, 50 layers, forward"});
  f.push_back({"decoder50_ops", static_cast<double>(ops), "ops", "primitive ops recorded"});
  f.push_back({"decoder50_ns_per_op", dt / static_cast<double>(ops) * 1e9, "ns", "goal < 200"});
  double base = alloc_baseline_ns();
  double c1k = chain_ns_per_op(1000, 201), c100k = chain_ns_per_op(100000, 5);
  f.push_back({"chain_1000_ns_per_op", c1k, "ns", "goal < 200 (PyTorch 1.13 C++ a+b: ~610 ns)"});
  f.push_back({"chain_100000_ns_per_op", c100k, "ns", "includes pending-graph compaction"});
  f.push_back({"baseline_alloc_256B_ns", base, "ns", "same run: one make_shared of 256 bytes"});
  f.push_back({"chain_1000_vs_alloc", c1k / base, "x", "ratio to the baseline"});
  return f;
}

// A 1000-node graph: the sync after tracing it again hits the cache; its cost excludes the run.
std::vector<Figure> sync_hit() {
  Tensor x0 = loom::ones({4}), y = loom::full({4}, 0.5);
  loom::sync();
  auto trace = [&] {
    Tensor x = x0;
    for (int i = 0; i < 500; ++i) x = x * y + y;
    return x;
  };
  {
    Tensor warm = trace();
    loom::sync();
  }
  constexpr int kReps = 200;
  std::vector<double> sync_only, trace_t;
  int64_t nodes = 0;
  for (int rep = 0; rep < kReps; ++rep) {
    double t0 = seconds();
    Tensor x = trace();
    double t1 = seconds();
    loom::reset_metrics();
    loom::sync();
    double t2 = seconds();
    Metrics m = loom::metrics();
    nodes = m.sync_nodes;
    trace_t.push_back(t1 - t0);
    sync_only.push_back((t2 - t1) - m.execute_seconds);
  }
  std::sort(sync_only.begin(), sync_only.end());
  std::sort(trace_t.begin(), trace_t.end());
  Metrics m = loom::metrics();
  std::vector<Figure> f;
  f.push_back({"sync_hit_us", sync_only[kReps / 2] * 1e6, "us",
               "goal < 50; a trace-cache hit: outputs' Merkle hashes, lookup, input binding"});
  f.push_back({"graph_nodes", static_cast<double>(nodes), "nodes", "nodes in the graph cut"});
  f.push_back({"compiles_in_last_rep", static_cast<double>(m.compiles), "", "0 = cache hit"});
  f.push_back(
      {"baseline_trace_us", trace_t[kReps / 2] * 1e6, "us", "same run: tracing those 1000 ops"});
  return f;
}

Register r1("trace_overhead", "ns per recorded op: long chains and the seed decoder (50 layers)",
            trace_overhead);
Register r2("sync_hit", "cost of a sync that hits the cache for a 1000-node graph, no execution",
            sync_hit);

}  // namespace
}  // namespace loom::bench
