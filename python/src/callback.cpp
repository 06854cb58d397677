// pure_callback from Python: a Python function over numpy arrays registered as a host
// callback, and the op that calls it (the pytrees, the results' declaration and the vjp are
// loom.pure_callback's, in _tracing.py).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "common.h"

namespace loom::py {

namespace {

void release_under_gil(PyObject* o) {
  if (!o || !Py_IsInitialized()) return;  // interpreter gone: nothing left to release
  nb::gil_scoped_acquire g;
  Py_DECREF(o);
}

}  // namespace

CallbackError::CallbackError(nb::python_error& e) {
  // With the GIL held (the callback's trampoline): take the exception object itself.
  e.restore();
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  Py_XDECREF(tb);
  type_.reset(type, release_under_gil);
  value_.reset(value, release_under_gil);
  PyObject* s = value ? PyObject_Str(value) : nullptr;
  what_ = s ? PyUnicode_AsUTF8(s) : "a Python exception in a host callback";
  Py_XDECREF(s);
  PyErr_Clear();
}

void CallbackError::restore() const noexcept {
  PyObject* tb = value_ ? PyException_GetTraceback(value_.get()) : nullptr;  // new reference
  Py_XINCREF(type_.get());
  Py_XINCREF(value_.get());
  PyErr_Restore(type_.get(), value_.get(), tb);
}

namespace {

// A copy of the host array as a numpy array (the program's buffer is only lent for the call).
nb::object numpy_copy(const HostArray& a) {
  const size_t bytes = static_cast<size_t>(a.type.nbytes());
  auto* keep = new Buffer(Buffer::allocate_uninitialized(bytes ? bytes : 1));
  if (bytes) std::memcpy(keep->data(), a.buffer.data(), bytes);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Buffer*>(p); });
  std::vector<size_t> shape(a.type.shape.begin(), a.type.shape.end());
  nb::ndarray<nb::numpy> arr(keep->data(), shape.size(), shape.data(), owner, nullptr,
                             dl_dtype(a.type.dtype), nb::device::cpu::value);
  return nb::cast(arr);
}

HostArray host_copy(nb::handle h, const std::string& name, size_t k) {
  Array arr;
  if (!nb::try_cast(h, arr))
    throw ExecError("pure_callback", detail::str_cat("[pure_callback] the callback '", name,
                                                     "' returned ", nb::inst_name(h).c_str(),
                                                     " as result ", k, "; expected a numpy array"));
  DType dt;
  try {
    dt = loom_dtype(arr.dtype(), "pure_callback");
  } catch (const DTypeError& e) {
    throw ExecError("pure_callback", detail::str_cat("[pure_callback] the callback '", name,
                                                     "' returned result ", k, ": ", e.what()));
  }
  HostArray x = HostArray::zeros(TensorType{dt, shape_of(arr)});
  copy_elements(arr, x.buffer.data(), itemsize(dt));
  return x;
}

// The registered function: numpy copies of the arguments in, the returned arrays copied out,
// with the GIL taken (the thread that runs the program may have released it).
HostCallback make_callback(const std::string& name, nb::callable fn) {
  auto* held = new nb::object(fn);  // the registry keeps every callback until exit
  return HostCallback(name, [held, name](const std::vector<HostArray>& args) {
    nb::gil_scoped_acquire gil;
    try {
      nb::list in;
      for (const HostArray& a : args) in.append(numpy_copy(a));
      nb::object r = (*held)(in);
      std::vector<HostArray> out;
      size_t k = 0;
      for (nb::handle h : r) out.push_back(host_copy(h, name, k++));
      return out;
    } catch (nb::python_error& e) {
      throw CallbackError(e);
    }
  });
}

std::vector<Tensor> call(const HostCallback& cb,
                         const std::vector<std::pair<std::vector<int64_t>, DType>>& results,
                         const std::vector<Tensor>& args) {
  std::vector<TensorType> types;
  for (const auto& [shape, dtype] : results) types.push_back(TensorType{dtype, Shape(shape)});
  return pure_callback(cb, std::move(types), args);
}

}  // namespace

void register_callbacks(nb::module_& m) {
  nb::class_<HostCallback>(m, "_HostCallback")
      .def("__init__",
           [](HostCallback* self, const std::string& name, nb::callable fn) {
             new (self) HostCallback(make_callback(name, std::move(fn)));
           })
      .def_prop_ro("id", &HostCallback::id)
      .def_prop_ro("name", &HostCallback::name);
  m.def("_pure_callback", &call, nb::arg("callback"), nb::arg("results"), nb::arg("args"));
}

}  // namespace loom::py
