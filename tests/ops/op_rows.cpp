// The rows of the op harness (op_rows.h): the closed forms are written here in double, from
// the definitions (PyTorch's semantics, docs/ir.md), never from loom's kernels.
#include "ops/op_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "loom/core/half.h"
#include "test_constants.h"

namespace loom::optest {

const std::vector<DType> kFloats = {DType::Float32, DType::Float64, DType::BFloat16,
                                    DType::Float16};
const std::vector<DType> kNumeric = {DType::Float32, DType::Float64, DType::BFloat16,
                                     DType::Float16, DType::Int32,   DType::Int64};
const std::vector<DType> kAll = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16,
                                 DType::Int32,   DType::Int64,   DType::Bool};
const std::vector<DType> kF32F64 = {DType::Float32, DType::Float64};

namespace {

using testing::kInf;
using testing::kNaN;
using Ts = std::vector<Tensor>;
using Hs = std::vector<HostArg>;

// ---- index math --------------------------------------------------------------------------

std::vector<int64_t> coords(int64_t k, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    c[d] = k % s[d];
    k /= s[d];
  }
  return c;
}
int64_t flat(const std::vector<int64_t>& c, const Shape& s) {
  int64_t k = 0;
  for (size_t d = 0; d < s.size(); ++d) k = k * s[d] + c[d];
  return k;
}
int64_t norm_axis(int64_t a, size_t rank) { return a < 0 ? a + static_cast<int64_t>(rank) : a; }

// numpy broadcasting of two shapes.
Shape bshape(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return Shape(out);
}
// The element of an input of shape `in` that output coordinate c (of shape out) reads.
int64_t bindex(const std::vector<int64_t>& c, const Shape& out, const Shape& in) {
  int64_t k = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    size_t d = i + (out.size() - in.size());
    k = k * in[i] + (in[i] == 1 ? 0 : c[d]);
  }
  return k;
}

// An output of shape `out` whose element at c is x[in_of(c)] (the layout ops).
Expected moved(const HostArg& x, const Shape& out,
               const std::function<int64_t(const std::vector<int64_t>&)>& in_of) {
  Expected e{x.dtype, out, {}, {}};
  for (int64_t k = 0; k < out.numel(); ++k) e.v.push_back(x.v[in_of(coords(k, out))]);
  return e;
}

bool floating(DType dt) { return is_floating(dt); }
// PyTorch's result dtype of an op that needs floats (ints and bool promote to float32).
DType float_of(DType dt) { return floating(dt) ? dt : DType::Float32; }

// ---- row makers --------------------------------------------------------------------------

// The values that cross exp's, f16's and bf16's overflow and underflow thresholds.
const std::vector<double> kSpecials = {kNaN,   kInf, -kInf, 0,  -0.0, 1,   -1,  2.5,  -3,   1e30,
                                       -1e-30, 10.5, 11.5,  88, 89,   709, 710, -745, -750, 0.5};

Arg wa(Shape s, double lo, double hi) { return Arg{std::move(s), {}, lo, hi}; }
Arg wperm(Shape s, double lo, double hi, std::vector<int64_t> perm) {
  Arg a = wa(std::move(s), lo, hi);
  a.perm = std::move(perm);
  return a;
}
Arg wstep(Shape s, double lo, double hi, int64_t dim = -1, int64_t step = 2) {
  Arg a = wa(std::move(s), lo, hi);
  a.step = step;
  a.step_dim = dim;
  return a;
}
Arg wexp(Shape s, double lo, double hi) {
  Arg a = wa(std::move(s), lo, hi);
  a.expand0 = true;
  return a;
}

// Wide cases of an elementwise op on one input: sizes across vector widths and thread
// splits, a transposed and a strided operand, the special values.
std::vector<Case> unary_wide(double lo, double hi) {
  return {{"37x129", {wa({37, 129}, lo, hi)}},
          {"1000", {wa({1000}, lo, hi)}},
          {"1023", {wa({1023}, lo, hi)}},
          {"4097", {wa({4097}, lo, hi)}},
          {"transposed 37x129", {wperm({37, 129}, lo, hi, {1, 0})}},
          {"strided", {wstep({6, 5}, lo, hi)}},
          {"specials", {{{20}, {}, 0, 0, kSpecials}}, true}};
}

std::vector<Case> unary_cases(double lo, double hi, bool specials) {
  std::vector<Case> cs = {
      {"0-d", {{{}, {}, lo, hi}}},
      {"0-size", {{{0}, {}, lo, hi}}},
      {"1-d", {{{5}, {}, lo, hi}}},
      {"2-d", {{{2, 3}, {}, lo, hi}}, false, true},
      {"0-size 3-d", {{{2, 0, 3}, {}, lo, hi}}},
  };
  if (specials) cs.push_back({"nan inf", {{{6}, {}, 0, 0, {kNaN, kInf, -kInf, 0, 1, -1}}}, true});
  return cs;
}

Row unary(std::string name, std::vector<std::string> ir, std::function<Tensor(const Tensor&)> f,
          std::function<double(double)> g, double lo, double hi, std::vector<DType> dts, bool diff,
          bool specials, bool keeps_ints = true) {
  Row r;
  r.name = std::move(name);
  r.ir_ops = std::move(ir);
  r.op = [f](const Ts& x) { return f(x[0]); };
  r.dtypes = std::move(dts);
  r.cases = unary_cases(lo, hi, specials);
  r.wide = unary_wide(lo, hi);
  r.closed = [g, keeps_ints](const Hs& a) {
    DType out = keeps_ints ? a[0].dtype : float_of(a[0].dtype);
    Expected e{out, a[0].shape, {}, {}};
    for (double v : a[0].v) e.v.push_back(floating(out) ? g(v) : std::trunc(g(v)));
    return e;
  };
  r.differentiable = diff;
  return r;
}

std::vector<Case> binary_cases(double lo, double hi, bool specials) {
  auto c = [&](std::string l, Shape a, Shape b, bool fd = false) {
    return Case{std::move(l), {{std::move(a), {}, lo, hi}, {std::move(b), {}, lo, hi}}, false, fd};
  };
  std::vector<Case> cs = {c("same", {4}, {4}),
                          c("row", {2, 3}, {3}, true),
                          c("outer", {2, 1}, {1, 3}),
                          c("0-d", {}, {2, 2}),
                          c("0-size", {0, 3}, {3}),
                          c("rank 3", {3, 1, 2}, {4, 1}),
                          c("row swapped", {3}, {2, 3}),
                          c("0-d swapped", {2, 2}, {}),
                          c("rank 3 swapped", {4, 1}, {3, 1, 2}),
                          c("1 x 0", {1}, {0}),
                          c("0 x 1", {0}, {1})};
  if (specials) {
    cs.push_back({"nan inf",
                  {{{3, 3}, {}, 0, 0, {kNaN, kNaN, kNaN, kInf, kInf, kInf, -kInf, -kInf, 0}},
                   {{3, 3}, {}, 0, 0, {kNaN, kInf, 1, kInf, -kInf, 0, -kInf, 0.5, 0}}},
                  true});
  }
  return cs;
}

std::vector<Case> binary_wide(double lo, double hi) {
  auto c = [](std::string l, Arg a, Arg b) {
    return Case{std::move(l), {std::move(a), std::move(b)}};
  };
  std::vector<Case> cs = {
      c("4097", wa({4097}, lo, hi), wa({4097}, lo, hi)),
      c("1000", wa({1000}, lo, hi), wa({1000}, lo, hi)),
      c("37x129 row", wa({37, 129}, lo, hi), wa({129}, lo, hi)),
      c("37x129 col", wa({37, 129}, lo, hi), wa({37, 1}, lo, hi)),
      c("5,1,1 x 1,129", wa({5, 1, 1}, lo, hi), wa({1, 129}, lo, hi)),
      c("1,129 x 5,1,1", wa({1, 129}, lo, hi), wa({5, 1, 1}, lo, hi)),
      c("permuted + contiguous", wperm({5, 4, 6}, lo, hi, {2, 0, 1}), wa({5, 4, 6}, lo, hi)),
      c("transposed both", wperm({6, 5}, lo, hi, {1, 0}), wperm({6, 5}, lo, hi, {1, 0})),
      c("strided + expanded", wstep({4, 3, 5}, lo, hi, 1), wexp({4, 3, 5}, lo, hi)),
      c("strided dim 0 + transposed", wstep({4, 5}, lo, hi, 0, 3), wperm({4, 5}, lo, hi, {1, 0}))};
  // every pair of the special values, through broadcasting
  cs.push_back(
      {"special pairs", {{{20, 1}, {}, 0, 0, kSpecials}, {{1, 20}, {}, 0, 0, kSpecials}}, true});
  return cs;
}

Row binary(std::string name, std::vector<std::string> ir,
           std::function<Tensor(const Tensor&, const Tensor&)> f,
           std::function<double(double, double)> g, double lo, double hi, std::vector<DType> dts,
           bool diff, bool specials, bool compare = false) {
  Row r;
  r.name = std::move(name);
  r.ir_ops = std::move(ir);
  r.op = [f](const Ts& x) { return f(x[0], x[1]); };
  r.dtypes = std::move(dts);
  r.cases = binary_cases(lo, hi, specials);
  r.wide = binary_wide(lo, hi);
  r.closed = [g, compare](const Hs& a) {
    Shape s = bshape(a[0].shape, a[1].shape);
    DType out = compare ? DType::Bool : a[0].dtype;
    Expected e{out, s, {}, {}};
    for (int64_t k = 0; k < s.numel(); ++k) {
      auto c = coords(k, s);
      double w = g(a[0].v[bindex(c, s, a[0].shape)], a[1].v[bindex(c, s, a[1].shape)]);
      e.v.push_back(floating(out) || compare ? w : std::trunc(w));
    }
    return e;
  };
  r.exact = compare;
  r.differentiable = diff;
  return r;
}

// ---- reductions --------------------------------------------------------------------------

enum class Red { Sum, Mean, Max, Min };

