// Benchmarks of the LLVM CPU backend, each against a baseline measured in the same run:
// fused_elementwise (vs a STREAM triad), matmul (vs OpenBLAS sgemm), compile_latency (vs
// tracing and the ref backend) and decoder_forward (vs sgemm alone and PyTorch). Each selects
// the "cpu" backend and, while it does not exist, runs on the current one and says so.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

// Declared here as well because cblas.h is only OpenBLAS's when the BLAS alternative points at
// it; CMake links libopenblas itself, which always has them.
extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int);

namespace loom::bench {
namespace {

constexpr double kGiga = 1e9;

// Notes end up inside JSON strings that main.cpp prints unescaped.
std::string json_safe(std::string s) {
  for (char& c : s)
    if (c == '"' || c == '\\' || c == '\n' || c == '\t') c = c == '"' ? '\'' : ' ';
  return s;
}

// Selects a backend for one benchmark and restores the previous one after, so the other
// benchmarks of `loom-bench all` keep the backend they started with. When `want` cannot be
// created (the cpu backend is not built yet) the current backend stays and figure() says why.
class BackendScope {
 public:
  explicit BackendScope(const std::string& want) : previous_(runtime::current_backend().name()) {
    // Replacing a backend by a new instance of itself would only throw its JIT away.
    if (previous_ != want) {
      try {
        runtime::set_backend(want);
      } catch (const Error& e) {
        reason_ = e.what();
      }
    }
    name_ = runtime::current_backend().name();
  }
  ~BackendScope() {
    if (name_ == previous_) return;
    try {
      runtime::set_backend(previous_);
    } catch (const Error&) {  // previous_ was created once, so this does not happen
    }
  }
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;

  const std::string& name() const { return name_; }
  bool is(const char* n) const { return name_ == n; }
  // The figure every benchmark here opens with: 1 when it ran on the cpu backend.
  Figure figure() const {
    if (is("cpu")) return {"backend_cpu", 1, "", "ran on the cpu backend"};
    return {
        "backend_cpu", 0, "",
        json_safe("FALLBACK: cpu backend unavailable (" + reason_ + "); ran on '" + name_ + "'")};
  }

