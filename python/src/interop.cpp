// numpy and DLPack, both ways. Out: a materialized tensor's buffer is shared (the returned
// array keeps a Buffer copy alive, and loom never reuses memory another holder sees; the
// buffer is marked shared, so ops traced later copy it, Buffer::shared). In:
// from_numpy/from_dlpack wrap the producer's memory (Buffer::wrap, the producer kept alive)
// when it is C-contiguous and aligned; tensor() copies.
#include <loom/trace/interop.h>
#include <nanobind/ndarray.h>

#include <cstring>

#include "common.h"
#include "tree.h"

namespace loom::py {

nb::dlpack::dtype dl_dtype(DType d) {
  using nb::dlpack::dtype_code;
  switch (d) {
    case DType::Bool: return {uint8_t(dtype_code::Bool), 8, 1};
    case DType::Int32: return {uint8_t(dtype_code::Int), 32, 1};
    case DType::Int64: return {uint8_t(dtype_code::Int), 64, 1};
    case DType::BFloat16: return {uint8_t(dtype_code::Bfloat), 16, 1};
    case DType::Float16: return {uint8_t(dtype_code::Float), 16, 1};
    case DType::Float32: return {uint8_t(dtype_code::Float), 32, 1};
    case DType::Float64: return {uint8_t(dtype_code::Float), 64, 1};
  }
  return {};
}

DType loom_dtype(nb::dlpack::dtype t, const char* op) {
  using nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(dtype_code::Bool) && t.bits == 8) return bool_;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 32) return int32;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 64) return int64;
    if (t.code == uint8_t(dtype_code::Bfloat) && t.bits == 16) return bfloat16;
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 16) return float16;
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 32) return float32;
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 64) return float64;
  }
  throw DTypeError(detail::str_cat("[", op, "] loom has no dtype for DLPack type code ",
                                   int(t.code), " with ", int(t.bits), " bits and ", int(t.lanes),
                                   " lanes; expected bool, int32, int64, "
                                   "bfloat16, float16, float32 or float64"));
}

bool c_contiguous(const Array& a) {
  int64_t expect = 1;
  for (size_t k = a.ndim(); k-- > 0;) {
    if (a.shape(k) != 1 && a.stride(k) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(k));
  }
  return true;
}

Shape shape_of(const Array& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t k = 0; k < a.ndim(); ++k) s[k] = static_cast<int64_t>(a.shape(k));
  return Shape(s);
}

namespace {

// The ndarray (and the producer it references) kept alive by a Buffer; released with the GIL.
std::shared_ptr<void> keep_alive(const Array& a) {
  return std::shared_ptr<void>(new Array(a), [](void* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: nothing left to release
    nb::gil_scoped_acquire g;
    delete static_cast<Array*>(p);
  });
}

Tensor copy_array(const Array& a, const char* op) {
  DType dt = loom_dtype(a.dtype(), op);
  Shape shape = shape_of(a);
  int64_t n = shape.numel(), isz = itemsize(dt);
  Buffer b = Buffer::allocate_uninitialized(static_cast<size_t>(n * isz));
  copy_elements(a, b.data(), isz);
  return tensor_from_buffer(std::move(b), std::move(shape), dt);
}

}  // namespace

void copy_elements(const Array& a, void* to, int64_t isz) {
  const int64_t n = shape_of(a).numel();
  auto* dst = static_cast<char*>(to);
  const auto* src = static_cast<const char*>(a.data());
  if (c_contiguous(a)) {
    if (n) std::memcpy(dst, src, static_cast<size_t>(n * isz));
  } else {  // strided: walk the multi-index
    std::vector<int64_t> idx(a.ndim(), 0);
    for (int64_t e = 0; e < n; ++e) {
      int64_t off = 0;
      for (size_t k = 0; k < a.ndim(); ++k) off += idx[k] * a.stride(k);
      std::memcpy(dst + e * isz, src + off * isz, static_cast<size_t>(isz));
      for (size_t k = a.ndim(); k-- > 0;) {
        if (++idx[k] < static_cast<int64_t>(a.shape(k))) break;
        idx[k] = 0;
      }
    }
  }
}