Expected reduce(const HostArg& x, std::vector<int64_t> dims, bool keepdim, Red kind) {
  const size_t rank = x.shape.size();
  std::vector<bool> red(rank, dims.empty());
  for (int64_t d : dims) red[norm_axis(d, rank)] = true;
  std::vector<int64_t> out;
  for (size_t d = 0; d < rank; ++d) {
    if (!red[d])
      out.push_back(x.shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  Shape os(out);
  DType dt = x.dtype;
  if (kind == Red::Sum && !floating(dt)) dt = DType::Int64;
  double init = kind == Red::Max ? -kInf : kind == Red::Min ? kInf : 0;
  Expected e{dt, os, std::vector<double>(os.numel(), init), std::vector<double>(os.numel(), 0)};
  std::vector<int64_t> n(os.numel(), 0);
  for (int64_t k = 0; k < x.shape.numel(); ++k) {
    auto c = coords(k, x.shape);
    std::vector<int64_t> oc;
    for (size_t d = 0; d < rank; ++d) {
      if (!red[d])
        oc.push_back(c[d]);
      else if (keepdim)
        oc.push_back(0);
    }
    int64_t o = flat(oc, os);
    double v = x.v[k];
    double& acc = e.v[o];
    if (kind == Red::Sum || kind == Red::Mean)
      acc += v;
    else if (std::isnan(v) || std::isnan(acc))
      acc = kNaN;
    else
      acc = kind == Red::Max ? std::max(acc, v) : std::min(acc, v);
    e.scale[o] += std::fabs(v);
    ++n[o];
  }
  if (kind == Red::Mean) {
    for (int64_t o = 0; o < os.numel(); ++o) {
      e.v[o] /= static_cast<double>(n[o]);
      e.scale[o] /= static_cast<double>(std::max<int64_t>(n[o], 1));
    }
  }
  if (kind == Red::Max || kind == Red::Min) e.scale.clear();
  return e;
}

Row reduction(std::string name, std::string variant, Red kind, std::vector<int64_t> dims,
              bool keepdim, bool all, std::vector<DType> dts, std::vector<std::string> ir) {
  Row r;
  r.name = std::move(name);
  r.variant = std::move(variant);
  r.ir_ops = std::move(ir);
  r.op = [=](const Ts& x) {
    switch (kind) {
      case Red::Sum: return all ? loom::sum(x[0]) : loom::sum(x[0], dims, keepdim);
      case Red::Mean: return all ? loom::mean(x[0]) : loom::mean(x[0], dims, keepdim);
      case Red::Max: return all ? loom::max(x[0]) : loom::max(x[0], dims, keepdim);
      case Red::Min: return all ? loom::min(x[0]) : loom::min(x[0], dims, keepdim);
    }
    return Tensor();
  };
  r.dtypes = std::move(dts);
  const bool mx = kind == Red::Max || kind == Red::Min;
  if (all) {
    r.cases = {{"0-d", {{{}, {}, -5, 5}}}, {"3-d", {{{2, 3, 4}, {}, -5, 5}}, false, true}};
    if (!mx) r.cases.push_back({"0-size", {{{0, 3}, {}, -5, 5}}});
  } else {
    r.cases = {{"3-d", {{{2, 3, 4}, {}, -5, 5}}, false, true},
               {"3-d wide", {{{3, 4, 5}, {}, -5, 5}}}};
    if (!mx) {
      r.cases.push_back({"0-size", {{{2, 0, 4}, {}, -5, 5}}});
    } else {  // a 0 extent on a dim that is not reduced
      std::vector<bool> red(3, dims.empty());
      for (int64_t d : dims) red[norm_axis(d, 3)] = true;
      for (size_t d = 0; d < 3; ++d) {
        if (red[d]) continue;
        std::vector<int64_t> sh = {3, 4, 5};
        sh[d] = 0;
        r.cases.push_back({"empty kept dim", {{Shape(sh), {}, -5, 5}}});
        break;
      }
    }
  }
  if (mx) {  // NaN propagates
    r.cases.push_back({"nan",
                       {{{2, 3, 4}, {}, 0, 0, {1, kNaN, 3, 4, 5, 6, -1, -2, kNaN, 0,  1,  2,
                                               3, 4,    5, 6, 7, 8, 9,  10, 11,   12, 13, 14}}},
                       true});
  }
  // wide: the special values in every row, big shapes where the dims fit, strided views
  const std::vector<double> nanrows = {-kInf, 0, 1, 2, -kInf, -kInf, -kInf, -kInf, kNaN, 1, 2, 3,
                                       kInf,  1, 2, 3, 1,     kNaN,  -kInf, kInf,  1,    2, 3, 4};
  auto fits = [&](size_t rank) {
    std::vector<bool> seen(rank, false);
    for (int64_t d : dims) {
      if (d >= static_cast<int64_t>(rank) || d < -static_cast<int64_t>(rank)) return false;
      if (seen[norm_axis(d, rank)]) return false;
      seen[norm_axis(d, rank)] = true;
    }
    return true;
  };
  const double m2 = 8;  // reordered sums of ~5000 terms drift like sqrt(n) roundings
  if (all || fits(1)) {
    r.wide.push_back({"4097", {wa({4097}, -3, 3)}, false, false, {}, m2});
    r.wide.push_back({"1000", {wa({1000}, -3, 3)}, false, false, {}, m2});
  }
  if (all || fits(2)) r.wide.push_back({"37x129", {wa({37, 129}, -3, 3)}, false, false, {}, m2});
  r.wide.push_back({"specials", {{{2, 3, 4}, {}, 0, 0, nanrows}}, true});
  r.wide.push_back({"permuted", {wperm({5, 4, 6}, -3, 3, {2, 0, 1})}});
  r.wide.push_back({"strided", {wstep({4, 3, 5}, -3, 3, 1)}});
  r.wide.push_back({"expanded", {wexp({4, 6, 5}, -3, 3)}});
  r.closed = [=](const Hs& a) {
    return reduce(a[0], all ? std::vector<int64_t>{} : dims, all ? false : keepdim, kind);
  };
  r.exact = mx;
  r.mult = mx ? 1 : 4;
  r.differentiable = true;
  return r;
}

Expected argmax_of(const HostArg& x, std::optional<int64_t> dim, bool keepdim) {
  if (!dim) {
    Expected e{DType::Int64, Shape{}, {0}, {}};
    double best = x.v[0];
    for (size_t k = 1; k < x.v.size(); ++k) {
      if (std::isnan(best)) break;
      if (std::isnan(x.v[k]) || x.v[k] > best) {
        best = x.v[k];
        e.v[0] = static_cast<double>(k);
      }
    }
    return e;
  }
  const size_t rank = x.shape.size();
  const int64_t d = rank == 0 ? 0 : norm_axis(*dim, rank);
  std::vector<int64_t> out;
  for (size_t i = 0; i < rank; ++i) {
    if (static_cast<int64_t>(i) != d)
      out.push_back(x.shape[i]);
    else if (keepdim)
      out.push_back(1);
  }
  Shape os(out);
  Expected e{DType::Int64, os, std::vector<double>(os.numel(), -1), {}};
  std::vector<double> best(os.numel(), 0);
  for (int64_t k = 0; k < x.shape.numel(); ++k) {
    auto c = coords(k, x.shape);
    std::vector<int64_t> oc;
    for (size_t i = 0; i < rank; ++i) {
      if (static_cast<int64_t>(i) != d)
        oc.push_back(c[i]);
      else if (keepdim)
        oc.push_back(0);
    }
    int64_t o = flat(oc, os);
    double v = x.v[k];
    int64_t at = rank == 0 ? 0 : c[d];
    if (e.v[o] < 0 || (!std::isnan(best[o]) && (std::isnan(v) || v > best[o]))) {
      best[o] = v;
      e.v[o] = static_cast<double>(at);
    }
  }
  return e;
}

// softmax (log: log_softmax) of x along dim, with the maximum subtracted.
Expected softmax_of(const HostArg& x, int64_t dim, bool log) {
  Expected e{float_of(x.dtype), x.shape, std::vector<double>(x.v.size()), {}};
  const int64_t d = norm_axis(dim, x.shape.size());
  for (int64_t k = 0; k < x.shape.numel(); ++k) {
    auto c = coords(k, x.shape);
    if (c[d] != 0) continue;
    double m = -kInf, s = 0;
    for (c[d] = 0; c[d] < x.shape[d]; ++c[d]) m = std::max(m, x.v[flat(c, x.shape)]);
    for (c[d] = 0; c[d] < x.shape[d]; ++c[d]) s += std::exp(x.v[flat(c, x.shape)] - m);
    for (c[d] = 0; c[d] < x.shape[d]; ++c[d]) {
      int64_t j = flat(c, x.shape);
      e.v[j] = log ? x.v[j] - m - std::log(s) : std::exp(x.v[j] - m) / s;
    }
  }
  return e;
}

// matmul with numpy's rules: 1-d operands gain a dimension that the result drops again.
Expected matmul_of(const HostArg& a, const HostArg& b) {
  Shape sa = a.shape, sb = b.shape;
  const bool va = sa.size() == 1, vb = sb.size() == 1;
  if (va) sa = Shape{1, sa[0]};
  if (vb) sb = Shape{sb[0], 1};
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  Shape ba(std::vector<int64_t>(sa.begin(), sa.end() - 2));
  Shape bb(std::vector<int64_t>(sb.begin(), sb.end() - 2));
  Shape batch = bshape(ba, bb);
  std::vector<int64_t> out(batch.begin(), batch.end());
  if (!va) out.push_back(m);
  if (!vb) out.push_back(n);
  Expected e{a.dtype, Shape(out), {}, {}};
  for (int64_t t = 0; t < batch.numel(); ++t) {
    auto c = coords(t, batch);
    const int64_t ia = bindex(c, batch, ba), ib = bindex(c, batch, bb);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          double t1 = a.v[(ia * m + i) * k + p] * b.v[(ib * k + p) * n + j];
          acc += t1;
          mag += std::fabs(t1);
        }
        e.v.push_back(acc);
        e.scale.push_back(mag);
      }
    }
  }
  return e;
}

// argsort / sort along dim by ranks: entry k of a line goes to the place counting the entries
// before it (smaller, or nan-last, or equal and earlier: stable), descending by the reversed
// order; indices (values: false) or the entries themselves.
Expected sorted_of(const HostArg& x, int64_t dim, bool descending, bool values) {
  Expected e{values ? x.dtype : DType::Int64, x.shape, std::vector<double>(x.v.size(), 0), {}};
  if (x.shape.empty()) {
    e.v[0] = values ? x.v[0] : 0;
    return e;
  }
  const int64_t d = norm_axis(dim, x.shape.size());
  auto before = [&](double a, double b) {  // a sorts strictly before b, ascending
    if (std::isnan(a)) return false;
    return std::isnan(b) || a < b;
  };
  for (int64_t k = 0; k < x.shape.numel(); ++k) {
    auto c = coords(k, x.shape);
    int64_t place = 0;
    for (int64_t j = 0; j < x.shape[d]; ++j) {
      auto cj = c;
      cj[d] = j;
      const double a = x.v[flat(cj, x.shape)], b = x.v[k];
      const bool earlier = descending ? before(b, a) : before(a, b);
      const bool tie = !before(a, b) && !before(b, a);
      if (earlier || (tie && j < c[d])) ++place;
    }
    auto out = c;
    out[d] = place;
    e.v[flat(out, x.shape)] = values ? x.v[k] : static_cast<double>(c[d]);
  }
  return e;
}