 private:
  std::string previous_, name_, reason_;
};

// A materialized loom tensor holding `host`.
Tensor materialized(std::vector<float> host, Shape shape) {
  Tensor t = loom::tensor(std::move(host), std::move(shape));
  loom::sync();
  return t;
}

// Seconds for tracing f and syncing its result. The result is freed after the clock stops:
// unmapping a large output is the allocator's cost, not the run's.
double time_loom_once(const std::function<Tensor()>& f) {
  Tensor y;
  double t0 = seconds();
  y = f();
  loom::sync();
  return seconds() - t0;
}

double time_once(const std::function<void()>& f) {
  double t0 = seconds();
  f();
  return seconds() - t0;
}

// OpenBLAS at full width for a baseline, restored after. The cpu backend runs OpenBLAS
// single-threaded inside its own pool, and the setting is process-wide, so without this the
// baseline would be OpenBLAS on one core.
class BlasThreads {
 public:
  BlasThreads() : previous_(openblas_get_num_threads()) {
    openblas_set_num_threads(hardware_threads());
  }
  ~BlasThreads() { openblas_set_num_threads(previous_); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
  int previous() const { return previous_; }

 private:
  int previous_;
};

// OpenBLAS's idle workers spin (yielding) for about 2^28 cycles before they sleep; a pause
// after a baseline keeps them from competing with the next loom run for the two cores.
void quiesce_blas() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

// ---- fused_elementwise ------------------------------------------------------------------

// The STREAM triad, noinline so it is compiled once as its own function. Blocks of 16 with a
// constant inner count because GCC's -O2 cost model ("very cheap") vectorizes a loop only when
// no scalar remainder is left; lo and hi are multiples of 16.
__attribute__((noinline)) void triad(float* __restrict a, const float* __restrict b,
                                     const float* __restrict c, float s, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i += 16)
    for (int64_t j = i; j < i + 16; ++j) a[j] = b[j] + s * c[j];
}

void triad_2t(float* a, const float* b, const float* c, float s, int64_t n) {
  std::thread second([=] { triad(a, b, c, s, n / 2, n); });
  triad(a, b, c, s, 0, n / 2);
  second.join();
}

// Eight elementwise ops over three inputs: one pass over memory for a fusing backend.
Tensor elementwise_chain(const Tensor& a, const Tensor& b, const Tensor& c) {
  Tensor t = a * b;     // mul
  t = t + c;            // add
  t = t * 0.5;          // mul (by a host scalar: a 0-d graph input)
  t = t - a;            // sub
  t = maximum(t, b);    // maximum
  t = -t;               // neg
  t = t - c;            // sub
  return loom::abs(t);  // abs
}

std::vector<Figure> fused_elementwise() {
  BackendScope backend("cpu");
  std::vector<Figure> f{backend.figure()};
  constexpr int64_t kN = int64_t{16} << 20;  // 16 Mi floats = 64 MiB per array
  // The ref interpreter takes seconds per run (doubles, one op at a time): fewer reps.
  const int reps = backend.is("ref") ? 3 : 15;
  HostRng rng(1);
  Tensor a = materialized(rng.uniform_vec(kN, -1, 1), {kN});
  Tensor b = materialized(rng.uniform_vec(kN, -1, 1), {kN});
  Tensor c = materialized(rng.uniform_vec(kN, -1, 1), {kN});
  std::vector<float> ta(kN, 0.0f), tb(kN, 1.0f), tc(kN, 2.0f);  // first touch before timing
  auto chain = [&] { return elementwise_chain(a, b, c); };

  Metrics m0 = loom::metrics();
  time_loom_once(chain);  // compiles
  Metrics m1 = loom::metrics();
  std::vector<double> loom_t, exec_t, t1, t2;
  // Interleaved, so that a noisy neighbour slows baseline and loom alike.
  for (int rep = 0; rep < reps; ++rep) {
    t1.push_back(time_once([&] { triad(ta.data(), tb.data(), tc.data(), 3.0f, 0, kN); }));
    t2.push_back(time_once([&] { triad_2t(ta.data(), tb.data(), tc.data(), 3.0f, kN); }));
    double e0 = loom::metrics().execute_seconds;
    loom_t.push_back(time_loom_once(chain));
    exec_t.push_back(loom::metrics().execute_seconds - e0);
  }
  const double loom_bytes = 4.0 * kN * sizeof(float);   // 3 distinct inputs + 1 output
  const double triad_bytes = 3.0 * kN * sizeof(float);  // STREAM counting: 2 reads + 1 write
  double loom_gbs = loom_bytes / median(loom_t) / kGiga;
  double exec_gbs = loom_bytes / median(exec_t) / kGiga;
  double triad1 = triad_bytes / median(t1) / kGiga, triad2 = triad_bytes / median(t2) / kGiga;
  f.push_back({"loom_ms", median(loom_t) * 1e3, "ms",
               "8 ops on 3 x 64 MiB f32 inputs, trace+sync, median of " + std::to_string(reps)});
  f.push_back({"loom_gb_per_s", loom_gbs, "GB/s", "(3 inputs + 1 output) x 64 MiB / time"});
  f.push_back({"loom_execute_gb_per_s", exec_gbs, "GB/s",
               "same bytes / metrics execute_seconds (no trace, cut or lookup)"});
  f.push_back({"compile_ms", (m1.compile_seconds - m0.compile_seconds) * 1e3, "ms",
               "first run: the one compile"});
  f.push_back({"baseline_triad_1t_gb_per_s", triad1, "GB/s",
               "same run: a[i] = b[i] + s*c[i], 64 MiB arrays, 1 thread, -O2 C++"});
  f.push_back(
      {"baseline_triad_2t_gb_per_s", triad2, "GB/s", "same run: the triad on 2 std::threads"});
  double best = std::max(triad1, triad2);
  f.push_back({"ratio_vs_triad_1t", loom_gbs / triad1, "x", "loom / 1-thread triad"});
  f.push_back({"ratio_vs_best_triad", loom_gbs / best, "x",
               "goal >= 0.85: loom / the better of the 1- and 2-thread triads"});
  return f;
}

// ---- matmul ----------------------------------------------------------------------------

std::vector<Figure> matmul_bench() {
  BackendScope backend("cpu");
  std::vector<Figure> f{backend.figure()};
  int blas_threads = 0, loom_blas_threads = 0;
  HostRng rng(2);
  for (int64_t n : {512, 1024, 2048}) {
    std::string p = "n" + std::to_string(n) + "_";
    // The ref interpreter's plain triple loop needs minutes at n = 2048.
    if (backend.is("ref") && n > 512) {
      f.push_back({p + "skipped", 0, "", "too slow on the ref backend; run with cpu"});
      continue;
    }
    const int reps = backend.is("ref") ? 2 : n <= 512 ? 30 : n <= 1024 ? 12 : 5;
    std::vector<float> ha = rng.uniform_vec(n * n, -1, 1), hb = rng.uniform_vec(n * n, -1, 1);
    std::vector<float> hc(n * n, 0.0f);
    Tensor a = materialized(ha, {n, n}), b = materialized(hb, {n, n});  // copies
    auto loom_mm = [&] { return loom::matmul(a, b); };
    auto blas_mm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, ha.data(), n, hb.data(),
                  n, 0.0f, hc.data(), n);
    };
    time_loom_once(loom_mm);  // compiles
    std::vector<double> lt, bt;
    for (int rep = 0; rep < reps; ++rep) lt.push_back(time_loom_once(loom_mm));
    {
      BlasThreads full;
      loom_blas_threads = full.previous();
      blas_threads = openblas_get_num_threads();
      blas_mm();  // OpenBLAS starts its threads and buffers
      for (int rep = 0; rep < reps; ++rep) bt.push_back(time_once(blas_mm));
    }
    quiesce_blas();
    // A fast wrong answer is no win: compare with sgemm's result.
    std::vector<float> got = loom::matmul(a, b).to_vector<float>();
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n * n; ++i) {
      err = std::max(err, static_cast<double>(std::fabs(got[i] - hc[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(hc[i])));
    }
    const double flop = 2.0 * n * n * n;
    double lg = flop / median(lt) / kGiga, bg = flop / median(bt) / kGiga;
    f.push_back({p + "loom_gflops", lg, "GFLOP/s",
                 "f32 n x n, trace+sync, median of " + std::to_string(reps)});
    f.push_back({p + "baseline_sgemm_gflops", bg, "GFLOP/s", "same run: cblas_sgemm, same data"});
    f.push_back({p + "ratio", lg / bg, "x", "goal >= 0.95"});
    f.push_back({p + "max_rel_diff", err / scale, "", "max |loom - sgemm| / max |sgemm|"});
  }
  f.push_back({"baseline_openblas_threads", static_cast<double>(blas_threads), "",
               "threads of the sgemm baseline; loom had set OpenBLAS to " +
                   std::to_string(loom_blas_threads)});
  return f;
}

// ---- compile_latency -------------------------------------------------------------------

// Builds the graph of rep k. For cold compiles, rep k > 0 is the rep-0 graph with one extent
// k smaller: the cpu backend keeps its kernels in a process-wide cache keyed by structure,
// which clear_compile_cache() does not drop, so the same graph again would find them.
using GraphFn = std::function<Tensor(int rep)>;

struct CompileTiming {
  double median_ms = 0, first_ms = 0, trace_ms = 0;
  int64_t nodes = 0, compiles = 0;
};

// Compile and trace time of f's graphs: the compile cache is cleared before each rep, so every
// sync compiles; compile time comes from the metrics, so running the graph is not counted.
CompileTiming time_compile(int reps, const GraphFn& f) {
  std::vector<double> compile, trace;
  CompileTiming r;
  for (int rep = 0; rep < reps; ++rep) {
    runtime::clear_compile_cache();
    Metrics m0 = loom::metrics();
    double t0 = seconds();
    Tensor y = f(rep);
    trace.push_back(seconds() - t0);
    loom::sync();
    Metrics m1 = loom::metrics();
    compile.push_back(m1.compile_seconds - m0.compile_seconds);
    if (rep == 0) r.nodes = m1.sync_nodes - m0.sync_nodes;
    r.compiles = std::max(r.compiles, m1.compiles - m0.compiles);
  }
  r.first_ms = compile[0] * 1e3;
  r.median_ms = median(compile) * 1e3;
  r.trace_ms = median(trace) * 1e3;
  return r;
}

// Ten primitive ops per step, elementwise and keepdim reductions (a softmax-like block), so a
// fusing backend has to cut kernels at the reductions.
Tensor reduction_chain(const Tensor& x, const Tensor& p, const Tensor& q, int steps) {
  Tensor h = x;
  for (int i = 0; i < steps; ++i) {
    h = loom::tanh(h * p + q);
    h = loom::exp(h - loom::max(h, {1}, true));
    h = h / loom::sum(h, {1}, true);
    h = loom::abs(h - p);
  }
  return h;
}

struct CompileRow {
  std::string name, what;
  GraphFn fn;
  int reps, ref_reps;
};

void compile_row(const BackendScope& backend, const CompileRow& row, std::vector<Figure>& f) {
  const std::string& n = row.name;
  const std::string reps = std::to_string(row.reps);
  CompileTiming t = time_compile(row.reps, row.fn);
  std::string check = t.compiles == 1 ? ""
                                      : "; WARNING: " + std::to_string(t.compiles) +
                                            " compiles in one sync, expected 1";
  f.push_back({n + "_compile_ms", t.median_ms, "ms",
               row.what + ", cold: median of " + reps + ", extent -k in rep k" + check});
  f.push_back({n + "_first_compile_ms", t.first_ms, "ms", "rep 0 alone: exactly that graph"});
  if (!backend.is("ref")) {  // ref has no kernel cache: this would repeat the figure above
    CompileTiming warm = time_compile(row.reps, [&](int) { return row.fn(0); });
    f.push_back(
        {n + "_recompile_ms", warm.median_ms, "ms",
         "rep-0 graph again after clear_compile_cache (backend caches warm), median of " + reps});
  }
  f.push_back({n + "_nodes", static_cast<double>(t.nodes), "nodes", "nodes in the graph cut"});
  f.push_back({n + "_baseline_trace_ms", t.trace_ms, "ms", "same run: tracing that graph"});
  if (backend.is("ref")) {
    f.push_back({n + "_baseline_ref_compile_ms", t.median_ms, "ms",
                 "same run: the ref backend (the one measured above)"});
    return;
  }
  BackendScope ref("ref");
  CompileTiming r = time_compile(row.ref_reps, row.fn);
  f.push_back({n + "_baseline_ref_compile_ms", r.median_ms, "ms",
               "same run: the ref backend (passes + interpreter plan), median of " +
                   std::to_string(row.ref_reps)});
}

std::vector<Figure> compile_latency() {
  BackendScope backend("cpu");
  std::vector<Figure> f{backend.figure()};
  // Every rep also runs the layer: about three seconds on the ref interpreter.
  const int layer_reps = backend.is("ref") ? 3 : 7, chain_reps = 7;
  HostRng rng(3);
  std::vector<Tensor> xs, ss;  // the inputs of rep k, one extent k smaller
  for (int64_t k = 0; k < layer_reps; ++k)
    xs.push_back(materialized(rng.normal_vec(4 * (512 - k) * 512, 1.0), {4, 512 - k, 512}));
  for (int64_t k = 0; k < chain_reps; ++k)
    ss.push_back(materialized(rng.normal_vec((32 - k) * 256, 1.0), {32 - k, 256}));
  Tensor w = materialized(rng.normal_vec(512 * 512, 0.02), {512, 512});
  Tensor b = materialized(rng.normal_vec(512, 0.02), {512});
  Tensor p = materialized(rng.normal_vec(256, 1.0), {256});
  Tensor q = materialized(rng.normal_vec(256, 1.0), {256});
  auto layer = [&](int k) {
    return loom::gelu(loom::matmul(xs[k], loom::transpose(w, 0, 1)) + b) + xs[k];
  };
  auto chain = [&](int k) { return reduction_chain(ss[k], p, q, 50); };
  compile_row(backend,
              {"layer", "decoder layer: Linear(512,512) + gelu + residual on [4,512,512]", layer,
               layer_reps, 3},
              f);
  compile_row(
      backend,
      {"graph500", "50 x 10 elementwise/reduction ops on [32,256]", chain, chain_reps, chain_reps},
      f);
  runtime::clear_compile_cache();  // leave no 500-node executables behind
  return f;
}

// ---- decoder_forward -------------------------------------------------------------------

constexpr int kLayers = 50;
constexpr int64_t kBatch = 4, kSeq = 512, kDim = 512;

// The seed decoder: 50 x [Linear(512,512) -> GELU -> residual], then LayerNorm(512). Host
// copies of the weights feed the sgemm baseline.
struct Decoder {
  std::vector<std::vector<float>> host_w;
  std::vector<Tensor> w, b;
  Tensor ln_w, ln_b;
  explicit Decoder(HostRng& rng) {
    for (int l = 0; l < kLayers; ++l) {
      host_w.push_back(rng.normal_vec(kDim * kDim, 0.02));
      w.push_back(loom::tensor(host_w.back(), {kDim, kDim}));
      b.push_back(loom::tensor(rng.normal_vec(kDim, 0.02), {kDim}));
    }
    ln_w = loom::ones({kDim});
    ln_b = loom::zeros({kDim});
    loom::sync();
  }
  Tensor forward(Tensor x) const {
    for (int l = 0; l < kLayers; ++l)
      x = loom::gelu(loom::matmul(x, loom::transpose(w[l], 0, 1)) + b[l]) + x;
    return loom::layer_norm(x, {kDim}, ln_w, ln_b);
  }
};

// Runs the PyTorch reference and returns its median in ms, or a negative value with `why`.
double torch_median_ms(std::string& why, std::string& version, const std::string& extra = "") {
  const char* python = "/usr/bin/python3";
  if (!torch_available()) {
    why = "PyTorch not installed for /usr/bin/python3 (apt-get install python3-torch)";
    return -1;
  }
  std::string script = bench_file("torch_reference.py");
  if (script.empty() || script.find('\'') != std::string::npos) {
    why = "bench/torch_reference.py not found";
    return -1;
  }
  std::string cmd = std::string(python) + " '" + script + "' --layers " + std::to_string(kLayers) +
                    " --reps 7 " + extra + " 2>&1";
  int rc = 0;
  const std::string out = command_output(cmd, &rc);
  const double ms = figure_in(out, "median_ms");
  if (std::string v = word_in(out, "torch_version"); !v.empty()) version = v;
  if (rc != 0 || ms < 0) {
    why = "torch_reference.py failed (exit " + std::to_string(rc) + ")";
    return -1;
  }
  return ms;
}

// The matmuls of one forward alone, on OpenBLAS: [2048,512] x W^T per layer, ping-ponging
// between two activations as the decoder chains them.
double sgemm_lower_bound_seconds(const Decoder& dec, int reps) {
  const int64_t m = kBatch * kSeq;
  HostRng rng(5);
  std::vector<float> x = rng.normal_vec(m * kDim, 1.0), y(m * kDim);
  auto run = [&] {
    float* in = x.data();
    float* out = y.data();
    for (int l = 0; l < kLayers; ++l) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, kDim, kDim, 1.0f, in, kDim,
                  dec.host_w[l].data(), kDim, 0.0f, out, kDim);
      std::swap(in, out);
    }
  };
  run();  // warm-up
  return median_seconds(reps, run);
}

