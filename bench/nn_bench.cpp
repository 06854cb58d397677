// nn and training: scan_layers_compile, scan_layers_step, mlp_train, trace_once_overhead.
// Each figure comes with its baseline from the same run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/program.h"
#include "bench.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace loom::bench {
namespace {

// The seed's decoder layer: Linear -> GELU -> residual.
struct DecoderLayer : nn::Module {
  std::shared_ptr<nn::Linear> linear;
  explicit DecoderLayer(int64_t dim) {
    linear = register_module("linear", std::make_shared<nn::Linear>(dim, dim));
  }
  Tensor forward(const Tensor& x) override { return loom::gelu((*linear)(x)) + x; }
};

struct Decoder {
  nn::ModuleList layers;
  nn::LayerNorm norm;
  Decoder(int n, int64_t dim) : norm(dim) {
    for (int i = 0; i < n; ++i) layers.push_back(std::make_shared<DecoderLayer>(dim));
    loom::sync();
  }
  Tensor forward(const Tensor& x, bool scan) {
    Tensor h = x;
    if (scan) {
      h = loom::scan_layers(layers, h);
    } else {
      for (size_t i = 0; i < layers.size(); ++i) h = (*layers[i])(h);
    }
    return norm(h);
  }
  void zero_grad() {
    for (Tensor& p : layers.parameters()) p.reset_grad();
  }
};

struct StepTiming {
  double compile_ms = 0, step_ms = 0;
};

// Forward + backward (loss = mean of the output) of a decoder of n layers; `seq` varies the
// shapes so that each measurement compiles its kernels cold.
StepTiming time_step(int n, bool scan, int64_t seq, int reps) {
  const int64_t dim = 512;
  Decoder dec(n, dim);
  Tensor x = loom::randn({4, seq, dim});
  loom::sync();
  runtime::clear_compile_cache();
  StepTiming r;
  std::vector<double> t;
  for (int rep = 0; rep <= reps; ++rep) {
    dec.zero_grad();
    Metrics m0 = loom::metrics();
    double t0 = seconds();
    loom::mean(dec.forward(x, scan)).backward();
    loom::sync();
    double dt = seconds() - t0;
    if (rep == 0)
      r.compile_ms = (loom::metrics().compile_seconds - m0.compile_seconds) * 1e3;
    else
      t.push_back(dt);
  }
  if (!t.empty()) r.step_ms = median(t) * 1e3;
  return r;
}

std::vector<Figure> scan_layers_compile() {
  std::vector<Figure> f;
  double scan1 = 0, scan100 = 0, loop50 = 0, scan50 = 0;
  int64_t seq = 256;  // a new sequence length per measurement: every compile is cold
  constexpr int kReps = 5;
  for (int n : {1, 10, 50, 100}) {
    std::vector<double> sv, lv;
    const int64_t first = seq;
    for (int rep = 0; rep < kReps; ++rep) {
      sv.push_back(time_step(n, true, seq--, 0).compile_ms);
      lv.push_back(time_step(n, false, seq--, 0).compile_ms);
    }
    const double s = median(sv), l = median(lv);
    f.push_back({"scan_layers_L" + std::to_string(n) + "_compile_ms", s, "ms",
                 "seed decoder forward+backward, dim 512, x [4," + std::to_string(seq + 1) + ".." +
                     std::to_string(first) + ",512], cold kernels, median of 5"});
    f.push_back(
        {"for_loop_L" + std::to_string(n) + "_compile_ms", l, "ms", "same, layers unrolled"});
    if (n == 1) scan1 = s;
    if (n == 100) scan100 = s;
    if (n == 50) loop50 = l, scan50 = s;
  }
  f.push_back({"scan_L100_vs_L1", scan100 / scan1, "x", "goal <= 1.2 (flat in depth)"});
  f.push_back({"for_loop_vs_scan_L50", loop50 / scan50, "x", "goal >= 20 (the seed reports 3.3x)"});
  return f;
}

// What scan_layers' stacking of the 50 layers' parameters costs alone: the same stacks
// (weights [50,512,512], biases [50,512]) built and synced, median of 5.
double stacking_ms() {
  Decoder dec(50, 512);
  std::vector<Tensor> w, b;
  for (size_t i = 0; i < dec.layers.size(); ++i) {
    auto named = dec.layers[i]->named_parameters();
    for (auto& [name, t] : named) (name == "linear.weight" ? w : b).push_back(t);
  }
  std::vector<double> t;
  for (int rep = 0; rep <= 5; ++rep) {
    double t0 = seconds();
    Tensor sw = loom::stack(w, 0), sb = loom::stack(b, 0);
    loom::sync();
    if (rep > 0) t.push_back(seconds() - t0);
  }
  return median(t) * 1e3;
}

// Step times of the same decoder run as scan_layers and as a for loop, the two alternating
// step by step (the machine's speed drifts over seconds), after one compiling step each.
StepTiming interleaved_steps(StepTiming* loop, int reps) {
  Decoder dec(50, 512);
  Tensor x = loom::randn({4, 512, 512});
  loom::sync();
  auto step = [&](bool scan) {
    dec.zero_grad();
    double t0 = seconds();
    loom::mean(dec.forward(x, scan)).backward();
    loom::sync();
    return seconds() - t0;
  };
  step(true);
  step(false);
  std::vector<double> s, l;
  for (int rep = 0; rep < reps; ++rep) {
    s.push_back(step(true));
    l.push_back(step(false));
  }
  loop->step_ms = median(l) * 1e3;
  StepTiming r;
  r.step_ms = median(s) * 1e3;
  return r;
}

std::vector<Figure> scan_layers_step() {
  StepTiming l;
  StepTiming s = interleaved_steps(&l, 5);
  double stack = stacking_ms();
  char share[128];
  std::snprintf(share, sizeof share,
                "same run: stacking the 50 layers' parameters alone (50 MiB), %.2f %% of the step",
                100 * stack / s.step_ms);
  return {
      {"scan_layers_step_ms", s.step_ms, "ms",
       "seed decoder (50 layers, [4,512,512]) forward+backward, median of 5"},
      {"for_loop_step_ms", l.step_ms, "ms",
       "same run, same weights: the layers unrolled, steps alternating with the scan's"},
      {"ratio", s.step_ms / l.step_ms, "x", "goal <= 1.05"},
      {"stacking_ms", stack, "ms", share},
  };
}

// PyTorch 1.13's steps per second for the same MLP step, or a negative value.
double torch_mlp_steps_per_s() {
  return torch_figure(
      "\n"
      "import torch, time\n"
      "torch.manual_seed(0)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, "
      "10))\n"
      "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
      "x = torch.randn(64, 784); y = torch.randint(0, 10, (64,))\n"
      "def step():\n"
      "  opt.zero_grad(); loss = torch.nn.functional.cross_entropy(m(x), y); loss.backward(); "
      "opt.step()\n"
      "for _ in range(50): step()\n"
      "best = 0\n"
      "for rep in range(5):\n"
      "  t0 = time.perf_counter()\n"
      "  for _ in range(300): step()\n"
      "  best = max(best, 300 / (time.perf_counter() - t0))\n"
      "print('steps_per_s', best)\n",
      "steps_per_s");
}

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(784, 256));
    b = register_module("b", std::make_shared<nn::Linear>(256, 10));
  }
  Tensor forward(const Tensor& x) override { return (*b)(loom::relu((*a)(x))); }
};

