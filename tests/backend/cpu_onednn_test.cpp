// Products on oneDNN (backend_cpu's onednn.cpp) against the reference backend: every shape
// class (transposes, batches, broadcast batches, 0-size, 1-row, strided views), the fused
// epilogues against the reference and against the unfused OpenBLAS plan, backward products,
// and the library the planner picks per shape. Each case also checks, in the CPU plan, that
// the product really ran on the library under test (and its post-ops), so a path that
// silently fell back to OpenBLAS or to a loop kernel fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/onednn.h"
#include "backend/cpu/plan.h"
#include "backend/cpu/program.h"
#include "backend/cpu/thread_pool.h"
#include "loom/ir/graph.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"
#include "loom/trace/interop.h"
#include "trace/context.h"

// libgomp's (linked with oneDNN).
extern "C" void omp_set_num_threads(int);
extern "C" int omp_get_max_threads();

namespace {

using loom::Shape;
using loom::Tensor;
using loom::cpu::Library;
using loom::cpu::PostOp;
using Outs = std::vector<Tensor>;

// Selects the library of every float32 product (or the table) for one scope; compiled
// executables are dropped on both ends, since the compile cache does not key on it.
class ForcedLibrary {
 public:
  explicit ForcedLibrary(std::optional<Library> l) {
    loom::sync();
    loom::cpu::force_library(l);
    loom::runtime::clear_compile_cache();
  }
  ~ForcedLibrary() {
    loom::cpu::force_library(std::nullopt);
    loom::runtime::clear_compile_cache();
  }
};

// Fixed values in about [-1, 1], different per salt.
Tensor data(Shape s, int salt) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(std::sin(0.731 * static_cast<double>(i) + 1.37 * salt));
  return loom::tensor(v, s);
}

// The CPU program of the graph that materializing `outs` runs (after the default passes, as
// the runtime compiles it).
loom::cpu::Program program_of(const Outs& outs) {
  loom::ir::Graph g = loom::ir::parse(loom::pending_ir(outs));
  loom::passes::default_pipeline().run(g);
  return loom::cpu::compile_program(g, /*region=*/false);
}

std::vector<std::vector<double>> values_on(const char* backend,
                                           const std::function<Outs()>& program) {
  loom::sync();
  loom::runtime::set_backend(backend);
  Outs outs = program();
  loom::sync();
  std::vector<std::vector<double>> v;
  for (const Tensor& t : outs) v.push_back(t.to_vector<double>());
  loom::runtime::set_backend("cpu");
  return v;
}

// |got - want| <= tol * (1 + |want|) element by element, outputs of equal sizes.
void expect_close(const std::vector<std::vector<double>>& got,
                  const std::vector<std::vector<double>>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got[o].size(), want[o].size()) << what << " output " << o;
    for (size_t i = 0; i < got[o].size(); ++i)
      ASSERT_NEAR(got[o][i], want[o][i], tol * (1 + std::abs(want[o][i])))
          << what << " output " << o << " element " << i;
  }
}

// The libraries of the program's MatMul steps, in order, those of loop bodies included.
void collect_libraries(const loom::cpu::Program& p, std::vector<Library>* r) {
  for (size_t si = 0; si < p.plan.steps.size(); ++si) {
    const loom::cpu::Step& st = p.plan.steps[si];
    if (st.kind == loom::cpu::Step::MatMul) r->push_back(st.lib);
    if (st.kind == loom::cpu::Step::Loop)
      for (const loom::cpu::Program& region : p.loops[si]->regions) collect_libraries(region, r);
  }
}
std::vector<Library> libraries(const loom::cpu::Program& p) {
  std::vector<Library> r;
  collect_libraries(p, &r);
  return r;
}

class CpuOnednn : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    previous_ = std::string(loom::runtime::current_backend().name());
    loom::runtime::set_backend("cpu");
  }
  void TearDown() override {
    loom::sync();
    loom::runtime::set_backend(previous_);
  }

  // Runs `program` forced onto oneDNN and checks every product ran there, then compares its
  // values with the reference backend's.
  void expect_onednn_matches_ref(const std::function<Outs()>& program, double tol = 2e-5) {
    std::vector<std::vector<double>> want = values_on("ref", program);
    ForcedLibrary forced(Library::Onednn);
    {
      Outs outs = program();
      loom::cpu::Program p = program_of(outs);
      std::vector<Library> libs = libraries(p);
      ASSERT_FALSE(libs.empty());
      for (Library l : libs) EXPECT_EQ(l, Library::Onednn);
      loom::sync();
    }
    expect_close(values_on("cpu", program), want, tol, "onednn vs ref");
  }

 private:
  std::string previous_;
};

TEST_F(CpuOnednn, PlainAndTransposedOperandsMatchTheReference) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("A transposed " + std::to_string(ta) + ", B transposed " + std::to_string(tb));
      expect_onednn_matches_ref([&] {
        // Transposes are strides of the stored matrices (no copies): [37,53] x [53,29].
        Tensor a = ta ? loom::transpose(data({53, 37}, 1), 0, 1) : data({37, 53}, 1);
        Tensor b = tb ? loom::transpose(data({29, 53}, 2), 0, 1) : data({53, 29}, 2);
        return Outs{loom::matmul(a, b)};
      });
    }
  }
}

