// loom-bench: one CLI for every benchmark of the project.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include "bench.h"

namespace loom::bench {

std::vector<Benchmark>& registry() {
  static std::vector<Benchmark> r;
  return r;
}

std::vector<std::pair<std::string, std::function<int(int, char**)>>>& children() {
  static std::vector<std::pair<std::string, std::function<int(int, char**)>>> c;
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = seconds();
    f();
    t.push_back(seconds() - t0);
  }
  return median(std::move(t));
}

namespace {

// Fused multiply-adds on 12 independent vectors (two FMA units, four cycles of latency: 8
// chains keep them busy, 12 leave room): 12 * 2 * lanes FLOP per iteration. Unrolled, the
// accumulators stay in registers (at -O2 they did not).
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iterations) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (__m256& v : a) v = _mm256_fmadd_ps(v, m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  return _mm256_cvtss_f32(s);
}

// The same on 16 floats: where the FMA units are 512 bits wide (Zen 5, Xeon) twice the AVX2
// loop's FLOP per cycle, where they split a 512-bit op in two (Zen 4) the same.
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iterations) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (__m512& v : a) v = _mm512_fmadd_ps(v, m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

// FLOP/s of `threads` threads running `loop` at once, best of three.
double fma_rate(int threads, float (*loop)(int64_t), double flop_per_iteration) {
  constexpr int64_t kIterations = 20'000'000;  // 3.84 GFLOP per thread with AVX2
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<float> sink{0};
    const double t0 = seconds();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&] { sink.store(loop(kIterations), std::memory_order_relaxed); });
    for (auto& t : ts) t.join();
    best = std::max(best, flop_per_iteration * kIterations * threads / (seconds() - t0));
  }
  return best;
}

}  // namespace

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

double fma_peak_flops(int threads) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  double peak = fma_rate(threads, fma_loop_avx2, 12 * 2 * 8);
  if (__builtin_cpu_supports("avx512f"))
    peak = std::max(peak, fma_rate(threads, fma_loop_avx512, 12 * 2 * 16));
  return peak;
}

std::string command_output(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    if (status) *status = -1;
    return out;
  }
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  int rc = pclose(pipe);
  if (status) *status = rc;
  return out;
}

std::string word_in(const std::string& output, const std::string& key) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 ||
        line[key.size()] != ' ')
      continue;
    std::istringstream rest(line.substr(key.size()));
    std::string word;
    rest >> word;
    return word;
  }
  return "";
}

double figure_in(const std::string& output, const std::string& key) {
  std::string w = word_in(output, key);
  char* end = nullptr;
  double v = std::strtod(w.c_str(), &end);
  return w.empty() || *end ? -1 : v;
}

std::string bench_file(const std::string& relative) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    candidates = {dir / relative, dir / "../share/loom" / relative};
  }
#ifdef LOOM_SOURCE_DIR
  candidates.push_back(fs::path(LOOM_SOURCE_DIR) / "bench" / relative);
#endif
  for (const fs::path& p : candidates)
    if (fs::exists(p, ec) && p.string().find('\'') == std::string::npos) return p.string();
  return "";
}

bool torch_available() {
  static const bool yes = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return yes;
}

std::string torch_output(const std::string& code) {
  if (!torch_available()) return "";
  return command_output("/usr/bin/python3 -c \"" + code + "\" 2>/dev/null");
}

double torch_figure(const std::string& code, const std::string& key) {
  return figure_in(torch_output(code), key);
}

}  // namespace loom::bench

namespace {

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // notes are one line
    r += c;
  }
  return r + "\"";
}

void print_json(const loom::bench::Benchmark& b, const std::vector<loom::bench::Figure>& figs) {
  std::printf("{\"benchmark\": %s, \"figures\": [", json_string(b.name).c_str());
  for (size_t i = 0; i < figs.size(); ++i) {
    // JSON has no inf or nan: those values print as null.
    char value[32] = "null";
    if (std::isfinite(figs[i].value)) std::snprintf(value, sizeof value, "%.6g", figs[i].value);
    std::printf("%s{\"name\": %s, \"value\": %s, \"unit\": %s, \"note\": %s}", i ? ", " : "",
                json_string(figs[i].name).c_str(), value, json_string(figs[i].unit).c_str(),
                json_string(figs[i].note).c_str());
  }
  std::printf("]}\n");
}

void print_table(const loom::bench::Benchmark& b, const std::vector<loom::bench::Figure>& figs) {
  std::printf("%s: %s\n", b.name.c_str(), b.description.c_str());
  for (const auto& f : figs)
    std::printf("  %-34s %12.4g %-6s %s\n", f.name.c_str(), f.value, f.unit.c_str(),
                f.note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && !std::strcmp(argv[1], "--child")) {
    for (auto& [name, run] : loom::bench::children())
      if (name == argv[2]) return run(argc - 3, argv + 3);
    std::fprintf(stderr, "loom-bench: unknown child '%s'\n", argv[2]);
    return 2;
  }
  bool json = false, list = false, peers = false;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json"))
      json = true;
    else if (!std::strcmp(argv[i], "--list"))
      list = true;
    else if (!std::strcmp(argv[i], "--peers"))
      peers = true;
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf(
          "usage: loom-bench [--list] [--json] [--peers] NAME... | all\n"
          "  --peers: also run the peers (LOOM_PEER_JAX, LOOM_PEER_TORCH_XLA, LOOM_PEER_TORCH)\n"
          "           on the benchmarks that have peer versions, and print a table;\n"
          "           with no NAME, those benchmarks\n");
      return 0;
    } else
      names.push_back(argv[i]);
  }
  auto& reg = loom::bench::registry();
  if (peers && names.empty()) names = loom::bench::peer_benchmarks();
  if (list || names.empty()) {
    for (const auto& b : reg) std::printf("%-20s %s\n", b.name.c_str(), b.description.c_str());
    return list ? 0 : 1;
  }
  for (const std::string& n : names) {
    bool found = false;
    for (const auto& b : reg) {
      if (n != "all" && b.name != n) continue;
      found = true;
      auto figs = b.run();
      if (peers) loom::bench::add_peer_figures(b.name, figs);
      if (json)
        print_json(b, figs);
      else
        print_table(b, figs);
    }
    if (!found) {
      std::fprintf(stderr, "loom-bench: unknown benchmark '%s' (see --list)\n", n.c_str());
      return 1;
    }
  }
  if (peers && !json) loom::bench::print_peer_table();
  return 0;
}
