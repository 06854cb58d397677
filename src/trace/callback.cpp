// pure_callback: a pure_callback node over the arguments, its results declared; with a vjp, a
// custom_vjp whose backward is a second callback.
#include "loom/trace/callback.h"

#include "loom/trace/control_flow.h"
#include "trace/context.h"
#include "trace/ops_impl.h"

namespace loom {

namespace {

std::vector<Tensor> call(const HostCallback& fn, const std::vector<TensorType>& types,
                         const std::vector<Tensor>& args, const CallSite& loc) {
  LOOM_CHECK_T(ShapeError, !types.empty(), "[pure_callback] the callback '", fn.name(),
               "' declares no results; a callback returns at least one array");
  ir::Attrs a;
  a.i = fn.id();
  for (const TensorType& t : types) {
    check_shape("pure_callback", t.shape);
    a.ints.push_back(static_cast<int64_t>(t.dtype));
    a.ints.push_back(static_cast<int64_t>(t.shape.size()));
    for (int64_t d : t.shape) a.ints.push_back(d);
  }
  detail::OpRecord rec;
  std::vector<ir::Value> operands;
  operands.reserve(args.size());
  for (const Tensor& x : args) {
    detail::type_of(x, "pure_callback");
    operands.push_back(rec.ctx.value_of(x));
  }
  std::vector<ir::Value> r = rec.b().make_region(ir::OpKind::PureCallback, operands, a, {});
  rec.ctx.note_site(r[0], loc);
  std::vector<Tensor> out;
  out.reserve(r.size());
  for (ir::Value v : r) out.push_back(rec.ctx.wrap(v));
  return out;
}

}  // namespace

HostCallback::HostCallback(std::string name, HostFn fn) : id_(-1), name_(std::move(name)) {
  id_ = detail::register_host_callback(name_, std::move(fn));
}

std::vector<Tensor> pure_callback(const HostCallback& fn, std::vector<TensorType> result_types,
                                  const std::vector<Tensor>& args, const CallbackOptions& opts,
                                  CallSite loc) {
  if (!opts.vjp) return call(fn, result_types, args, loc);
  std::vector<TensorType> arg_types;
  for (const Tensor& x : args) arg_types.push_back(detail::type_of(x, "pure_callback"));
  const HostCallback vjp = *opts.vjp;
  auto primal = [fn, result_types, loc](const std::vector<Tensor>& a) {
    return call(fn, result_types, a, loc);
  };
  auto fwd = [fn, result_types, loc](const std::vector<Tensor>& a) {
    std::vector<Tensor> out = call(fn, result_types, a, loc), res = a;
    res.insert(res.end(), out.begin(), out.end());
    return std::pair{out, res};
  };
  auto bwd = [vjp, arg_types, loc](const std::vector<Tensor>& res,
                                   const std::vector<Tensor>& grads) {
    std::vector<Tensor> in = res;
    in.insert(in.end(), grads.begin(), grads.end());
    return call(vjp, arg_types, in, loc);
  };
  return CustomVjp(primal, fwd, bwd, loc)(args);
}

}  // namespace loom
