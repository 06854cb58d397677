// torch's conveniences (loom/trace/torch_ops.h), composed from loom's ops: masks come from
// iota and comparisons, running sums from triangular products, top-k from masked argmax.
#include "loom/trace/torch_ops.h"

#include <cmath>
#include <limits>

#include "loom/trace/autograd.h"
#include "trace/ops_impl.h"

namespace loom {

namespace {
using ir::OpKind;
TensorType type_of(const Tensor& x) { return {x.dtype(), x.shape()}; }

// x (op) c with c a constant of x's dtype: numbers fixed by an op's definition.
Tensor cbin(OpKind op, const Tensor& x, double c) {
  detail::OpRecord rec;
  ir::Value vx = rec.ctx.value_of(x), vc = rec.ctx.constant(c, x.dtype());
  return rec.ctx.wrap(rec.b().binary(op, vx, vc));
}
// A 0-d constant.
Tensor lit(double v, DType dt) {
  detail::OpRecord rec;
  return rec.ctx.wrap(rec.ctx.constant(v, dt));
}
// The index along `axis` of every element of a tensor of shape s (int64).
Tensor iota(const Shape& s, int64_t axis) {
  detail::OpRecord rec;
  return rec.ctx.wrap(rec.b().iota(TensorType{DType::Int64, s}, axis));
}
Tensor both(const Tensor& a, const Tensor& b) { return where(a, b, a); }    // a && b
Tensor either(const Tensor& a, const Tensor& b) { return where(a, a, b); }  // a || b
// True where any element along d is true (keepdim).
Tensor any_along(const Tensor& m, int64_t d) {
  return max(to(m, DType::Int32), {d}, true) > Scalar(0);
}

// Keeps x where `keep(j - i)` over the last two dims, else 0.
Tensor triangle(const char* op, const Tensor& x, int64_t diagonal, bool lower) {
  LOOM_CHECK_T(ShapeError, x.dim() >= 2, "[", op, "] expected a tensor of 2 or more dims, got ",
               type_of(x));
  Shape s({x.size(-2), x.size(-1)});
  Tensor offset = iota(s, 1) - iota(s, 0);  // j - i
  Tensor keep = lower ? offset <= Scalar(diagonal) : offset >= Scalar(diagonal);
  return where(keep, x, lit(0, x.dtype()));
}
}  // namespace

namespace {
constexpr double kGeluC = 0.044715;
constexpr double kGeluK = 0.79788456080286535588;  // sqrt(2 / pi)
// tanh(sqrt(2/pi) (x + 0.044715 x^3)): gelu's tanh form and its gradient build it alike, so
// the two share its nodes in one graph.
Tensor gelu_tanh(const Tensor& x) {
  return tanh(cbin(OpKind::Mul, x + cbin(OpKind::Mul, x * x * x, kGeluC), kGeluK));
}
}  // namespace

Tensor gelu(const Tensor& x, std::string_view approximate) {
  if (approximate == "none") return gelu(x);
  LOOM_CHECK_T(Error, approximate == "tanh", "[gelu] approximate must be 'none' or 'tanh', got '",
               approximate, "'");
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()), "[gelu] expected a floating-point tensor, got ",
               type_of(x));
  return cbin(OpKind::Mul, x, 0.5) * cbin(OpKind::Add, gelu_tanh(x), 1);
}

