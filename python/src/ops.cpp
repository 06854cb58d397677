// The ops of API.md as functions of loom._loom. Those whose Python signature equals the C++ one
// are bound under their names; reductions and layout ops with torch's argument conventions
// (dim=None, keepdim=False, *shape) get raw forms (`_sum(x, dims, keepdim)`) that
// python/loom/_ops.py wraps.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace loom::py {
namespace {

using TT = Tensor (*)(const Tensor&, const Tensor&);

// input <op> other where either may be a Python number (at least one is a tensor).
template <TT tt>
Tensor binary_fn(nb::handle a, nb::handle b, const char* op) {
  Operand x, y;
  if (!to_operand(a, &x))
    throw nb::type_error(detail::str_cat("[", op,
                                         "] argument 'input' must be a Tensor or a "
                                         "number, got ",
                                         Py_TYPE(a.ptr())->tp_name)
                             .c_str());
  if (!to_operand(b, &y))
    throw nb::type_error(detail::str_cat("[", op,
                                         "] argument 'other' must be a Tensor or a "
                                         "number, got ",
                                         Py_TYPE(b.ptr())->tp_name)
                             .c_str());
  if (!x.tensor.defined() && !y.tensor.defined())
    throw nb::type_error(detail::str_cat("[", op, "] needs at least one Tensor argument").c_str());
  Tensor ta = x.tensor.defined() ? x.tensor : as_tensor(x, y.tensor);
  Tensor tb = y.tensor.defined() ? y.tensor : as_tensor(y, ta);
  return tt(ta, tb);
}

Tensor t_add(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor t_sub(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor t_mul(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor t_div(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor t_pow(const Tensor& a, const Tensor& b) { return pow(a, b); }
Tensor t_max(const Tensor& a, const Tensor& b) { return maximum(a, b); }
Tensor t_min(const Tensor& a, const Tensor& b) { return minimum(a, b); }
Tensor t_eq(const Tensor& a, const Tensor& b) { return a == b; }
Tensor t_ne(const Tensor& a, const Tensor& b) { return a != b; }
Tensor t_lt(const Tensor& a, const Tensor& b) { return a < b; }
Tensor t_le(const Tensor& a, const Tensor& b) { return a <= b; }
Tensor t_gt(const Tensor& a, const Tensor& b) { return a > b; }
Tensor t_ge(const Tensor& a, const Tensor& b) { return a >= b; }

// Unary and binary elementwise ops, where, clamp, to.
void register_elementwise(nb::module_& m) {
  using nb::arg;
#define LOOM_UNARY(name) m.def(#name, [](const Tensor& x) { return name(x); }, arg("input"))
  LOOM_UNARY(neg);
  LOOM_UNARY(abs);
  LOOM_UNARY(exp);
  LOOM_UNARY(log);
  LOOM_UNARY(sqrt);
  LOOM_UNARY(rsqrt);
  LOOM_UNARY(tanh);
  LOOM_UNARY(sigmoid);
  LOOM_UNARY(relu);
  LOOM_UNARY(sin);
  LOOM_UNARY(cos);
  LOOM_UNARY(erf);
  LOOM_UNARY(logical_not);
  LOOM_UNARY(floor);
#undef LOOM_UNARY
  m.def("_gelu", [](const Tensor& x) { return gelu(x); }, arg("input"));

#define LOOM_BINARY(py, fn)                                                                 \
  m.def(                                                                                    \
      py, [](nb::handle a, nb::handle b) { return binary_fn<fn>(a, b, py); }, arg("input"), \
      arg("other"))
  LOOM_BINARY("add", t_add);
  LOOM_BINARY("sub", t_sub);
  LOOM_BINARY("mul", t_mul);
  LOOM_BINARY("div", t_div);
  LOOM_BINARY("true_divide", t_div);
  LOOM_BINARY("pow", t_pow);
  LOOM_BINARY("maximum", t_max);
  LOOM_BINARY("minimum", t_min);
  LOOM_BINARY("floor_divide", floor_divide);
  LOOM_BINARY("remainder", remainder);
  LOOM_BINARY("fmod", fmod);
  LOOM_BINARY("logical_and", logical_and);
  LOOM_BINARY("logical_or", logical_or);
  LOOM_BINARY("eq", t_eq);
  LOOM_BINARY("ne", t_ne);
  LOOM_BINARY("lt", t_lt);
  LOOM_BINARY("le", t_le);
  LOOM_BINARY("gt", t_gt);
  LOOM_BINARY("ge", t_ge);
#undef LOOM_BINARY

  m.def(
      "where",
      [](const Tensor& cond, nb::handle a, nb::handle b) {
        Operand x, y;
        if (!to_operand(a, &x))
          throw nb::type_error("[where] argument 'input' must be a Tensor or a number");
        if (!to_operand(b, &y))
          throw nb::type_error("[where] argument 'other' must be a Tensor or a number");
        if (!x.tensor.defined() && !y.tensor.defined()) {
          DType dt = result_type(result_type(bool_, x.scalar), y.scalar);
          return where(cond, scalar_tensor(x.scalar, dt), scalar_tensor(y.scalar, dt));
        }
        Tensor ta = x.tensor.defined() ? x.tensor : as_tensor(x, y.tensor);
        Tensor tb = y.tensor.defined() ? y.tensor : as_tensor(y, ta);
        return where(cond, ta, tb);
      },
      arg("condition"), arg("input"), arg("other"));
  m.def("clamp", &clamp, arg("input"), arg("min").none() = nb::none(),
        arg("max").none() = nb::none());
  m.def("to", &to, arg("input"), arg("dtype"));
}

// Reductions (raw forms: python/loom/_ops.py wraps them), softmaxes and matmul.
void register_reductions(nb::module_& m) {
  using nb::arg;
  m.def(
      "_sum",
      [](const Tensor& x, nb::handle d, bool k) {
        return d.is_none() ? (k ? sum(x, {}, true) : sum(x)) : sum(x, dims_of(d), k);
      },
      arg("input"), arg("dim").none(), arg("keepdim"));
  m.def(
      "_mean",
      [](const Tensor& x, nb::handle d, bool k) {
        return d.is_none() ? (k ? mean(x, {}, true) : mean(x)) : mean(x, dims_of(d), k);
      },
      arg("input"), arg("dim").none(), arg("keepdim"));
  m.def(
      "_amax",
      [](const Tensor& x, nb::handle d, bool k) {
        return d.is_none() ? (k ? max(x, {}, true) : max(x)) : max(x, dims_of(d), k);
      },
      arg("input"), arg("dim").none(), arg("keepdim"));
  m.def(
      "_amin",
      [](const Tensor& x, nb::handle d, bool k) {
        return d.is_none() ? (k ? min(x, {}, true) : min(x)) : min(x, dims_of(d), k);
      },
      arg("input"), arg("dim").none(), arg("keepdim"));
  m.def(
      "_argmax",
      [](const Tensor& x, std::optional<int64_t> d, bool k) {
        return d ? argmax(x, *d, k) : argmax(x);
      },
      arg("input"), arg("dim").none(), arg("keepdim"));
  m.def("_argsort", &argsort, arg("input"), arg("dim"), arg("descending"));
  m.def("softmax", &softmax, arg("input"), arg("dim"));
  m.def("log_softmax", &log_softmax, arg("input"), arg("dim"));
  m.def("matmul", &matmul, arg("input"), arg("other"));
}

// Layout ops, joins and basic slicing.
void register_shape(nb::module_& m) {
  using nb::arg;
  m.def("_reshape", &reshape);
  m.def("_view", &view);
  m.def("_permute", &permute);
  m.def("_expand", &expand);
  m.def("transpose", &transpose, arg("input"), arg("dim0"), arg("dim1"));
  m.def("contiguous", &contiguous, arg("input"));
  m.def("unsqueeze", &unsqueeze, arg("input"), arg("dim"));
  m.def(
      "_squeeze",
      [](const Tensor& x, std::optional<int64_t> d) { return d ? squeeze(x, *d) : squeeze(x); },
      arg("input"), arg("dim").none());
  m.def("flatten", &flatten, arg("input"), arg("start_dim") = 0, arg("end_dim") = -1);
  m.def("cat", &cat, arg("tensors"), arg("dim") = 0);
  m.def("stack", &stack, arg("tensors"), arg("dim") = 0);
  m.def("slice", &slice, arg("input"), arg("dim"), arg("start"), arg("end"), arg("step") = 1);
  m.def("select", &select, arg("input"), arg("dim"), arg("index"));
}

// Ops that take an index tensor.
void register_indexing(nb::module_& m) {
  using nb::arg;
  m.def(
      "index_select",
      [](const Tensor& x, int64_t dim, const Tensor& index) { return index_select(x, dim, index); },
      arg("input"), arg("dim"), arg("index"));
  m.def(
      "gather",
      [](const Tensor& x, int64_t dim, const Tensor& index) { return gather(x, dim, index); },
      arg("input"), arg("dim"), arg("index"));
  m.def(
      "index_add",
      [](const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
        return index_add(x, dim, index, source);
      },
      arg("input"), arg("dim"), arg("index"), arg("source"));
}

// Layers' functional forms and losses.
void register_nn(nb::module_& m) {
  using nb::arg;
  m.def(
      "layer_norm",
      [](const Tensor& x, std::vector<int64_t> shape, std::optional<Tensor> w,
         std::optional<Tensor> b, double eps) {
        return layer_norm(x, std::move(shape), w ? *w : Tensor(), b ? *b : Tensor(), eps);
      },
      arg("input"), arg("normalized_shape"), arg("weight").none() = nb::none(),
      arg("bias").none() = nb::none(), arg("eps") = 1e-5);
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> mask,
         double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
        return scaled_dot_product_attention(
            q, k, v, {mask.value_or(Tensor()), dropout_p, is_causal, scale, enable_gqa});
      },
      arg("query"), arg("key"), arg("value"), arg("attn_mask").none() = nb::none(),
      arg("dropout_p") = 0.0, arg("is_causal") = false, arg("scale").none() = nb::none(),
      arg("enable_gqa") = false);
  m.def("_packed_qkv_attention", &packed_qkv_attention, arg("qkv"), arg("heads"),
        arg("is_causal") = true);
  m.def(
      "embedding",
      [](const Tensor& input, const Tensor& weight) { return embedding(input, weight); },
      arg("input"), arg("weight"));
  m.def("dropout", &dropout, arg("input"), arg("p") = 0.5, arg("training") = true);
  m.def(
      "cross_entropy",
      [](const Tensor& input, const Tensor& target, int64_t ignore_index) {
        return cross_entropy(input, target, ignore_index);
      },
      arg("input"), arg("target"), arg("ignore_index") = -100);
  m.def("mse_loss", &mse_loss, arg("input"), arg("target"));
}

// factories (python/loom/_creation.py gives them torch's signatures)
void register_factories(nb::module_& m) {
  using nb::arg;
  using Dims = const std::vector<int64_t>&;
  m.def("_zeros", [](Dims s, DType dt) { return zeros(s, dt); });
  m.def("_ones", [](Dims s, DType dt) { return ones(s, dt); });
  m.def("_full", [](Dims s, double v, DType dt) { return full(s, v, dt); });
  m.def("_arange", [](double a, double b, DType dt) { return arange(a, b, dt); });
  m.def("_randn", [](Dims s, DType dt) { return randn(s, dt); });
  m.def("_rand", [](Dims s, DType dt) { return rand(s, dt); });
  m.def("manual_seed", &manual_seed, arg("seed"));
}

}  // namespace

void register_ops(nb::module_& m) {
  register_elementwise(m);
  register_reductions(m);
  register_shape(m);
  register_indexing(m);
  register_nn(m);
  register_factories(m);
}

}  // namespace loom::py
