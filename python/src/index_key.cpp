// The one parser of t[key] (index_key.h).
#include "index_key.h"

#include <nanobind/stl/vector.h>

namespace loom::py {

namespace {

int64_t norm_index(int64_t i, int64_t n, int64_t dim) {
  if (i < -n || i >= n)
    throw nb::index_error(
        detail::str_cat("index ", i, " is out of bounds for dimension ", dim, " with size ", n)
            .c_str());
  return i < 0 ? i + n : i;
}

// The key's items, lists turned into int64 index tensors (t[:, [-1]]).
std::vector<nb::object> key_items(nb::handle key) {
  std::vector<nb::object> items;
  auto add = [&](nb::handle h) {
    if (!PyList_Check(h.ptr())) {
      items.push_back(nb::borrow(h));
      return;
    }
    std::vector<int64_t> v;
    for (nb::handle e : h) {
      if (!PyLong_Check(e.ptr()) || PyBool_Check(e.ptr()))
        throw nb::type_error(
            detail::str_cat("[index] a list index must hold ints, got an element of type ",
                            Py_TYPE(e.ptr())->tp_name)
                .c_str());
      v.push_back(nb::cast<int64_t>(e));
    }
    int64_t n = static_cast<int64_t>(v.size());
    items.push_back(nb::steal(new_tensor_object(tensor<int64_t>(std::move(v), Shape({n})))));
  };
  if (PyTuple_Check(key.ptr())) {
    for (nb::handle h : key) add(h);
  } else {
    add(key);
  }
  return items;
}

// The dims the key's items index (each but None and ...), after checking how many there are.
int64_t consumed_dims(const std::vector<nb::object>& items, int64_t rank) {
  int64_t consumed = 0, ellipses = 0, tensors = 0;
  for (const nb::object& h : items) {
    if (h.is_none()) continue;
    if (is_tensor(h.ptr())) ++tensors;
    if (h.ptr() == Py_Ellipsis) {
      ++ellipses;
      continue;
    }
    ++consumed;
  }
  if (ellipses > 1) throw nb::index_error("an index can only have a single ellipsis ('...')");
  if (tensors > 1) {
    // torch broadcasts several index tensors together (advanced indexing); applying them one
    // dim at a time would silently give another result.
    PyErr_SetString(PyExc_NotImplementedError,
                    "[index] a key with several index tensors (advanced indexing) is not "
                    "supported: index one dim at a time, e.g. t[i][:, j]");
    throw nb::python_error();
  }
  if (consumed > rank)
    throw nb::index_error(
        detail::str_cat("too many indices for tensor of dimension ", rank).c_str());
  return consumed;
}

IndexItem whole(int64_t n) {
  IndexItem it{IndexItem::Kind::Range};
  it.stop = it.len = n;
  it.whole = it.filled = true;
  return it;
}

IndexItem range_item(nb::handle h, int64_t n) {
  Py_ssize_t start, stop, step;
  if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
  if (step <= 0) throw nb::value_error("step must be greater than zero");
  IndexItem it{IndexItem::Kind::Range};
  it.len = PySlice_AdjustIndices(n, &start, &stop, step);
  it.start = start, it.stop = stop, it.step = step;
  it.whole = start == 0 && step == 1 && it.len == n;
  return it;
}

IndexItem tensor_item(nb::handle h) {
  IndexItem it{IndexItem::Kind::Tensor};
  it.tensor = tensor_of(h.ptr());
  LOOM_CHECK_T(DTypeError, is_integral(it.tensor.dtype()),
               "[index] tensors used as indices must be int64 or int32, got ",
               name(it.tensor.dtype()), " (a bool mask is supported alone, in t[mask] = v)");
  return it;
}

}  // namespace

std::vector<IndexItem> parse_index_key(const Shape& shape, nb::handle key) {
  const std::vector<nb::object> items = key_items(key);
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t consumed = consumed_dims(items, rank);
  std::vector<IndexItem> out;
  int64_t d = 0;    // the dim of the tensor the next item indexes
  int64_t pos = 0;  // the item's dim as torch's errors count it (each item one, ... its span)
  for (const nb::object& h : items) {
    if (h.is_none()) {
      out.push_back({IndexItem::Kind::NewAxis});
    } else if (h.ptr() == Py_Ellipsis) {
      for (int64_t k = 0; k < rank - consumed; ++k) out.push_back(whole(shape[d++]));
      pos += rank - consumed - 1;
    } else if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
      IndexItem it{IndexItem::Kind::Int};
      it.index = norm_index(nb::cast<int64_t>(h), shape[d++], pos);
      out.push_back(it);
    } else if (PySlice_Check(h.ptr())) {
      out.push_back(range_item(h, shape[d++]));
    } else if (is_tensor(h.ptr())) {
      out.push_back(tensor_item(h));
      ++d;
    } else {
      throw nb::type_error(
          detail::str_cat("[index] only integers, slices (`:`), ellipsis (`...`), None and "
                          "int64 tensors are valid indices, got ",
                          Py_TYPE(h.ptr())->tp_name)
              .c_str());
    }
    ++pos;
  }
  while (d < rank) out.push_back(whole(shape[d++]));
  return out;
}

void register_index_key(nb::module_& m) {
  // The parsed key as tuples, for _setitem.py: ("none",), ("int", i), ("range", range),
  // ("tensor", t); one per dim of `shape` plus one per None.
  m.def(
      "_index_key",
      [](std::vector<int64_t> shape, nb::handle key) {
        nb::list out;
        nb::object range = nb::module_::import_("builtins").attr("range");
        for (IndexItem& it : parse_index_key(Shape(shape), key)) {
          switch (it.kind) {
            case IndexItem::Kind::NewAxis: out.append(nb::make_tuple("none")); break;
            case IndexItem::Kind::Int: out.append(nb::make_tuple("int", it.index)); break;
            case IndexItem::Kind::Range:
              out.append(nb::make_tuple("range", range(it.start, it.stop, it.step)));
              break;
            case IndexItem::Kind::Tensor: out.append(nb::make_tuple("tensor", it.tensor)); break;
          }
        }
        return out;
      },
      nb::arg("shape"), nb::arg("key").none());
}

}  // namespace loom::py