// The MLP's training step on fixed data: forward, cross entropy, backward, optimizer step.
struct MlpTraining {
  int seeded = (loom::manual_seed(0), 0);  // before the model draws its weights
  Mlp model;
  std::unique_ptr<optim::Optimizer> opt;
  Tensor x, y;
  MlpTraining(int64_t batch, bool adamw) {
    if (adamw)
      opt = std::make_unique<optim::AdamW>(model.parameters(), 1e-3);
    else
      opt = std::make_unique<optim::SGD>(model.parameters(), 0.01);
    x = loom::randn({batch, 784});
    y = loom::argmax(loom::randn({batch, 10}), 1);
    loom::sync();
  }
  Tensor step(const Tensor& xb, const Tensor& yb) {
    Tensor loss = loom::cross_entropy(model(xb), yb);
    loss.backward();
    opt->step();
    opt->zero_grad();
    return loss;
  }
};

std::vector<Figure> mlp_train() {
  MlpTraining t(64, /*adamw=*/false);
  auto body = [&](const Tensor& xb, const Tensor& yb) { return t.step(xb, yb); };
  auto plain = [&] {
    body(t.x, t.y);
    loom::sync();
  };
  auto once = loom::compile(body, {.name = "mlp_step", .trace_once = true});
  auto replay = [&] { once(t.x, t.y); };
  auto rate = [](const std::function<void()>& step) {
    for (int i = 0; i < 30; ++i) step();
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = seconds();
      for (int i = 0; i < 200; ++i) step();
      best = std::max(best, 200 / (seconds() - t0));
    }
    return best;
  };
  double p = rate(plain);
  const Metrics m0 = loom::metrics();
  double r = rate(replay);
  const Metrics m1 = loom::metrics();
  std::vector<Figure> f = {
      {"steps_per_s", p, "steps/s",
       "784-256-10 MLP, batch 64, SGD: trace + sync each step, best of 5 x 200"},
      {"trace_once_steps_per_s", r, "steps/s", "the same step compiled with trace_once"},
      {"trace_once_execute_us",
       (m1.execute_seconds - m0.execute_seconds) * 1e6 /
           static_cast<double>(m1.executions - m0.executions),
       "us", "the executable's run per step (mean, all trace_once steps)"},
  };
  const double bound = 1 / mlp_products_seconds();
  f.push_back({"baseline_products_steps_per_s", bound, "steps/s",
               "same run: the step's 5 matmuls alone on cblas_sgemm, full width (an upper bound)"});
  f.push_back({"trace_once_over_products_bound", r / bound, "x", "1 = the matmuls' own speed"});
  const int cores = hardware_threads();
  if (const double peak = fma_peak_flops(cores); peak > 0) {
    const double flops = 2.0 * 64 * (2 * 784 * 256 + 3 * 256 * 10);  // fwd, dW1, dW2, dH
    char note[160];
    std::snprintf(note, sizeof note,
                  "same run: the products' %.1f MFLOP at the FMA peak (%d threads, %.0f GFLOP/s)",
                  flops / 1e6, cores, peak / 1e9);
    f.push_back({"baseline_fma_peak_steps_per_s", peak / flops, "steps/s", note});
  }
  double torch = torch_mlp_steps_per_s();
  if (torch > 0) {
    f.push_back(
        {"baseline_torch_steps_per_s", torch, "steps/s", "same run: PyTorch 1.13, same step"});
    f.push_back({"speedup_vs_torch", p / torch, "x", "goal >= 1.5 (trace + sync each step)"});
    f.push_back({"trace_once_speedup_vs_torch", r / torch, "x", "with trace_once"});
  } else {
    f.push_back({"baseline_torch_steps_per_s", 0, "steps/s",
                 "not measured: python3-torch not installed (issue figure: ~1500 here)"});
  }
  // Last: OpenMP's threads may spin for a while after oneDNN's calls.
  const double onednn = 1 / mlp_onednn_products_seconds();
  f.push_back({"baseline_onednn_products_steps_per_s", onednn, "steps/s",
               "same run: the 5 matmuls alone on oneDNN, threaded by oneDNN (an upper bound)"});
  f.push_back({"trace_once_over_onednn_bound", r / onednn, "x",
               "1 = the step at its products' speed on oneDNN"});
  return f;
}

