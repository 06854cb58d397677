// The reference backend: interprets a graph one op at a time with plain loops. Slow on
// purpose; it is the executable specification every other backend is tested against.
// Floating-point ops compute in double and round once to the result dtype; integer ops
// compute in int64 with two's-complement wrap to the result dtype.
//
// Edge cases, chosen so that no input is undefined behaviour: float -> int truncates toward
// zero, maps NaN to 0 and saturates at the integer range; anything -> bool is `!= 0` (NaN is
// true); integer x / 0 is 0 and INT_MIN / -1 wraps; integer pow with a negative exponent is 0
// except for bases 1 and -1. An integral constant takes its value rounded to nearest (halves
// away from zero) and saturated. bf16/f16 results round once from double (no double rounding).
#pragma once

#include <memory>

#include "loom/backend/backend.h"

namespace loom::backend {

std::unique_ptr<Backend> make_ref_backend();

// Evaluates node `id` of `g` with its reference kernel: `operands` hold the operand values as
// contiguous arrays of their types; returns the result. Other backends fall back on it for
// ops they do not generate code for.
// For a node with several results (control flow) it returns result 0.
Buffer ref_eval_node(const ir::Graph& g, ir::NodeId id, std::span<const Buffer> operands);
// As ref_eval_node, returning every result of the node (one Buffer each, in order).
// Control-flow nodes compile their regions on each call: to run one many times, compile it
// once with ref_compile_node.
std::vector<Buffer> ref_eval_node_all(const ir::Graph& g, ir::NodeId id,
                                      std::span<const Buffer> operands);
// Node `id` of `g` alone (regions included) as a reference Executable: its inputs are the
// node's operands, its outputs all of the node's results.
std::shared_ptr<const Executable> ref_compile_node(const ir::Graph& g, ir::NodeId id);

// The ExecError an indexing op (gather, index_select, index_add: `op`) raises for index k
// outside [0, extent) along `axis`; native kernels of other backends raise the same one.
[[noreturn]] void throw_index_out_of_range(const char* op, int64_t k, int64_t axis, int64_t extent);

}  // namespace loom::backend