TEST_F(CpuOnednn, SplitProductsMatchTheReference) {
  // Rows split across the pool ([300,64]x[64,96]) and columns split for one row
  // ([1,200]x[200,300] and a 1-row batch).
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({300, 64}, 3), data({64, 96}, 4))}; });
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({1, 200}, 5), data({200, 300}, 6))}; });
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({3, 1, 40}, 7), data({3, 40, 50}, 8))}; });
  // From 32 rows up rows are split before columns: the MLP's class (64 rows, B transposed,
  // bias and relu as post-ops), an odd count (22 and 23 rows), and below 32 rows columns.
  expect_onednn_matches_ref([] {
    Tensor w = data({160, 200}, 9);
    return Outs{
        loom::relu(loom::matmul(data({64, 200}, 10), loom::transpose(w, 0, 1)) + data({160}, 11))};
  });
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({45, 100}, 12), data({100, 130}, 13))}; });
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({20, 100}, 14), data({100, 300}, 15))}; });
}

// A read transposed (a weight gradient's dY^T [m,k] of a stored [k,m]): on AVX-512 each task
// copies its rows of A dense and the product runs on brgemm with its post-ops fused, where it
// would run on gemm:jit; parts past 64K elements of A keep reading it in place.
TEST_F(CpuOnednn, TransposedAIsCopiedDenseForBrgemm) {
  struct Case {
    int64_t m, n, k;
    bool dense;
  };
  for (const Case& c : {Case{256, 784, 64, true}, Case{45, 130, 64, true}, Case{300, 96, 64, true},
                        Case{2048, 64, 128, false}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k));
    auto program = [&] {
      Tensor dy = data({c.k, c.m}, 21), x = data({c.k, c.n}, 22);
      // A scale and an update folded in as post-ops (binary with a scalar, binary with a full
      // operand), and the plain product.
      Tensor g = loom::matmul(loom::transpose(dy, 0, 1), x);
      Tensor h = loom::matmul(loom::transpose(dy * 0.5, 0, 1), x);
      // A scale then a row (scale folded into A's copy, then the row as the primitive's bias).
      Tensor r = loom::matmul(loom::transpose(dy * 2.0, 0, 1), x) * 0.25 + data({c.n}, 25);
      return Outs{g, h * data({1}, 23) + data({c.m, c.n}, 24), r};
    };
    expect_onednn_matches_ref(program, 5e-5);
    if (!loom::cpu::onednn_avx512()) continue;
    ForcedLibrary forced(Library::Onednn);
    Outs outs = program();
    loom::cpu::Program p = program_of(outs);
    for (const auto& prod : p.onednn) {
      if (!prod) continue;
      const std::string impl = loom::cpu::onednn_describe(*prod);
      EXPECT_EQ(impl.rfind(c.dense ? "brg" : "gemm", 0), 0u) << impl;
    }
    loom::sync();
  }
}

// An SGD update, w - lr * (product), folds into the product as scales and an add of w (the
// scales into A's dense copy where A is copied for brgemm); when
// the old w dies with the step its memory takes the new w, and the product adds in place
// (oneDNN's sum post-op on brgemm; gemm:jit, which has no fused kernel for that sum, gets a
// copy of w's block first). Three steps, against the same steps on the reference backend, with
// the old weight donated and, in a second run, kept alive by another handle (then it must
// stay untouched). Shapes: the MLP's weight gradients (A read transposed, copied dense, row
// parts and one part), a product in column parts, and a transposed A too big to copy.
TEST_F(CpuOnednn, WeightUpdatesAddInPlaceIntoTheDonatedWeight) {
  struct Case {
    int64_t m, n, k;
    bool columns;  // x [m,k] against a transposed [n,k]: column parts
  };
  for (const Case& c : {Case{256, 784, 64, false}, Case{10, 256, 64, false},
                        Case{32, 256, 784, true}, Case{2048, 64, 128, false}}) {
    for (bool keep : {false, true}) {
      SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                   (keep ? ", old weight kept" : ", old weight donated"));
      auto product = [&](int step) {
        if (c.columns)
          return loom::matmul(data({c.m, c.k}, 40 + step),
                              loom::transpose(data({c.n, c.k}, 50), 0, 1));
        return loom::matmul(loom::transpose(data({c.k, c.m}, 40 + step), 0, 1),
                            data({c.k, c.n}, 50));
      };
      auto run = [&](const char* backend, bool check) -> std::vector<std::vector<double>> {
        loom::sync();
        loom::runtime::set_backend(backend);
        Tensor w = data({c.m, c.n}, 60);
        loom::sync();
        for (int step = 0; step < 3; ++step) {
          Tensor old = keep ? w : Tensor();
          const std::vector<float> before = keep ? old.to_vector<float>() : std::vector<float>{};
          const void* memory = w.impl()->buffer.data();
          w = w - product(step) * 0.03;
          if (check) {
            loom::cpu::Program p = program_of({w});
            EXPECT_EQ(p.plan.kernels.size(), 0u);  // no loop kernel: the product writes w
            const loom::cpu::OnednnProduct* prod = nullptr;
            for (const auto& q : p.onednn)
              if (q) prod = q.get();
            if (prod == nullptr) {
              ADD_FAILURE() << "no product on oneDNN";
              return {};
            }
            const std::string how = loom::cpu::onednn_describe(*prod);
            EXPECT_TRUE(loom::cpu::onednn_fused(*prod)) << how;
            // Parts on brgemm add in place (column parts, whose full addend brgemm refuses
            // beside their dense scratch, run on gemm:jit).
            const bool brg = how.rfind("brg", 0) == 0;
            EXPECT_EQ(how.find("in place") != std::string::npos, brg && !c.columns) << how;
            // The MLP's first weight gradient copies A dense for brgemm: the learning rate and
            // the -1 scale that copy instead of running as post-ops.
            if (loom::cpu::onednn_avx512() && c.m == 256)
              EXPECT_NE(how.find("scales folded into A's copy"), std::string::npos) << how;
          }
          loom::sync();
          if (check && !keep) EXPECT_EQ(w.impl()->buffer.data(), memory) << "step " << step;
          if (keep) EXPECT_EQ(old.to_vector<float>(), before) << "step " << step;
        }
        std::vector<std::vector<double>> v{w.to_vector<double>()};
        loom::runtime::set_backend("cpu");
        return v;
      };
      std::vector<std::vector<double>> want = run("ref", false);
      ForcedLibrary forced(Library::Onednn);
      expect_close(run("cpu", true), want, 5e-5, "updated weight");
    }
  }
}

