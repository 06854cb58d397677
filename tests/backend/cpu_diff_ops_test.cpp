// Differential tests, part 2: reductions, softmax and the nn functions, matmul, layout and
// indexing ops, random numbers and dropout, factories and in-place ops, each run on the
// reference interpreter and on the cpu backend and compared (tests/backend/diff_util.h).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "backend/diff_util.h"

namespace loom::difftest {
namespace {

using CpuDiffReduce = DiffTest;
using CpuDiffNN = DiffTest;
using CpuDiffMatmul = DiffTest;
using CpuDiffLayout = DiffTest;
using CpuDiffIndex = DiffTest;
using CpuDiffRandom = DiffTest;

std::string dims_str(const std::vector<int64_t>& dims, bool keepdim) {
  std::ostringstream os;
  os << Shape(dims) << (keepdim ? " keepdim" : "");
  return os.str();
}
// Number of terms per output element of a reduction of shape s over dims (all when empty).
int64_t terms(const Shape& s, const std::vector<int64_t>& dims) {
  if (dims.empty()) return s.numel();
  int64_t n = 1;
  for (int64_t d : dims) n *= s[normalize_axis("terms", d, s.rank())];
  return n;
}

// ---- reductions ------------------------------------------------------------------------

TEST_F(CpuDiffReduce, SumMeanMaxMinOverDimsInEveryDType) {
  const std::vector<std::vector<int64_t>> dim_sets = {{},     {0},     {1},      {2},      {-1},
                                                      {0, 2}, {1, 2}, {-3, -1}, {0, 1, 2}, {2, 0}};
  for (DType dt : kAllDTypes) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(str(dt, {}) + (keepdim ? " keepdim" : ""));
      expect_same([&](Outs& o) {
        const Shape s{3, 4, 5};
        Tensor x = input(dt, s, 50, -5, 5);
        for (const std::vector<int64_t>& dims : dim_sets) {
          const std::string tag = " " + dims_str(dims, keepdim);
          const int64_t n = terms(s, dims);
          o.reduced("sum" + tag, sum(x, dims, keepdim), n, sum(mag(x), dims, keepdim));
          o.exact("max" + tag, max(x, dims, keepdim));
          o.exact("min" + tag, min(x, dims, keepdim));
          if (is_floating(dt))
            o.reduced("mean" + tag, mean(x, dims, keepdim), n, mean(mag(x), dims, keepdim));
        }
        if (dt == DType::Bool) return;
        for (int64_t d : {0, 1, 2, -1, -2})  // integer inputs in [-5, 5]: many ties
          o.exact("argmax " + std::to_string(d), argmax(x, d, keepdim));
        o.exact("argmax flat", argmax(x));
      });
    }
  }
  expect_same([&](Outs& o) {  // the overloads without dims
    Tensor x = input(DType::Float32, {6, 7}, 51);
    o.reduced("sum()", sum(x), 42, sum(mag(x)));
    o.reduced("mean()", mean(x), 42, mean(mag(x)));
    o.exact("max()", max(x));
    o.exact("min()", min(x));
  });
}

TEST_F(CpuDiffReduce, IntegerSumsAccumulateInInt64) {
  expect_same([&](Outs& o) {
    Tensor big = from_ints(DType::Int32, {4, 3}, {2147483647, 2147483647, -2147483648, 1, 2, 3,
                                                  2147483647, 2147483647, 2147483647, -5, 0, 5});
    o.exact("sum i32 all", sum(big));
    o.exact("sum i32 dim", sum(big, {0}));
    o.exact("sum bool", sum(input(DType::Bool, {37, 129}, 52), {1}));
    const int64_t i64_max = std::numeric_limits<int64_t>::max();
    o.exact("sum i64 wraps", sum(from_ints(DType::Int64, {2}, {i64_max, 1})));
  });
}

// ---- softmax and the nn functions ------------------------------------------------------

TEST_F(CpuDiffNN, SoftmaxAndLogSoftmaxOverEveryDim) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16,
                   DType::Int32}) {
    for (const Shape& s : {Shape{4, 7}, Shape{2, 3, 5}, Shape{1}, Shape{37, 129}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        Tensor x = input(dt, s, 53, -6, 6);
        if (!is_floating(dt)) x = to(x, DType::Float32);  // softmax takes floats (as torch)
        for (int64_t d = -s.rank(); d < s.rank(); ++d) {
          const int64_t n = s[normalize_axis("softmax", d, s.rank())];
          o.normalized("softmax " + std::to_string(d), softmax(x, d), n);
          o.normalized("log_softmax " + std::to_string(d), log_softmax(x, d), n);
        }
        o.normalized("softmax of transposed", softmax(transpose(x, 0, -1), 0), s.back());
      });
    }
  }
}