Row make(std::string name, std::string variant, std::vector<std::string> ir, OpFn op,
         std::vector<DType> dts, std::vector<Case> cases, ClosedForm closed, bool diff,
         bool exact = false, double mult = 1) {
  Row r;
  r.name = std::move(name);
  r.variant = std::move(variant);
  r.ir_ops = std::move(ir);
  r.op = std::move(op);
  r.dtypes = std::move(dts);
  r.cases = std::move(cases);
  r.closed = std::move(closed);
  r.differentiable = diff;
  r.exact = exact;
  r.mult = mult;
  return r;
}

Arg in(Shape s, double lo = -9, double hi = 9) { return Arg{std::move(s), {}, lo, hi}; }
Arg idx(Shape s, int64_t n, DType dt = DType::Int64) {
  return Arg{std::move(s), dt, 0, static_cast<double>(n - 1), {}, false};
}
Arg shape_of(Shape s) { return Arg{std::move(s), DType::Float32, 0, 1, {}, false}; }
Arg given(Shape s, std::vector<double> v, DType dt) {
  return Arg{std::move(s), dt, 0, 0, std::move(v), false};
}

// ---- the table -----------------------------------------------------------------------------

std::vector<Row> elementwise_rows() {
  auto sq = [](double x) { return x * x; };
  std::vector<Row> r = {
      unary(
          "neg", {"neg"}, [](const Tensor& x) { return loom::neg(x); }, [](double x) { return -x; },
          -5, 5, kNumeric, true, true),
  };
  r.push_back(unary(
      "operator-", {"neg"}, [](const Tensor& x) { return -x; }, [](double x) { return -x; }, -5, 5,
      kNumeric, true, false));
  r.back().variant = "unary";
  r.push_back(unary(
      "abs", {"abs"}, [](const Tensor& x) { return loom::abs(x); },
      [](double x) { return std::fabs(x); }, -5, 5, kNumeric, true, true));
  r.push_back(unary(
      "exp", {"exp", "convert"}, [](const Tensor& x) { return loom::exp(x); },
      [](double x) { return std::exp(x); }, -4, 4, kAll, true, true, false));
  r.push_back(unary(
      "log", {"log", "convert"}, [](const Tensor& x) { return loom::log(x); },
      [](double x) { return std::log(x); }, 0.1, 9, kAll, true, true, false));
  r.push_back(unary(
      "sqrt", {"sqrt", "convert"}, [](const Tensor& x) { return loom::sqrt(x); },
      [](double x) { return std::sqrt(x); }, 0.1, 9, kAll, true, true, false));
  r.push_back(unary(
      "rsqrt", {"sqrt", "div", "constant", "convert"},
      [](const Tensor& x) { return loom::rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
      0.1, 9, kAll, true, false, false));
  r.back().mult = 2;
  r.push_back(unary(
      "tanh", {"tanh", "convert"}, [](const Tensor& x) { return loom::tanh(x); },
      [](double x) { return std::tanh(x); }, -3, 3, kAll, true, true, false));
  r.push_back(unary(
      "sigmoid", {"neg", "exp", "add", "div", "constant", "convert"},
      [](const Tensor& x) { return loom::sigmoid(x); },
      [](double x) { return 1 / (1 + std::exp(-x)); }, -6, 6, kAll, true, true, false));
  r.back().mult = 3;
  r.push_back(unary(
      "relu", {"le", "where", "constant"}, [](const Tensor& x) { return loom::relu(x); },
      [](double x) { return std::isnan(x) ? x : std::max(x, 0.0); }, -3, 3, kNumeric, true, true));
  r.push_back(unary(
      "gelu", {"mul", "erf", "add", "constant", "convert"},
      [](const Tensor& x) { return loom::gelu(x); },
      [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4, kAll, true,
      false, false));
  r.back().mult = 4;
  r.push_back(unary(
      "sin", {"sin", "convert"}, [](const Tensor& x) { return loom::sin(x); },
      [](double x) { return std::sin(x); }, -3, 3, kAll, true, true, false));
  r.push_back(unary(
      "cos", {"cos", "convert"}, [](const Tensor& x) { return loom::cos(x); },
      [](double x) { return std::cos(x); }, -3, 3, kAll, true, true, false));
  r.push_back(unary(
      "erf", {"erf", "convert"}, [](const Tensor& x) { return loom::erf(x); },
      [](double x) { return std::erf(x); }, -2, 2, kAll, true, true, false));
  r.push_back(unary(
      "clamp", {"lt", "gt", "le", "ge", "mul", "where", "constant"},
      [](const Tensor& x) { return loom::clamp(x, -1.0, 2.0); },
      [](double x) { return std::isnan(x) ? x : std::min(std::max(x, -1.0), 2.0); }, -3, 3, kFloats,
      true, true));
  r.push_back(unary(
      "pow", {"pow"}, [](const Tensor& x) { return loom::pow(x, 2); }, sq, -3, 3, kNumeric, true,
      false));
  r.back().variant = "scalar";
  r.push_back(unary(
      "operator*", {"mul"}, [](const Tensor& x) { return x * 3; }, [](double x) { return 3 * x; },
      -3, 3, kNumeric, true, false));
  r.back().variant = "scalar";
  r.push_back(unary(
      "operator-", {"sub"}, [](const Tensor& x) { return 1 - x; }, [](double x) { return 1 - x; },
      -3, 3, kNumeric, true, false));
  r.back().variant = "scalar lhs";
  r.push_back(unary(
      "operator+", {"add"}, [](const Tensor& x) { return x + 2.5; },
      [](double x) { return x + 2.5; }, -3, 3, kFloats, true, false));
  r.back().variant = "scalar";
  r.push_back(unary(
      "operator/", {"div"}, [](const Tensor& x) { return 2.0 / x; }, [](double x) { return 2 / x; },
      0.5, 3, kFloats, true, false));
  r.back().variant = "scalar lhs";
  r.push_back(unary(
      "operator/", {"div", "convert"}, [](const Tensor& x) { return x / 2; },
      [](double x) { return x / 2; }, -5, 5, kNumeric, true, false, false));
  r.back().variant = "scalar (ints: true division)";
  r.push_back(unary(
      "operator<", {"lt"}, [](const Tensor& x) { return x < 0.5; },
      [](double x) { return double(x < 0.5); }, -2, 2, kFloats, false, true));
  r.back().variant = "scalar";
  r.back().closed = [c = r.back().closed](const Hs& a) {
    Expected e = c(a);
    e.dtype = DType::Bool;
    return e;
  };
  r.back().exact = true;
  r.push_back(unary(
      "logical_not", {"not", "convert"}, [](const Tensor& x) { return loom::logical_not(x); },
      [](double x) { return double(x == 0); }, -2, 2, kAll, false, true));
  r.back().closed = [c = r.back().closed](const Hs& a) {
    Expected e{DType::Bool, a[0].shape, {}, {}};
    for (double v : a[0].v) e.v.push_back(v == 0 ? 1 : 0);
    return e;
  };
  r.back().exact = true;
  // binary
  r.push_back(binary(
      "add", {"add"}, [](auto& a, auto& b) { return loom::add(a, b); },
      [](double a, double b) { return a + b; }, -5, 5, kNumeric, true, true));
  r.push_back(binary(
      "sub", {"sub"}, [](auto& a, auto& b) { return loom::sub(a, b); },
      [](double a, double b) { return a - b; }, -5, 5, kNumeric, true, false));
  r.push_back(binary(
      "mul", {"mul"}, [](auto& a, auto& b) { return loom::mul(a, b); },
      [](double a, double b) { return a * b; }, -5, 5, kNumeric, true, true));
  r.push_back(binary(
      "div", {"div"}, [](auto& a, auto& b) { return loom::div(a, b); },
      [](double a, double b) { return a / b; }, 0.5, 5, kFloats, true, true));
  r.push_back(binary(
      "pow", {"pow"}, [](auto& a, auto& b) { return loom::pow(a, b); },
      [](double a, double b) { return std::pow(a, b); }, 0.5, 3, kFloats, true, false));
  r.back().mult = 2;
  r.push_back(binary(
      "maximum", {"maximum"}, [](auto& a, auto& b) { return loom::maximum(a, b); },
      [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }, -5,
      5, kAll, true, true));
  r.push_back(binary(
      "minimum", {"minimum"}, [](auto& a, auto& b) { return loom::minimum(a, b); },
      [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); }, -5,
      5, kAll, true, true));
  // torch's division by floor (div_floor_floating for floats), Python's signs for the
  // remainder; integer division by zero gives 0 (loom's rule, docs/ir.md).
  auto div_floor = [](double a, double b) {
    if (b == 0) return a / b;
    const double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= 1;
    if (div == 0) return std::copysign(0.0, a / b);
    double fl = std::floor(div);
    return div - fl > 0.5 ? fl + 1 : fl;
  };
  auto py_mod = [](double a, double b) {
    const double mod = std::fmod(a, b);
    return mod != 0 && (b < 0) != (mod < 0) ? mod + b : mod;
  };
  auto division_row = [&](std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f,
                          std::function<double(double, double)> on_floats,
                          std::function<double(double, double)> on_ints) {
    Row row = binary(name, {}, f, on_floats, -7, 7, kNumeric, false, true);
    for (Case& c : row.cases) {
      // a divisor that is a materialized 0 raises (torch's ZeroDivisionError); drawn 0-d
      // divisors stay nonzero
      if (c.label == "0-d swapped") c.args[1].values = {-3};
    }
    row.cases.push_back({"signs and zeros",
                         {{{8}, {}, 0, 0, {7, -7, 7, -7, 0, 5, -6, 6}},
                          {{8}, {}, 0, 0, {2, 2, -2, -2, 3, 0, 3, -3}}}});
    row.cases.push_back({"halves",
                         {{{6}, {}, 0, 0, {7.5, -7.5, 0.5, -0.5, 6, 1e30}},
                          {{6}, {}, 0, 0, {2, 2, -1.5, 0.25, -0.75, 3}}},
                         true});
    row.closed = [on_floats, on_ints](const Hs& a) {
      Shape s = bshape(a[0].shape, a[1].shape);
      Expected e{a[0].dtype, s, {}, {}};
      for (int64_t k = 0; k < s.numel(); ++k) {
        auto c = coords(k, s);
        const double x = a[0].v[bindex(c, s, a[0].shape)], y = a[1].v[bindex(c, s, a[1].shape)];
        e.v.push_back(floating(e.dtype) ? on_floats(x, y) : y == 0 ? 0 : on_ints(x, y));
      }
      return e;
    };
    return row;
  };
  const std::vector<std::string> division_ir = {
      "convert", "rem", "div", "sub", "add", "mul", "eq", "ne", "lt", "gt", "where", "not", "abs"};
  r.push_back(division_row(
      "floor_divide", [](auto& a, auto& b) { return loom::floor_divide(a, b); }, div_floor,
      [](double a, double b) { return std::floor(a / b); }));
  r.back().ir_ops = division_ir;
  r.push_back(division_row(
      "remainder", [](auto& a, auto& b) { return loom::remainder(a, b); }, py_mod,
      [](double a, double b) { return a - std::floor(a / b) * b; }));
  r.back().ir_ops = {"convert", "rem", "add", "ne", "lt", "where", "not"};
  r.push_back(division_row(
      "fmod", [](auto& a, auto& b) { return loom::fmod(a, b); },
      [](double a, double b) { return std::fmod(a, b); },
      [](double a, double b) { return std::fmod(a, b); }));
  r.back().ir_ops = {"rem"};
  r.back().differentiable = true;
  r.push_back(unary(
      "floor", {"convert", "abs", "lt", "gt", "sub", "where"},
      [](const Tensor& x) { return loom::floor(x); }, [](double x) { return std::floor(x); }, -5, 5,
      kNumeric, false, true));
  for (const char* op : {"logical_and", "logical_or"}) {
    const bool is_and = std::string(op) == "logical_and";
    r.push_back(binary(
        op, {"where"},
        [is_and](auto& a, auto& b) {
          return is_and ? loom::logical_and(a, b) : loom::logical_or(a, b);
        },
        [is_and](double a, double b) {
          return double(is_and ? (a != 0 && b != 0) : (a != 0 || b != 0));
        },
        0, 1, {DType::Bool}, false, false, true));
  }
  r.push_back(binary(
      "operator+", {"add"}, [](auto& a, auto& b) { return a + b; },
      [](double a, double b) { return a + b; }, -5, 5, kNumeric, true, false));
  r.push_back(binary(
      "operator-", {"sub"}, [](auto& a, auto& b) { return a - b; },
      [](double a, double b) { return a - b; }, -5, 5, kNumeric, true, false));
  r.push_back(binary(
      "operator*", {"mul"}, [](auto& a, auto& b) { return a * b; },
      [](double a, double b) { return a * b; }, -5, 5, kNumeric, true, false));
  r.push_back(binary(
      "operator/", {"div"}, [](auto& a, auto& b) { return a / b; },
      [](double a, double b) { return a / b; }, 0.5, 5, kFloats, true, false));
  struct Cmp {
    const char* name;
    const char* ir;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    std::function<double(double, double)> g;
  };
  for (const Cmp& c : std::vector<Cmp>{{"operator<", "lt", [](auto& a, auto& b) { return a < b; },
                                        [](double a, double b) { return double(a < b); }},
                                       {"operator<=", "le", [](auto& a, auto& b) { return a <= b; },
                                        [](double a, double b) { return double(a <= b); }},
                                       {"operator>", "gt", [](auto& a, auto& b) { return a > b; },
                                        [](double a, double b) { return double(a > b); }},
                                       {"operator>=", "ge", [](auto& a, auto& b) { return a >= b; },
                                        [](double a, double b) { return double(a >= b); }},
                                       {"operator==", "eq", [](auto& a, auto& b) { return a == b; },
                                        [](double a, double b) { return double(a == b); }},
                                       {"operator!=", "ne", [](auto& a, auto& b) { return a != b; },
                                        [](double a, double b) { return double(a != b); }}}) {
    r.push_back(binary(c.name, {c.ir}, c.f, c.g, -2, 2, kAll, false, true, true));
    // values on a grid of halves, so that equality happens
    r.back().cases.push_back({"ties",
                              {{{8}, {}, 0, 0, {-1, 0, 0.5, 1, 1, 2, -2, 1.5}},
                               {{8}, {}, 0, 0, {-1, 0.5, 0.5, 2, 1, 0, -2, 1.5}}}});
  }
  r.push_back(make(
      "where", "", {"where"}, [](const Ts& x) { return loom::where(x[0], x[1], x[2]); }, kAll,
      {{"same", {idx({3, 4}, 2, DType::Bool), in({3, 4}), in({3, 4})}, false, true},
       {"broadcast", {idx({3, 1}, 2, DType::Bool), in({1, 4}), in({})}},
       {"0-d cond", {idx({}, 2, DType::Bool), in({3, 4}), in({3, 4})}},
       {"0-size", {idx({0, 4}, 2, DType::Bool), in({0, 4}), in({4})}}},
      [](const Hs& a) {
        Shape s = bshape(bshape(a[0].shape, a[1].shape), a[2].shape);
        Expected e{a[1].dtype, s, {}, {}};
        for (int64_t k = 0; k < s.numel(); ++k) {
          auto c = coords(k, s);
          e.v.push_back(a[0].v[bindex(c, s, a[0].shape)] != 0 ? a[1].v[bindex(c, s, a[1].shape)]
                                                              : a[2].v[bindex(c, s, a[2].shape)]);
        }
        return e;
      },
      true, true));
  for (DType to : {DType::Float64, DType::Int32, DType::BFloat16, DType::Bool}) {
    r.push_back(make(
        "to", std::string(name(to)), {"convert"}, [to](const Ts& x) { return loom::to(x[0], to); },
        kAll,
        {{"2-d", {in({3, 4}, -9, 9)}, false, to == DType::Float64},
         {"0-d", {in({})}},
         {"0-size", {in({0, 2})}}},
        [to](const Hs& a) {
          Expected e{to, a[0].shape, {}, {}};
          for (double v : a[0].v) {
            switch (to) {
              case DType::Bool: e.v.push_back(v != 0); break;
              case DType::Int32: e.v.push_back(std::trunc(v)); break;
              case DType::BFloat16:
                e.v.push_back(bf16_to_float(float_to_bf16(static_cast<float>(v))));
                break;
              default: e.v.push_back(v);
            }
          }
          return e;
        },
        to == DType::Float64, true));
  }
  return r;
}

std::vector<Row> reduction_rows() {
  std::vector<Row> r;
  const std::vector<DType> sums = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16,
                                   DType::Int32,   DType::Int64,   DType::Bool};
  r.push_back(reduction("sum", "all", Red::Sum, {}, false, true, sums, {"reduce_sum", "convert"}));
  r.push_back(reduction("mean", "all", Red::Mean, {}, false, true, kFloats,
                        {"reduce_sum", "div", "constant"}));
  r.push_back(reduction("max", "all", Red::Max, {}, false, true, kAll, {"reduce_max"}));
  r.push_back(reduction("min", "all", Red::Min, {}, false, true, kAll, {"reduce_min"}));
  // every set of reduced dims (an empty set reduces all), with and without keepdim
  const std::vector<std::vector<int64_t>> dim_sets = {
      {}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}, {-3, -1}, {0, 1, 2}, {2, 0}, {0, -1}};
  for (const std::vector<int64_t>& dims : dim_sets) {
    for (bool keep : {false, true}) {
      std::string v = "dims " + Shape(dims).str() + (keep ? " keepdim" : "");
      r.push_back(
          reduction("sum", v, Red::Sum, dims, keep, false, sums, {"reduce_sum", "convert"}));
      r.push_back(reduction("mean", v, Red::Mean, dims, keep, false, kFloats,
                            {"reduce_sum", "div", "constant"}));
      r.push_back(reduction("max", v, Red::Max, dims, keep, false, kAll, {"reduce_max"}));
      r.push_back(reduction("min", v, Red::Min, dims, keep, false, kAll, {"reduce_min"}));
    }
  }
  auto argmax_cases = [] {
    return std::vector<Case>{
        {"3-d", {in({2, 3, 4}, -5, 5)}},
        {"ties", {given({4}, {1, 5, 5, 2}, DType::Float32)}},
        {"nan", {given({2, 4}, {1, kNaN, 7, kNaN, -kInf, -kInf, -kInf, -kInf}, DType::Float32)}},
        {"0-d", {in({})}}};
  };
  r.push_back(make(
      "argmax", "flat", {"argmax", "reshape"}, [](const Ts& x) { return loom::argmax(x[0]); },
      kNumeric, argmax_cases(), [](const Hs& a) { return argmax_of(a[0], std::nullopt, false); },
      false, true));
  // wide: many ties (integer and bf16 values in [-5, 5]), big and strided inputs
  auto argmax_wide = [](bool big) {
    std::vector<Case> w = {{"permuted", {wperm({5, 4, 6}, -5, 5, {2, 0, 1})}},
                           {"strided", {wstep({4, 3, 5}, -5, 5, 1)}},
                           {"expanded", {wexp({4, 6, 5}, -5, 5)}}};
    if (big) {
      w.push_back({"4097", {wa({4097}, -5, 5)}});
      w.push_back({"37x129", {wa({37, 129}, -5, 5)}});
      w.push_back({"transposed 37x129", {wperm({37, 129}, -5, 5, {1, 0})}});
    }
    return w;
  };
  r.back().wide = argmax_wide(true);
  for (bool keep : {false, true}) {
    r.push_back(make(
        "argmax", keep ? "dim keepdim" : "dim", {"argmax", "reshape"},
        [keep](const Ts& x) { return loom::argmax(x[0], x[0].dim() == 0 ? 0 : -1, keep); },
        kNumeric, argmax_cases(), [keep](const Hs& a) { return argmax_of(a[0], -1, keep); }, false,
        true));
    r.back().cases.push_back({"0-size", {in({2, 0, 3})}});
    r.back().wide = argmax_wide(true);
    for (int64_t dim : {0, 1, 2, -2}) {  // the other dims of a 3-d input
      r.push_back(make(
          "argmax", "dim " + std::to_string(dim) + (keep ? " keepdim" : ""), {"argmax"},
          [keep, dim](const Ts& x) { return loom::argmax(x[0], dim, keep); }, kNumeric,
          {{"3-d", {in({3, 4, 5}, -5, 5)}},
           {"nan", {given({2, 2, 2}, {1, kNaN, 7, kNaN, -kInf, -kInf, 2, 2}, DType::Float32)}},
           {"0-size",
            {in(dim == 0   ? Shape{3, 0, 2}
                : dim == 2 ? Shape{2, 0, 3}
                           : Shape{0, 3, 2})}}},
          [keep, dim](const Hs& a) { return argmax_of(a[0], dim, keep); }, false, true));
      r.back().wide = argmax_wide(false);
    }
  }
  for (bool desc : {false, true}) {
    for (int64_t dim : {-1, 0}) {
      const std::string v = "dim " + std::to_string(dim) + (desc ? " descending" : "");
      r.push_back(make(
          "argsort", v, {"argsort", "reshape"},
          [=](const Ts& x) { return loom::argsort(x[0], dim, desc); }, kNumeric,
          {{"3-d", {in({3, 4, 5}, -5, 5)}},
           {"ties", {given({2, 5}, {1, 5, 5, 2, 5, 0, 0, 0, 0, 0}, DType::Float32)}},
           {"nan", {given({2, 4}, {1, kNaN, 7, kNaN, -kInf, 3, kInf, -kInf}, DType::Float32)}},
           {"0-d", {in({})}},
           {"0-size", {in({2, 0})}}},
          [=](const Hs& a) { return sorted_of(a[0], dim, desc, false); }, false, true));
      r.back().wide = argmax_wide(false);
      r.push_back(make(
          "argsort", v + " (sort's values)", {"argsort", "gather"},
          [=](const Ts& x) { return loom::sort(x[0], dim, desc).first; }, kNumeric,
          {{"3-d", {in({3, 4, 5}, -5, 5)}, false, true},
           {"nan", {given({2, 4}, {1, kNaN, 7, kNaN, -kInf, 3, kInf, -kInf}, DType::Float32)}},
           {"0-d", {in({})}}},
          [=](const Hs& a) { return sorted_of(a[0], dim, desc, true); }, true, true));
    }
  }
  for (bool log : {false, true}) {
    for (int64_t dim : {0, 1, -1}) {
      r.push_back(make(
          log ? "log_softmax" : "softmax", "dim " + std::to_string(dim),
          log ? std::vector<std::string>{"reduce_max", "sub", "exp", "reduce_sum", "log"}
              : std::vector<std::string>{"reduce_max", "sub", "exp", "reduce_sum", "div"},
          [=](const Ts& x) {
            return log ? loom::log_softmax(x[0], dim) : loom::softmax(x[0], dim);
          },
          kFloats,  // integer inputs are refused, as torch
          {{"2-d", {in({3, 4}, -5, 5)}, false, true},
           {"3-d", {in({2, 3, 5}, -5, 5)}},
           {"large logits", {given({2, 2}, {1000, 1000, -1000, 1}, DType::Float32)}},
           {"0-size", {in({0, 3})}}},
          [=](const Hs& a) { return softmax_of(a[0], dim, log); }, true, false, 8));
      const std::vector<double> rows = {-kInf, 0,     1,     2,      // one -inf: probability 0
                                        -kInf, -kInf, -kInf, -kInf,  // all -inf: nan everywhere
                                        kNaN,  1,     2,     3,      // nan: nan row
                                        kInf,  1,     2,     3,      // +inf: nan from inf - inf
                                        1,     kNaN,  -kInf, kInf,   // everything at once
                                        1,     2,     3,     4};
      r.back().wide = {
          {"37x129", {wa({37, 129}, -6, 6)}, false, false, {}, 4},
          {"transposed 37x129", {wperm({37, 129}, -6, 6, {1, 0})}, false, false, {}, 4},
          {"4x7", {wa({4, 7}, -6, 6)}},
          {"strided", {wstep({4, 7}, -6, 6, 0)}},
          {"nan inf rows", {{{6, 4}, {}, 0, 0, rows}}, true}};
      if (dim != 1) {
        r.back().wide.push_back({"1", {wa({1}, -6, 6)}});
        r.back().wide.push_back({"4097", {wa({4097}, -6, 6)}, false, false, {}, 4});
      }
    }
  }
  return r;
}

