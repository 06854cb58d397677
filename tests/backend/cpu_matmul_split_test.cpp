// Products with few rows split across threads by columns: plain and transposed B, f32 and f64,
// against the product computed here in double.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "backend/cpu/plan.h"
#include "backend/cpu/program.h"
#include "loom/ir/graph.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;

std::vector<double> host_values(int64_t n, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + salt);
  return v;
}

TEST(CpuMatmulSplit, FewRowsManyColumnsMatchTheHostProduct) {
  // [12,300]x[300,520] and a row against a 3 MB B (a bias gradient as ones x dY).
  for (auto [m, k, n] : {std::array<int64_t, 3>{12, 300, 520}, {1, 2048, 384}})
    for (loom::DType dt : {loom::float32, loom::float64}) {
      for (bool trans : {false, true}) {
        SCOPED_TRACE(std::string(trans ? "B transposed " : "") +
                     (dt == loom::float32 ? "f32" : "f64"));
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

namespace {

// Slices that are contiguous blocks of a buffer are read in place (views): values against the
// host, including a view feeding a product, slices of slices, and a dead input whose memory
// an output may take while views of it are still read.
TEST(CpuViews, BlockSlicesReadInPlace) {
  const int64_t L = 6, R = 4, C = 5;
  std::vector<double> xv = host_values(L * R * C, 3);
  auto at = [&](int64_t l, int64_t r, int64_t c) { return xv[(l * R + r) * C + c]; };
  Tensor x = loom::tensor(xv, {L, R, C});
  Tensor w = loom::tensor(host_values(C * 3, 4), {C, 3});
  std::vector<double> wv = w.to_vector<double>();
  for (int rep = 0; rep < 2; ++rep) {  // rep 1: x is dead after the call and may be donated
    Tensor src = rep == 0 ? x : loom::tensor(xv, {L, R, C});
    Tensor a = loom::slice(src, 0, 2, 4) * 2.0 + loom::slice(src, 0, 0, 2);  // [2, R, C]
    Tensor inner = loom::slice(loom::slice(src, 0, 1, 5), 0, 2, 3);          // src[3:4]
    Tensor p = loom::matmul(loom::select(src, 0, 5), w);                     // [R, 3]
    if (rep == 1) src = Tensor();
    loom::sync();
    std::vector<double> av = a.to_vector<double>(), iv = inner.to_vector<double>(),
                        pv = p.to_vector<double>();
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          EXPECT_DOUBLE_EQ(av[(l * R + r) * C + c], at(l + 2, r, c) * 2 + at(l, r, c));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) EXPECT_DOUBLE_EQ(iv[r * C + c], at(3, r, c));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < 3; ++j) {
        double want = 0;
        for (int64_t c = 0; c < C; ++c) want += at(5, r, c) * wv[c * 3 + j];
        EXPECT_NEAR(pv[r * 3 + j], want, 1e-12);
      }
  }
}

}  // namespace

namespace {

// v rounded to `dt` (bfloat16 or float16) and back.
std::vector<double> rounded(const std::vector<double>& v, loom::DType dt) {
  const int64_t n = static_cast<int64_t>(v.size());
  return loom::to(loom::tensor(v, {n}), dt).to_vector<double>();
}

// Half-precision products run as float32 products between conversions (plan.cpp,
// split_results): one library call, not the reference loop. Values against the product of
// the rounded operands computed here in double and rounded once, within one ulp of the type:
// plain, B transposed, a broadcast batch, one row, k = 0, and the gradients of both operands.
TEST(CpuHalfProducts, RunAsFloat32AndMatchTheRoundedHostProduct) {
  for (loom::DType dt : {loom::bfloat16, loom::float16}) {
    SCOPED_TRACE(dt == loom::bfloat16 ? "bf16" : "f16");
    const double ulp = dt == loom::bfloat16 ? 1.0 / 128 : 1.0 / 1024;
    struct Case {
      int64_t batch, m, k, n;
      bool trans;
    };
    for (Case c : {Case{1, 33, 70, 45, false}, Case{1, 33, 70, 45, true}, Case{3, 5, 64, 17, false},
                   Case{1, 1, 300, 130, true}, Case{1, 4, 0, 6, false}}) {
      SCOPED_TRACE(::testing::Message() << c.batch << "x[" << c.m << "," << c.k << "]x[" << c.k
                                        << "," << c.n << "]" << (c.trans ? " B^T" : ""));
      std::vector<double> a = rounded(host_values(c.batch * c.m * c.k, 5), dt);
      std::vector<double> b = rounded(host_values(c.k * c.n, 6), dt);
      std::vector<double> bt(b.size());
      for (int64_t i = 0; i < c.k; ++i)
        for (int64_t j = 0; j < c.n; ++j) bt[j * c.k + i] = b[i * c.n + j];
      Tensor ta = loom::to(loom::tensor(a, {c.batch, c.m, c.k}), dt).requires_grad_();
      Tensor tb = c.trans ? loom::to(loom::tensor(bt, {c.n, c.k}), dt).requires_grad_()
                          : loom::to(loom::tensor(b, {c.k, c.n}), dt).requires_grad_();
      Tensor y = loom::matmul(ta, c.trans ? loom::transpose(tb, 0, 1) : tb);
      ASSERT_EQ(y.dtype(), dt);
      if (c.k > 0) {
        auto exe = loom::runtime::compile_cached(loom::ir::parse(loom::pending_ir({y})));
        EXPECT_EQ(exe->num_library_calls(), 1);
      }
      loom::sum(loom::to(y, loom::float32)).backward();
      std::vector<double> got = y.to_vector<double>();
      for (int64_t bi = 0; bi < c.batch; ++bi)
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            double want = 0;
            for (int64_t q = 0; q < c.k; ++q) want += a[(bi * c.m + i) * c.k + q] * b[q * c.n + j];
            ASSERT_NEAR(got[(bi * c.m + i) * c.n + j], want, ulp * std::abs(want) + 1e-30)
                << bi << "," << i << "," << j;
          }
      // d sum / d a[i,q] = sum_j b[q,j]; d sum / d b[q,j] = sum over batches and rows of a[.,q].
      std::vector<double> ga = ta.grad().to_vector<double>(), gb = tb.grad().to_vector<double>();
      for (int64_t r = 0; r < c.batch * c.m; ++r)
        for (int64_t q = 0; q < c.k; ++q) {
          double want = 0;
          for (int64_t j = 0; j < c.n; ++j) want += b[q * c.n + j];
          ASSERT_NEAR(ga[r * c.k + q], want, ulp * std::abs(want) + 1e-30) << "grad a " << r;
        }
      for (int64_t q = 0; q < c.k; ++q)
        for (int64_t j = 0; j < c.n; ++j) {
          double want = 0;
          for (int64_t r = 0; r < c.batch * c.m; ++r) want += a[r * c.k + q];
          const double g = gb[c.trans ? j * c.k + q : q * c.n + j];
          ASSERT_NEAR(g, want, ulp * std::abs(want) + 1e-30) << "grad b " << q << "," << j;
        }
    }
  }
}

}  // namespace