std::vector<Figure> decoder_forward() {
  BackendScope backend("cpu");
  std::vector<Figure> f{backend.figure()};
  if (backend.is("ref")) {
    f.push_back({"skipped", 0, "",
                 "the ref backend needs minutes for this forward; run with the cpu backend"});
    return f;
  }
  HostRng rng(4);
  Decoder dec(rng);
  Tensor x = materialized(rng.normal_vec(kBatch * kSeq * kDim, 1.0), {kBatch, kSeq, kDim});
  auto forward = [&] { return dec.forward(x); };

  Metrics m0 = loom::metrics();
  double first = time_loom_once(forward);  // compiles
  Metrics m1 = loom::metrics();
  constexpr int kReps = 7;
  std::vector<double> t;
  for (int rep = 0; rep < kReps; ++rep) t.push_back(time_loom_once(forward));
  double loom_ms = median(t) * 1e3;
  double blas_ms = 0;
  int blas_threads = 0;
  {
    BlasThreads full;
    blas_threads = openblas_get_num_threads();
    blas_ms = sgemm_lower_bound_seconds(dec, 5) * 1e3;
  }
  quiesce_blas();
  const double flop = 2.0 * kBatch * kSeq * kDim * kDim * kLayers;

  f.push_back({"forward_ms", loom_ms, "ms",
               "goal < 300; 50 layers, [4,512,512] f32, trace+sync, median of 7"});
  f.push_back({"first_run_ms", first * 1e3, "ms", "trace + compile + run"});
  f.push_back({"compile_ms", (m1.compile_seconds - m0.compile_seconds) * 1e3, "ms",
               "compile time of the first run (kernels already in the process cache excluded)"});
  f.push_back({"matmul_gflops", flop / (loom_ms * 1e-3) / kGiga, "GFLOP/s",
               "matmul flops / whole forward time"});
  f.push_back({"baseline_sgemm_only_ms", blas_ms, "ms",
               "same run: the 50 matmuls alone on cblas_sgemm, " + std::to_string(blas_threads) +
                   " OpenBLAS threads (a lower bound)"});
  f.push_back({"ratio_vs_sgemm_only", loom_ms / blas_ms, "x", "1.0 = only the matmuls cost"});
  std::string why, version;
  double torch_ms = torch_median_ms(why, version);
  if (torch_ms > 0) {
    f.push_back(
        {"baseline_torch_ms", torch_ms, "ms",
         json_safe("same run: PyTorch " + version + " no_grad, default threads, median of 7")});
    f.push_back({"ratio_vs_torch", loom_ms / torch_ms, "x", "< 1 = faster than PyTorch"});
  } else {
    f.push_back({"baseline_torch_ms", 0, "ms", json_safe("not measured: " + why)});
  }
  return f;
}