std::vector<Row> linalg_and_layout_rows() {
  std::vector<Row> r;
  auto mm = [](std::string l, Shape a, Shape b, bool fd = false) {
    return Case{std::move(l), {in(std::move(a), -3, 3), in(std::move(b), -3, 3)}, false, fd};
  };
  r.push_back(make(
      "matmul", "", {"matmul"}, [](const Ts& x) { return loom::matmul(x[0], x[1]); }, kNumeric,
      {mm("2-d", {3, 4}, {4, 2}, true), mm("batched", {2, 3, 4}, {2, 4, 5}),
       mm("broadcast batch", {2, 1, 2, 3}, {3, 3, 2}), mm("2-d x batch", {2, 4}, {3, 4, 3}),
       mm("1-d x 1-d", {5}, {5}), mm("1-d x 2-d", {4}, {4, 3}), mm("2-d x 1-d", {3, 4}, {4}),
       mm("M=0", {0, 3}, {3, 4}), mm("K=0", {3, 0}, {0, 4}), mm("N=0", {3, 4}, {4, 0}),
       mm("1x1", {1, 1}, {1, 1}), mm("batch x 2-d", {3, 2, 4}, {4, 6}),
       mm("1-d x 3-d", {4}, {2, 4, 3}), mm("3-d x 1-d", {2, 3, 4}, {4}),
       // zero-size batches, with and without K = 0 (once a SIGFPE on the cpu backend)
       mm("batch 0, K=0", {0, 2, 0}, {0, 0, 1}), mm("batch 0 x 2-d, K=0", {0, 2, 0}, {0, 1}),
       mm("batch 0", {0, 2, 3}, {0, 3, 4}), mm("broadcast batch 0", {2, 1, 2, 3}, {0, 3, 2}),
       mm("batch x K=0", {3, 2, 0}, {3, 0, 4})},
      [](const Hs& a) { return matmul_of(a[0], a[1]); }, true, false, 4));
  auto mw = [](std::string l, Arg a, Arg b) {
    return Case{std::move(l), {std::move(a), std::move(b)}, false, false, {}, 4};
  };
  r.back().wide = {mw("odd 17x33 33x9", wa({17, 33}, -3, 3), wa({33, 9}, -3, 3)),
                   mw("wide 37x129 129x33", wa({37, 129}, -3, 3), wa({129, 33}, -3, 3)),
                   mw("a @ b^T", wa({3, 4}, -3, 3), wperm({4, 5}, -3, 3, {1, 0})),
                   mw("a^T @ b", wperm({2, 3, 4}, -3, 3, {0, 2, 1}), wa({2, 4, 5}, -3, 3)),
                   mw("a^T @ b^T", wperm({3, 6}, -3, 3, {1, 0}), wperm({6, 4}, -3, 3, {1, 0})),
                   mw("big a @ b^T", wa({37, 129}, -3, 3), wperm({129, 33}, -3, 3, {1, 0})),
                   mw("permuted batch", wperm({2, 3, 4}, -3, 3, {1, 2, 0}), wa({2, 4, 5}, -3, 3)),
                   mw("sliced", wstep({3, 4}, -3, 3, 0), wstep({4, 3}, -3, 3, -1, 3)),
                   mw("expanded", wexp({3, 4}, -3, 3), wa({4, 2}, -3, 3))};
  r.back().ir_ops = {"matmul", "reshape"};
  auto x234 = [] { return std::vector<Case>{{"3-d", {in({2, 3, 4})}, false, true}}; };
  auto same_values = [](Shape out) {
    return [out](const Hs& a) { return Expected{a[0].dtype, out, a[0].v, {}}; };
  };
  r.push_back(make(
      "reshape", "", {"reshape"}, [](const Ts& x) { return loom::reshape(x[0], {4, -1}); }, kAll,
      x234(), same_values({4, 6}), true, true));
  r.push_back(make(
      "reshape", "to 0-d", {"reshape"}, [](const Ts& x) { return loom::reshape(x[0], {}); }, kAll,
      {{"1x1", {in({1, 1})}, false, true}}, same_values({}), true, true));
  r.push_back(make(
      "view", "", {"reshape"}, [](const Ts& x) { return loom::view(x[0], {3, -1}); }, kAll, x234(),
      same_values({3, 8}), true, true));
  r.push_back(make(
      "flatten", "", {"reshape"}, [](const Ts& x) { return loom::flatten(x[0], 1); }, kAll, x234(),
      same_values({2, 12}), true, true));
  r.push_back(make(
      "flatten", "0-d", {"reshape"}, [](const Ts& x) { return loom::flatten(x[0]); }, kAll,
      {{"0-d", {in({})}, false, true}}, same_values({1}), true, true));
  r.push_back(make(
      "unsqueeze", "", {"reshape"}, [](const Ts& x) { return loom::unsqueeze(x[0], -1); }, kAll,
      x234(), same_values({2, 3, 4, 1}), true, true));
  r.push_back(make(
      "squeeze", "all", {"reshape"}, [](const Ts& x) { return loom::squeeze(x[0]); }, kAll,
      {{"ones", {in({1, 3, 1, 2})}, false, true}}, same_values({3, 2}), true, true));
  r.push_back(make(
      "squeeze", "dim", {"reshape"}, [](const Ts& x) { return loom::squeeze(x[0], 0); }, kAll,
      {{"ones", {in({1, 3, 1})}, false, true}}, same_values({3, 1}), true, true));
  auto permuted = [](std::vector<int64_t> p) {
    return [p](const Hs& a) {
      const Shape& s = a[0].shape;
      std::vector<int64_t> out;
      for (int64_t d : p) out.push_back(s[d]);
      return moved(a[0], Shape(out), [&](const std::vector<int64_t>& c) {
        std::vector<int64_t> ic(s.size());
        for (size_t i = 0; i < p.size(); ++i) ic[p[i]] = c[i];
        return flat(ic, s);
      });
    };
  };
  r.push_back(make(
      "permute", "", {"permute"}, [](const Ts& x) { return loom::permute(x[0], {2, 0, 1}); }, kAll,
      x234(), permuted({2, 0, 1}), true, true));
  r.push_back(make(
      "permute", "negative dims", {"permute"},
      [](const Ts& x) { return loom::permute(x[0], {-1, -3, -2}); }, kAll, x234(),
      permuted({2, 0, 1}), true, true));
  r.push_back(make(
      "transpose", "", {"permute"}, [](const Ts& x) { return loom::transpose(x[0], 0, -1); }, kAll,
      x234(), permuted({2, 1, 0}), true, true));
  r.push_back(make(
      "contiguous", "transposed, then view", {"permute", "convert", "reshape"},
      [](const Ts& x) { return loom::view(loom::contiguous(loom::transpose(x[0], 0, -1)), {-1}); },
      kAll, x234(),
      [permuted](const Hs& a) {
        Expected e = permuted({2, 1, 0})(a);
        e.shape = Shape{24};
        return e;
      },
      true, true));
  r.push_back(make(
      "expand", "", {"expand"}, [](const Ts& x) { return loom::expand(x[0], {2, 3, -1}); }, kAll,
      {{"grow rank", {in({3, 1})}, false, true}},
      [](const Hs& a) {
        Shape out{2, 3, 1};
        return moved(a[0], out,
                     [&](const std::vector<int64_t>& c) { return bindex(c, out, a[0].shape); });
      },
      true, true));
  r.back().ir_ops = {"expand"};
  r.push_back(make(
      "expand", "0-d", {"expand"}, [](const Ts& x) { return loom::expand(x[0], {2, 2}); }, kAll,
      {{"0-d", {in({})}, false, true}},
      [](const Hs& a) {
        return Expected{a[0].dtype, Shape{2, 2}, std::vector<double>(4, a[0].v[0]), {}};
      },
      true, true));
  // slice(x, dim, start, end, step) with Python's clamping of the bounds.
  struct Sl {
    int64_t dim, start, end, step;
  };
  for (Sl s :
       std::vector<Sl>{{0, -7, 9, 3}, {1, 1, 3, 1}, {2, 0, 100, 2}, {0, 5, 2, 1}, {-1, 0, -1, 2}}) {
    r.push_back(make(
        "slice",
        std::to_string(s.dim) + " " + std::to_string(s.start) + ":" + std::to_string(s.end) + ":" +
            std::to_string(s.step),
        {"slice"}, [s](const Ts& x) { return loom::slice(x[0], s.dim, s.start, s.end, s.step); },
        kAll, {{"3-d", {in({10, 3, 4})}, false, true}},
        [s](const Hs& a) {
          const Shape& sh = a[0].shape;
          const int64_t d = norm_axis(s.dim, sh.size()), n = sh[d];
          auto clampb = [n](int64_t b) { return std::clamp(b < 0 ? b + n : b, int64_t{0}, n); };
          const int64_t lo = clampb(s.start), hi = clampb(s.end);
          const int64_t len = hi > lo ? (hi - lo + s.step - 1) / s.step : 0;
          std::vector<int64_t> out(sh.begin(), sh.end());
          out[d] = len;
          return moved(a[0], Shape(out), [&](std::vector<int64_t> c) {
            c[d] = lo + c[d] * s.step;
            return flat(c, sh);
          });
        },
        true, true));
  }
  for (auto [dim, index] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {-1, -1}, {2, 3}}) {
    r.push_back(make(
        "select", std::to_string(dim) + " " + std::to_string(index), {"slice", "reshape"},
        [dim, index](const Ts& x) { return loom::select(x[0], dim, index); }, kAll, x234(),
        [dim, index](const Hs& a) {
          const Shape& sh = a[0].shape;
          const int64_t d = norm_axis(dim, sh.size()), i = index < 0 ? index + sh[d] : index;
          std::vector<int64_t> out;
          for (size_t k = 0; k < sh.size(); ++k) {
            if (static_cast<int64_t>(k) != d) out.push_back(sh[k]);
          }
          return moved(a[0], Shape(out), [&](const std::vector<int64_t>& c) {
            std::vector<int64_t> ic(c);
            ic.insert(ic.begin() + d, i);
            return flat(ic, sh);
          });
        },
        true, true));
  }
  r.push_back(make(
      "Tensor::operator[]", "", {"slice", "reshape"}, [](const Ts& x) { return x[0][-1][2]; }, kAll,
      x234(),
      [](const Hs& a) {
        return moved(a[0], Shape{4}, [](const std::vector<int64_t>& c) { return 20 + c[0]; });
      },
      true, true));
  // cat / stack: pieces along an axis, at offsets.
  auto cat_of = [](int64_t dim, bool stack) {
    return [dim, stack](const Hs& a) {
      std::vector<Shape> shapes;
      for (const HostArg& h : a) {
        std::vector<int64_t> s(h.shape.begin(), h.shape.end());
        if (stack) s.insert(s.begin() + norm_axis(dim, s.size() + 1), 1);
        shapes.push_back(Shape(s));
      }
      const int64_t d = norm_axis(dim, shapes[0].size());
      std::vector<int64_t> out(shapes[0].begin(), shapes[0].end());
      out[d] = 0;
      for (const Shape& s : shapes) out[d] += s[d];
      Shape os(out);
      Expected e{a[0].dtype, os, {}, {}};
      for (int64_t k = 0; k < os.numel(); ++k) {
        auto c = coords(k, os);
        size_t p = 0;
        while (c[d] >= shapes[p][d]) c[d] -= shapes[p++][d];
        e.v.push_back(a[p].v[flat(c, shapes[p])]);
      }
      return e;
    };
  };
  r.push_back(make(
      "cat", "dim 1", {"concat"}, [](const Ts& x) { return loom::cat({x[0], x[1], x[2]}, 1); },
      kAll,
      {{"3 pieces", {in({2, 2, 4}), in({2, 1, 4}), in({2, 3, 4})}, false, true},
       {"empty piece", {in({2, 0, 4}), in({2, 3, 4}), in({2, 1, 4})}}},
      cat_of(1, false), true, true));
  r.push_back(make(
      "cat", "dim -1", {"concat"}, [](const Ts& x) { return loom::cat({x[0], x[1]}, -1); }, kAll,
      {{"2 pieces", {in({2, 3}), in({2, 2})}, false, true}}, cat_of(-1, false), true, true));
  r.push_back(make(
      "stack", "dim 1", {"concat", "reshape"},
      [](const Ts& x) { return loom::stack({x[0], x[1]}, 1); }, kAll,
      {{"2-d", {in({2, 3}), in({2, 3})}, false, true}}, cat_of(1, true), true, true));
  r.push_back(make(
      "stack", "0-d", {"concat", "reshape"},
      [](const Ts& x) { return loom::stack({x[0], x[1], x[0]}); }, kAll,
      {{"0-d", {in({}), in({})}, false, true}},
      [](const Hs& a) {
        return Expected{a[0].dtype, Shape{3}, {a[0].v[0], a[1].v[0], a[0].v[0]}, {}};
      },
      true, true));
  return r;
}