Tensor gelu_backward(const Tensor& grad, const Tensor& x, std::string_view approximate) {
  LOOM_CHECK_T(Error, approximate == "none" || approximate == "tanh",
               "[gelu_backward] approximate must be 'none' or 'tanh', got '", approximate, "'");
  LOOM_CHECK_T(DTypeError, is_floating(x.dtype()) && grad.dtype() == x.dtype(),
               "[gelu_backward] expected grad and x of one floating dtype, got ", type_of(grad),
               " and ", type_of(x));
  Tensor half_x = cbin(OpKind::Mul, x, 0.5);
  if (approximate == "none") {  // d/dx x/2 (1 + erf(u)), u = x/sqrt(2), as gelu(x) builds them
    Tensor u = cbin(OpKind::Mul, x, M_SQRT1_2);
    Tensor cdf = cbin(OpKind::Add, erf(u), 1);
    Tensor pdf = cbin(OpKind::Mul, exp(-(u * u)), M_2_SQRTPI * M_SQRT1_2);  // sqrt(2/pi) e^-u^2
    return grad * (cbin(OpKind::Mul, cdf, 0.5) + half_x * pdf);
  }
  Tensor t = gelu_tanh(x);
  Tensor one_t = cbin(OpKind::Add, t, 1);
  Tensor slope =
      cbin(OpKind::Mul, cbin(OpKind::Add, cbin(OpKind::Mul, x * x, 3 * kGeluC), 1), kGeluK);
  Tensor sech2 = lit(1, x.dtype()) - t * t;
  return grad * (cbin(OpKind::Mul, one_t, 0.5) + half_x * sech2 * slope);
}

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle("tril", x, diagonal, true); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle("triu", x, diagonal, false); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value) {
  LOOM_CHECK_T(DTypeError, mask.dtype() == DType::Bool,
               "[masked_fill] only supports boolean masks, but got mask ", type_of(mask));
  LOOM_CHECK_T(ShapeError, value.dim() == 0,
               "[masked_fill] only supports a 0-dimensional value tensor, but got ",
               type_of(value));
  return where(mask, to(value, x.dtype()), x);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  double v = value.is_int ? static_cast<double>(value.ivalue) : value.value;
  return masked_fill(x, mask, full({}, v, x.dtype()));
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  LOOM_CHECK_T(ShapeError, x.dim() > 0, "[split] expected a tensor of 1 or more dims, got ",
               type_of(x));
  int64_t d = normalize_axis("split", dim, x.dim()), total = 0;
  for (int64_t s : sizes) {
    LOOM_CHECK_T(ShapeError, s >= 0, "[split] split_sizes must be non-negative, got ",
                 Shape(sizes));
    total += s;
  }
  LOOM_CHECK_T(ShapeError, total == x.size(d), "[split] split_with_sizes expects split_sizes to ",
               "sum exactly to ", x.size(d), " (input tensor's size at dimension ", d,
               "), but got split_sizes=", Shape(sizes));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, d, at, at + s));
    at += s;
  }
  return out;
}
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  LOOM_CHECK_T(ShapeError, x.dim() > 0, "[split] expected a tensor of 1 or more dims, got ",
               type_of(x));
  int64_t d = normalize_axis("split", dim, x.dim()), n = x.size(d);
  LOOM_CHECK_T(ShapeError, split_size > 0 || (split_size == 0 && n == 0),
               "[split] split_size can only be 0 if dimension size is 0, but got split_size ",
               split_size, " for ", type_of(x));
  if (n == 0) return {x};
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  return split(x, sizes, d);
}
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  LOOM_CHECK_T(ShapeError, chunks > 0,
               "[chunk] expects `chunks` to be greater than 0, got: ", chunks);
  LOOM_CHECK_T(ShapeError, x.dim() > 0, "[chunk] expected a tensor of 1 or more dims, got ",
               type_of(x));
  int64_t d = normalize_axis("chunk", dim, x.dim()), n = x.size(d);
  if (n == 0) return std::vector<Tensor>(chunks, x);  // torch gives `chunks` empty pieces
  return split(x, (n + chunks - 1) / chunks, d);
}

