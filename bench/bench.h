// The loom-bench registry: each benchmark returns figures, each with the baseline measured in
// the same run, because this machine is shared and noisy. `loom-bench --list`,
// `loom-bench NAME [--json]`, `loom-bench all`.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::bench {

struct Figure {
  std::string name;  // "ns_per_op"
  double value;
  std::string unit;  // "ns"
  std::string note;  // what it means / the goal
};

struct Benchmark {
  std::string name, description;
  std::function<std::vector<Figure>()> run;
};

std::vector<Benchmark>& registry();
struct Register {
  Register(std::string name, std::string description, std::function<std::vector<Figure>()> run) {
    registry().push_back({std::move(name), std::move(description), std::move(run)});
  }
};

// Hidden subcommands (`loom-bench --child NAME ARGS...`), run in a fresh process by
// benchmarks that measure process start (warm_start). Each returns the exit status.
std::vector<std::pair<std::string, std::function<int(int, char**)>>>& children();
struct RegisterChild {
  RegisterChild(std::string name, std::function<int(int, char**)> run) {
    children().emplace_back(std::move(name), std::move(run));
  }
};

inline double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Deterministic host data without <random>'s cost: splitmix64, then Box-Muller for normals.
class HostRng {
 public:
  explicit HostRng(uint64_t seed) : s_(seed) {}
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal(double stddev) {
    double u1 = 1.0 - uniform(), u2 = uniform();
    return static_cast<float>(stddev * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  std::vector<float> uniform_vec(int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = lo + static_cast<float>(uniform()) * (hi - lo);
    return v;
  }
  std::vector<float> normal_vec(int64_t n, double stddev) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(stddev);
    return v;
  }

 private:
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t s_;
};

// The median of v; of `reps` timings of f() in seconds.
double median(std::vector<double> v);
double median_seconds(int reps, const std::function<void()>& f);
// The hardware threads of this machine (at least 1): the benches' full width (main.cpp).
int hardware_threads();
// The machine's floating-point peak in this run, FLOP/s: independent fused multiply-adds on
// `threads` threads at once (12 accumulators each, for ~0.2 s; AVX2, and AVX-512 where the
// CPU has it, the faster of the two), the bound no product can pass; 0 when the CPU has no
// AVX2 FMA (main.cpp).
double fma_peak_flops(int threads);
// The operands and results of the five products of the 784-256-10 MLP's training step (batch
// 64), row-major, seeded: h = x W1^T, logits = h W2^T, dW2 = dY^T h, dh = dY W2, dW1 = dh^T x
// (the logits stand in for dY). `best_step_seconds` times a step of them: 50 warm-up steps,
// then the best of 5 x 200 (cpu_bench.cpp).
struct MlpProducts {
  static constexpr int64_t b = 64, in = 784, hid = 256, out = 10;
  std::vector<float> x, w1, w2, h, lg, dw2, dh, dw1;
  MlpProducts();
  static double best_step_seconds(const std::function<void()>& step);
};
// The five products alone, on OpenBLAS at full width: a lower bound of the step (cpu_bench.cpp).
double mlp_products_seconds();
// The same five products on oneDNN's matmul primitive, threaded by oneDNN (OpenMP, every
// core), best of 5 x 200: the step's bound on the library loom's products run on
// (onednn_baseline.cpp).
double mlp_onednn_products_seconds();

// Baselines and child processes print "key value" lines. command_output runs a shell command
// and returns its standard output (*status: its exit status, -1 when it could not start);
// word_in and figure_in read the value after `key` ("" and -1 when absent).
std::string command_output(const std::string& cmd, int* status = nullptr);
std::string word_in(const std::string& output, const std::string& key);
double figure_in(const std::string& output, const std::string& key);
// A file shipped with the benchmarks (`torch_reference.py`, `peers/jax_peer.py`): beside the
// executable, installed under share/loom, or in the source tree; "" when none exists.
std::string bench_file(const std::string& relative);
// This executable's path, for running its children (`loom-bench --child NAME`).
std::string self_path();
// Whether /usr/bin/python3 imports torch (python3-torch: the PyTorch baselines).
bool torch_available();
// What `python3 -c CODE` prints (CODE without double quotes), "" when PyTorch is missing; the
// figure `key` it prints, or -1 when PyTorch is missing or the script prints nothing under it.
std::string torch_output(const std::string& code);
double torch_figure(const std::string& code, const std::string& key);

// `loom-bench --peers` (peers.cpp): the benchmarks that have peer versions, their figures
// from the peers in the same run (appended to the benchmark's), and the closing table.
bool has_peers(const std::string& benchmark);
std::vector<std::string> peer_benchmarks();
void add_peer_figures(const std::string& benchmark, std::vector<Figure>& figs);
void print_peer_table();

}  // namespace loom::bench