// A product of few rows against a transposed B (an MLP's batch against a Linear's weight, each
// part's block of B dense) splits its columns across the pool; each part writes its
// block of C dense for brgemm, post-ops fused, and copies it into place, on AVX-512, where a
// strided block ran on gemm:jit with its bias in a loop; a full residual operand, which
// brgemm refuses beside a dense C, stays fused on gemm:jit. A plain B, whose column blocks are
// strided (gemm:jit again), keeps splitting rows. Widths that do not split evenly.
TEST_F(CpuOnednn, ColumnPartsWriteDenseForBrgemm) {
  struct Case {
    int64_t m, n, k;
    bool bt;
  };
  for (const Case& c : {Case{64, 256, 784, true}, Case{64, 256, 784, false},
                        Case{17, 301, 256, true}, Case{100, 130, 128, false}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                 (c.bt ? " B^T" : ""));
    auto program = [&] {
      Tensor x = data({c.m, c.k}, 31);
      Tensor w = c.bt ? loom::transpose(data({c.n, c.k}, 32), 0, 1) : data({c.k, c.n}, 32);
      Tensor plain = loom::matmul(x, w);
      Tensor biased = loom::relu(loom::matmul(x * 0.5, w) + data({c.n}, 33));
      Tensor residual = loom::matmul(x * 2.0, w) + data({c.m, c.n}, 34);
      return Outs{plain, biased, residual};
    };
    expect_onednn_matches_ref(program, 5e-5);
    if (!loom::cpu::onednn_avx512() || loom::cpu::ThreadPool::instance().size() < 2) continue;
    ForcedLibrary forced(Library::Onednn);
    Outs outs = program();
    loom::cpu::Program p = program_of(outs);
    std::vector<std::string> impls;
    for (const auto& prod : p.onednn)
      if (prod) impls.push_back(loom::cpu::onednn_describe(*prod));
    ASSERT_EQ(impls.size(), 3u);
    for (size_t i = 0; i < impls.size(); ++i) {
      SCOPED_TRACE(impls[i]);
      EXPECT_EQ(impls[i].find(", 2 column parts") != std::string::npos, c.bt);
      EXPECT_EQ(impls[i].find(", 2 parts") != std::string::npos, !c.bt);
      EXPECT_EQ(impls[i].find("post-ops in loom"), std::string::npos);
      const bool brg = impls[i].rfind("brg", 0) == 0;
      EXPECT_EQ(brg, !(c.bt && i == 2));
    }
    loom::sync();
  }
}

// loom's epilogue runs on each part's block wherever the part lies: row parts, column parts
// written dense and copied into place (the epilogue then reads C at the output's row stride),
// batches of their own (B differs per batch), one row, a transposed A copied dense, and widths
// that leave a masked tail (17, 301 columns). GELU of the product plus a bias, then a residual,
// against the reference; each product says where its post-ops ran.
TEST_F(CpuOnednn, GeluEpilogueRunsOnEveryPartLayout) {
  struct Case {
    const char* name;
    int64_t batch, m, n, k;
    bool bt, at, batched_b;
  };
  for (const Case& c : {Case{"row parts", 1, 300, 64, 96, true, false, false},
                        Case{"column parts", 1, 64, 256, 784, true, false, false},
                        Case{"column parts, ragged", 1, 17, 301, 256, true, false, false},
                        Case{"batches with their own B", 3, 40, 24, 32, false, false, true},
                        Case{"one row", 1, 1, 130, 64, false, false, false},
                        Case{"A transposed", 1, 256, 48, 64, false, true, false}}) {
    SCOPED_TRACE(c.name);
    auto program = [&] {
      Shape xs = c.at ? Shape{c.k, c.m} : Shape{c.m, c.k};
      if (c.batch > 1) xs.insert(0, c.batch);
      Tensor x = data(xs, 71);
      if (c.at) x = loom::transpose(x, -1, -2);
      Shape ws = c.bt ? Shape{c.n, c.k} : Shape{c.k, c.n};
      if (c.batched_b) ws.insert(0, c.batch);
      Tensor w = data(ws, 72);
      if (c.bt) w = loom::transpose(w, -1, -2);
      Shape ys = {c.m, c.n};
      if (c.batch > 1) ys.insert(0, c.batch);
      return Outs{loom::gelu(loom::matmul(x, w) + data({c.n}, 73)) + data(ys, 74)};
    };
    expect_onednn_matches_ref(program, 3e-5);
    ForcedLibrary forced(Library::Onednn);
    Outs outs = program();
    loom::cpu::Program p = program_of(outs);
    size_t products = 0;
    for (const auto& prod : p.onednn) {
      if (!prod) continue;
      ++products;
      const std::string how = loom::cpu::onednn_describe(*prod);
      EXPECT_FALSE(loom::cpu::onednn_fused(*prod)) << how;
      EXPECT_NE(how.find("post-ops in loom's epilogue"), std::string::npos) << how;
      EXPECT_EQ(how.find("refused"), std::string::npos) << how;
    }
    EXPECT_EQ(products, 1u);
    loom::sync();
  }
}

