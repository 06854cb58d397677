// torch's conveniences (loom/trace/torch_ops.h) as functions of loom._loom, and the switches
// behind loom.no_grad / enable_grad / set_grad_enabled. python/loom/_torch_ops.py gives them
// torch's argument forms and installs the Tensor methods.
#include "loom/trace/torch_ops.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "loom/trace/update_rules.h"

namespace loom::py {
namespace {

// The optimizers' update rules (loom/trace/update_rules.h); loom.optim keeps the groups and
// the state around them. Tensors not used by the options may be None.
void register_update_rules(nb::module_& m) {
  using nb::arg;
  m.def(
      "_sgd_update",
      [](Tensor& p, const Tensor& g, std::optional<Tensor> buf, std::optional<Tensor> steps,
         const Tensor& lr, double momentum, double dampening, double weight_decay, bool nesterov,
         bool maximize) {
        Tensor b = buf.value_or(Tensor()), s = steps.value_or(Tensor());
        sgd_update(p, g, b, s, lr, {momentum, dampening, weight_decay, nesterov, maximize});
      },
      arg("p"), arg("grad"), arg("buf").none(), arg("steps").none(), arg("lr"), arg("momentum"),
      arg("dampening"), arg("weight_decay"), arg("nesterov"), arg("maximize"));
  m.def(
      "_adamw_update",
      [](Tensor& p, const Tensor& g, Tensor& m1, Tensor& v, std::optional<Tensor> vmax,
         Tensor& step, const Tensor& lr, double beta1, double beta2, double eps,
         double weight_decay, bool amsgrad, bool maximize) {
        Tensor vm = vmax.value_or(Tensor());
        adamw_update(p, g, m1, v, vm, step, lr,
                     {beta1, beta2, eps, weight_decay, amsgrad, maximize});
      },
      arg("p"), arg("grad"), arg("exp_avg"), arg("exp_avg_sq"), arg("max_exp_avg_sq").none(),
      arg("step"), arg("lr"), arg("beta1"), arg("beta2"), arg("eps"), arg("weight_decay"),
      arg("amsgrad"), arg("maximize"));
}

// gelu's approximation, triangles, masked_fill, splits, cumsum, topk, multinomial.
void register_conveniences(nb::module_& m) {
  using nb::arg;
  m.def(
      "_gelu_approx",
      [](const Tensor& x, const std::string& approximate) { return gelu(x, approximate); },
      arg("input"), arg("approximate"));
  m.def(
      "gelu_backward",
      [](const Tensor& grad, const Tensor& x, const std::string& approximate) {
        return gelu_backward(grad, x, approximate);
      },
      arg("grad_output"), arg("input"), arg("approximate") = "none",
      "torch's aten.gelu_backward: grad_output * gelu'(input), sharing gelu(input)'s nodes.");
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
  m.def("_sort", &loom::sort, arg("input"), arg("dim"), arg("descending"));
  m.def("_topk", &topk, arg("input"), arg("k"), arg("dim"), arg("largest"), arg("sorted"));
  m.def("_multinomial", &multinomial, arg("input"), arg("num_samples"), arg("replacement"));
}

// In-place fills, is_leaf and the grad-mode switch.
void register_inplace_and_grad(nb::module_& m) {
  using nb::arg;
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

}  // namespace

void register_torch_ops(nb::module_& m) {
  register_update_rules(m);
  register_conveniences(m);
  register_inplace_and_grad(m);
}

}  // namespace loom::py
