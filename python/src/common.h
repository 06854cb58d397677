// Shared helpers of the binding files: Python numbers as loom operands, dtype rules for
// Python scalars, and each file's register_* entry point.
#pragma once

#include <loom/loom.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <string>

namespace loom::py {

namespace nb = nanobind;

// The loom.Tensor Python type, set by register_tensor. is_tensor and tensor_of test and read an
// instance without nanobind's per-call type lookup by std::type_info (nb::isinstance, nb::cast),
// which costs more than the check itself on the operators' path.
extern PyTypeObject* tensor_type;
inline bool is_tensor(PyObject* o) {
  PyTypeObject* t = Py_TYPE(o);
  return (t == tensor_type || PyType_IsSubtype(t, tensor_type)) && nb::inst_ready(o);
}
inline Tensor& tensor_of(PyObject* o) { return *nb::inst_ptr<Tensor>(o); }
// A new loom.Tensor object holding t (nb::cast's work without its lookups): a new reference.
PyObject* new_tensor_object(Tensor&& t);
// For a CPython slot function's catch (...): sets the Python error for the exception in flight
// as nanobind's dispatch would (a loom error as its loom.<Class>, python_error restored,
// nanobind's builtin exceptions as their Python classes, others as RuntimeError).
void set_python_error() noexcept;

// A binary operator's right-hand side: a tensor or a Python number (bool, int, float).
struct Operand {
  Tensor tensor;  // defined when the operand is a tensor
  Scalar scalar{0.0};
};
// False when `h` is neither a loom Tensor nor a Python/numpy number (the caller returns
// NotImplemented, as Python's protocol wants).
bool to_operand(nb::handle h, Operand* out);

// The number as a 0-d tensor of result_type(like, s) (loom/trace/ops.h).
Tensor scalar_tensor(const Scalar& s, DType like);
// The operand as a tensor next to `other`.
Tensor as_tensor(const Operand& o, const Tensor& other);

// Python's dims argument: None (every dim), an int, or a sequence of ints.
std::vector<int64_t> dims_of(nb::handle dims);

// numpy and DLPack arrays (interop.cpp): loom's dtype of theirs and back, the shape, whether the
// layout is row-major, and a copy of the elements (itemsize isz) into row-major memory.
using Array = nb::ndarray<nb::device::cpu>;
nb::dlpack::dtype dl_dtype(DType d);
DType loom_dtype(nb::dlpack::dtype t, const char* op);
bool c_contiguous(const Array& a);
Shape shape_of(const Array& a);
void copy_elements(const Array& a, void* to, int64_t isz);

// A Python exception raised inside a host callback (pure_callback), carried through loom's C++
// (the tensors it poisons hold it) and raised again, as itself, at every read.
class CallbackError : public std::exception {
 public:
  explicit CallbackError(nb::python_error& e);
  void restore() const noexcept;  // sets it as the current Python error; repeatable
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::shared_ptr<PyObject> type_, value_;
  std::string what_;
};

void register_errors(nb::module_& m);
void register_callbacks(nb::module_& m);
void register_tensor(nb::module_& m);
void register_ops(nb::module_& m);
void register_interop(nb::module_& m);
void register_transforms(nb::module_& m);
void register_tracing(nb::module_& m);
void register_io(nb::module_& m);
void register_dist(nb::module_& m);

}  // namespace loom::py
