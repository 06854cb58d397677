// loom.Tensor: properties, operators (reflected forms with Python numbers, in-place forms,
// comparisons) and basic indexing. Argument conventions (dim=, keepdim=) and methods that
// only rearrange arguments live in python/loom/_tensor.py.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <sstream>

#include "common.h"
#include "index_key.h"
#include "tree.h"

namespace loom::py {

PyTypeObject* tensor_type = nullptr;

PyObject* new_tensor_object(Tensor&& t) {
  nb::object o = nb::inst_alloc(nb::handle(reinterpret_cast<PyObject*>(tensor_type)));
  ::new (nb::inst_ptr<Tensor>(o)) Tensor(std::move(t));
  nb::inst_mark_ready(o);
  return o.release().ptr();
}

namespace {

using TT = Tensor (*)(const Tensor&, const Tensor&);
using TS = Tensor (*)(const Tensor&, Scalar);
using ST = Tensor (*)(Scalar, const Tensor&);

Tensor op_add(const Tensor& a, const Tensor& b) { return a + b; }
Tensor op_sub(const Tensor& a, const Tensor& b) { return a - b; }
Tensor op_mul(const Tensor& a, const Tensor& b) { return a * b; }
Tensor op_div(const Tensor& a, const Tensor& b) { return a / b; }
Tensor op_lt(const Tensor& a, const Tensor& b) { return a < b; }
Tensor op_le(const Tensor& a, const Tensor& b) { return a <= b; }
Tensor op_gt(const Tensor& a, const Tensor& b) { return a > b; }
Tensor op_ge(const Tensor& a, const Tensor& b) { return a >= b; }
Tensor op_eq(const Tensor& a, const Tensor& b) { return a == b; }
Tensor op_ne(const Tensor& a, const Tensor& b) { return a != b; }
Tensor op_pow(const Tensor& a, const Tensor& b) { return pow(a, b); }
Tensor op_mm(const Tensor& a, const Tensor& b) { return matmul(a, b); }

// to_operand, or a numpy array as the tensor torch.from_numpy would make of it (a copy), so
// that `t + array` and `t += array` stay loom tensors with autograd, as torch's operators do.
bool operand(nb::handle h, Operand* o) {
  if (to_operand(h, o)) return true;
  if (std::strcmp(Py_TYPE(h.ptr())->tp_name, "numpy.ndarray") != 0) return false;
  // a handle, not an object: nothing to release after the interpreter is gone
  static nb::handle copy =
      nb::object(nb::module_::import_("loom._loom").attr("_tensor_copy")).release();
  o->tensor = nb::cast<Tensor>(copy(h));
  return true;
}

// a <op> other, or other <op> a when `reflected`; NotImplemented for foreign types.
template <TT tt>
nb::object binary(const Tensor& a, nb::handle other, bool reflected) {
  Operand o;
  if (!operand(other, &o)) return nb::borrow(Py_NotImplemented);
  Tensor b = as_tensor(o, a);
  return nb::steal(new_tensor_object(reflected ? tt(b, a) : tt(a, b)));
}

// The fast path of + - * /: a Python number stays a host scalar input. A new reference.
template <TT tt, TS ts, ST st>
PyObject* arith(const Tensor& a, nb::handle other, bool reflected) {
  Operand o;
  if (!operand(other, &o)) Py_RETURN_NOTIMPLEMENTED;
  if (o.tensor.defined()) return new_tensor_object(reflected ? tt(o.tensor, a) : tt(a, o.tensor));
  return new_tensor_object(reflected ? st(o.scalar, a) : ts(a, o.scalar));
}

// + - * / as CPython number slots (nb_add, ...): Python calls the slot for a + b when a is a
// Tensor, and when only b is one (reflected). A slot costs no method lookup and no nanobind
// argument dispatch per call, which a def'd __add__ pays; Tensor.__add__ and __radd__ still
// exist (CPython's wrappers of the slot).
template <TT tt, TS ts, ST st>
PyObject* number_slot(PyObject* a, PyObject* b) noexcept {
  try {
    if (is_tensor(a)) return arith<tt, ts, st>(tensor_of(a), b, false);
    if (is_tensor(b)) return arith<tt, ts, st>(tensor_of(b), a, true);
    Py_RETURN_NOTIMPLEMENTED;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

Tensor sub_ts(const Tensor& a, Scalar s) { return a - s; }
Tensor sub_st(Scalar s, const Tensor& a) { return s - a; }

PyType_Slot tensor_slots[] = {
    {Py_nb_add, reinterpret_cast<void*>(number_slot<op_add, operator+, operator+ >)},
    {Py_nb_subtract, reinterpret_cast<void*>(number_slot<op_sub, sub_ts, sub_st>)},
    {Py_nb_multiply, reinterpret_cast<void*>(number_slot<op_mul, operator*, operator*>)},
    {Py_nb_true_divide, reinterpret_cast<void*>(number_slot<op_div, operator/, operator/ >)},
    {0, nullptr}};

// In place: PyTorch refuses a result of a higher category than the destination.
void assign(Tensor& dst, const Tensor& result, const char* op) {
  auto cat = [](DType d) { return d == bool_ ? 0 : is_integral(d) ? 1 : 2; };
  LOOM_CHECK_T(DTypeError, cat(result.dtype()) <= cat(dst.dtype()), "[", op, "] result type ",
               name(result.dtype()), " can't be cast to the destination's dtype ",
               name(dst.dtype()));
  dst.copy_(result);
}

template <TT tt>
nb::object inplace(nb::handle self, nb::handle other, const char* op) {
  Tensor& a = nb::cast<Tensor&>(self);
  Operand o;
  if (!operand(other, &o)) return nb::borrow(Py_NotImplemented);
  assign(a, tt(a, as_tensor(o, a)), op);
  return nb::borrow(self);
}

// An index tensor's negative entries counted from the back, as torch; entries below -n stay
// negative, so index_select's check names them as the user wrote them.
Tensor wrap_negative(const Tensor& idx, int64_t n) {
  return where(idx < Scalar(0), where(idx >= Scalar(-n), idx + Scalar(n), idx), idx);
}

// getitem's step for an index tensor at dim d of r: the entries it selects, in idx's shape.
Tensor index_by_tensor(const Tensor& r, int64_t d, const Tensor& idx) {
  Shape rs = r.shape();
  Tensor flat = index_select(r, d, wrap_negative(reshape(idx, {-1}), r.size(d)));
  std::vector<int64_t> shape;
  for (int64_t k = 0; k < d; ++k) shape.push_back(rs[k]);
  for (int64_t k = 0; k < idx.dim(); ++k) shape.push_back(idx.size(k));
  for (int64_t k = d + 1; k < r.dim(); ++k) shape.push_back(rs[k]);
  return reshape(flat, shape);
}

// Basic indexing: ints (negative too), slices with steps, None, ..., int lists, one int64
// index tensor; the key parsed by index_key.h, as assignments parse it.
Tensor getitem(const Tensor& x, nb::handle key) {
  Tensor r = x;
  int64_t d = 0;  // the dim of r the next item applies to
  for (const IndexItem& it : parse_index_key(x.shape(), key)) {
    switch (it.kind) {
      case IndexItem::Kind::NewAxis: r = unsqueeze(r, d++); break;
      case IndexItem::Kind::Int: r = select(r, d, it.index); break;
      case IndexItem::Kind::Range:
        if (!it.filled)
          r = it.len == 0 ? slice(r, d, 0, 0) : slice(r, d, it.start, it.stop, it.step);
        ++d;
        break;
      case IndexItem::Kind::Tensor:
        r = index_by_tensor(r, d, it.tensor);
        d += it.tensor.dim();
        break;
    }
  }
  return r;
}

std::string repr(const Tensor& t) {
  std::ostringstream os;
  PythonSite at;
  {
    nb::gil_scoped_release g;
    os << t;
  }
  return os.str();
}

nb::tuple shape_tuple(const Tensor& t) {
  const Shape& s = t.shape();
  PyObject* tup = PyTuple_New(s.rank());
  for (int64_t k = 0; k < s.rank(); ++k) PyTuple_SET_ITEM(tup, k, PyLong_FromLongLong(s[k]));
  return nb::steal<nb::tuple>(tup);
}

nb::object item(const Tensor& t) {
  LOOM_CHECK_T(ShapeError, t.numel() == 1, "[item] a Tensor with ", t.numel(),
               " elements cannot be converted to a Python number");
  PythonSite at;
  DType dt = t.dtype();
  if (dt == bool_) {
    bool v;
    {
      nb::gil_scoped_release g;
      v = t.item<bool>();
    }
    return nb::bool_(v);
  }
  if (is_integral(dt)) {
    int64_t v;
    {
      nb::gil_scoped_release g;
      v = t.item<int64_t>();
    }
    return nb::int_(v);
  }
  double v;
  {
    nb::gil_scoped_release g;
    v = t.item<double>();
  }
  return nb::float_(v);
}

// loom.dtype and promote_types.
void register_dtype(nb::module_& m) {
  nb::enum_<DType>(m, "dtype", "A tensor element type: loom.float32, loom.int64, ...")
      .value("bool_", DType::Bool)
      .value("int32", DType::Int32)
      .value("int64", DType::Int64)
      .value("bfloat16", DType::BFloat16)
      .value("float16", DType::Float16)
      .value("float32", DType::Float32)
      .value("float64", DType::Float64)
      .def("__repr__",
           [](DType d) {
             return std::string("loom.") + (d == bool_ ? "bool" : std::string(name(d)));
           })
      .def_prop_ro("itemsize", [](DType d) { return itemsize(d); })
      .def_prop_ro("is_floating_point", [](DType d) { return is_floating(d); });
  m.def("promote_types", &promote_types, nb::arg("type1"), nb::arg("type2"));
}

// Tensor's constructor, shape and autograd properties.
void register_tensor_properties(nb::class_<Tensor>& cls) {
  // Tensor(t): another handle on t's tensor (in-place ops are seen through both); this is what
  // lets Python subclass Tensor (loom.nn.Parameter calls it on a detached leaf).
  cls.def(nb::init<const Tensor&>(), nb::arg("data"))
      .def_prop_ro("dtype", &Tensor::dtype)
      .def("_shape", &shape_tuple)
      // The dtype as its enum's number: loom.torch's wrappers index a tuple with it (the Enum
      // object costs ~0.3 us more to make and look up).
      .def("_dtype_code", [](const Tensor& t) { return static_cast<int>(t.dtype()); })
      .def("dim", &Tensor::dim)
      .def_prop_ro("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("__len__",
           [](const Tensor& t) {
             if (t.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
             return t.size(0);
           })
      .def_prop_ro("is_pending", &Tensor::is_pending)
      .def_prop_ro("requires_grad", &Tensor::requires_grad)
      .def(
          "requires_grad_",
          [](nb::handle self, bool on) {
            nb::cast<Tensor&>(self).requires_grad_(on);
            return nb::borrow(self);
          },
          nb::arg("requires_grad") = true)
      .def_prop_rw(
          "grad",
          [](const Tensor& t) -> std::optional<Tensor> {
            Tensor g = t.grad();
            if (!g.defined()) return std::nullopt;
            return g;
          },
          [](Tensor& t, nb::handle g) {
            if (!g.is_none()) throw nb::type_error("grad: only None can be assigned (zero_grad)");
            t.reset_grad();
          },
          nb::arg("value").none())
      .def(
          "backward",
          [](const Tensor& t, std::optional<Tensor> gradient) {
            if (gradient)
              t.backward(*gradient);
            else
              t.backward();
          },
          nb::arg("gradient").none() = nb::none());
}

// Tensor's conversions to Python values, indexing and unary operators.
void register_tensor_methods(nb::class_<Tensor>& cls) {
  cls.def("detach", &Tensor::detach)
      .def("item", &item)
      .def("__repr__", &repr)
      .def("__bool__",
           [](const Tensor& t) {
             LOOM_CHECK_T(ShapeError, t.numel() == 1, "[bool] the truth value of a Tensor with ",
                          t.numel(), " elements is ambiguous");
             PythonSite at;
             nb::gil_scoped_release g;
             return t.item<double>() != 0;
           })
      .def("__float__", [](const Tensor& t) { return nb::float_(item(t)); })
      .def("__int__", [](const Tensor& t) { return nb::int_(item(t)); })
      .def("__index__",
           [](const Tensor& t) {
             LOOM_CHECK_T(DTypeError, is_integral(t.dtype()) && t.numel() == 1,
                          "[index] only integer tensors of a single element can be converted "
                          "to an index, got ",
                          name(t.dtype()), " with ", t.numel(), " elements");
             return nb::int_(item(t));
           })
      .def("__getitem__", &getitem, nb::arg("key").none())
      .def(
          "copy_",
          [](nb::handle self, const Tensor& src) {
            nb::cast<Tensor&>(self).copy_(src);
            return nb::borrow(self);
          },
          nb::arg("src"))
      .def("zero_",
           [](nb::handle self) {
             nb::cast<Tensor&>(self).zero_();
             return nb::borrow(self);
           })
      .def("__neg__", [](const Tensor& t) { return -t; })
      .def("__pos__", [](const Tensor& t) { return t; })
      .def("__abs__", [](const Tensor& t) { return abs(t); })
      .def("__invert__",
           [](const Tensor& t) {
             LOOM_CHECK_T(DTypeError, t.dtype() == bool_,
                          "[invert] operator ~ needs a bool tensor, got ", name(t.dtype()));
             return logical_not(t);
           })
      .def("__hash__", [](const Tensor& t) { return reinterpret_cast<intptr_t>(t.impl()); });
}

// Tensor's binary operators besides the number slots: in-place, reflected, comparisons.
void register_tensor_operators(nb::class_<Tensor>& cls) {
  // + - * / are the type's number slots (tensor_slots); their in-place forms are methods.
#define LOOM_INPLACE(py, fn, tt) \
  cls.def("__i" py "__", [](nb::handle a, nb::handle b) { return inplace<tt>(a, b, fn); })
  LOOM_INPLACE("add", "add_", op_add);
  LOOM_INPLACE("sub", "sub_", op_sub);
  LOOM_INPLACE("mul", "mul_", op_mul);
  LOOM_INPLACE("truediv", "div_", op_div);
#undef LOOM_INPLACE

#define LOOM_BINARY(py, fn, tt)                                                                 \
  cls.def("__" py "__", [](const Tensor& a, nb::handle b) { return binary<tt>(a, b, false); }); \
  cls.def("__r" py "__", [](const Tensor& a, nb::handle b) { return binary<tt>(a, b, true); }); \
  cls.def("__i" py "__", [](nb::handle a, nb::handle b) { return inplace<tt>(a, b, fn); })
  LOOM_BINARY("floordiv", "floor_divide_", floor_divide);
  LOOM_BINARY("mod", "remainder_", remainder);
  LOOM_BINARY("pow", "pow_", op_pow);
  LOOM_BINARY("matmul", "matmul_", op_mm);
  LOOM_BINARY("and", "logical_and_", logical_and);
  LOOM_BINARY("or", "logical_or_", logical_or);
#undef LOOM_BINARY

  // Comparisons: a reflected comparison swaps its sense (3 < t is t > 3).
#define LOOM_CMP(py, tt, rtt, op, rop)                         \
  cls.def("__" py "__", [](const Tensor& a, nb::handle b) {    \
    Operand o;                                                 \
    if (!operand(b, &o)) return nb::borrow(Py_NotImplemented); \
    if (o.tensor.defined()) return nb::cast(tt(a, o.tensor));  \
    return nb::steal(new_tensor_object(a op o.scalar));        \
  })
  LOOM_CMP("lt", op_lt, op_gt, <, >);
  LOOM_CMP("le", op_le, op_ge, <=, >=);
  LOOM_CMP("gt", op_gt, op_lt, >, <);
  LOOM_CMP("ge", op_ge, op_le, >=, <=);
  LOOM_CMP("eq", op_eq, op_eq, ==, ==);
  LOOM_CMP("ne", op_ne, op_ne, !=, !=);
#undef LOOM_CMP
}

}  // namespace

void register_tensor(nb::module_& m) {
  register_dtype(m);
  nb::class_<Tensor> cls(m, "Tensor", "A lazy tensor: ops record a graph, reading a value runs it.",
                         nb::type_slots(tensor_slots));
  tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  register_tensor_properties(cls);
  register_tensor_methods(cls);
  register_tensor_operators(cls);
}

}  // namespace loom::py