// The MLP's trace_once step compiled twice, once run as a step graph and once step by step,
// alternating every 200 steps for 30 rounds in this process (the machine's speed drifts over
// seconds): the medians, and in how many rounds the graph was faster.
std::vector<Figure> step_graph() {
  const cpu::StepGraphMode saved = cpu::step_graph_mode();
  MlpTraining plain(64, /*adamw=*/false), graph(64, /*adamw=*/false);
  auto compiled = [](MlpTraining& t, const char* name) {
    return loom::compile([&t](const Tensor& xb, const Tensor& yb) { return t.step(xb, yb); },
                         {.name = name, .trace_once = true});
  };
  auto a = compiled(plain, "mlp_step_by_step");
  auto b = compiled(graph, "mlp_step_graph");
  const int64_t runs0 = cpu::step_graph_runs();
  cpu::set_step_graph(cpu::StepGraphMode::Off);
  for (int i = 0; i < 2; ++i) a(plain.x, plain.y).item<float>();
  loom::runtime::clear_compile_cache();  // the same graph: compile it again, as a step graph
  cpu::set_step_graph(cpu::StepGraphMode::Auto);
  for (int i = 0; i < 2; ++i) b(graph.x, graph.y).item<float>();
  cpu::set_step_graph(saved);
  const int64_t runs1 = cpu::step_graph_runs();
  std::vector<double> ta, tb;
  int faster = 0;
  for (int round = 0; round < 30; ++round) {
    for (int i = 0; i < 20; ++i) a(plain.x, plain.y);
    double t0 = seconds();
    for (int i = 0; i < 200; ++i) a(plain.x, plain.y);
    ta.push_back((seconds() - t0) / 200);
    for (int i = 0; i < 20; ++i) b(graph.x, graph.y);
    t0 = seconds();
    for (int i = 0; i < 200; ++i) b(graph.x, graph.y);
    tb.push_back((seconds() - t0) / 200);
    faster += tb.back() < ta.back();
  }
  const int64_t runs2 = cpu::step_graph_runs();
  return {
      {"step_graph_us", median(tb) * 1e6, "us",
       "784-256-10 MLP SGD step (trace_once), its steps run as a dependency graph"},
      {"step_by_step_us", median(ta) * 1e6, "us", "same run: the same step run step by step"},
      {"ratio", median(tb) / median(ta), "x", "graph / step by step, medians of 30 rounds"},
      {"rounds_graph_faster", static_cast<double>(faster), "", "of 30 alternating rounds"},
      {"graph_runs_in_warmup", static_cast<double>(runs1 - runs0), "",
       "2 expected: only the graph's executable takes it"},
      {"graph_runs_timed", static_cast<double>(runs2 - runs1), "", "6600 expected"},
  };
}

