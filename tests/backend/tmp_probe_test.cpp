// temporary probe (not for commit)
#define TEST_F(a, b) void unused_##a##b()
#include "backend/random_programs_test.cpp"
#undef TEST_F
namespace loom::difftest {
namespace {
TEST(TmpProbe, Describe) {
  const char* s = std::getenv("PROBE_SEEDS");
  uint64_t first = s ? std::strtoull(s, nullptr, 10) : 20240611;
  for (uint64_t i = 0; i < 2; ++i) std::printf("=== seed %llu\n%s\n", (unsigned long long)(first + i), describe(first + i).c_str());
}
TEST(TmpProbe, Stats) {
  uint64_t n = env_or("LOOM_RANDOM_PROGRAMS", 300);
  std::vector<double> worst, loose;
  int64_t elems = 0, exact_outs = 0, tol_outs = 0, empty_outs = 0;
  for (uint64_t i = 0; i < n; ++i) {
    runtime::set_backend("ref");
    auto a = run_program(1000 + i, nullptr);
    runtime::set_backend("cpu");
    auto b = run_program(1000 + i, nullptr);
    for (size_t k = 0; k < a.values.size(); ++k) {
      const Values &w = a.values[k], &g = b.values[k];
      elems += w.shape.numel();
      if (w.shape.numel() == 0) { empty_outs++; continue; }
      if (!is_floating(w.dtype) || w.tol.abs == 0) { exact_outs++; continue; }
      tol_outs++;
      double mx = 0, ratio = 0;
      for (size_t e = 0; e < w.f.size(); ++e) {
        if (std::isnan(w.f[e])) continue;
        mx = std::max(mx, std::fabs(w.f[e]));
        double bound = w.tol.rel * std::fabs(w.f[e]) + w.tol.abs;
        ratio = std::max(ratio, std::fabs(w.f[e] - g.f[e]) / bound);
      }
      worst.push_back(ratio);
      loose.push_back(mx > 0 ? w.tol.abs / mx : 0);
      if (mx > 0 && w.tol.abs / mx > 1 && std::getenv("SHOW")) std::printf("LOOSE seed %llu %s tol %g max %g\n%s\n", (unsigned long long)(1000+i), w.name.c_str(), w.tol.abs, mx, describe(1000+i).c_str());
    }
  }
  std::sort(worst.begin(), worst.end()); std::sort(loose.begin(), loose.end());
  auto q = [](std::vector<double>& v, double p) { return v.empty() ? 0 : v[(size_t)(p * (v.size() - 1))]; };
  std::printf("elems %lld exact %lld tol %lld empty %lld\n", (long long)elems, (long long)exact_outs, (long long)tol_outs, (long long)empty_outs);
  std::printf("diff/tol: median %g p90 %g max %g\n", q(worst, 0.5), q(worst, 0.9), q(worst, 1));
  std::printf("tol/max|v|: median %g p90 %g p99 %g max %g\n", q(loose, 0.5), q(loose, 0.9), q(loose, 0.99), q(loose, 1));
  runtime::set_backend("ref");
}
}
}