// ---- decoder_train_step ----------------------------------------------------------------

// The seed decoder's training step: forward, loss = mean of the output, backward into every
// weight and bias (the gradients materialized by the sync), as PyTorch's loss.backward().
std::vector<Figure> decoder_train_step() {
  BackendScope backend("cpu");
  std::vector<Figure> f{backend.figure()};
  if (backend.is("ref")) {
    f.push_back({"skipped", 0, "", "the ref backend needs minutes; run with the cpu backend"});
    return f;
  }
  HostRng rng(4);
  Decoder dec(rng);
  for (int l = 0; l < kLayers; ++l) {
    dec.w[l].requires_grad_();
    dec.b[l].requires_grad_();
  }
  Tensor x = materialized(rng.normal_vec(kBatch * kSeq * kDim, 1.0), {kBatch, kSeq, kDim});
  auto step = [&] {
    for (int l = 0; l < kLayers; ++l) {
      dec.w[l].reset_grad();
      dec.b[l].reset_grad();
    }
    double t0 = seconds();
    loom::mean(dec.forward(x)).backward();
    loom::sync();
    return seconds() - t0;
  };
  Metrics m0 = loom::metrics();
  double first = step();
  Metrics m1 = loom::metrics();
  constexpr int kReps = 5;
  std::vector<double> t;
  for (int rep = 0; rep < kReps; ++rep) t.push_back(step());
  double loom_ms = median(t) * 1e3;
  double blas_ms = 0;
  {
    BlasThreads full;
    blas_ms = 3 * sgemm_lower_bound_seconds(dec, 3) * 1e3;  // forward, dX and dW products
  }
  quiesce_blas();
  f.push_back({"train_step_ms", loom_ms, "ms",
               "goal < 900; forward + backward, 50 layers, [4,512,512] f32, median of 5"});
  f.push_back({"first_step_ms", first * 1e3, "ms", "trace + compile + run"});
  f.push_back({"compile_ms", (m1.compile_seconds - m0.compile_seconds) * 1e3, "ms", "first step"});
  f.push_back({"baseline_3x_sgemm_ms", blas_ms, "ms",
               "same run: 3 x the forward's 50 matmuls on cblas_sgemm (a lower bound)"});
  const int cores = hardware_threads();
  if (const double peak = fma_peak_flops(cores); peak > 0) {
    // 50 forward products, 50 weight gradients, 49 input gradients (the input needs none).
    const double flops = (3.0 * kLayers - 1) * 2.0 * kBatch * kSeq * kDim * kDim;
    char note[160];
    std::snprintf(note, sizeof note,
                  "same run: the step's %d products at the FMA peak (%d threads, %.0f GFLOP/s)",
                  3 * kLayers - 1, cores, peak / 1e9);
    f.push_back({"baseline_fma_peak_ms", flops / peak * 1e3, "ms", note});
  }
  std::string why, version;
  double torch_ms = torch_median_ms(why, version, "--train");
  if (torch_ms > 0) {
    f.push_back({"baseline_torch_ms", torch_ms, "ms",
                 json_safe("same run: PyTorch " + version + " loss.backward(), median of 7")});
    f.push_back({"ratio_vs_torch", loom_ms / torch_ms, "x", "< 1 = faster than PyTorch"});
  } else {
    f.push_back({"baseline_torch_ms", 0, "ms", json_safe("not measured: " + why)});
  }
  for (int l = 0; l < kLayers; ++l) {
    dec.w[l].reset_grad();
    dec.b[l].reset_grad();
  }
  return f;
}