// Products summed into one value (m1 + m2 + m3 + ...): each sum is a pattern the first
// product's epilogue folds, with the next product as its binary operand; a later product must
// not fold the same sums again (it read the other's unwritten values: garbage, or a null
// operand past oneDNN's post-op limit). Chains of 2 to 12 products, with a bias and a GELU.
TEST_F(CpuOnednn, ProductsSummedInAChainAreFoldedOnce) {
  for (int n : {2, 3, 5, 12}) {
    SCOPED_TRACE(std::to_string(n) + " products");
    expect_onednn_matches_ref([n] {
      Tensor sum;
      for (int i = 0; i < n; ++i) {
        Tensor m = loom::matmul(data({8, 16 + i}, i), data({16 + i, 24}, 50 + i));
        sum = i == 0 ? m + data({24}, 99) : sum + m;
      }
      return Outs{sum, loom::gelu(sum)};
    });
  }
}

// Each thread keeps an argument table per part (memory objects re-pointed per task): more
// distinct parts than its cache holds (512), run twice, so tables are dropped and remade
// mid-run, and parts shared by tasks at different offsets (batches) are re-pointed.
TEST_F(CpuOnednn, ArgumentTablesSurviveManyPartsAndRepeatedRuns) {
  auto program = [] {
    Outs outs;
    Tensor sum = loom::zeros({2, 3});
    for (int64_t k = 1; k <= 530; ++k)
      sum = sum + loom::matmul(data({2, k}, static_cast<int>(k)), data({k, 3}, 7));
    outs.push_back(sum);
    outs.push_back(loom::matmul(data({5, 4, 9}, 1), data({5, 9, 6}, 2)));
    return outs;
  };
  for (int run = 0; run < 2; ++run) expect_onednn_matches_ref(program, 5e-5);
}

TEST_F(CpuOnednn, BatchedAndBroadcastBatchesMatchTheReference) {
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({3, 17, 23}, 1), data({3, 23, 19}, 2))}; });
  // B shared by every batch: one tall product.
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({3, 17, 23}, 3), data({23, 19}, 4))}; });
  // A shared by every batch.
  expect_onednn_matches_ref(
      [] { return Outs{loom::matmul(data({17, 23}, 5), data({3, 23, 19}, 6))}; });
  // Broadcast on both sides over two batch dims, with transposed B.
  expect_onednn_matches_ref([] {
    Tensor b = loom::transpose(data({1, 3, 4, 6}, 8), 2, 3);
    return Outs{loom::matmul(data({2, 1, 5, 6}, 7), b)};
  });
}

TEST_F(CpuOnednn, StridedViewsMatchTheReference) {
  expect_onednn_matches_ref([] {
    // A column block of a wider matrix (row stride 60), a batch read through a permute (batch
    // stride 24, row stride 72), and a row slice with a step.
    Tensor a = loom::slice(data({33, 60}, 1), 1, 7, 31);
    Tensor x = loom::transpose(data({20, 3, 24}, 2), 0, 1);  // [3,20,24]
    Tensor b = loom::slice(data({48, 18}, 3), 0, 0, 48, 2);  // rows 0, 2, ... : [24,18]
    return Outs{loom::matmul(a, b), loom::matmul(x, b)};
  });
}

TEST_F(CpuOnednn, EmptyProducts) {
  // No rows, no columns: nothing to compute; k = 0: zeros (declared to stay on OpenBLAS's
  // memset path, checked below).
  expect_onednn_matches_ref([] { return Outs{loom::matmul(data({0, 8}, 1), data({8, 5}, 2))}; });
  expect_onednn_matches_ref([] { return Outs{loom::matmul(data({2, 0, 8}, 1), data({8, 5}, 2))}; });
  expect_onednn_matches_ref([] { return Outs{loom::matmul(data({4, 8}, 1), data({8, 0}, 2))}; });
  std::vector<std::vector<double>> want =
      values_on("ref", [] { return Outs{loom::matmul(data({4, 0}, 1), data({0, 5}, 2))}; });
  ForcedLibrary forced(Library::Onednn);
  Outs outs{loom::matmul(data({4, 0}, 1), data({0, 5}, 2))};
  EXPECT_EQ(libraries(program_of(outs)), std::vector<Library>{Library::OpenBlas});
  loom::sync();
  expect_close({outs[0].to_vector<double>()}, want, 0, "k = 0");
}

// How a product in row parts reads an earlier product's result, which decides whether row runs
// (cpu_backend.cpp) may chain them without a join: as A or as a residual, only at its own rows;
// as B, or broadcast, anywhere.
TEST_F(CpuOnednn, RowReadsOfAnEarlierResult) {
  ForcedLibrary forced(Library::Onednn);
  if (loom::cpu::ThreadPool::instance().size() < 2) GTEST_SKIP() << "one thread: no row parts";
  Tensor x = data({256, 128}, 1), w = data({128, 128}, 2), v = data({128, 128}, 3);
  Tensor y = loom::matmul(x, loom::transpose(w, 0, 1));             // the earlier result, [256,128]
  Tensor as_a = loom::matmul(y, v);                                 // A: rows
  Tensor residual = loom::matmul(x, v) + y;                         // a residual: rows
  Tensor as_b = loom::matmul(data({256, 256}, 4), y);               // B: every row of y
  Tensor row = loom::matmul(x * 2.0, v) + loom::slice(y, 0, 0, 1);  // row 0 for every row
  Tensor other = loom::matmul(x * 3.0, v);                          // does not read y
  loom::cpu::Program p = program_of({as_a, residual, as_b, row, other});
  // The products in plan order: y's first, then the five readers.
  std::vector<size_t> products;
  for (size_t si = 0; si < p.plan.steps.size(); ++si)
    if (p.onednn[si]) products.push_back(si);
  ASSERT_EQ(products.size(), 6u);
  ASSERT_GE(loom::cpu::onednn_row_bounds(*p.onednn[products[0]]).size(), 3u);  // row parts
  const int yb = p.plan.buf_of[p.plan.steps[products[0]].node];
  std::vector<loom::cpu::RowRead> reads;
  for (size_t i = 1; i < products.size(); ++i)
    reads.push_back(loom::cpu::onednn_row_read(*p.onednn[products[i]], yb, 256 * 128));
  using R = loom::cpu::RowRead;
  EXPECT_EQ(reads, (std::vector<R>{R::SameRows, R::SameRows, R::Other, R::Other, R::None}));
  loom::sync();
}