namespace {

// dW = dY^T X with dY computed (a ReLU's gradient): dY is stored once, contiguously, and the
// product reads it transposed through strides; no kernel writes the transpose. Values against
// the host, with a second consumer of dY (the bias gradient, a column sum) beside the product.
TEST(CpuViews, TransposedComputedOperandIsStoredOnceAndReadThroughStrides) {
  const int64_t m = 64, k = 40, n = 30;
  std::vector<double> gv = host_values(m * k, 5), hv = host_values(m * k, 6),
                      xv = host_values(m * n, 7);
  for (loom::DType dt : {loom::float32, loom::float64}) {
    SCOPED_TRACE(dt == loom::float32 ? "f32" : "f64");
    loom::runtime::set_backend("cpu");
    Tensor g = loom::to(loom::tensor(gv, {m, k}), dt), h = loom::to(loom::tensor(hv, {m, k}), dt);
    Tensor x = loom::to(loom::tensor(xv, {m, n}), dt);
    Tensor dy = loom::where(h > 0.0, g, g * 0.0);
    Tensor dw = loom::matmul(loom::transpose(dy, 0, 1), x);  // [k, n]
    Tensor db = loom::sum(dy, {0});
    loom::ir::Graph graph = loom::ir::parse(loom::pending_ir({dw, db}));
    loom::passes::default_pipeline().run(graph);
    loom::cpu::Program p = loom::cpu::compile_program(graph, /*region=*/false);
    bool transposed_read = false;
    for (const loom::cpu::Step& st : p.plan.steps)
      if (st.kind == loom::cpu::Step::MatMul) transposed_read = st.views[0].trans;
    EXPECT_TRUE(transposed_read);
    for (const loom::cpu::KernelSpec& ks : p.plan.kernels)
      for (const loom::cpu::Stage& st : ks.stages)
        EXPECT_NE(p.graph.node(st.node).op, loom::ir::OpKind::Permute) << ks.name;
    std::vector<double> got = dw.to_vector<double>(), gotb = db.to_vector<double>();
    const double tol = dt == loom::float32 ? 1e-4 : 1e-12;
    for (int64_t i = 0; i < k; ++i) {
      double bias = 0;
      for (int64_t r = 0; r < m; ++r) bias += hv[r * k + i] > 0 ? gv[r * k + i] : 0;
      ASSERT_NEAR(gotb[i], bias, tol * (1 + std::abs(bias))) << i;
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t r = 0; r < m; ++r)
          want += (hv[r * k + i] > 0 ? gv[r * k + i] : 0) * xv[r * n + j];
        ASSERT_NEAR(got[i * n + j], want, tol * (1 + std::abs(want))) << i << "," << j;
      }
    }
  }
}