Register r6("decoder_train_step",
            "seed decoder forward + backward (50 layers) vs 3x the sgemm bound and PyTorch",
            decoder_train_step);

// ---- warm_start ------------------------------------------------------------------------

// The child: the seed decoder's forward once in this fresh process, with the persistent cache
// in argv[0]; prints its compile time and counts for the parent.
int warm_start_child(int argc, char** argv) {
  if (argc < 1) return 2;
  double t0 = seconds();
  runtime::set_cache_dir(argv[0]);
  HostRng rng(4);
  Decoder dec(rng);
  Tensor x = materialized(rng.normal_vec(kBatch * kSeq * kDim, 1.0), {kBatch, kSeq, kDim});
  double setup = seconds() - t0;
  double forward = time_loom_once([&] { return dec.forward(x); });
  Metrics m = loom::metrics();
  std::printf(
      "compile_s %.6f\nforward_s %.6f\nsetup_s %.6f\ncompiles %lld\ndisk_hits %lld\n"
      "loads %lld\nwrites %lld\n",
      m.compile_seconds, forward, setup, static_cast<long long>(m.compiles),
      static_cast<long long>(m.disk_cache_hits), static_cast<long long>(m.disk_cache_loads),
      static_cast<long long>(m.disk_cache_writes));
  return 0;
}
RegisterChild child1("warm_start", warm_start_child);

