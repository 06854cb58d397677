// Type rules by op family; infer_type (builder.cpp) dispatches here on the op's traits.
#pragma once

#include <span>
#include <string>

#include "loom/core/error.h"
#include "loom/ir/builder.h"

namespace loom::ir::detail {

// "f32[3], i64[3]": the operand types for messages.
std::string operand_types(const Graph& g, std::span<const Value> operands);

TensorType infer_elementwise(const Graph& g, OpKind op, std::span<const Value> xs,
                             const TensorType* given);
TensorType infer_reduce(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a);
TensorType infer_layout(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a);
TensorType infer_index(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a);
TensorType infer_collective(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a);
TensorType infer_linalg(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a);
// attention and attention_grad (kMultiResult): every result's type.
std::vector<TensorType> infer_attention(const Graph& g, OpKind op, std::span<const Value> xs,
                                        const Attrs& a);
// pure_callback (kMultiResult): the declared result types.
std::vector<TensorType> infer_pure_callback(const Graph& g, std::span<const Value> xs,
                                            const Attrs& a);

}  // namespace loom::ir::detail