std::vector<Row> index_rows() {
  std::vector<Row> r;
  for (DType it : {DType::Int32, DType::Int64}) {
    const std::string iv = std::string(name(it)) + " indices";
    for (int64_t dim : {0, 1, -1}) {
      r.push_back(make(
          "index_select", "dim " + std::to_string(dim) + " " + iv, {"index_select"},
          [dim](const Ts& x) { return loom::index_select(x[0], dim, x[1]); }, kAll,
          {{"3-d", {in({3, 4, 2}), idx({5}, 2, it)}, false, true},
           {"repeats", {in({4, 3, 2}), given({4}, {1, 1, 0, 1}, it)}},
           {"empty index", {in({3, 2, 2}), given({0}, {}, it)}}},
          [dim](const Hs& a) {
            const Shape& sh = a[0].shape;
            const int64_t d = norm_axis(dim, sh.size());
            std::vector<int64_t> out(sh.begin(), sh.end());
            out[d] = a[1].shape.numel();
            return moved(a[0], Shape(out), [&](std::vector<int64_t> c) {
              c[d] = static_cast<int64_t>(a[1].v[c[d]]);
              return flat(c, sh);
            });
          },
          true, true));
    }
    for (int64_t dim : {0, 1}) {
      r.push_back(make(
          "gather", "dim " + std::to_string(dim) + " " + iv, {"gather"},
          [dim](const Ts& x) { return loom::gather(x[0], dim, x[1]); }, kAll,
          {{"like torch", {in({3, 4}), idx({2, 3}, 3, it)}, false, true},
           {"smaller index", {in({3, 3}), given({2, 1}, {2, 0}, it)}},
           {"empty index", {in({3, 4}), given({0, 4}, {}, it)}}},
          [dim](const Hs& a) {
            return moved(a[0], a[1].shape, [&](std::vector<int64_t> c) {
              const int64_t k = flat(c, a[1].shape);
              c[dim] = static_cast<int64_t>(a[1].v[k]);
              return flat(c, a[0].shape);
            });
          },
          true, true));
    }
    r.push_back(make(
        "embedding", iv, {"index_select", "reshape"},
        [](const Ts& x) { return loom::embedding(x[0], x[1]); }, kAll,
        {{"2-d indices", {idx({2, 3}, 5, it), in({5, 3})}, false, true},
         {"1-d", {given({5}, {4, 0, 4, 1, 2}, it), in({5, 3})}},
         {"0-d", {given({}, {3}, it), in({5, 3})}}},
        [](const Hs& a) {
          std::vector<int64_t> out(a[0].shape.begin(), a[0].shape.end());
          const int64_t cols = a[1].shape[1];
          out.push_back(cols);
          Expected e{a[1].dtype, Shape(out), {}, {}};
          for (double i : a[0].v) {
            for (int64_t j = 0; j < cols; ++j)
              e.v.push_back(a[1].v[static_cast<int64_t>(i) * cols + j]);
          }
          return e;
        },
        true, true));
  }
  for (DType it : {DType::Int32, DType::Int64}) {
    const std::string iv = std::string(name(it)) + " indices";
    for (int64_t dim : {0, 1, -1}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      // x [3,4,2]; source: x's shape with the index's length along d.
      auto src = [d](int64_t m) {
        std::vector<int64_t> s{3, 4, 2};
        s[static_cast<size_t>(d)] = m;
        return Shape(s);
      };
      const int64_t e = Shape{3, 4, 2}[d];
      r.push_back(make(
          "index_add", "dim " + std::to_string(dim) + " " + iv, {"index_add"},
          [dim](const Ts& x) { return loom::index_add(x[0], dim, x[1], x[2]); }, kNumeric,
          {{"3-d", {in({3, 4, 2}), idx({5}, e, it), in(src(5))}, false, true},
           {"repeats", {in({3, 4, 2}), given({4}, {1, 1, 0, 1}, it), in(src(4))}},
           {"empty index", {in({3, 4, 2}), given({0}, {}, it), in(src(0))}}},
          [d](const Hs& a) {
            Expected out{a[0].dtype, a[0].shape, a[0].v, {}};
            for (int64_t k = 0; k < a[2].shape.numel(); ++k) {
              std::vector<int64_t> c = coords(k, a[2].shape);
              c[static_cast<size_t>(d)] = static_cast<int64_t>(a[1].v[c[d]]);
              out.v[flat(c, a[0].shape)] += a[2].v[k];
            }
            return out;
          },
          true));
    }
  }
  // The index input of the gather/index_select/index_add rows is integral: the grad check
  // skips it.
  return r;
}