// ---- fused epilogues ------------------------------------------------------------------

struct EpilogueCase {
  const char* name;
  std::vector<PostOp::Kind> post;            // expected post-ops, in order
  std::function<Tensor(const Tensor& y)> f;  // the consumers of the product y ([2,24,40])
  // A first Add of a row (or a scalar) is the primitive's bias argument when fused.
  bool bias_in_primitive = false;
};

Tensor bias() { return data({40}, 11); }
Tensor residual() { return data({2, 24, 40}, 12); }

std::vector<EpilogueCase> epilogue_cases() {
  using K = PostOp::Kind;
  return {
      {"bias", {K::Add}, [](const Tensor& y) { return y + bias(); }, true},
      {"decoder: bias, exact gelu, residual",
       {K::Add, K::Gelu, K::Add},
       [](const Tensor& y) { return loom::gelu(y + bias()) + residual(); },
       true},
      {"relu", {K::Add, K::Relu}, [](const Tensor& y) { return loom::relu(y + bias()); }, true},
      {"tanh", {K::Tanh}, [](const Tensor& y) { return loom::tanh(y); }},
      // A negation that is the output itself (no sigmoid behind it): a linear -x.
      {"bias, negated", {K::Add, K::Linear}, [](const Tensor& y) { return -(y + bias()); }, true},
      // A scalar first stays a binary post-op (oneDNN 2.6 runs a [1,1] bias in a loop).
      {"shift, tanh", {K::Add, K::Tanh}, [](const Tensor& y) { return loom::tanh(y + 0.5f); }},
      {"sigmoid", {K::Sigmoid}, [](const Tensor& y) { return loom::sigmoid(y); }},
      // Scalars from the caller are 0-d inputs: binary post-ops broadcast from [1,1].
      {"scale and shift", {K::Mul, K::Add}, [](const Tensor& y) { return y * 0.25f + 3.0f; }},

      {"residual times a row, minus a column",
       {K::Mul, K::Sub},
       [](const Tensor& y) { return y * data({1, 1, 40}, 13) - data({2, 24, 1}, 14); }},
      {"divide by a tensor, max and min",
       {K::Div, K::Max, K::Min},
       [](const Tensor& y) {
         Tensor d = loom::exp(data({24, 40}, 15)) + 1.0f;
         return loom::minimum(loom::maximum(y / d, data({40}, 16)), residual());
       }},
      // An operand read across its rows (column stride 24): loom's epilogue reads the stride
      // at run time.
      {"transposed residual, gelu", {K::Gelu, K::Add}, [](const Tensor& y) {
         return loom::gelu(y) + loom::transpose(data({2, 40, 24}, 17), 1, 2);
       }}};
}

// Each case's post-ops as the table places them (inside oneDNN; in loom's epilogue after the
// product for an exact GELU, whose oneDNN post-op is slower, or where oneDNN refuses the list),
// and then every case in loom's epilogue (set_epilogues_everywhere): against the reference
// and against the unfused plan, whose loop kernel computes the same ops.
TEST_F(CpuOnednn, FusedEpiloguesMatchTheReferenceAndTheUnfusedPlan) {
  for (bool everywhere : {false, true}) {
    SCOPED_TRACE(everywhere ? "every post-op list in loom's epilogue" : "as the table places them");
    size_t placed = 0;  // in oneDNN, or in loom's epilogue by choice
    for (const EpilogueCase& c : epilogue_cases()) {
      SCOPED_TRACE(c.name);
      auto program = [&] {
        Tensor x = data({2, 24, 32}, 1), w = data({40, 32}, 2);
        return Outs{c.f(loom::matmul(x, loom::transpose(w, 0, 1)))};
      };
      std::vector<std::vector<double>> want = values_on("ref", program);
      std::vector<std::vector<double>> unfused;
      {
        ForcedLibrary forced(Library::OpenBlas);
        Outs outs = program();
        loom::cpu::Program p = program_of(outs);
        ASSERT_EQ(libraries(p), std::vector<Library>{Library::OpenBlas});
        EXPECT_GE(p.plan.kernels.size(), 1u);  // the consumers run as a loop kernel
        loom::sync();
        unfused = values_on("cpu", program);
      }
      loom::cpu::set_epilogues_everywhere(everywhere);
      // The table's own choice: this product (and its epilogue) goes to oneDNN.
      Outs outs = program();
      loom::cpu::Program p = program_of(outs);
      ASSERT_EQ(libraries(p), std::vector<Library>{Library::Onednn});
      const loom::cpu::Step* st = nullptr;
      for (const loom::cpu::Step& s : p.plan.steps)
        if (s.kind == loom::cpu::Step::MatMul) st = &s;
      std::vector<PostOp::Kind> kinds;
      for (const PostOp& po : st->post) kinds.push_back(po.kind);
      EXPECT_EQ(kinds, c.post);
      // The product writes the epilogue's value: no kernel computes it (the operands that are
      // expressions, like exp(d) + 1, still get theirs).
      EXPECT_EQ(p.plan.buf_of[st->out], p.plan.output_bufs[0]);
      const loom::cpu::OnednnProduct& prod =
          *p.onednn[static_cast<size_t>(st - p.plan.steps.data())];
      const std::string how = loom::cpu::onednn_describe(prod);
      EXPECT_NE(how.rfind("ref", 0), 0u) << how;
      const bool gelu = std::count(c.post.begin(), c.post.end(), PostOp::Gelu) > 0;
      const bool chosen = everywhere || gelu;
      const bool fused = loom::cpu::onednn_fused(prod);
      EXPECT_FALSE(chosen && fused) << how;
      if (!fused) {
        EXPECT_NE(how.find("post-ops in loom's epilogue"), std::string::npos) << how;
        EXPECT_EQ(how.find("refused") == std::string::npos, chosen) << how;
      }
      // A first row-vector add is the primitive's bias, fused or before loom's epilogue
      // (unless oneDNN refused the list: then the epilogue adds it too).
      EXPECT_EQ(how.find("bias in the primitive") != std::string::npos,
                c.bias_in_primitive && (fused || chosen))
          << how;
      placed += fused || chosen;
      loom::sync();
      std::vector<std::vector<double>> got = values_on("cpu", program);
      loom::cpu::set_epilogues_everywhere(false);
      expect_close(got, want, 3e-5, "fused vs ref");
      expect_close(got, unfused, 3e-5, "fused vs unfused");
    }
    // oneDNN refuses one list here: a row and a column operand together (on AVX2, and on
    // AVX-512 with 2.6's brgemm).
    EXPECT_GE(placed + 1, epilogue_cases().size());
  }
}

