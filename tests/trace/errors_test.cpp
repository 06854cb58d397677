// Bad input: every op family given wrong shapes, dtypes, axes or indices throws a loom::Error
// subclass whose message names the op, the shapes and dtypes, and what was expected.
#include <gtest/gtest.h>

#include <functional>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

using loom::Tensor;

using loom::testing::expect_error;

Tensor f32(loom::Shape s) { return loom::zeros(std::move(s)); }

TEST(BadInput, ElementwiseShapesAndDTypes) {
  expect_error<loom::ShapeError>([] { f32({3}) + f32({4}); },
                                 {"[add]", "f32[3]", "f32[4]", "broadcast"});
  expect_error<loom::ShapeError>([] { loom::maximum(f32({2, 3}), f32({3, 2})); },
                                 {"[maximum]", "[2,3]", "[3,2]"});
  expect_error<loom::DTypeError>([] { loom::where(f32({2}), f32({2}), f32({2})); },
                                 {"[where]", "bool", "f32[2]"});
  expect_error<loom::DTypeError>([] { -loom::tensor(std::vector<bool>{true}, {1}); },
                                 {"[neg]", "bool[1]"});
  expect_error<loom::Error>([] { loom::clamp(f32({2}), std::nullopt, std::nullopt); },
                            {"[clamp]", "min"});
  expect_error<loom::Error>(
      [] {
        Tensor t;
        loom::exp(t);
      },
      {"undefined"});
}

TEST(BadInput, ReductionsAxes) {
  expect_error<loom::ShapeError>([] { loom::sum(f32({2, 3}), {2}); },
                                 {"[sum]", "axis 2", "rank 2"});
  expect_error<loom::ShapeError>([] { loom::sum(f32({2, 3}), {1, -1}); },
                                 {"[sum]", "more than once"});
  expect_error<loom::ShapeError>([] { loom::max(f32({0, 3})); }, {"[max]", "empty", "f32[0,3]"});
  expect_error<loom::ShapeError>([] { loom::argmax(f32({0})); }, {"[argmax]", "f32[0]"});
  expect_error<loom::DTypeError>([] { loom::mean(loom::ones({2}, loom::DType::Int64)); },
                                 {"[mean]", "i64[2]", "floating"});
  expect_error<loom::ShapeError>([] { loom::softmax(f32({2}), 1); }, {"[softmax]", "axis 1"});
}

TEST(BadInput, MatmulShapes) {
  expect_error<loom::ShapeError>([] { loom::matmul(f32({2, 3}), f32({4, 5})); },
                                 {"[matmul]", "f32[2,3]", "f32[4,5]", "inner"});
  expect_error<loom::ShapeError>([] { loom::matmul(f32({2, 3, 4}), f32({5, 4, 2})); },
                                 {"[matmul]", "broadcast"});
  expect_error<loom::ShapeError>([] { loom::matmul(loom::tensor(1.0f), f32({2})); },
                                 {"[matmul]", "f32[]"});
}

TEST(BadInput, LayoutOps) {
  expect_error<loom::ShapeError>([] { loom::reshape(f32({2, 3}), {4, 2}); },
                                 {"[reshape]", "f32[2,3]", "[4,2]"});
  expect_error<loom::ShapeError>([] { loom::reshape(f32({2, 3}), {-1, -1}); }, {"[reshape]", "-1"});
  expect_error<loom::ShapeError>([] { loom::view(f32({2, 3}), {-1, 4}); }, {"[view]", "f32[2,3]"});
  expect_error<loom::ShapeError>([] { loom::permute(f32({2, 3}), {0, 0}); },
                                 {"[permute]", "f32[2,3]"});
  expect_error<loom::ShapeError>([] { loom::permute(f32({2, 3}), {0}); },
                                 {"[permute]", "expected 2"});
  expect_error<loom::ShapeError>([] { loom::transpose(f32({2, 3}), 0, 2); },
                                 {"[transpose]", "axis 2"});
  expect_error<loom::ShapeError>([] { loom::expand(f32({2, 3}), {4, 3}); },
                                 {"[expand]", "f32[2,3]", "[4,3]"});
  expect_error<loom::ShapeError>([] { loom::cat({f32({2, 3}), f32({3, 3})}, 1); },
                                 {"[concat]", "f32[2,3]", "f32[3,3]"});
  expect_error<loom::ShapeError>([] { loom::cat({}, 0); }, {"[cat]", "non-empty"});
  expect_error<loom::ShapeError>([] { loom::stack({f32({2}), f32({3})}); },
                                 {"[stack]", "f32[3]", "f32[2]"});
  expect_error<loom::ShapeError>([] { loom::slice(f32({4}), 0, 0, 4, 0); }, {"[slice]", "step"});
  expect_error<loom::ShapeError>([] { f32({3})[3]; }, {"[select]", "index 3", "size 3"});
  expect_error<loom::ShapeError>([] { loom::unsqueeze(f32({3}), 3); }, {"[unsqueeze]", "axis 3"});
  expect_error<loom::ShapeError>([] { loom::flatten(f32({2, 3, 4}), 2, 1); },
                                 {"[flatten]", "start_dim"});
}