std::vector<Row> nn_rows() {
  std::vector<Row> r;
  auto ln = [](const HostArg& x, int64_t norm, const HostArg* w, const HostArg* b, double eps) {
    Expected e{x.dtype, x.shape, std::vector<double>(x.v.size()), {}};
    for (size_t r0 = 0; r0 < x.v.size(); r0 += norm) {
      double m = 0, var = 0;
      for (int64_t k = 0; k < norm; ++k) m += x.v[r0 + k] / norm;
      for (int64_t k = 0; k < norm; ++k) var += (x.v[r0 + k] - m) * (x.v[r0 + k] - m) / norm;
      for (int64_t k = 0; k < norm; ++k) {
        double y = (x.v[r0 + k] - m) / std::sqrt(var + eps);
        if (w) y *= w->v[k];
        if (b) y += b->v[k];
        e.v[r0 + k] = y;
      }
    }
    return e;
  };
  r.push_back(make(
      "layer_norm", "affine", {"reduce_sum", "div", "sub", "mul", "add", "sqrt", "constant"},
      [](const Ts& x) { return loom::layer_norm(x[0], {4}, x[1], x[2]); }, kFloats,
      {{"3-d", {in({2, 3, 4}, -3, 3), in({4}, 0.5, 2), in({4})}, false, true}},
      [ln](const Hs& a) { return ln(a[0], 4, &a[1], &a[2], 1e-5); }, true, false, 16));
  r.push_back(make(
      "layer_norm", "two dims, no affine",
      {"reduce_sum", "div", "sub", "mul", "add", "sqrt", "constant"},
      [](const Ts& x) { return loom::layer_norm(x[0], {3, 4}, {}, {}, 1e-3); }, kFloats,
      {{"3-d", {in({2, 3, 4}, -3, 3)}, false, true}},
      [ln](const Hs& a) { return ln(a[0], 12, nullptr, nullptr, 1e-3); }, true, false, 16));
  auto ce = [](const HostArg& l, const HostArg& t, bool probs) {
    const int64_t n = l.shape.size() == 1 ? 1 : l.shape[0], c = l.shape.back();
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      double m = -kInf, s = 0;
      for (int64_t k = 0; k < c; ++k) m = std::max(m, l.v[i * c + k]);
      for (int64_t k = 0; k < c; ++k) s += std::exp(l.v[i * c + k] - m);
      for (int64_t k = 0; k < c; ++k) {
        const double p = probs ? t.v[i * c + k] : double(static_cast<int64_t>(t.v[i]) == k);
        loss -= p * (l.v[i * c + k] - m - std::log(s)) / n;
      }
    }
    return Expected{l.dtype, Shape{}, {loss}, {}};
  };
  const std::vector<std::string> ce_ops = {
      "reduce_max", "sub",    "exp",      "reduce_sum", "log",   "reshape", "neg",
      "div",        "gather", "constant", "ne",         "where", "convert"};
  for (DType it : {DType::Int32, DType::Int64}) {
    r.push_back(make(
        "cross_entropy", std::string(name(it)) + " targets", ce_ops,
        [](const Ts& x) { return loom::cross_entropy(x[0], x[1]); }, kFloats,
        {{"batch", {in({3, 4}, -3, 3), idx({3}, 4, it)}, false, true},
         {"1-d", {in({5}, -3, 3), given({}, {2}, it)}}},
        [ce](const Hs& a) { return ce(a[0], a[1], false); }, true, false, 16));
    r.back().wide = {{"37x129", {wa({37, 129}, -6, 6), idx({37}, 129, it)}, false, false, {}, 4}};
  }
  r.push_back(make(
      "cross_entropy", "probabilities",
      {"reduce_max", "sub", "exp", "reduce_sum", "log", "mul", "neg", "div", "constant"},
      [](const Ts& x) { return loom::cross_entropy(x[0], loom::softmax(x[1], 1)); }, kFloats,
      {{"batch", {in({3, 4}, -3, 3), in({3, 4})}, false, true}},
      [ce](const Hs& a) {
        return ce(a[0], HostArg{a[1].dtype, a[1].shape, softmax_of(a[1], 1, false).v}, true);
      },
      true, false, 16));
  r.push_back(make(
      "mse_loss", "", {"sub", "mul", "reduce_sum", "div", "constant"},
      [](const Ts& x) { return loom::mse_loss(x[0], x[1]); }, kFloats,
      {{"2-d", {in({2, 3}), in({2, 3})}, false, true}, {"0-size", {in({0}), in({0})}}},
      [](const Hs& a) {
        if (a[0].v.empty()) return Expected{a[0].dtype, Shape{}, {kNaN}, {}};  // 0 / 0
        double s = 0, mag = 0;
        for (size_t i = 0; i < a[0].v.size(); ++i) {
          s += (a[0].v[i] - a[1].v[i]) * (a[0].v[i] - a[1].v[i]) / a[0].v.size();
          mag += (std::fabs(a[0].v[i]) + std::fabs(a[1].v[i])) *
                 (std::fabs(a[0].v[i]) + std::fabs(a[1].v[i])) / a[0].v.size();
        }
        return Expected{a[0].dtype, Shape{}, {s}, {mag}};
      },
      true, false, 8));
  r.back().wide = {{"37x129", {wa({37, 129}, -6, 6), wa({37, 129}, -2, 2)}, false, false, {}, 8}};
  // dropout: each element is 0 or x / (1 - p); no closed form for which. Masks of the same
  // seed agree bit for bit between ref and cpu, at big shapes and on strided inputs too.
  for (double p : {0.25, 0.5, 0.9, 0.0, 1.0}) {
    Row d = make(
        "dropout",
        p == 0.25  ? "p 0.25"
        : p == 0.5 ? "p 0.5"
        : p == 0.9 ? "p 0.9"
        : p == 0   ? "p 0"
                   : "p 1",
        {"rand_uniform", "ge", "where", "constant", "mul"},
        [p](const Ts& x) { return loom::dropout(x[0], p); }, kFloats,
        {{"1-d", {in({64})}}, {"0-d", {in({})}}, {"0-size", {in({2, 0})}}},
        [](const Hs& a) { return Expected{a[0].dtype, a[0].shape, {}, {}}; }, false, true);
    d.wide = {{"4097", {wa({4097}, -2, 2)}},
              {"37x129", {wa({37, 129}, -2, 2)}},
              {"transposed", {wperm({37, 129}, -2, 2, {1, 0})}}};
    d.property = [p](const Hs& a, const Expected& e,
                     const std::vector<double>& got) -> std::string {
      const double tol = e.dtype == DType::Float64   ? 1e-12
                         : e.dtype == DType::Float32 ? 1e-6
                                                     : 1e-2;
      int64_t kept = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        kept += got[i] != 0;
        if (got[i] != 0 && (p == 1 || std::fabs(got[i] - a[0].v[i] / (1 - p)) >
                                          tol * std::max(1.0, std::fabs(got[i]))))
          return "element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                 ", neither 0 nor x/(1-p)";
        if (p == 0 && got[i] != a[0].v[i]) return "p 0 changed element " + std::to_string(i);
      }
      // at 4097 draws the kept fraction is within 5 standard deviations of 1 - p
      const double n = static_cast<double>(got.size());
      if (n > 1000 && std::fabs(kept / n - (1 - p)) > 5 * std::sqrt(p * (1 - p) / n) + 0.02)
        return "kept " + std::to_string(kept) + " of " + std::to_string(got.size());
      return "";
    };
    if (p == 0) d.ir_ops = {};                   // the identity: no mask is drawn
    if (p == 1) d.ir_ops = {"constant", "mul"};  // every element dropped: x * 0
    r.push_back(std::move(d));
  }
  // scaled_dot_product_attention in double: each score row written out, masked, softmaxed.
  // q [..., H, L, E], k and v [..., H / group, S, E|Ev]; a row with every key masked gives 0.
  auto sdpa = [](const HostArg& q, const HostArg& k, const HostArg& v, const HostArg* mask,
                 bool causal, int64_t group) {
    const size_t r = q.shape.size();
    const int64_t L = q.shape[r - 2], E = q.shape[r - 1], S = k.shape[r - 2], Ev = v.shape[r - 1];
    const int64_t heads = r >= 3 ? q.shape[r - 3] : 1, batches = q.shape.numel() / (L * E);
    std::vector<int64_t> os(q.shape.begin(), q.shape.end());
    os.back() = Ev;
    Expected e{q.dtype, Shape(os), {}, {}};
    std::vector<int64_t> sc(q.shape.begin(), q.shape.end() - 1);
    sc.push_back(S);
    const Shape scores(sc);
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t kb = (b / heads) * (heads / group) + (b % heads) / group;
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(S);
        double top = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < E; ++d)
            acc += q.v[(b * L + i) * E + d] * k.v[(kb * S + j) * E + d];
          acc /= std::sqrt(static_cast<double>(E));
          if (causal && j > i) acc = -kInf;
          if (mask) {
            const double m =
                mask->v[bindex(coords((b * L + i) * S + j, scores), scores, mask->shape)];
            acc = mask->dtype == DType::Bool ? (m != 0 ? acc : -kInf) : acc + m;
          }
          s[j] = acc;
          top = std::max(top, acc);
        }
        double total = 0;
        for (double& x : s) total += (x = top == -kInf ? 0 : std::exp(x - top));
        for (int64_t d = 0; d < Ev; ++d) {
          double acc = 0, mag = 0;
          for (int64_t j = 0; j < S; ++j) {
            acc += s[j] * v.v[(kb * S + j) * Ev + d];
            mag += s[j] * std::fabs(v.v[(kb * S + j) * Ev + d]);
          }
          e.v.push_back(total == 0 ? 0 : acc / total);
          e.scale.push_back(total == 0 ? 0 : mag / total);
        }
      }
    }
    return e;
  };
  const std::vector<std::string> sdpa_ops = {"attention", "convert"};  // half: via float32
  auto attn = [](SdpaOptions o) {
    return [o](const Ts& x) {
      SdpaOptions with = o;
      if (x.size() > 3) with.attn_mask = x[3];
      return loom::scaled_dot_product_attention(x[0], x[1], x[2], with);
    };
  };
  r.push_back(make(
      "scaled_dot_product_attention", "", sdpa_ops, attn({}), kFloats,
      {{"3-d", {in({2, 3, 4}, -2, 2), in({2, 5, 4}, -2, 2), in({2, 5, 6})}, false, true},
       {"one query, one key", {in({1, 1, 2}, -2, 2), in({1, 1, 2}, -2, 2), in({1, 1, 3})}}},
      [sdpa](const Hs& a) { return sdpa(a[0], a[1], a[2], nullptr, false, 1); }, true, false, 8));
  r.back().wide = {{"130 queries x 300 keys",
                    {wa({2, 130, 16}, -2, 2), wa({2, 300, 16}, -2, 2), wa({2, 300, 8}, -2, 2)},
                    false,
                    false,
                    {},
                    4}};
  r.push_back(make(
      "scaled_dot_product_attention", "causal", sdpa_ops, attn({.is_causal = true}), kFloats,
      {{"L < S", {in({1, 2, 5, 3}, -2, 2), in({1, 2, 7, 3}, -2, 2), in({1, 2, 7, 4})}, false, true},
       {"L > S", {in({1, 1, 6, 2}, -2, 2), in({1, 1, 4, 2}, -2, 2), in({1, 1, 4, 2})}}},
      [sdpa](const Hs& a) { return sdpa(a[0], a[1], a[2], nullptr, true, 1); }, true, false, 8));
  r.back().wide = {
      {"200 x 200",
       {wa({1, 2, 200, 8}, -2, 2), wa({1, 2, 200, 8}, -2, 2), wa({1, 2, 200, 8}, -2, 2)},
       false,
       false,
       {},
       4}};
  // Row 1 of the bool mask keeps no key: its output is 0, and its gradients too.
  std::vector<double> keep(4 * 6);
  for (size_t k = 0; k < keep.size(); ++k) keep[k] = k / 6 == 1 ? 0 : (k * 7 % 5) != 0;
  r.push_back(make(
      "scaled_dot_product_attention", "bool mask", sdpa_ops, attn({}), kFloats,
      {{"broadcast mask",
        {in({2, 2, 4, 3}, -2, 2), in({2, 2, 6, 3}, -2, 2), in({2, 2, 6, 3}),
         given({4, 6}, keep, DType::Bool)},
        false,
        true}},
      [sdpa](const Hs& a) { return sdpa(a[0], a[1], a[2], &a[3], false, 1); }, true, false, 8));
  r.push_back(make(
      "scaled_dot_product_attention", "additive mask", sdpa_ops, attn({}), kFloats,
      {{"per-batch mask",
        {in({2, 2, 4, 3}, -2, 2), in({2, 2, 6, 3}, -2, 2), in({2, 2, 6, 3}),
         in({2, 1, 4, 6}, -2, 2)},
        false,
        true}},
      [sdpa](const Hs& a) { return sdpa(a[0], a[1], a[2], &a[3], false, 1); }, true, false, 8));
  r.push_back(make(
      "scaled_dot_product_attention", "grouped heads", sdpa_ops, attn({.enable_gqa = true}),
      kFloats,
      {{"4 q heads, 2 k/v heads",
        {in({1, 4, 3, 2}, -2, 2), in({1, 2, 5, 2}, -2, 2), in({1, 2, 5, 3})},
        false,
        true}},
      [sdpa](const Hs& a) { return sdpa(a[0], a[1], a[2], nullptr, false, 2); }, true, false, 8));
  // qkv [B, T, 3 d] of 2 heads: q, k, v split and moved to [B, 2, T, d / 2], causal attention,
  // the heads joined back.
  r.push_back(make(
      "packed_qkv_attention", "", {"slice", "reshape", "permute", "attention", "convert"},
      [](const Ts& x) { return loom::packed_qkv_attention(x[0], 2); }, kFloats,
      {{"2 heads", {in({2, 3, 12}, -2, 2)}, false, true}},
      [sdpa](const Hs& a) {
        const int64_t B = a[0].shape[0], T = a[0].shape[1], d = a[0].shape[2] / 3, hd = d / 2;
        auto head = [&](int64_t part) {
          HostArg h{a[0].dtype, Shape{B, 2, T, hd}, {}};
          for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < 2; ++n)
              for (int64_t t = 0; t < T; ++t)
                for (int64_t e = 0; e < hd; ++e)
                  h.v.push_back(a[0].v[(b * T + t) * 3 * d + part * d + n * hd + e]);
          return h;
        };
        Expected o = sdpa(head(0), head(1), head(2), nullptr, true, 1);
        Expected e{o.dtype, Shape{B, T, d}, {}, {}};
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < 2; ++n)
              for (int64_t k = 0; k < hd; ++k) {
                e.v.push_back(o.v[((b * 2 + n) * T + t) * hd + k]);
                e.scale.push_back(o.scale[((b * 2 + n) * T + t) * hd + k]);
              }
        return e;
      },
      true, false, 8));
  r.push_back(make(
      "dropout", "eval", {}, [](const Ts& x) { return loom::dropout(x[0], 0.3, false); }, kFloats,
      {{"2-d", {in({2, 3})}, false, true}},
      [](const Hs& a) { return Expected{a[0].dtype, a[0].shape, a[0].v, {}}; }, true, true));
  return r;
}