namespace {

// Shares when it can (C-contiguous, element-aligned), else copies.
Tensor share_array(const Array& a, const char* op) {
  DType dt = loom_dtype(a.dtype(), op);
  if (!c_contiguous(a) || reinterpret_cast<uintptr_t>(a.data()) % itemsize(dt) != 0)
    return copy_array(a, op);
  Shape shape = shape_of(a);
  size_t nbytes = static_cast<size_t>(shape.numel() * itemsize(dt));
  Buffer b = Buffer::wrap(const_cast<void*>(a.data()), nbytes, keep_alive(a));
  return tensor_from_buffer(std::move(b), std::move(shape), dt);
}

// t's value as an ndarray of framework F over t's buffer (no copy).
template <class F>
nb::ndarray<F> export_array(const Tensor& t) {
  Buffer b;
  {
    PythonSite at;
    nb::gil_scoped_release g;
    b = tensor_buffer(t);
  }
  b.mark_shared();  // the array may be written: pending reads of t copy it from now on
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* keep = new Buffer(b);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Buffer*>(p); });
  void* data = b.data() ? b.data() : static_cast<void*>(keep);  // a 0-size tensor: any pointer
  return nb::ndarray<F>(data, shape.size(), shape.data(), owner, nullptr, dl_dtype(t.dtype()),
                        nb::device::cpu::value);
}

}  // namespace

void register_interop(nb::module_& m) {
  m.def("_tensor_copy", [](const Array& a) { return copy_array(a, "tensor"); }, nb::arg("data"));
  m.def(
      "from_numpy", [](const Array& a) { return share_array(a, "from_numpy"); }, nb::arg("ndarray"),
      "A tensor sharing the array's memory (C-contiguous arrays; others are copied).");
  m.def(
      "from_dlpack", [](const Array& a) { return share_array(a, "from_dlpack"); },
      nb::arg("ext_tensor"), "A tensor over any CPU DLPack producer's memory, without copying.");

  nb::handle cls = m.attr("Tensor");
  nb::class_<Tensor>& tc = static_cast<nb::class_<Tensor>&>(cls);
  tc.def(
      "numpy",
      [](const Tensor& t) {
        LOOM_CHECK_T(DTypeError, t.dtype() != bfloat16,
                     "[numpy] numpy has no bfloat16; use t.float().numpy() or DLPack");
        return export_array<nb::numpy>(t);
      },
      nb::rv_policy::reference);
  tc.def(
      "__array__",
      [](const Tensor& t, nb::handle dtype, nb::handle copy) {
        LOOM_CHECK_T(DTypeError, t.dtype() != bfloat16,
                     "[__array__] numpy has no bfloat16; use t.float() or DLPack");
        nb::object a = nb::cast(export_array<nb::numpy>(t), nb::rv_policy::reference);
        if (!dtype.is_none()) a = a.attr("astype")(dtype);
        return a;
      },
      nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none());
  tc.def(
      "__dlpack__",
      [](const Tensor& t, nb::handle stream) {
        // a DLPack capsule (nanobind's no_framework form)
        return nb::cast(export_array<nb::no_framework>(t), nb::rv_policy::reference);
      },
      nb::arg("stream") = nb::none());
  tc.def("__dlpack_device__", [](const Tensor&) { return nb::make_tuple(1, 0); });
  // Where t's value lies, (address, bytes), materializing t but not handing the memory out:
  // torch.compile's backend checks that the outputs it gives torch without a copy alias nothing.
  tc.def("_memory", [](const Tensor& t) {
    PythonSite at;
    Buffer b;
    {
      nb::gil_scoped_release g;
      b = tensor_buffer(t);
    }
    return nb::make_tuple(reinterpret_cast<uintptr_t>(b.data()), b.nbytes());
  });
  tc.def("data_ptr", [](const Tensor& t) {
    PythonSite at;
    nb::gil_scoped_release g;
    Buffer b = tensor_buffer(t);
    b.mark_shared();
    return reinterpret_cast<uintptr_t>(b.data());
  });
}

}  // namespace loom::py