namespace {
// The running sums along the last dim (inclusive, or of the elements before each). Up to
// kSmall elements: one product with a triangular mask; past it, blocks of about sqrt(n): the
// sums within each block plus the exclusive running sum of the block totals.
Tensor scan_last(const Tensor& x, bool inclusive) {
  constexpr int64_t kSmall = 128;
  int64_t n = x.size(-1);
  int64_t last = x.dim() - 1;
  if (n == 0) return x;
  if (n <= kSmall) {
    Shape s({n, n});
    Tensor j = iota(s, 0), i = iota(s, 1);
    return matmul(x, to(inclusive ? j <= i : j < i, x.dtype()));  // m[j][i] = j <= i (j < i)
  }
  int64_t b = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  int64_t blocks = (n + b - 1) / b;
  std::vector<int64_t> lead = x.shape().vec();
  lead.pop_back();
  Tensor padded = x;
  if (blocks * b > n) {
    std::vector<int64_t> pad = lead;
    pad.push_back(blocks * b - n);
    padded = cat({x, zeros(Shape(pad), x.dtype())}, last);
  }
  std::vector<int64_t> bs = lead;
  bs.push_back(blocks);
  bs.push_back(b);
  Tensor xr = reshape(padded, bs);
  Tensor within = scan_last(xr, inclusive);
  Tensor before = scan_last(sum(xr, {last + 1}), false);  // the totals of the earlier blocks
  std::vector<int64_t> flat = lead;
  flat.push_back(blocks * b);
  return slice(reshape(within + unsqueeze(before, last + 1), flat), last, 0, n);
}
}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  DType out = is_floating(x.dtype()) ? x.dtype() : DType::Int64;
  DType work = out == DType::Float16 || out == DType::BFloat16 ? DType::Float32 : out;
  if (x.dim() == 0) {
    normalize_axis("cumsum", dim, 1);
    return to(x, out);
  }
  int64_t d = normalize_axis("cumsum", dim, x.dim()), last = x.dim() - 1;
  Tensor xw = to(x, work);
  if (d != last) xw = transpose(xw, d, last);
  Tensor r = scan_last(xw, true);
  if (d != last) r = transpose(r, d, last);
  return to(r, out);
}

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  Tensor idx = argsort(x, dim, descending);
  if (x.dim() == 0) return {x, idx};
  return {gather(x, normalize_axis("sort", dim, x.dim()), idx), idx};
}