TEST_F(CpuDiffNN, LayerNormWithAndWithoutAffine) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {4, 6, 8}, 54, -3, 3);
      Tensor w8 = input(dt, {8}, 55, 0.5, 2), b8 = input(dt, {8}, 56);
      Tensor w68 = input(dt, {6, 8}, 57, 0.5, 2), b68 = input(dt, {6, 8}, 58);
      o.normalized("plain", layer_norm(x, {8}), 8);
      o.normalized("affine", layer_norm(x, {8}, w8, b8), 8);
      o.normalized("weight only", layer_norm(x, {8}, w8), 8);
      o.normalized("bias only", layer_norm(x, {8}, Tensor(), b8), 8);
      o.normalized("two dims", layer_norm(x, {6, 8}, w68, b68, 1e-3), 48);
      o.normalized("all dims", layer_norm(x, {4, 6, 8}), 192);
      o.normalized("transposed input", layer_norm(transpose(x, 1, 2), {6}), 6);
      // Rows far from zero cancel in x - mean; in bf16/f16 the result then hinges on the
      // rounding of each intermediate, so only the wide types are compared there.
      if (dt == DType::Float32 || dt == DType::Float64)
        o.normalized("offset rows", layer_norm(x + 100, {8}), 8);
    });
  }
}

TEST_F(CpuDiffNN, ActivationsAndLosses) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {37, 129}, 59, -6, 6);
      o.trans("gelu", gelu(x));
      o.trans("sigmoid", sigmoid(x));
      o.exact("relu", relu(x));
      Tensor logits = input(dt, {8, 5}, 60, -4, 4);
      for (DType it : {DType::Int32, DType::Int64}) {
        Tensor target = indices(it, {8}, 5, 61);
        o.normalized("cross_entropy " + std::string(name(it)), cross_entropy(logits, target), 40);
      }
      Tensor probs = softmax(input(dt, {8, 5}, 62), 1);
      o.normalized("cross_entropy probs", cross_entropy(logits, probs), 40);
      o.normalized("cross_entropy 1-d", cross_entropy(select(logits, 0, 3),
                                                      from_ints(DType::Int64, {}, {2})), 5);
      o.normalized("cross_entropy wide", cross_entropy(x, indices(DType::Int64, {37}, 129, 63)),
                   37 * 129);
      Tensor y = input(dt, {37, 129}, 64);
      o.reduced("mse_loss", mse_loss(x, y), x.numel(), mean((mag(x) + mag(y)) * (mag(x) + mag(y))));
      o.exact("mse_loss empty", mse_loss(input(dt, {0}, 65), input(dt, {0}, 66)));  // nan
    });
  }
}

// ---- matmul ----------------------------------------------------------------------------

// Each product is a sum of K terms; the tolerance scales with |a| @ |b| in float64.
void check_matmul(Outs& o, const std::string& name, const Tensor& a, const Tensor& b) {
  Tensor c = matmul(a, b);
  const int64_t k = a.shape().back();
  if (is_floating(c.dtype())) o.reduced(name, c, k, matmul(mag(a), mag(b)));
  else o.exact(name, c);
}