// Host time of a trace_once step, excluding the executable's run.
std::vector<Figure> trace_once_overhead() {
  MlpTraining t(8, /*adamw=*/true);
  const Tensor& x = t.x;
  const Tensor& y = t.y;
  auto body = [&](const Tensor& xb, const Tensor& yb) { return t.step(xb, yb); };
  auto once = loom::compile(body, {.name = "overhead", .trace_once = true});
  for (int i = 0; i < 20; ++i) once(x, y);
  std::vector<double> host, traced;
  for (int rep = 0; rep < 200; ++rep) {
    Metrics m0 = loom::metrics();
    double t0 = seconds();
    once(x, y);
    double dt = seconds() - t0;
    host.push_back(dt - (loom::metrics().execute_seconds - m0.execute_seconds));
  }
  for (int rep = 0; rep < 50; ++rep) {
    Metrics m0 = loom::metrics();
    double t0 = seconds();
    body(x, y);
    loom::sync();
    double dt = seconds() - t0;
    traced.push_back(dt - (loom::metrics().execute_seconds - m0.execute_seconds));
  }
  double h = median(host), tr = median(traced);
  return {
      {"trace_once_host_us", h * 1e6, "us",
       "goal < 20: replaying an MLP + AdamW step, excluding execution"},
      {"baseline_traced_host_us", tr * 1e6, "us",
       "same run: tracing the step and syncing (cache hit)"},
      {"saving", tr / h, "x", "host time saved by trace_once"},
  };
}

Register r1("scan_layers_compile",
            "compile time of the decoder fwd+bwd, L = 1..100, scan_layers vs for loop",
            scan_layers_compile);
Register r2("scan_layers_step", "decoder (50 layers) fwd+bwd step time, scan_layers vs for loop",
            scan_layers_step);
Register r3("mlp_train", "784-256-10 MLP SGD steps per second vs PyTorch", mlp_train);
Register r5("step_graph", "the MLP step as a step graph against step by step, alternating",
            step_graph);
Register r4("trace_once_overhead", "host time of a trace_once step, excluding execution",
            trace_once_overhead);

}  // namespace
}  // namespace loom::bench