TEST_F(CpuOnednn, GraphConstantsAreLinearPostOps) {
  // Constants of the graph itself (as composites write them) become a linear eltwise
  // post-op: (a b) * 2 - 0.5 and then 3 - that, -2 (a b) + 3.5, as one (oneDNN 2.6 gets two
  // linear post-ops in a row wrong).
  loom::ir::Graph g = loom::ir::parse(R"(graph(%0: f32[24,32], %1: f32[32,40]) {
  %2 = matmul(%0, %1) : f32[24,40]
  %3 = constant() {value=2} : f32[]
  %4 = expand(%3) {shape=[24,40]} : f32[24,40]
  %5 = mul(%2, %4) : f32[24,40]
  %6 = constant() {value=0.5} : f32[]
  %7 = expand(%6) {shape=[24,40]} : f32[24,40]
  %8 = sub(%5, %7) : f32[24,40]
  %9 = constant() {value=3} : f32[]
  %10 = expand(%9) {shape=[24,40]} : f32[24,40]
  %11 = sub(%10, %8) : f32[24,40]
  return %11
}
)");
  loom::cpu::Program p = loom::cpu::compile_program(g, false);
  std::vector<PostOp::Kind> kinds;
  for (const loom::cpu::Step& s : p.plan.steps)
    for (const PostOp& po : s.post) kinds.push_back(po.kind);
  EXPECT_EQ(kinds, (std::vector<PostOp::Kind>{PostOp::Linear}));
  EXPECT_EQ(p.plan.kernels.size(), 0u);  // no loop kernel: the product writes 3 - x
  std::vector<loom::Buffer> in = {loom::tensor_buffer(data({24, 32}, 1)),
                                  loom::tensor_buffer(data({32, 40}, 2))};
  loom::runtime::set_backend("ref");
  std::vector<loom::Buffer> want = loom::runtime::run_graph(g, in);
  loom::runtime::set_backend("cpu");
  std::vector<loom::Buffer> got = loom::runtime::run_graph(g, in);
  const float* w = static_cast<const float*>(want[0].data());
  const float* o = static_cast<const float*>(got[0].data());
  for (int64_t i = 0; i < 24 * 40; ++i) ASSERT_NEAR(o[i], w[i], 3e-5 * (1 + std::abs(w[i]))) << i;
}

TEST_F(CpuOnednn, DecoderLayerHasNoLoopKernel) {
  Tensor x = data({4, 64, 128}, 1), w = data({128, 128}, 2), b = data({128}, 3);
  Tensor y = loom::gelu(loom::matmul(x, loom::transpose(w, 0, 1)) + b) + x;
  loom::cpu::Program p = program_of({y});
  EXPECT_EQ(p.plan.kernels.size(), 0u);
  EXPECT_EQ(p.plan.steps.size(), 1u);
  loom::sync();
}

TEST_F(CpuOnednn, EpilogueStopsAtAValueUsedElsewhere) {
  // The pre-activation is also an output (as when the backward keeps it): only the bias is
  // folded; gelu reads the product's buffer in a kernel.
  auto program = [] {
    Tensor h = loom::matmul(data({24, 32}, 1), loom::transpose(data({40, 32}, 2), 0, 1)) + bias();
    return Outs{h, loom::gelu(h)};
  };
  std::vector<std::vector<double>> want = values_on("ref", program);
  Outs outs = program();
  loom::cpu::Program p = program_of(outs);
  ASSERT_EQ(libraries(p), std::vector<Library>{Library::Onednn});
  for (const loom::cpu::Step& s : p.plan.steps) {
    if (s.kind == loom::cpu::Step::MatMul) {
      EXPECT_EQ(s.post.size(), 1u);
    }
  }
  loom::sync();
  expect_close(values_on("cpu", program), want, 3e-5, "partial epilogue vs ref");
}