// Past this k, topk sorts the line instead of taking k rounds of a masked argmax.
constexpr int64_t kTopkRounds = 16;

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  if (x.dim() == 0) {
    LOOM_CHECK_T(ShapeError, k == 0 || k == 1, "[topk] selected index k out of range: k ", k,
                 " for ", type_of(x));
    auto [v, i] = topk(reshape(x, {1}), k, 0, largest, sorted);
    return {k == 1 ? reshape(v, {}) : v, k == 1 ? reshape(i, {}) : i};
  }
  LOOM_CHECK_T(DTypeError, x.dtype() != DType::Bool, "[topk] not implemented for bool, got ",
               type_of(x));
  int64_t d = normalize_axis("topk", dim, x.dim());
  LOOM_CHECK_T(ShapeError, k >= 0 && k <= x.size(d), "[topk] selected index k out of range: k ", k,
               " for dim ", d, " of ", type_of(x));
  std::vector<int64_t> ks = x.shape().vec();
  ks[d] = 0;
  if (k == 0) return {slice(x, d, 0, 0), zeros(Shape(ks), DType::Int64)};
  if (k > kTopkRounds) {  // one stable sort: the same order (ties by index, nan as largest)
    Tensor indices = slice(argsort(x.detach(), d, largest), d, 0, k);
    return {gather(x, d, indices), indices};
  }
  DType dt = x.dtype();
  bool flt = is_floating(dt);
  double inf = std::numeric_limits<double>::infinity();
  Tensor xd = x.detach();
  // what taken entries read as: never better than a free one (integers: the row's extreme)
  Tensor filler =
      flt ? lit(largest ? -inf : inf, dt) : (largest ? min(xd, {d}, true) : max(xd, {d}, true));
  Tensor nan = flt ? xd != xd : Tensor();
  Tensor pos = iota(x.shape(), d), taken = full(x.shape(), 0, DType::Bool);
  std::vector<Tensor> picks;
  for (int64_t r = 0; r < k; ++r) {
    Tensor free = logical_not(taken);
    Tensor plain = flt ? both(free, logical_not(nan)) : free;  // free, not nan
    Tensor masked = where(plain, xd, filler);
    Tensor best = largest ? max(masked, {d}, true) : min(masked, {d}, true);
    Tensor cand = both(plain, masked == best);
    if (flt) {  // nan first when largest, last when smallest
      Tensor free_nan = both(free, nan);
      cand = largest ? where(any_along(free_nan, d), free_nan, cand)
                     : where(any_along(cand, d), cand, free_nan);
    }
    Tensor idx = argmax(to(cand, DType::Int32), d, true);  // the first candidate
    picks.push_back(idx);
    taken = either(taken, pos == idx);
  }
  Tensor indices = picks.size() == 1 ? picks[0] : cat(picks, d);
  return {gather(x, d, indices), indices};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  LOOM_CHECK_T(ShapeError, probs.dim() == 1 || probs.dim() == 2,
               "[multinomial] prob_dist must be 1 or 2 dim, got ", type_of(probs));
  LOOM_CHECK_T(DTypeError, is_floating(probs.dtype()),
               "[multinomial] only supports floating-point dtypes for input, got ", type_of(probs));
  LOOM_CHECK_T(ShapeError, num_samples > 0, "[multinomial] cannot sample n_sample <= 0 samples");
  int64_t n = probs.size(-1);
  LOOM_CHECK_T(ShapeError, n > 0, "[multinomial] the number of categories cannot be 0, got ",
               type_of(probs));
  LOOM_CHECK_T(ShapeError, replacement || num_samples <= n,
               "[multinomial] cannot sample n_sample > prob_dist.size(-1) samples without "
               "replacement: ",
               num_samples, " samples from ", type_of(probs));
  DType work = probs.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor logp = log(to(probs.detach(), work));
  auto gumbel = [&](const Shape& s) { return -log(-log(rand(s, work))); };
  if (num_samples == 1 || !replacement) {
    Tensor keys = logp + gumbel(logp.shape());
    if (num_samples == 1) return argmax(keys, probs.dim() - 1, true);
    return topk(keys, num_samples, probs.dim() - 1)
        .second;  // Gumbel-top-k: draws without replacement
  }
  std::vector<int64_t> s = logp.shape().vec();
  s.insert(s.end() - 1, num_samples);  // [..., num_samples, C]: one draw per row
  return argmax(unsqueeze(logp, probs.dim() - 1) + gumbel(Shape(s)), probs.dim());
}

namespace {
void check_leaf_inplace(const Tensor& x, const char* op) {
  LOOM_CHECK_T(AutodiffError, !(grad_enabled() && is_leaf(x) && x.requires_grad()), "[", op,
               "] a leaf tensor ", type_of(x),
               " that requires grad cannot be updated in place outside no_grad (its gradient "
               "would refer to the old value); update it under loom::NoGradGuard (Python: "
               "`with loom.no_grad():`)");
}
}  // namespace

Tensor& fill_(Tensor& x, Scalar value) {
  check_leaf_inplace(x, "fill_");
  double v = value.is_int ? static_cast<double>(value.ivalue) : value.value;
  return x.copy_(full({}, v, x.dtype()));
}
Tensor& fill_(Tensor& x, const Tensor& value) {
  check_leaf_inplace(x, "fill_");
  LOOM_CHECK_T(ShapeError, value.dim() == 0,
               "[fill_] only supports a 0-dimensional value tensor, but got ", type_of(value));
  return x.copy_(value);
}
Tensor& zero_(Tensor& x) { return x.zero_(); }  // the leaf rule is Tensor::zero_'s
bool is_leaf(const Tensor& x) {
  detail::type_of(x, "is_leaf");  // an undefined tensor is an Error
  return x.impl()->requires_grad || !x.requires_grad();
}

void set_grad_enabled(bool on) { detail::TraceContext::get().grad().set_enabled(on); }
GradModeGuard::GradModeGuard(bool enabled) : previous_(grad_enabled()) {
  set_grad_enabled(enabled);
}
GradModeGuard::~GradModeGuard() { set_grad_enabled(previous_); }

}  // namespace loom