TEST_F(CpuDiffMatmul, ShapesBatchesAndTransposedOperands) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      uint32_t seed = 70;
      auto in = [&](Shape s) { return input(dt, std::move(s), seed++, -3, 3); };
      check_matmul(o, "3x4 4x5", in({3, 4}), in({4, 5}));
      check_matmul(o, "1x1", in({1, 1}), in({1, 1}));
      check_matmul(o, "odd 17x33 33x9", in({17, 33}), in({33, 9}));
      check_matmul(o, "wide 37x129 129x33", in({37, 129}), in({129, 33}));
      check_matmul(o, "M=0", in({0, 3}), in({3, 4}));
      check_matmul(o, "K=0", in({3, 0}), in({0, 4}));
      check_matmul(o, "N=0", in({3, 4}), in({4, 0}));
      check_matmul(o, "batched", in({2, 3, 4}), in({2, 4, 5}));
      check_matmul(o, "broadcast batch", in({2, 1, 3, 4}), in({3, 4, 5}));
      check_matmul(o, "batch x 2-d", in({3, 2, 4}), in({4, 6}));
      check_matmul(o, "2-d x batch", in({2, 4}), in({5, 4, 3}));
      check_matmul(o, "1-d x 1-d", in({7}), in({7}));
      check_matmul(o, "1-d x 2-d", in({4}), in({4, 3}));
      check_matmul(o, "2-d x 1-d", in({3, 4}), in({4}));
      check_matmul(o, "1-d x 3-d", in({4}), in({2, 4, 3}));
      check_matmul(o, "3-d x 1-d", in({2, 3, 4}), in({4}));
      check_matmul(o, "a @ b^T", in({3, 4}), transpose(in({5, 4}), 0, 1));
      check_matmul(o, "a^T @ b", transpose(in({2, 4, 3}), -1, -2), in({2, 4, 5}));
      check_matmul(o, "a^T @ b^T", transpose(in({6, 3}), 0, 1), transpose(in({4, 6}), 1, 0));
      check_matmul(o, "big a @ b^T", in({37, 129}), transpose(in({33, 129}), 0, 1));
      check_matmul(o, "permuted batch", permute(in({4, 2, 3}), {1, 2, 0}), in({2, 4, 5}));
      check_matmul(o, "sliced", slice(in({6, 4}), 0, 0, 6, 2), slice(in({4, 10}), 1, 1, 10, 3));
      check_matmul(o, "expanded", expand(in({1, 4}), {3, 4}), in({4, 2}));
      Tensor g = in({5, 3});
      check_matmul(o, "gram", transpose(g, 0, 1), g);
    });
  }
  expect_same([&](Outs& o) {  // mixed dtypes converted first (matmul does not promote, as torch)
    check_matmul(o, "i32 @ f32", to(input(DType::Int32, {3, 4}, 90, -3, 3), DType::Float32),
                 input(DType::Float32, {4, 2}, 91));
    check_matmul(o, "bf16 @ f16", to(input(DType::BFloat16, {3, 4}, 92), DType::Float32),
                 to(input(DType::Float16, {4, 2}, 93), DType::Float32));
  });
}

// ---- layout ----------------------------------------------------------------------------

TEST_F(CpuDiffLayout, EveryLayoutOpInEveryDType) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {2, 3, 4}, 100, -9, 9);
      o.exact("reshape", reshape(x, {4, 6}));
      o.exact("reshape -1", reshape(x, {-1}));
      o.exact("reshape 0-d", reshape(input(dt, {1, 1}, 101), {}));
      o.exact("view", view(x, {3, -1}));
      o.exact("permute", permute(x, {2, 0, 1}));
      o.exact("permute neg", permute(x, {-1, -3, -2}));
      o.exact("transpose", transpose(x, 0, 2));
      o.exact("transpose last", transpose(x, -1, -2));
      o.exact("unsqueeze 0", unsqueeze(x, 0));
      o.exact("unsqueeze -1", unsqueeze(x, -1));
      o.exact("unsqueeze mid", unsqueeze(x, 2));
      o.exact("squeeze", squeeze(input(dt, {1, 3, 1, 2}, 102)));
      o.exact("squeeze dim", squeeze(input(dt, {3, 1, 2}, 103), 1));
      o.exact("squeeze no-op", squeeze(x, 1));
      o.exact("flatten", flatten(x));
      o.exact("flatten 1", flatten(x, 1));
      o.exact("flatten 0 1", flatten(x, 0, 1));
      o.exact("flatten 0-d", flatten(input(dt, {}, 104)));
      o.exact("expand", expand(input(dt, {3, 1}, 105), {2, 3, 4}));
      o.exact("expand -1", expand(input(dt, {1, 4}, 106), {5, -1}));
      o.exact("expand 0-d", expand(input(dt, {}, 107), {2, 2}));
      o.exact("expand to 0", expand(input(dt, {1, 3}, 108), {0, 3}));
      Tensor y = input(dt, {2, 3, 4}, 109, -9, 9);
      o.exact("cat 0", cat({x, y}, 0));
      o.exact("cat 1", cat({x, input(dt, {2, 1, 4}, 110), y}, 1));
      o.exact("cat -1", cat({x, y, x}, -1));
      o.exact("cat empty piece", cat({x, input(dt, {2, 0, 4}, 111)}, 1));
      o.exact("cat mixed", cat({x, input(DType::Float32, {2, 3, 4}, 112)}, 0));
      o.exact("cat transposed", cat({transpose(x, 1, 2), transpose(y, 1, 2)}, 1));
      o.exact("cat single", cat({x}, 2));
      o.exact("stack 0", stack({x, y}, 0));
      o.exact("stack 1", stack({x, y, x}, 1));
      o.exact("stack -1", stack({x, y}, -1));
      o.exact("stack 0-d", stack({input(dt, {}, 113), input(dt, {}, 114)}));
      o.exact("slice step", slice(x, 2, 0, 4, 2));
      o.exact("slice step 3", slice(x, 2, 1, 4, 3));
      o.exact("slice neg", slice(x, 1, -2, 100));
      o.exact("slice empty", slice(x, 0, 5, 10));
      o.exact("slice big step", slice(x, 2, 0, 4, 5));
      o.exact("slice neg end", slice(x, -1, 0, -1, 2));
      o.exact("select", select(x, 0, 1));
      o.exact("select neg", select(x, -1, -1));
      o.exact("operator[]", x[1]);
      o.exact("x[1][2]", x[1][2]);
      // layout chains that force a copy, then arithmetic on the result
      o.exact("permute reshape", reshape(permute(x, {2, 0, 1}), {4, 6}));
      o.exact("slice transpose flatten", flatten(transpose(slice(x, 2, 1, 4, 2), 0, 2)));
      o.exact("expand permute", permute(expand(input(dt, {3, 1}, 115), {2, 3, 4}), {2, 1, 0}));
      if (dt != DType::Bool) o.arith("chain + 1", reshape(permute(x, {1, 2, 0}), {12, 2}) + 1);
    });
  }
}

