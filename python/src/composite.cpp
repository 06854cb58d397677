// Operands and the composites PyTorch has that loom's C++ API lacks, written from its ops.
#include <cmath>
#include <cstring>

#include "common.h"

namespace loom::py {

bool to_operand(nb::handle h, Operand* out) {
  PyObject* o = h.ptr();
  if (is_tensor(o)) {
    out->tensor = tensor_of(o);
    return true;
  }
  if (PyBool_Check(o)) {
    out->scalar = Scalar(o == Py_True);
  } else if (PyLong_Check(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return false;
    out->scalar = Scalar(static_cast<int64_t>(v));
  } else if (PyFloat_Check(o)) {
    out->scalar = Scalar(PyFloat_AS_DOUBLE(o));
  } else if (std::strncmp(Py_TYPE(o)->tp_name, "numpy.", 6) == 0 &&
             std::strcmp(Py_TYPE(o)->tp_name, "numpy.ndarray") != 0) {
    return to_operand(h.attr("item")(), out);  // a numpy scalar counts as a Python number
  } else {
    return false;
  }
  out->tensor = Tensor();
  return true;
}

DType scalar_dtype(const Scalar& s, DType like) {
  int cat_s = s.is_bool ? 0 : s.is_int ? 1 : 2;
  int cat_t = like == bool_ ? 0 : is_integral(like) ? 1 : 2;
  if (cat_s <= cat_t) return like;
  return cat_s == 1 ? int64 : float32;
}

Tensor scalar_tensor(const Scalar& s, DType like) {
  DType dt = scalar_dtype(s, like);
  if (s.is_int && dt == int64) return tensor(s.ivalue);
  return full(Shape{}, s.value, dt);
}

Tensor as_tensor(const Operand& o, const Tensor& other) {
  return o.tensor.defined() ? o.tensor : scalar_tensor(o.scalar, other.dtype());
}

namespace {
// 2^(mantissa bits): every float of at least this magnitude is an integer.
double integral_bound(DType dt) {
  switch (dt) {
    case DType::BFloat16: return 128.0;
    case DType::Float16: return 1024.0;
    case DType::Float32: return 8388608.0;
    default: return 4503599627370496.0;
  }
}
}  // namespace

Tensor floor(const Tensor& x) {
  if (!is_floating(x.dtype())) return x;
  DType dt = x.dtype();
  Tensor ok = abs(x) < Scalar(integral_bound(dt));  // false for NaN and Inf: kept as they are
  Tensor zero = zeros(Shape{}, dt);
  Tensor xs = where(ok, x, zero);
  Tensor t = to(to(xs, int64), dt);  // truncation toward zero
  Tensor f = where(t > xs, t - Scalar(1.0), t);
  return where(ok, f, x);
}

Tensor floor_divide(const Tensor& a, const Tensor& b) {
  DType dt = promote_types(a.dtype(), b.dtype());
  if (is_floating(dt)) return floor(div(to(a, dt), to(b, dt)));
  // Integers: the quotient in float64 is exact while |a| < 2^53.
  Tensor q = floor(div(to(a, float64), to(b, float64)));
  return to(q, dt);
}

Tensor remainder(const Tensor& a, const Tensor& b) {
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor a2 = to(a, dt), b2 = to(b, dt);
  return sub(a2, mul(floor_divide(a2, b2), b2));
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  LOOM_CHECK_T(DTypeError, a.dtype() == bool_ && b.dtype() == bool_,
               "[logical_and] operator & needs bool tensors, got ", name(a.dtype()), " and ",
               name(b.dtype()));
  return where(a, b, zeros(Shape{}, bool_));
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  LOOM_CHECK_T(DTypeError, a.dtype() == bool_ && b.dtype() == bool_,
               "[logical_or] operator | needs bool tensors, got ", name(a.dtype()), " and ",
               name(b.dtype()));
  return where(a, ones(Shape{}, bool_), b);
}

std::vector<int64_t> dims_of(nb::handle dims) {
  std::vector<int64_t> out;
  if (dims.is_none()) return out;
  if (PyLong_Check(dims.ptr())) {
    out.push_back(nb::cast<int64_t>(dims));
    return out;
  }
  for (nb::handle d : dims) out.push_back(nb::cast<int64_t>(d));
  return out;
}

}  // namespace loom::py
