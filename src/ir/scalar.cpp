// The elementwise ops' scalar semantics (loom/ir/scalar.h), shared by ref and folding.
#include "loom/ir/scalar.h"

#include <cmath>

#include "loom/core/error.h"

namespace loom::ir {

namespace {

// Repeated squaring in uint64, which wraps like every other integer op.
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

int64_t int_div(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(a));
  return a / b;
}

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

}  // namespace

double scalar_float(OpKind op, double a, double b) {
  switch (op) {
    case OpKind::Neg: return -a;
    case OpKind::Abs: return std::fabs(a);
    case OpKind::Exp: return std::exp(a);
    case OpKind::Log: return std::log(a);
    case OpKind::Sqrt: return std::sqrt(a);
    case OpKind::Tanh: return std::tanh(a);
    case OpKind::Sin: return std::sin(a);
    case OpKind::Cos: return std::cos(a);
    case OpKind::Erf: return std::erf(a);
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Pow: return std::pow(a, b);
    case OpKind::Maximum: return std::isnan(a) ? a : std::isnan(b) ? b : (a > b ? a : b);
    case OpKind::Minimum: return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? a : b);
    case OpKind::Rem: return std::fmod(a, b);
    default: LOOM_ASSERT(false);
  }
  return 0;
}

int64_t scalar_int(OpKind op, int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case OpKind::Neg: return static_cast<int64_t>(0 - ua);  // -INT64_MIN wraps to itself
    case OpKind::Abs: return a < 0 ? static_cast<int64_t>(0 - ua) : a;
    case OpKind::Not: return a == 0;
    case OpKind::Add: return static_cast<int64_t>(ua + ub);
    case OpKind::Sub: return static_cast<int64_t>(ua - ub);
    case OpKind::Mul: return static_cast<int64_t>(ua * ub);
    case OpKind::Div: return int_div(a, b);
    case OpKind::Rem: return b == 0 || b == -1 ? 0 : a % b;
    case OpKind::Pow: return int_pow(a, b);
    case OpKind::Maximum: return a > b ? a : b;
    case OpKind::Minimum: return a < b ? a : b;
    case OpKind::And: return a != 0 && b != 0;
    case OpKind::Or: return a != 0 || b != 0;
    default: LOOM_ASSERT(false);
  }
  return 0;
}

bool scalar_compare(OpKind op, double a, double b) { return compare(op, a, b); }
bool scalar_compare(OpKind op, int64_t a, int64_t b) { return compare(op, a, b); }

}  // namespace loom::ir
