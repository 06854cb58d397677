// Reference kernels of the elementwise ops: unary math, convert, binary arithmetic (with
// numpy broadcasting), logic, comparisons and where. Floats compute in double; integers
// compute in int64 with arithmetic done in uint64 so that overflow wraps instead of being UB.
#include <cmath>
#include <limits>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

double float_unary(OpKind op, double x) {
  switch (op) {
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::fabs(x);
    case OpKind::Exp: return std::exp(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Sin: return std::sin(x);
    case OpKind::Cos: return std::cos(x);
    case OpKind::Erf: return std::erf(x);
    default: LOOM_ASSERT(false);
  }
  return 0;
}

int64_t int_unary(OpKind op, int64_t x) {
  const uint64_t neg = uint64_t{0} - static_cast<uint64_t>(x);  // -INT64_MIN wraps to itself
  switch (op) {
    case OpKind::Neg: return static_cast<int64_t>(neg);
    case OpKind::Abs: return x < 0 ? static_cast<int64_t>(neg) : x;
    case OpKind::Not: return x == 0;
    default: LOOM_ASSERT(false);
  }
  return 0;
}

// Like torch: a negative exponent gives 0 except for bases 1 and -1; otherwise repeated
// squaring in uint64, which wraps like every other integer op.
int64_t int_pow(int64_t base, int64_t exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent & 1) ? -1 : 1;
    return 0;
  }
  uint64_t result = 1, b = static_cast<uint64_t>(base);
  for (uint64_t e = static_cast<uint64_t>(exponent); e != 0; e >>= 1) {
    if (e & 1) result *= b;
    b *= b;
  }
  return static_cast<int64_t>(result);
}

// Truncates toward zero; x / 0 is 0 and INT64_MIN / -1 wraps to INT64_MIN (both UB in C++).
int64_t int_div(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(a));
  return a / b;
}

double float_binary(OpKind op, double a, double b) {
  switch (op) {
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Pow: return std::pow(a, b);
    // NaN propagates (like torch.maximum), unlike std::fmax.
    case OpKind::Maximum: return std::isnan(a) ? a : std::isnan(b) ? b : (a > b ? a : b);
    case OpKind::Minimum: return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? a : b);
    default: LOOM_ASSERT(false);
  }
  return 0;
}

int64_t int_binary(OpKind op, int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case OpKind::Add: return static_cast<int64_t>(ua + ub);
    case OpKind::Sub: return static_cast<int64_t>(ua - ub);
    case OpKind::Mul: return static_cast<int64_t>(ua * ub);
    case OpKind::Div: return int_div(a, b);
    case OpKind::Pow: return int_pow(a, b);
    case OpKind::Maximum: return a > b ? a : b;
    case OpKind::Minimum: return a < b ? a : b;
    case OpKind::And: return a != 0 && b != 0;
    case OpKind::Or: return a != 0 || b != 0;
    default: LOOM_ASSERT(false);
  }
  return 0;
}

// With NaN every comparison is false except ne, which the C++ operators already do.
template <class T>
bool compare(OpKind op, T a, T b) {
  switch (op) {
    case OpKind::Eq: return a == b;
    case OpKind::Ne: return a != b;
    case OpKind::Lt: return a < b;
    case OpKind::Le: return a <= b;
    case OpKind::Gt: return a > b;
    case OpKind::Ge: return a >= b;
    default: LOOM_ASSERT(false);
  }
  return false;
}

void unary_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const bool floating = is_floating(x.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, float_unary(node.op, x.get_f(e)));
    } else {
      out.set_i(e, int_unary(node.op, x.get_i(e)));
    }
  }
}

// Floats go through set_f (truncate / saturate / != 0 / round); ints and bool through set_i
// (wrap / != 0 / round), which is the whole conversion table of docs/ir.md.
void convert_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const bool floating = is_floating(x.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, x.get_f(e));
    } else {
      out.set_i(e, x.get_i(e));
    }
  }
}

void binary_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &a = in[0], &b = in[1];
  const BroadcastIndex ia(out.shape(), a.shape()), ib(out.shape(), b.shape());
  const bool floating = is_floating(a.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, float_binary(node.op, a.get_f(ia(e)), b.get_f(ib(e))));
    } else {
      out.set_i(e, int_binary(node.op, a.get_i(ia(e)), b.get_i(ib(e))));
    }
  }
}

void compare_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &a = in[0], &b = in[1];
  const BroadcastIndex ia(out.shape(), a.shape()), ib(out.shape(), b.shape());
  const bool floating = is_floating(a.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    const bool r = floating ? compare(node.op, a.get_f(ia(e)), b.get_f(ib(e)))
                            : compare(node.op, a.get_i(ia(e)), b.get_i(ib(e)));
    out.set_i(e, r);
  }
}

void where_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const Array &cond = in[0], &a = in[1], &b = in[2];
  const BroadcastIndex ic(out.shape(), cond.shape()), ia(out.shape(), a.shape()),
      ib(out.shape(), b.shape());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (cond.get_i(ic(e)) != 0) {
      out.copy_from(e, a, ia(e));
    } else {
      out.copy_from(e, b, ib(e));
    }
  }
}

}  // namespace

void register_elementwise_kernels(KernelTable& t) {
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Tanh,
                    OpKind::Sin, OpKind::Cos, OpKind::Erf, OpKind::Not}) {
    t.set(op, unary_kernel);
  }
  t.set(OpKind::Convert, convert_kernel);
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow,
                    OpKind::Maximum, OpKind::Minimum, OpKind::And, OpKind::Or}) {
    t.set(op, binary_kernel);
  }
  for (OpKind op : {OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge}) {
    t.set(op, compare_kernel);
  }
  t.set(OpKind::Where, where_kernel);
}

}  // namespace loom::detail::ref
