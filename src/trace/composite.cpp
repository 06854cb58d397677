// Composite ops, written once from primitives (STYLE.md: a small primitive set, composites on
// top). They need no IR op, kernel or gradient rule of their own. Numbers fixed by an op's
// definition (gelu's 1/sqrt(2)) are constants; numbers a caller passes (dropout's p, clamp's
// bounds, layer_norm's eps) are host scalars, i.e. graph inputs that may change freely.
#include <cmath>

#include "loom/trace/ops.h"
#include "trace/ops_impl.h"

namespace loom {

namespace {
TensorType type_of(const Tensor& x) { return {x.dtype(), x.shape()}; }

// A 0-d constant of dtype dt.
Tensor lit(double v, DType dt) {
  detail::OpRecord rec;
  return rec.ctx.wrap(rec.ctx.constant(v, dt));
}
// x (op) c, or c (op) x, with c a constant of x's dtype; one recorded op.
Tensor cbin(ir::OpKind op, const Tensor& x, double c, bool c_first = false) {
  detail::OpRecord rec;
  ir::Value vx = rec.ctx.value_of(x), vc = rec.ctx.constant(c, x.dtype());
  return rec.ctx.wrap(c_first ? rec.b().binary(op, vc, vx) : rec.b().binary(op, vx, vc));
}
using ir::OpKind;
DType float_of(const Tensor& x) { return is_floating(x.dtype()) ? x.dtype() : DType::Float32; }
}  // namespace

// where(x <= 0, 0, x) rather than maximum(x, 0): the gradient at 0 is 0 and relu(nan) is nan
// with gradient 1, as torch (maximum splits a tie's gradient evenly).
Tensor relu(const Tensor& x) {
  LOOM_CHECK_T(DTypeError, x.dtype() != DType::Bool, "[relu] expected a numeric tensor, got ",
               type_of(x));
  detail::OpRecord rec;
  ir::Value vx = rec.ctx.value_of(x), zero = rec.ctx.constant(0, x.dtype());
  return rec.ctx.wrap(rec.b().where(rec.b().binary(OpKind::Le, vx, zero), zero, vx));
}
Tensor sigmoid(const Tensor& x) {
  DType dt = float_of(x);
  return cbin(OpKind::Div, cbin(OpKind::Add, exp(-to(x, dt)), 1), 1, true);
}
Tensor rsqrt(const Tensor& x) { return cbin(OpKind::Div, sqrt(x), 1, true); }
Tensor gelu(const Tensor& x) {  // x/2 * (1 + erf(x/sqrt(2)))
  DType dt = float_of(x);
  Tensor xf = to(x, dt);
  return cbin(OpKind::Mul, xf, 0.5) * cbin(OpKind::Add, erf(cbin(OpKind::Mul, xf, M_SQRT1_2)), 1);
}

// torch's clamp: min(max(x, lo), hi) (so hi wins when lo > hi, and nan stays nan), with
// gradient 1 where lo <= x <= hi (bounds included) and 0 elsewhere, nan included. The value
// outside [lo, hi] comes from branches that carry no gradient to x (x * 0 only passes nan on).
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  LOOM_CHECK_T(Error, lo || hi, "[clamp] expected at least one of min and max");
  // Integral bounds keep an integer tensor integral, as in torch.
  auto bound = [&](double v) {
    return is_floating(x.dtype()) || v != std::floor(v) ? Scalar(v)
                                                        : Scalar(static_cast<int64_t>(v));
  };
  DType dt = x.dtype();
  if (lo) dt = promote_types(dt, detail::result_type(x, bound(*lo)));
  if (hi) dt = promote_types(dt, detail::result_type(x, bound(*hi)));
  Tensor xv = to(x, dt);
  Tensor vlo = lo ? full({}, *lo, dt) : Tensor(), vhi = hi ? full({}, *hi, dt) : Tensor();
  Tensor keep = lo ? xv >= vlo : xv <= vhi;
  if (lo && hi) keep = where(keep, xv <= vhi, keep);  // keep && x <= hi
  Tensor out = cbin(OpKind::Mul, xv, 0);
  if (hi) out = where(xv > vhi, vhi, out);
  if (lo) out = where(xv < vlo, vlo, out);
  if (lo && hi) out = where(out > vhi, vhi, out);  // lo > hi: hi wins
  return where(keep, xv, out);
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()), "[mean] expected a floating-point tensor, got ",
               type_of(x), "; convert it with to() first");
  std::vector<int64_t> ds = detail::reduce_dims("mean", x, dims);
  int64_t n = 1;
  for (int64_t d : ds) n *= x.shape()[d];
  return cbin(OpKind::Div, sum(x, ds, keepdim), static_cast<double>(n));
}