struct ChildRun {
  double wall = 0, compile = 0, forward = 0;
  long long compiles = -1, disk_hits = -1;
  bool ok = false;
};

ChildRun run_warm_start_child(const std::string& dir) {
  ChildRun r;
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || exe.find('\'') != std::string::npos || dir.find('\'') != std::string::npos) return r;
  std::string cmd = "'" + exe + "' --child warm_start '" + dir + "' 2>/dev/null";
  double t0 = seconds();
  int rc = 0;
  const std::string out = command_output(cmd, &rc);
  r.wall = seconds() - t0;
  r.compile = figure_in(out, "compile_s");
  r.forward = figure_in(out, "forward_s");
  r.compiles = static_cast<long long>(figure_in(out, "compiles"));
  r.disk_hits = static_cast<long long>(figure_in(out, "disk_hits"));
  r.ok = rc == 0 && r.compiles >= 0;
  return r;
}

std::vector<Figure> warm_start() {
  namespace fs = std::filesystem;
  std::vector<Figure> f;
  if (runtime::current_backend().name() != "cpu") {
    f.push_back({"skipped", 0, "", "needs the cpu backend (the persistent cache stores its code)"});
    return f;
  }
  fs::path dir = fs::temp_directory_path() / ("loom_warm_start_" + std::to_string(::getpid()));
  constexpr int kReps = 5;
  std::vector<double> cold_wall, cold_compile, cold_fwd, warm_wall, warm_compile, warm_fwd;
  long long warm_compiles = 0, warm_disk_hits = 0;
  for (int rep = 0; rep < kReps; ++rep) {
    fs::remove_all(dir);
    ChildRun cold = run_warm_start_child(dir.string());
    ChildRun warm = run_warm_start_child(dir.string());
    if (!cold.ok || !warm.ok) {
      fs::remove_all(dir);
      f.push_back({"failed", 0, "", "a child process failed (loom-bench --child warm_start DIR)"});
      return f;
    }
    cold_wall.push_back(cold.wall), cold_compile.push_back(cold.compile);
    cold_fwd.push_back(cold.forward);
    warm_wall.push_back(warm.wall), warm_compile.push_back(warm.compile);
    warm_fwd.push_back(warm.forward);
    warm_compiles += warm.compiles;
    warm_disk_hits += warm.disk_hits;
  }
  fs::remove_all(dir);
  double cc = median(cold_compile), wc = median(warm_compile);
  f.push_back({"cold_process_wall_ms", median(cold_wall) * 1e3, "ms",
               "fresh process, empty cache dir: weights, decoder forward (50 layers), exit"});
  f.push_back({"warm_process_wall_ms", median(warm_wall) * 1e3, "ms",
               "fresh process, the cache dir the cold one filled"});
  f.push_back({"cold_compile_ms", cc * 1e3, "ms", "metrics().compile_seconds in the cold process"});
  f.push_back({"warm_compile_ms", wc * 1e3, "ms",
               "the same in the warm one: passes, planning, loading objects"});
  f.push_back({"warm_over_cold_compile", wc / cc, "x", "goal < 0.05"});
  f.push_back({"cold_first_forward_ms", median(cold_fwd) * 1e3, "ms", "trace + compile + run"});
  f.push_back({"warm_first_forward_ms", median(warm_fwd) * 1e3, "ms", "trace + load + run"});
  f.push_back({"warm_compiles", static_cast<double>(warm_compiles), "",
               "graphs compiled by all warm processes (goal 0); disk hits: " +
                   std::to_string(warm_disk_hits)});
  return f;
}