// ---- indexing --------------------------------------------------------------------------

TEST_F(CpuDiffIndex, IndexSelectGatherEmbeddingInEveryDType) {
  for (DType dt : kAllDTypes) {
    for (DType it : {DType::Int32, DType::Int64}) {
      SCOPED_TRACE(str(dt, {}) + " indices " + std::string(name(it)));
      expect_same([&](Outs& o) {
        Tensor x = input(dt, {5, 6, 4}, 120, -9, 9);
        o.exact("index_select 0", index_select(x, 0, from_ints(it, {4}, {4, 0, 4, 2})));
        o.exact("index_select 1", index_select(x, 1, indices(it, {9}, 6, 121)));
        o.exact("index_select -1", index_select(x, -1, from_ints(it, {2}, {3, 3})));
        o.exact("index_select empty", index_select(x, 1, from_ints(it, {0}, {})));
        o.exact("index_select 0-d idx", index_select(x, 0, from_ints(it, {}, {2})));
        o.exact("index_select transposed",
                index_select(transpose(x, 0, 2), 0, from_ints(it, {3}, {1, 0, 3})));
        Tensor x2 = input(dt, {3, 4}, 122, -9, 9);
        o.exact("gather 1", gather(x2, 1, indices(it, {3, 6}, 4, 123)));
        o.exact("gather 0", gather(x2, 0, indices(it, {2, 4}, 3, 124)));
        o.exact("gather smaller", gather(x2, 1, from_ints(it, {2, 1}, {2, 0})));
        o.exact("gather 3-d", gather(x, 1, indices(it, {5, 2, 4}, 6, 125)));
        o.exact("gather -1", gather(x, -1, indices(it, {4, 6, 7}, 4, 126)));
        o.exact("gather empty", gather(x2, 1, from_ints(it, {0, 4}, {})));
        Tensor table = input(dt, {10, 4}, 127, -9, 9);
        o.exact("embedding", embedding(indices(it, {2, 3}, 10, 128), table));
        o.exact("embedding 1-d", embedding(from_ints(it, {5}, {9, 0, 9, 1, 2}), table));
        o.exact("embedding 0-d", embedding(from_ints(it, {}, {7}), table));
      });
    }
  }
}

