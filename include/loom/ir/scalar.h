// The scalar semantics of the elementwise ops of ops.def (docs/ir.md), defined once: the
// reference backend computes every element with these functions and constant folding folds
// with them (adding only its "will not decide" guards), so the two can never disagree. The
// CPU backend's code generator is tested against them through the reference backend.
//
// Floats compute in double (the caller rounds to the result dtype). Integers and bools
// compute in int64 with arithmetic done in uint64, so overflow wraps instead of being
// undefined; bools are 0/1. Pure functions, thread-safe.
#pragma once

#include <cstdint>

#include "loom/ir/op_kind.h"

namespace loom::ir {

// A unary (b ignored) or binary float op: neg abs exp log sqrt tanh sin cos erf, add sub mul
// div pow maximum minimum. maximum/minimum: a NaN operand wins (the first one), else the
// larger (smaller) value, else b (so the order of signed zeros is defined).
double scalar_float(OpKind op, double a, double b = 0);
// A unary (b ignored) or binary integer or bool op: neg abs not, add sub mul div pow
// maximum minimum and or. div truncates toward zero, x / 0 is 0 and INT64_MIN / -1 wraps;
// pow with a negative exponent is 0 except for bases 1 and -1 (as torch).
int64_t scalar_int(OpKind op, int64_t a, int64_t b = 0);
// eq ne lt le gt ge. With NaN every comparison is false except ne.
bool scalar_compare(OpKind op, double a, double b);
bool scalar_compare(OpKind op, int64_t a, int64_t b);

}  // namespace loom::ir