namespace {
void check_floating(const char* op, const Tensor& x) {
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()), "[", op,
               "] expected a floating-point tensor, got ", type_of(x),
               " (torch refuses integer and bool inputs too); convert it with to() first");
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  check_floating("softmax", x);
  int64_t d = normalize_axis("softmax", dim, x.dim());
  Tensor xf = to(x, float_of(x));
  if (x.dim() == 0) return exp(xf - xf);
  if (x.shape()[d] == 0) return xf;  // empty along dim: nothing to normalize, as torch
  Tensor e = exp(xf - max(xf, {d}, true));
  return e / sum(e, {d}, true);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  check_floating("log_softmax", x);
  int64_t d = normalize_axis("log_softmax", dim, x.dim());
  Tensor xf = to(x, float_of(x));
  if (x.dim() == 0) return xf - xf;
  if (x.shape()[d] == 0) return xf;
  Tensor shifted = xf - max(xf, {d}, true);
  return shifted - log(sum(exp(shifted), {d}, true));
}

Tensor layer_norm(const Tensor& x, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool ok = k >= 1 && k <= x.dim();
  for (int64_t i = 0; ok && i < k; ++i) ok = x.shape()[x.dim() - k + i] == normalized_shape[i];
  LOOM_CHECK_T(ShapeError, ok, "[layer_norm] normalized_shape ", Shape(normalized_shape),
               " does not match the trailing dims of ", type_of(x));
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()),
               "[layer_norm] expected a floating-point input, got ", type_of(x));
  for (const Tensor* p : {&weight, &bias}) {
    LOOM_CHECK_T(ShapeError, !p->defined() || p->shape() == Shape(normalized_shape),
                 "[layer_norm] weight and bias must have shape ", Shape(normalized_shape), ", got ",
                 type_of(*p));
  }
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  Tensor centered = x - mean(x, dims, true);
  Tensor var = mean(centered * centered, dims, true);
  Tensor y = centered * rsqrt(var + Scalar(eps));
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::source_location loc) {
  LOOM_CHECK_T(ShapeError, weight.dim() == 2, "[embedding] weight must be 2-d [num, dim], got ",
               type_of(weight));
  LOOM_CHECK_T(DTypeError, is_integral(indices.dtype()),
               "[embedding] indices must be int32 or int64, got ", type_of(indices));
  std::vector<int64_t> out = indices.shape().vec();
  out.push_back(weight.shape()[1]);
  return reshape(index_select(weight, 0, reshape(indices, {-1}), loc), out);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  LOOM_CHECK_T(Error, p >= 0 && p <= 1, "[dropout] probability must be in [0, 1], got ", p);
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()),
               "[dropout] expected a floating-point input, got ", type_of(x));
  if (!training || p == 0) return x;
  if (p == 1) return cbin(OpKind::Mul, x, 0);
  Tensor keep = rand(x.shape(), x.dtype()) >= Scalar(p);
  return where(keep, x * Scalar(1.0 / (1.0 - p)), lit(0, x.dtype()));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     std::source_location loc) {
  LOOM_CHECK_T(ShapeError, logits.dim() == 1 || logits.dim() == 2,
               "[cross_entropy] logits must be [C] or [N, C], got ", type_of(logits));
  int64_t cdim = logits.dim() - 1;
  Tensor logp = log_softmax(logits, cdim);
  if (is_floating(target.dtype())) {  // class probabilities
    LOOM_CHECK_T(ShapeError, target.shape() == logits.shape(),
                 "[cross_entropy] probability target ", type_of(target), " must match logits ",
                 type_of(logits));
    LOOM_CHECK_T(DTypeError, ignore_index == -100, "[cross_entropy] ignore_index (", ignore_index,
                 ") is not supported for probability targets ", type_of(target));
    return -mean(sum(to(target, logp.dtype()) * logp, {cdim}));
  }
  LOOM_CHECK_T(
      DTypeError, is_integral(target.dtype()),
      "[cross_entropy] target must hold class indices (int) or probabilities (float), got ",
      type_of(target));
  bool ok = logits.dim() == 1 ? target.dim() == 0
                              : target.dim() == 1 && target.shape()[0] == logits.shape()[0];
  LOOM_CHECK_T(ShapeError, ok, "[cross_entropy] target ", type_of(target),
               " does not match logits ", type_of(logits),
               "; expected [N] class indices for [N, C]");
  // The mean over the targets that are not ignore_index (torch: nan when all are); ignored
  // rows read class 0 and are masked out, so their gradient is 0.
  Tensor valid = target != Scalar(ignore_index);
  Tensor safe = where(valid, target, lit(0, target.dtype()));
  Tensor picked = gather(logp, cdim, unsqueeze(safe, -1), loc);
  Tensor kept = where(unsqueeze(valid, -1), picked, lit(0, logp.dtype()));
  return -sum(kept) / to(sum(valid), logp.dtype());
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  LOOM_CHECK_T(ShapeError, input.shape() == target.shape(), "[mse_loss] input ", type_of(input),
               " and target ", type_of(target), " must have the same shape");
  Tensor d = input - target;
  return mean(d * d);
}

}  // namespace loom
