// Internals of the passes room: one factory per pass (pipeline.cpp maps names to them) and
// the scalar arithmetic of constant folding.
#pragma once

#include <memory>
#include <optional>
#include <span>

#include "loom/passes/pass.h"

namespace loom::passes::detail {

std::unique_ptr<Pass> make_dce();
std::unique_ptr<Pass> make_cse();
std::unique_ptr<Pass> make_simplify();
std::unique_ptr<Pass> make_inline();

// A constant's value as kernels see it: rounded to its float dtype, or nullopt when an
// integer or bool constant holds a value its dtype cannot (whose meaning the backends leave
// open, so it is not folded).
std::optional<double> constant_value(double f, DType dt);

// Folds the elementwise op on 0-d operands with the reference backend's semantics: floats in
// double, rounded once to `out`; integers in int64 with two's-complement wrap to `out`.
// `xs` are constant_value()s of dtype `in` (for where, of its second and third operands,
// the condition first as 0 or 1). Returns nullopt for what it will not decide (integer pow,
// NaN in maximum/minimum, out-of-range conversions, results a double cannot hold exactly).
std::optional<double> fold_elementwise(ir::OpKind op, std::span<const double> xs, DType in,
                                       DType out);

}  // namespace loom::passes::detail
