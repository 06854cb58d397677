// Control flow and trace-once: scan_compile_flat, scan_vs_unrolled, cumsum_scan and
// assume_pure_hit. Each figure comes with its baseline from the same run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace loom::bench {
namespace {

std::string backend_name() { return std::string(runtime::current_backend().name()); }

// A decoder-like layer: tanh(h @ W + x) + h, with W captured and x one row of xs.
Tensor scan_layer_graph(int64_t length, int64_t dim) {
  Tensor w = loom::randn({dim, dim}) * (1.0 / static_cast<double>(dim));
  Tensor xs = loom::randn({length, dim});
  Tensor h0 = loom::zeros({8, dim});
  return loom::scan(
             [&](const Tensor& h, const Tensor& x) {
               return std::pair{loom::tanh(loom::matmul(h, w) + x) + h, std::tuple<>{}};
             },
             h0, xs)
      .first;
}

// Compile time of a scan of 10 and of 10000 steps. Each rep uses a feature extent no other
// rep uses, so every compile is cold (the process-wide kernel cache cannot answer).
std::vector<Figure> scan_compile_flat() {
  constexpr int kReps = 7;
  std::vector<double> short_ms, long_ms;
  for (int rep = 0; rep < kReps; ++rep) {
    for (int64_t length : {int64_t{10}, int64_t{10000}}) {
      const int64_t dim = 48 + 2 * rep + (length == 10 ? 0 : 1);
      runtime::clear_compile_cache();
      Tensor y = scan_layer_graph(length, dim);
      Metrics m0 = loom::metrics();
      loom::sync();
      Metrics m1 = loom::metrics();
      (length == 10 ? short_ms : long_ms)
          .push_back((m1.compile_seconds - m0.compile_seconds) * 1e3);
    }
  }
  double s = median(short_ms), l = median(long_ms);
  return {
      {"scan10_compile_ms", s, "ms",
       "scan of 10 steps (tanh(h@W+x)+h), cold, median of 7 on " + backend_name()},
      {"scan10000_compile_ms", l, "ms", "the same body, 10000 steps"},
      {"ratio_10000_vs_10", l / s, "x", "goal <= 1.1 (compile time flat in length)"},
  };
}

constexpr int64_t kLayers = 50, kRows = 4 * 128, kDim = 256;

// The seed decoder layer, gelu(x @ W^T + b) + x, over 50 layers: as a scan over stacked
// weights, and unrolled over per-layer weights (the same numbers).
std::vector<Figure> scan_vs_unrolled() {
  loom::manual_seed(11);
  Tensor ws = loom::randn({kLayers, kDim, kDim}) * (1.0 / 16),
         bs = loom::randn({kLayers, kDim}) * 0.1;
  std::vector<Tensor> w, b;
  for (int64_t l = 0; l < kLayers; ++l) {
    w.push_back(ws[l]);
    b.push_back(bs[l]);
  }
  Tensor x = loom::randn({kRows, kDim});
  loom::sync();
  auto scanned = [&] {
    return loom::scan(
               [](const Tensor& h, const std::pair<Tensor, Tensor>& wb) {
                 Tensor y =
                     loom::gelu(loom::matmul(h, loom::transpose(wb.first, 0, 1)) + wb.second) + h;
                 return std::pair{y, std::tuple<>{}};
               },
               x, std::pair{ws, bs})
        .first;
  };
  auto unrolled = [&] {
    Tensor h = x;
    for (int64_t l = 0; l < kLayers; ++l)
      h = loom::gelu(loom::matmul(h, loom::transpose(w[l], 0, 1)) + b[l]) + h;
    return h;
  };
  auto time_exec = [](const std::function<Tensor()>& f, std::vector<float>* out) {
    std::vector<double> t;
    for (int rep = 0; rep < 9; ++rep) {
      Tensor y = f();
      Metrics m0 = loom::metrics();
      loom::sync();
      t.push_back(loom::metrics().execute_seconds - m0.execute_seconds);
      if (rep == 0) *out = y.to_vector<float>();
    }
    return median(t);
  };
  std::vector<float> ys, yu;
  double ts = time_exec(scanned, &ys), tu = time_exec(unrolled, &yu);
  double err = 0;
  for (size_t i = 0; i < ys.size(); ++i)
    err = std::max(err, static_cast<double>(std::abs(ys[i] - yu[i])));
  return {
      {"scan_ms", ts * 1e3, "ms",
       "50 layers gelu(x@W^T+b)+x, x [512,256], scan over stacked W on " + backend_name()},
      {"unrolled_ms", tu * 1e3, "ms", "same run: the same layers unrolled"},
      {"ratio_scan_vs_unrolled", ts / tu, "x", "goal <= 1.05"},
      {"max_abs_difference", err, "", "scan against unrolled results"},
  };
}

// A Python loop over PyTorch tensors doing the same cumulative sum, per iteration (us), or
// a negative value when PyTorch is not installed.
double torch_loop_us(int64_t n) {
  return torch_figure(
      "\nimport torch, time\ntorch.set_num_threads(1)\n"
      "xs = torch.arange(1, " +
          std::to_string(n + 1) +
          ", dtype=torch.float32).reshape(-1, 1)\n"
          "ts = []\nfor rep in range(9):\n  t0 = time.perf_counter()\n  acc = torch.zeros(1)\n"
          "  out = []\n  for x in xs:\n    acc = acc + x\n    out.append(acc)\n  ys = "
          "torch.stack(out)\n"
          "  ts.append(time.perf_counter() - t0)\nts.sort()\nprint('us', ts[4] / " +
          std::to_string(n) + " * 1e6)\n",
      "us");
}

std::vector<Figure> cumsum_scan() {
  constexpr int64_t kN = 1000;
  std::vector<float> host(kN);
  for (int64_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i + 1);
  Tensor xs = loom::tensor(host, {kN});
  loom::sync();
  auto call = [&] {
    return loom::scan(
        [](const Tensor& c, const Tensor& x) {
          Tensor s = c + x;
          return std::pair{s, s};
        },
        loom::zeros({}), xs);
  };
  // Calls for 0.2 s before any is timed: a call takes a few microseconds, so 21 timed calls
  // right after the process starts fell in whatever state the core was in then (ten runs:
  // 3.5-3.7 ns an iteration in eight, 5.1-5.5 in two, every figure of those two slower);
  // the peer's calls are timed after its imports and jit compile.
  for (const double until = seconds() + 0.2; seconds() < until;) {
    auto [total, ys] = call();
    loom::sync();
  }
  std::vector<double> t, wall;
  double last = 0;
  for (int rep = 0; rep < 21; ++rep) {
    const Metrics m0 = loom::metrics();  // read outside the timed call (it takes locks)
    const double t0 = seconds();
    auto [total, ys] = call();
    loom::sync();
    wall.push_back(seconds() - t0);
    t.push_back(loom::metrics().execute_seconds - m0.execute_seconds);
    last = total.item<float>();
  }
  double per_iter_ns = median(t) / kN * 1e9;
  double call_ns = median(wall) / kN * 1e9;
  // The same scan as a compiled step (trace_once), as jax.jit compiles the peer's: traced on
  // its first call only.
  auto cumsum = loom::compile(
      [](const Tensor& x) {
        return loom::scan(
            [](const Tensor& c, const Tensor& x) {
              Tensor s = c + x;
              return std::pair{s, s};
            },
            loom::zeros({}), x);
      },
      {.name = "cumsum", .trace_once = true});
  std::vector<double> compiled;
  float compiled_last = 0;
  for (const double until = seconds() + 0.2; seconds() < until;) cumsum(xs);  // as above
  loom::sync();
  for (int rep = 0; rep < 41; ++rep) {
    const double t0 = seconds();
    auto [total, ys] = cumsum(xs);
    loom::sync();
    compiled.push_back(seconds() - t0);
    if (rep == 0) compiled_last = total.item<float>();
  }
  const double compiled_ns = median(compiled) / kN * 1e9;
  // Same run: the loop on the host, in C++ (the floor).
  volatile float sink = 0;
  double host_s = median_seconds(21, [&] {
    std::vector<float> out(kN);
    float acc = 0;
    for (int64_t i = 0; i < kN; ++i) out[i] = acc += host[i];
    sink = out[kN - 1];
  });
  std::vector<Figure> f = {
      {"scan_ns_per_iteration", per_iter_ns, "ns",
       "scan cumsum of 1000 f32 scalars on " + backend_name() + " (one executable run / 1000)"},
      {"scan_call_ns_per_iteration", call_ns, "ns",
       "the whole call (trace, cache hit, run) / 1000, as a peer's jitted call is timed"},
      {"result", last, "", "500500 expected"},
      {"compiled_call_ns_per_iteration", compiled_ns, "ns",
       "the scan inside loom::compile(trace_once), as jax.jit compiles the peer's: whole call / "
       "1000"},
      {"compiled_result", compiled_last, "", "500500 expected"},
      {"baseline_cpp_loop_ns_per_iteration", host_s / kN * 1e9, "ns",
       "same run: a C++ loop on the host"},
  };
  double torch_us = torch_loop_us(kN);
  if (torch_us > 0) {
    f.push_back({"baseline_torch_python_loop_ns", torch_us * 1e3, "ns",
                 "same run: a Python loop over PyTorch tensors"});
    f.push_back({"speedup_vs_torch_loop", torch_us * 1e3 / per_iter_ns, "x", "goal >= 20"});
  } else {
    f.push_back({"baseline_torch_python_loop_ns", 0, "ns",
                 "not measured: python3-torch not installed (issue figure: ~2200 ns here)"});
  }
  return f;
}

// A body of `ops` elementwise ops.
Tensor chain_body(const Tensor& x, const Tensor& y, int ops) {
  Tensor h = x;
  for (int i = 0; i < ops / 2; ++i) h = h * y + y;
  return h;
}

// Cost of an assume_pure call that hits its cache, for bodies of 10 and 1000 ops, against
// tracing the 1000 ops directly.
std::vector<Figure> assume_pure_hit() {
  Tensor x = loom::ones({4}), y = loom::full({4}, 0.5);
  loom::sync();
  auto small =
      loom::assume_pure([](const Tensor& a, const Tensor& b) { return chain_body(a, b, 10); });
  auto big =
      loom::assume_pure([](const Tensor& a, const Tensor& b) { return chain_body(a, b, 1000); });
  small(x, y);
  big(x, y);
  loom::sync();
  constexpr int kCalls = 200;
  auto per_call = [&](const std::function<Tensor()>& f) {
    std::vector<double> t;
    for (int rep = 0; rep < 15; ++rep) {
      double t0 = seconds();
      {
        Tensor keep;
        for (int i = 0; i < kCalls; ++i) keep = f();
      }
      t.push_back((seconds() - t0) / kCalls);
      loom::sync();  // every result is dead: drops the pending graph
    }
    return median(t);
  };
  Metrics m0 = loom::metrics();
  double hit10 = per_call([&] { return small(x, y); });
  double hit1000 = per_call([&] { return big(x, y); });
  int64_t traced = loom::metrics().bodies_traced - m0.bodies_traced;
  double trace1000 = per_call([&] { return chain_body(x, y, 1000); });
  return {
      {"hit_10_op_body_us", hit10 * 1e6, "us", "a cached call (one call node), 10-op body"},
      {"hit_1000_op_body_us", hit1000 * 1e6, "us", "a cached call, 1000-op body"},
      {"ratio_1000_vs_10", hit1000 / hit10, "x", "goal <= 1.2"},
      {"baseline_trace_1000_ops_us", trace1000 * 1e6, "us", "same run: tracing the 1000 ops"},
      {"saving_vs_tracing", trace1000 / hit1000, "x", "goal >= 20 (PyTorch/XLA reports 6x)"},
      {"bodies_traced_during_hits", static_cast<double>(traced), "", "0 expected"},
  };
}

// Peak memory (bytes held by live buffers, from the allocator) of forward + backward of a
// 200-step scan, with residuals saved and with remat.
std::vector<Figure> scan_remat_memory() {
  constexpr int64_t kSteps = 200, kBatch = 64, kDim = 256;
  std::vector<Figure> f;
  std::vector<float> grads[2];
  double peak_mb[2] = {0, 0}, ms[2] = {0, 0};
  for (int remat = 0; remat < 2; ++remat) {
    loom::manual_seed(5);
    Tensor w = (loom::randn({kDim, kDim}) * (1.0 / 16)).detach();
    Tensor xs = loom::randn({kSteps, kBatch, kDim});
    loom::sync();
    w.requires_grad_();
    for (int rep = 0; rep < 3; ++rep) {  // rep 0 compiles; the last one is measured
      w.reset_grad();
      loom::sync();
      const size_t base = Buffer::live_bytes();
      Buffer::reset_peak();
      double t0 = seconds();
      auto [h, none] = loom::scan(
          [&](const Tensor& h, const Tensor& x) {
            Tensor a = loom::matmul(h, w) + x;
            Tensor n = loom::tanh(a) * loom::sigmoid(a) + h * 0.5;
            return std::pair{n, std::tuple<>{}};
          },
          loom::zeros({kBatch, kDim}), xs, {.remat = remat == 1});
      loom::sum(h).backward();
      loom::sync();
      ms[remat] = (seconds() - t0) * 1e3;
      peak_mb[remat] = static_cast<double>(Buffer::peak_bytes() - base) / (1 << 20);
    }
    grads[remat] = w.grad().to_vector<float>();
  }
  double diff = 0;
  for (size_t i = 0; i < grads[0].size(); ++i)
    diff = std::max(diff, static_cast<double>(std::abs(grads[0][i] - grads[1][i])));
  const double carry_mb = kBatch * kDim * 4.0 / (1 << 20);
  f.push_back({"saved_residuals_peak_mb", peak_mb[0], "MiB",
               "200 steps, carry [64,256] f32, forward + backward, residuals stacked"});
  f.push_back({"remat_peak_mb", peak_mb[1], "MiB", "same, each step recomputed in the backward"});
  f.push_back({"ratio_saved_vs_remat", peak_mb[0] / peak_mb[1], "x", "memory remat saves"});
  f.push_back({"baseline_carry_stack_mb", kSteps * carry_mb, "MiB",
               "the carries of all steps (what remat must keep)"});
  f.push_back({"saved_ms", ms[0], "ms", "time, residuals saved"});
  f.push_back({"remat_ms", ms[1], "ms", "time, remat (recomputes the forward)"});
  f.push_back({"max_grad_difference", diff, "", "saved against remat gradients"});
  return f;
}

Register r5("scan_remat_memory", "peak memory of a 200-step scan's backward, saved vs remat",
            scan_remat_memory);

Register r1("scan_compile_flat", "compile time of a scan with 10 and 10000 steps (cold kernels)",
            scan_compile_flat);
Register r2("scan_vs_unrolled", "50 decoder-like layers as a scan against the same layers unrolled",
            scan_vs_unrolled);
Register r3("cumsum_scan", "scan cumsum over 1000 scalars, per iteration", cumsum_scan);
Register r4("assume_pure_hit", "a cached assume_pure call, 10- and 1000-op bodies, vs tracing",
            assume_pure_hit);

}  // namespace
}  // namespace loom::bench