TEST_F(CpuOnednn, BatchedProductWithPerBatchOperands) {
  // Operands that differ per batch keep the batches apart (no tall product).
  expect_onednn_matches_ref(
      [] {
        Tensor y = loom::matmul(data({3, 17, 23}, 1), data({3, 23, 19}, 2));
        return Outs{loom::tanh(y + data({3, 1, 19}, 3)) * data({3, 17, 19}, 4)};
      },
      3e-5);
}

TEST_F(CpuOnednn, BackwardProductsMatchTheReference) {
  // dW = dY^T X and dX = dY W of a Linear + GELU, on oneDNN.
  expect_onednn_matches_ref(
      [] {
        Tensor x = data({48, 32}, 1).requires_grad_(), w = data({40, 32}, 2).requires_grad_();
        Tensor b = data({40}, 3).requires_grad_();
        Tensor loss = loom::sum(loom::gelu(loom::matmul(x, loom::transpose(w, 0, 1)) + b) *
                                data({48, 40}, 4));
        loss.backward();
        return Outs{loss, x.grad(), w.grad(), b.grad()};
      },
      1e-4);
}

TEST_F(CpuOnednn, ProductsInAScanBodyAndTheirGradients) {
  // Region plans (a scan over stacked layers, as scan_layers runs): the body's product with
  // bias, gelu and residual as post-ops, and the reverse scan of the backward.
  expect_onednn_matches_ref(
      [] {
        Tensor w = data({3, 24, 24}, 1).requires_grad_(), b = data({3, 24}, 2).requires_grad_();
        Tensor x = data({2, 8, 24}, 3);
        auto [h, ys] = loom::scan(
            [](const Tensor& h, const std::pair<Tensor, Tensor>& wb) {
              Tensor y =
                  loom::gelu(loom::matmul(h, loom::transpose(wb.first, 0, 1)) + wb.second) + h;
              return std::pair{y, loom::sum(y)};
            },
            x, std::pair{w, b});
        Tensor loss = loom::sum(h * data({2, 8, 24}, 4)) + loom::sum(ys);
        loss.backward();
        return Outs{loss, h, w.grad(), b.grad()};
      },
      1e-4);
}

// Threads of this process (Linux: one entry per thread under /proc/self/task).
// The ids of the process's threads.
std::set<std::string> process_threads() {
  std::set<std::string> ids;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ids.insert(e.path().filename().string());
  return ids;
}

// The threads in `now` that `before` did not have.
std::set<std::string> new_threads(const std::set<std::string>& before,
                                  const std::set<std::string>& now) {
  std::set<std::string> r;
  for (const std::string& id : now)
    if (!before.count(id)) r.insert(id);
  return r;
}