TEST(BadInput, IndexingOps) {
  Tensor x = f32({3, 4});
  expect_error<loom::DTypeError>([&] { loom::index_select(x, 0, f32({2})); },
                                 {"[index_select]", "int32 or int64", "f32[2]"});
  expect_error<loom::ShapeError>(
      [&] { loom::index_select(x, 2, loom::zeros({2}, loom::DType::Int64)); },
      {"[index_select]", "axis 2"});
  expect_error<loom::ShapeError>([&] { loom::gather(x, 1, loom::zeros({3}, loom::DType::Int64)); },
                                 {"[gather]", "rank"});
  expect_error<loom::ExecError>(
      [&] {
        loom::index_select(x, 0, loom::tensor(std::vector<int64_t>{0, 3}, {2})).to_vector<float>();
      },
      {"index_select", "3", "axis 0"});
  loom::sync();
  expect_error<loom::ExecError>(
      [&] {
        loom::gather(x, 1, loom::tensor(std::vector<int64_t>{0, -1, 0}, {3, 1})).to_vector<float>();
      },
      {"gather", "-1"});
  loom::sync();
  expect_error<loom::DTypeError>([] { loom::embedding(f32({2}), f32({4, 3})); },
                                 {"[embedding]", "f32[2]"});
  expect_error<loom::ShapeError>(
      [] { loom::embedding(loom::zeros({2}, loom::DType::Int64), f32({4})); },
      {"[embedding]", "2-d"});
}

TEST(BadInput, NnFunctions) {
  expect_error<loom::ShapeError>([] { loom::layer_norm(f32({2, 3}), {4}); },
                                 {"[layer_norm]", "[4]", "f32[2,3]"});
  expect_error<loom::ShapeError>([] { loom::layer_norm(f32({2, 3}), {3}, f32({2})); },
                                 {"[layer_norm]", "f32[2]"});
  expect_error<loom::Error>([] { loom::dropout(f32({2}), 1.5); }, {"[dropout]", "1.5"});
  expect_error<loom::ShapeError>(
      [] { loom::cross_entropy(f32({4, 3}), loom::zeros({5}, loom::DType::Int64)); },
      {"[cross_entropy]", "i64[5]", "f32[4,3]"});
  expect_error<loom::DTypeError>(
      [] { loom::cross_entropy(f32({4, 3}), loom::zeros({4}, loom::DType::Bool)); },
      {"[cross_entropy]", "bool[4]"});
  expect_error<loom::ShapeError>([] { loom::mse_loss(f32({4, 3}), f32({3})); },
                                 {"[mse_loss]", "f32[4,3]", "f32[3]"});
}

TEST(BadInput, FactoriesAndReads) {
  expect_error<loom::ShapeError>([] { loom::tensor(std::vector<float>{1, 2, 3}, {2, 2}); },
                                 {"[tensor]", "3 values", "[2,2]"});
  expect_error<loom::ShapeError>([] { loom::zeros({-1, 2}); }, {"[full]", "negative"});
  expect_error<loom::DTypeError>([] { loom::randn({2}, loom::DType::Int32); },
                                 {"[randn]", "int32"});
  expect_error<loom::DTypeError>([] { loom::arange(0, 3, loom::DType::Bool); },
                                 {"[arange]", "bool"});
  expect_error<loom::ShapeError>([] { f32({2}).item<float>(); }, {"[item]", "f32[2]"});
  expect_error<loom::ShapeError>([] { f32({2}).size(1); }, {"[size]", "axis 1"});
  expect_error<loom::ShapeError>(
      [] {
        Tensor t = f32({2});
        t.add_(f32({3, 2}));
      },
      {"[add_]", "f32[2]"});
  expect_error<loom::DTypeError>(
      [] {
        Tensor t = loom::zeros({2}, loom::DType::Int64);
        t.add_(f32({2}));
      },
      {"[add_]", "float32", "i64[2]"});
  expect_error<loom::ShapeError>(
      [] {
        Tensor t = f32({2});
        t.copy_(f32({3}));
      },
      {"[copy_]", "f32[3]", "f32[2]"});
  expect_error<loom::DTypeError>([] { loom::zeros({2}, loom::DType::Int64).requires_grad_(); },
                                 {"[requires_grad_]", "i64[2]"});
  loom::sync();
}

}  // namespace
