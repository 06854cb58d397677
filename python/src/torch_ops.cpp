// torch's conveniences (loom/trace/torch_ops.h) as functions of loom._loom, and the switches
// behind loom.no_grad / enable_grad / set_grad_enabled. python/loom/_torch_ops.py gives them
// torch's argument forms and installs the Tensor methods.
#include "loom/trace/torch_ops.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace loom::py {

void register_torch_ops(nb::module_& m) {
  using nb::arg;
  m.def(
      "_gelu_approx",
      [](const Tensor& x, const std::string& approximate) { return gelu(x, approximate); },
      arg("input"), arg("approximate"));
  m.def("tril", &tril, arg("input"), arg("diagonal") = 0);
  m.def("triu", &triu, arg("input"), arg("diagonal") = 0);
  m.def(
      "_masked_fill",
      [](const Tensor& x, const Tensor& mask, nb::handle value) {
        if (nb::isinstance<Tensor>(value)) return masked_fill(x, mask, nb::cast<Tensor>(value));
        Operand o;
        if (!to_operand(value, &o))
          throw nb::type_error(detail::str_cat("masked_fill(): argument 'value' must be a number "
                                               "or a 0-d Tensor, got ",
                                               Py_TYPE(value.ptr())->tp_name)
                                   .c_str());
        return masked_fill(x, mask, o.scalar);
      },
      arg("input"), arg("mask"), arg("value"));
  m.def(
      "_split_size", [](const Tensor& x, int64_t size, int64_t dim) { return split(x, size, dim); },
      arg("input"), arg("split_size"), arg("dim"));
  m.def(
      "_split_sizes",
      [](const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
        return split(x, sizes, dim);
      },
      arg("input"), arg("split_sizes"), arg("dim"));
  m.def("_chunk", &chunk, arg("input"), arg("chunks"), arg("dim"));
  m.def("_cumsum", &cumsum, arg("input"), arg("dim"));
  m.def("_topk", &topk, arg("input"), arg("k"), arg("dim"), arg("largest"), arg("sorted"));
  m.def("_multinomial", &multinomial, arg("input"), arg("num_samples"), arg("replacement"));
  m.def(
      "_fill_",
      [](nb::handle self, nb::handle value) {
        Tensor& t = nb::cast<Tensor&>(self);
        if (nb::isinstance<Tensor>(value)) {
          fill_(t, nb::cast<Tensor>(value));
          return nb::borrow(self);
        }
        Operand o;
        if (!to_operand(value, &o))
          throw nb::type_error(detail::str_cat("fill_(): argument 'value' must be a number, got ",
                                               Py_TYPE(value.ptr())->tp_name)
                                   .c_str());
        fill_(t, o.scalar);
        return nb::borrow(self);
      },
      arg("self"), arg("value"));
  m.def(
      "_zero_",
      [](nb::handle self) {
        zero_(nb::cast<Tensor&>(self));
        return nb::borrow(self);
      },
      arg("self"));
  m.def("_is_leaf", &is_leaf, arg("input"));
  m.def("_set_grad_enabled", &set_grad_enabled, arg("mode"));
}

}  // namespace loom::py