TEST_F(CpuOnednn, StartsNoOpenMpThreads) {
  // oneDNN's calls run one per pool thread, single-threaded: its OpenMP team (one thread per
  // core) is never started, neither when a primitive is created nor when it runs. A fresh
  // thread compiles and runs the product: its OpenMP settings are the process defaults.
  ForcedLibrary forced(Library::Onednn);
  {
    ForcedLibrary warm(Library::OpenBlas);  // the pool and the JIT started
    loom::matmul(data({8, 8}, 1), data({8, 8}, 2)).to_vector<double>();
  }
  loom::cpu::force_library(Library::Onednn);
  std::set<std::string> before, started;
  std::thread t([&] {
    before = process_threads();
    // A fresh shape (a new primitive) split in row parts across the pool, with a post-op.
    Tensor y = loom::tanh(loom::matmul(data({256, 96}, 3), data({96, 136}, 4)));
    y.to_vector<double>();
    // libgomp keeps a team's threads alive after the call; a transient thread that a run
    // may start ends: wait up to 2 s for those. (Threads that end, like the JIT's start-up
    // preload, do not count.)
    for (int i = 0; i < 200; ++i) {
      started = new_threads(before, process_threads());
      if (started.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  t.join();
  EXPECT_TRUE(started.empty()) << started.size() << " thread(s) started and stayed";
}

TEST_F(CpuOnednn, KeepsTheCallersOpenMpSetting) {
  // The caller's thread count for its own OpenMP code (PyTorch's, say) survives the calls
  // that compile and run oneDNN products on that thread.
  ForcedLibrary forced(Library::Onednn);
  int after = 0;
  std::thread t([&] {
    omp_set_num_threads(3);
    Tensor y = loom::matmul(data({200, 72}, 5), data({72, 88}, 6)) + data({88}, 7);
    y.to_vector<double>();
    after = omp_get_max_threads();
  });
  t.join();
  EXPECT_EQ(after, 3);
}

// ---- the library per shape --------------------------------------------------------------

TEST(CpuOnednnTable, LibraryPerShapeClassOnAvx2) {
  auto table = [](int64_t m, int64_t n, int64_t k, bool a_trans, bool epilogue) {
    return loom::cpu::library_table(false, loom::DType::Float32, m, n, k, 1, a_trans, epilogue);
  };
  // Tiny output width (an MLP's last layer): OpenBLAS.
  EXPECT_EQ(table(64, 10, 256, false, false), Library::OpenBlas);
  // MLP hidden layers, forward and backward: oneDNN.
  EXPECT_EQ(table(64, 256, 784, false, false), Library::Onednn);
  EXPECT_EQ(table(784, 256, 64, true, false), Library::Onednn);
  // A weight gradient with a long k (dY^T X over 2048 rows): OpenBLAS.
  EXPECT_EQ(table(512, 512, 2048, true, false), Library::OpenBlas);
  // The decoder's [2048,512]x[512,512]: a tie without an epilogue, oneDNN with one.
  EXPECT_EQ(table(2048, 512, 512, false, false), Library::OpenBlas);
  EXPECT_EQ(table(2048, 512, 512, false, true), Library::Onednn);
}

TEST(CpuOnednnTable, LibraryPerShapeClassOnAvx512) {
  auto table = [](int64_t m, int64_t n, int64_t k, bool a_trans) {
    return loom::cpu::library_table(true, loom::DType::Float32, m, n, k, 1, a_trans, false);
  };
  // Narrow outputs: brgemm from 10 columns up to k = 512 (an MLP's logits), else OpenBLAS.
  EXPECT_EQ(table(64, 10, 256, false), Library::Onednn);
  EXPECT_EQ(table(32, 15, 512, false), Library::Onednn);
  EXPECT_EQ(table(64, 4, 256, false), Library::OpenBlas);
  EXPECT_EQ(table(64, 10, 1024, false), Library::OpenBlas);
  EXPECT_EQ(table(64, 256, 784, false), Library::Onednn);
  EXPECT_EQ(table(512, 512, 2048, true), Library::Onednn);
  EXPECT_EQ(table(2048, 512, 512, false), Library::Onednn);
}

TEST(CpuOnednnTable, OtherDTypesAndEmptyKStayOnOpenBlas) {
  // oneDNN 2.6 has no f64 matmul; k = 0 is a memset. Forcing oneDNN does not change either.
  ForcedLibrary forced(Library::Onednn);
  EXPECT_EQ(loom::cpu::choose_library(loom::DType::Float64, 64, 256, 784, 1, false, false),
            Library::OpenBlas);
  EXPECT_EQ(loom::cpu::choose_library(loom::DType::Float32, 64, 256, 0, 1, false, false),
            Library::OpenBlas);
  EXPECT_EQ(loom::cpu::choose_library(loom::DType::Float32, 64, 10, 256, 1, false, false),
            Library::Onednn);
}

// oneDNN answers some post-op lists with its reference implementation ("ref:any", a plain
// loop: an MLP step took 300 ms instead of 1 ms); loom then keeps the product on a fast kernel
// and applies the post-ops after it. Every product of an MLP's training step, forward and
// backward, with the table's choices.
TEST_F(CpuOnednn, NoProductRunsOnOnednnsReferenceKernel) {
  Tensor x = data({64, 784}, 1), w1 = data({256, 784}, 2), b1 = data({256}, 3);
  Tensor w2 = data({10, 256}, 4), b2 = data({10}, 5);
  w1.requires_grad_();
  b1.requires_grad_();
  w2.requires_grad_();
  b2.requires_grad_();
  Tensor h = loom::relu(loom::matmul(x, loom::transpose(w1, 0, 1)) + b1);
  Tensor loss = loom::mean(loom::matmul(h, loom::transpose(w2, 0, 1)) + b2);
  loss.backward();
  loom::cpu::Program p = program_of({loss, w1.grad(), b1.grad(), w2.grad(), b2.grad()});
  int onednn = 0;
  for (size_t si = 0; si < p.plan.steps.size(); ++si) {
    if (!p.onednn[si]) continue;
    ++onednn;
    const std::string what = loom::cpu::onednn_describe(*p.onednn[si]);
    EXPECT_NE(what.rfind("ref", 0), 0u) << "step " << si << ": " << what;
  }
  EXPECT_GT(onednn, 0);
  loom::sync();
}

TEST(CpuOnednnTable, ChoiceIsInTheDebugLog) {
  loom::sync();
  // The lines LOOM_DEBUG=2 prints for each product of a plan.
  Tensor x = data({64, 256}, 1), w1 = data({256, 256}, 2), w2 = data({256, 4}, 3);
  Tensor h = loom::relu(loom::matmul(x, w1) + data({256}, 4));
  loom::cpu::Program p = program_of({loom::matmul(h, w2)});
  std::string log = loom::cpu::describe_products(p.graph, p.plan);
  EXPECT_NE(log.find("f32[64,256] x f32[256,256] on onednn post-ops add relu"), std::string::npos)
      << log;
  EXPECT_NE(log.find("f32[64,256] x f32[256,4] on openblas"), std::string::npos) << log;
  loom::sync();
}

// Run by CpuOnednnTable.ChoiceIsInTheDebugLogOfAProcess in a child process under LOOM_DEBUG=2:
// an MLP's two products, one per library.
TEST(CpuOnednnDebugChild, DISABLED_Run) {
  loom::runtime::set_backend("cpu");
  Tensor x = data({64, 256}, 1), w1 = data({256, 256}, 2), w2 = data({256, 4}, 3);
  Tensor h = loom::relu(loom::matmul(x, w1) + data({256}, 4));
  loom::matmul(h, w2).to_vector<double>();
}

TEST(CpuOnednnTable, ChoiceIsInTheDebugLogOfAProcess) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "env -u LOOM_MATMUL LOOM_DEBUG=2 '" + self +
                          "' --gtest_also_run_disabled_tests "
                          "--gtest_filter=CpuOnednnDebugChild.DISABLED_Run 2>&1";
  std::string log;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) log.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << log;
  EXPECT_NE(log.find("[loom]   matmul %"), std::string::npos) << log;
  EXPECT_NE(log.find("f32[64,256] x f32[256,256] on onednn post-ops add relu"), std::string::npos)
      << log;
  EXPECT_NE(log.find("f32[64,256] x f32[256,4] on openblas"), std::string::npos) << log;
}

}  // namespace