// Factories (loom/trace/tensor.h) reach the source and random ops.
std::vector<Row> factory_rows() {
  std::vector<Row> r;
  auto filled = [](Shape s, double v) {
    return [s, v](const Hs&) {
      return Expected{DType::Float32, s, std::vector<double>(s.numel(), v), {}};
    };
  };
  for (DType dt : kAll) {
    const std::string dn(name(dt));
    auto typed = [dt](ClosedForm f) {
      return [dt, f](const Hs& a) {
        Expected e = f(a);
        e.dtype = dt;
        if (dt == DType::Bool)
          for (double& v : e.v) v = v != 0;
        else if (!is_floating(dt))
          for (double& v : e.v) v = std::trunc(v);
        return e;
      };
    };
    r.push_back(make(
        "zeros", dn, {"expand"}, [dt](const Ts&) { return loom::zeros({2, 3}, dt); }, {dt},
        {{"2-d", {}}}, typed(filled({2, 3}, 0)), false, true));
    r.push_back(make(
        "ones", dn, {"expand"}, [dt](const Ts&) { return loom::ones({4}, dt); }, {dt},
        {{"1-d", {}}}, typed(filled({4}, 1)), false, true));
    r.push_back(make(
        "full", dn, {"expand"}, [dt](const Ts&) { return loom::full({3, 2}, 1.5, dt); }, {dt},
        {{"2-d", {}}}, typed(filled({3, 2}, 1.5)), false, true));
    if (dt == DType::Bool) continue;
    // Integer dtypes start at a whole number: loom's arange(-2.5, 3, int64) has 6 elements,
    // torch 1.13's has 5 (left to the semantics work of issue 13).
    const bool whole = !is_floating(dt);
    std::vector<std::string> ir = {"iota", "add"};
    if (dt != DType::Float64 && dt != DType::Int64) ir.push_back("convert");
    r.push_back(make(
        "arange", dn, ir, [dt, whole](const Ts&) { return loom::arange(whole ? -2 : -2.5, 3, dt); },
        {dt}, {{"start", {}}}, typed([whole](const Hs&) {
          return whole ? Expected{DType::Float32, Shape{5}, {-2, -1, 0, 1, 2}, {}}
                       : Expected{DType::Float32, Shape{6}, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5}, {}};
        }),
        false, true));
  }
  for (bool normal : {false, true})
    for (DType dt : kFloats) {
      Row rr = make(
          normal ? "randn" : "rand", std::string(name(dt)),
          {normal ? "rand_normal" : "rand_uniform"},
          [normal, dt](const Ts& x) {  // the shape of the (unused) input
            return normal ? loom::randn(x[0].shape(), dt) : loom::rand(x[0].shape(), dt);
          },
          {dt},
          {{"2-d", {shape_of({5, 3})}},
           {"0-d", {shape_of({})}},
           {"1", {shape_of({1})}},
           {"3", {shape_of({3})}},
           {"0", {shape_of({0})}},
           {"0-size", {shape_of({2, 0, 3})}}},
          [dt](const Hs& a) { return Expected{dt, a[0].shape, {}, {}}; }, false, true);
      // the same seed gives the same bits on ref and cpu (core/philox.h rounded once)
      rr.wide = {{"4097", {shape_of({4097})}}, {"37x129", {shape_of({37, 129})}}};
      rr.property = [normal](const Hs&, const Expected&,
                             const std::vector<double>& got) -> std::string {
        for (double v : got) {
          if (!std::isfinite(v) || (!normal && (v < 0 || v > 1)))
            return "a draw out of range: " + std::to_string(v);
        }
        return "";
      };
      r.push_back(std::move(rr));
    }
  return r;
}

}  // namespace

