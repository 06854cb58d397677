// Python operands as loom tensors and scalars (torch's promotion of Python numbers).
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

Tensor scalar_tensor(const Scalar& s, DType like) {
  DType dt = result_type(like, s);
  if (s.is_int && dt == int64) return tensor(s.ivalue);
  return full(Shape{}, s.value, dt);
}

Tensor as_tensor(const Operand& o, const Tensor& other) {
  return o.tensor.defined() ? o.tensor : scalar_tensor(o.scalar, other.dtype());
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
