// Products with few rows split across threads by columns: plain and transposed B, f32 and f64,
// against the product computed here in double.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/loom.h"

namespace {

using loom::Tensor;

std::vector<double> host_values(int64_t n, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + salt);
  return v;
}

TEST(CpuMatmulSplit, FewRowsManyColumnsMatchTheHostProduct) {
  const int64_t m = 12, k = 300, n = 520;
  for (loom::DType dt : {loom::float32, loom::float64}) {
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::string(trans ? "B transposed " : "") + (dt == loom::float32 ? "f32" : "f64"));
      std::vector<double> a = host_values(m * k, 1), b = host_values(k * n, 2);
      Tensor ta = loom::to(loom::tensor(a, {m, k}), dt);
      // trans: B is stored as [n, k] and read through a transpose (a weight in Linear).
      std::vector<double> bt(static_cast<size_t>(k * n));
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < n; ++j) bt[j * k + i] = b[i * n + j];
      Tensor tb = trans ? loom::transpose(loom::to(loom::tensor(bt, {n, k}), dt), 0, 1)
                        : loom::to(loom::tensor(b, {k, n}), dt);
      std::vector<double> got = loom::matmul(ta, tb).to_vector<double>();
      const double tol = dt == loom::float32 ? 1e-3 : 1e-10;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t q = 0; q < k; ++q) want += a[i * k + q] * b[q * n + j];
          ASSERT_NEAR(got[i * n + j], want, tol * (1 + std::abs(want))) << i << "," << j;
        }
    }
  }
}

}  // namespace