// An index out of range is a run-time ExecError on every backend, never an out-of-bounds read.
TEST_F(CpuDiffIndex, OutOfRangeIndexIsAnExecErrorOnBothBackends) {
  for (const std::string& backend : {std::string("ref"), other_backend()}) {
    SCOPED_TRACE(backend);
    runtime::set_backend(backend);
    Tensor x = input(DType::Float32, {3, 4}, 129);
    EXPECT_THROW(index_select(x, 0, from_ints(DType::Int64, {2}, {0, 3})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(index_select(x, 1, from_ints(DType::Int32, {1}, {-1})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(gather(x, 1, from_ints(DType::Int32, {3, 1}, {0, 4, 0})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(embedding(from_ints(DType::Int64, {2}, {1, 10}), x).to_vector<double>(),
                 ExecError);
    sync();
    // a good program still runs afterwards
    EXPECT_EQ(index_select(x, 0, from_ints(DType::Int64, {1}, {2})).to_vector<double>(),
              slice(x, 0, 2, 3).to_vector<double>());
  }
}

// ---- random numbers and dropout --------------------------------------------------------

// Same seed, same numbers on every backend, bit for bit (core/philox.h rounded once).
TEST_F(CpuDiffRandom, RandAndRandnAreBitExact) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, (uint64_t{1} << 40) + 7}) {
    for (DType dt : kFloatDTypes) {
      SCOPED_TRACE(str(dt, {}) + " seed " + std::to_string(seed));
      expect_same(
          [&](Outs& o) {
            for (const Shape& s : {Shape{}, Shape{1}, Shape{3}, Shape{5, 3}, Shape{4097},
                                   Shape{37, 129}, Shape{0}, Shape{2, 0, 3}}) {
              o.exact("rand " + str(dt, s), rand(s, dt));
              o.exact("randn " + str(dt, s), randn(s, dt));
            }
            Tensor u = rand({7, 9}, dt);
            o.arith("rand * 2 - 1", u * 2 - 1);
            o.exact("rand transposed", transpose(u, 0, 1));
            Tensor r = randn({1000}, dt);
            o.reduced("randn sum", sum(r), 1000, sum(mag(r)));
          },
          seed);
    }
  }
}

TEST_F(CpuDiffRandom, DropoutSameSeedSameMask) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {4097}, 130), m = input(dt, {37, 129}, 131);
      auto check = [&](const std::string& n, Tensor t) {
        // x * (1 / (1 - p)) rounds once: exact for float32 and float64
        if (dt == DType::Float32 || dt == DType::Float64) o.exact(n, std::move(t));
        else o.arith(n, std::move(t));
      };
      check("p 0.3", dropout(x, 0.3));
      check("p 0.5 2-d", dropout(m, 0.5));
      check("p 0.9", dropout(m, 0.9));
      check("second draw", dropout(x, 0.3));  // a new key offset: a different mask
      check("p 0", dropout(x, 0.0));
      check("p 1", dropout(x, 1.0));
      check("eval", dropout(x, 0.3, false));
      check("of relu", dropout(relu(m), 0.2));
      check("transposed", dropout(transpose(m, 0, 1), 0.4));
      check("empty", dropout(input(dt, {2, 0}, 132), 0.5));
      check("0-d", dropout(input(dt, {}, 133), 0.5));
    });
  }
}

// ---- factories and in-place ops --------------------------------------------------------

TEST_F(CpuDiffLayout, FactoriesAndInPlaceOps) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      o.exact("zeros", zeros({2, 3}, dt));
      o.exact("ones", ones({4}, dt));
      o.exact("full", full({3, 2}, 1.5, dt));
      o.exact("full 0-d", full({}, -2, dt));
      if (dt != DType::Bool) {
        o.exact("arange", arange(0, 10, dt));
        o.exact("arange frac", arange(-2.5, 3, dt));
        o.exact("arange empty", arange(2, 2, dt));  // arange(3, 1) raises, as torch
      }
      Tensor t = input(dt, {3, 4}, 140, -9, 9);
      Tensor c = zeros({3, 4}, dt);
      c.copy_(input(DType::Float64, {4}, 141, -9, 9));  // broadcast and convert
      o.exact("copy_", c);
      if (dt != DType::Bool) {
        Tensor a = input(dt, {3, 4}, 142, -9, 9);
        a.add_(t);
        o.arith("add_", a);
      }
      Tensor z = input(dt, {3, 4}, 143);
      z.zero_();
      o.exact("zero_", z);
      o.exact("detach", t.detach());
    });
  }
}

}  // namespace
}  // namespace loom::difftest