// A reshape that merges dims of a dense value ([4,8,16] as [32,16], a weight gradient's
// operands) is read by the product in place; a reshape of a transposed value is not dense and
// is copied first. Values against the host either way.
TEST(CpuViews, MergedDimsOfADenseValueAreReadInPlace) {
  const int64_t b = 4, t = 8, c = 16, o = 12;
  std::vector<double> xv = host_values(b * t * c, 8), gv = host_values(b * t * o, 9);
  loom::runtime::set_backend("cpu");
  Tensor x = loom::tensor(xv, {b, t, c}), g = loom::tensor(gv, {b, t, o});
  Tensor dy = loom::tanh(g);                                        // computed
  Tensor xt = loom::reshape(loom::transpose(x, 1, 2), {b * c, t});  // not dense: a copy
  Tensor dw = loom::matmul(loom::transpose(loom::reshape(dy, {b * t, o}), 0, 1),
                           loom::reshape(x, {b * t, c}));  // [o, c]
  std::vector<double> wv = host_values(t * 5, 10);
  Tensor q = loom::matmul(xt, loom::tensor(wv, {t, 5}));  // [b * c, 5]
  loom::ir::Graph graph = loom::ir::parse(loom::pending_ir({dw}));
  loom::passes::default_pipeline().run(graph);
  loom::cpu::Program p = loom::cpu::compile_program(graph, /*region=*/false);
  for (const loom::cpu::KernelSpec& ks : p.plan.kernels)
    for (const loom::cpu::Stage& st : ks.stages)
      EXPECT_NE(p.graph.node(st.node).op, loom::ir::OpKind::Reshape) << ks.name;
  std::vector<double> got = dw.to_vector<double>();
  for (int64_t i = 0; i < o; ++i)
    for (int64_t j = 0; j < c; ++j) {
      double want = 0;
      for (int64_t r = 0; r < b * t; ++r) want += std::tanh(gv[r * o + i]) * xv[r * c + j];
      ASSERT_NEAR(got[i * c + j], want, 1e-12 * (1 + std::abs(want))) << i << "," << j;
    }
  std::vector<double> gq = q.to_vector<double>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t j = 0; j < 5; ++j) {
        double want = 0;
        for (int64_t ti = 0; ti < t; ++ti) want += xv[(bi * t + ti) * c + ci] * wv[ti * 5 + j];
        ASSERT_NEAR(gq[(bi * c + ci) * 5 + j], want, 1e-12 * (1 + std::abs(want)))
            << bi << "," << ci;
      }
}

}  // namespace