// Rows without wide cases of their own get non-contiguous variants of their first case with
// an input of rank >= 2: every such input permuted (dims reversed), the first input strided
// along dim 0, the first input expanded along dim 0.
void add_layout_variants(Row* row) {
  if (!row->wide.empty()) return;
  for (const Case& c : row->cases) {
    bool fits = !c.args.empty() && c.args[0].shape.size() >= 1 && c.args[0].shape[0] > 0;
    bool any2 = false;
    for (const Arg& a : c.args) any2 = any2 || (a.shape.size() >= 2 && a.shape.numel() > 0);
    if (!fits || !any2) continue;
    Case perm = c, strided = c, expanded = c;
    perm.label += " permuted";
    perm.fd = strided.fd = expanded.fd = false;
    for (Arg& a : perm.args) {
      if (a.shape.size() < 2) continue;
      for (size_t d = a.shape.size(); d-- > 0;) a.perm.push_back(static_cast<int64_t>(d));
    }
    strided.label += " strided";
    strided.args[0].step = 2;
    strided.args[0].step_dim = 0;
    expanded.label += " expanded";
    expanded.args[0].expand0 = true;
    row->wide = {perm, strided, expanded};
    return;
  }
}

const std::vector<Row>& op_rows() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> all;
    for (auto* part : {&elementwise_rows, &reduction_rows, &linalg_and_layout_rows, &index_rows,
                       &nn_rows, &factory_rows}) {
      for (Row& r : (*part)()) all.push_back(std::move(r));
    }
    for (Row& r : all) add_layout_variants(&r);
    return all;
  }();
  return rows;
}

}  // namespace loom::optest