Register r1("fused_elementwise",
            "8 fused elementwise ops on 64 MiB f32 arrays vs a STREAM triad (1 and 2 threads)",
            fused_elementwise);
Register r2("matmul", "f32 matmul n = 512, 1024, 2048 vs cblas_sgemm (OpenBLAS)", matmul_bench);
Register r3("compile_latency",
            "ms to compile a decoder layer and a 500-node graph vs tracing and the ref backend",
            compile_latency);
Register r4("decoder_forward",
            "seed decoder forward (50 layers) vs the sgemm lower bound and PyTorch",
            decoder_forward);
Register r5("warm_start",
            "seed decoder forward in a fresh process: cold vs warm persistent cache (median of 5)",
            warm_start);

}  // namespace

MlpProducts::MlpProducts() : h(b * hid), lg(b * out), dw2(out * hid), dh(b * hid), dw1(hid * in) {
  HostRng rng(7);
  x = rng.normal_vec(b * in, 1.0);
  w1 = rng.normal_vec(hid * in, 0.05);
  w2 = rng.normal_vec(out * hid, 0.05);
}

double MlpProducts::best_step_seconds(const std::function<void()>& step) {
  for (int i = 0; i < 50; ++i) step();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = seconds();
    for (int i = 0; i < 200; ++i) step();
    best = std::min(best, (seconds() - t0) / 200);
  }
  return best;
}

double mlp_products_seconds() {
  BlasThreads threads;
  MlpProducts m;
  const int b = MlpProducts::b, in = MlpProducts::in, hid = MlpProducts::hid,
            out = MlpProducts::out;
  auto& [x, w1, w2, h, lg, dw2, dh, dw1] = m;
  auto step = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, hid, in, 1.0f, x.data(), in, w1.data(),
                in, 0.0f, h.data(), hid);  // h = x W1^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, out, hid, 1.0f, h.data(), hid,
                w2.data(), hid, 0.0f, lg.data(), out);  // logits = h W2^T
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, hid, b, 1.0f, lg.data(), out,
                h.data(), hid, 0.0f, dw2.data(), hid);  // dW2 = dY^T h
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, hid, out, 1.0f, lg.data(), out,
                w2.data(), hid, 0.0f, dh.data(), hid);  // dh = dY W2
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hid, in, b, 1.0f, dh.data(), hid, x.data(),
                in, 0.0f, dw1.data(), in);  // dW1 = dh^T x
  };
  return MlpProducts::best_step_seconds(step);
}

}  // namespace loom::bench
