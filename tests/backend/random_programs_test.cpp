// Random differential programs: a seeded generator of well-typed programs (elementwise ops,
// reductions, layout ops and matrix products on random shapes of rank 0-4) that runs each
// program on the reference interpreter and on the cpu backend and compares the outputs.
//
// Floats are compared against an error bound that the generator carries beside every value:
// `mag` bounds |element| and `err` bounds one backend's distance from exact arithmetic, so
// two backends may differ by 2 * err. Values that every correct backend must reproduce bit
// for bit (integers, bool, and data movement or selection of such values) are `exact`; only
// exact values feed comparisons, argmax and float-to-int conversions, whose results would
// otherwise flip on a rounding difference. Magnitudes are kept in range by power-of-two
// rescaling, so the bounds stay tight enough to catch indexing mistakes.
//
// LOOM_RANDOM_PROGRAMS=n sets the number of programs (default 1000), LOOM_RANDOM_SEED the
// first seed; program i uses seed + i, and a mismatch prints both and the program's IR.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/diff_util.h"

namespace loom::difftest {
namespace {

using RandomPrograms = DiffTest;

constexpr int64_t kMaxNumel = 1024;  // keeps 1000 programs within a few seconds on ref
constexpr double kSoftMag = 64;      // floats above this are rescaled by a power of two

int category(DType d) { return d == DType::Bool ? 0 : is_integral(d) ? 1 : 2; }

// PyTorch's result type of a binary op (mirrors src/trace/ops.cpp).
DType result_type(const Tensor& a, const Tensor& b) {
  if ((a.dim() > 0) == (b.dim() > 0)) return promote_types(a.dtype(), b.dtype());
  const Tensor& dimmed = a.dim() > 0 ? a : b;
  const Tensor& zero_dim = a.dim() > 0 ? b : a;
  return category(zero_dim.dtype()) > category(dimmed.dtype()) ? zero_dim.dtype()
                                                                : dimmed.dtype();
}
DType result_type(DType t, bool scalar_is_int) {
  const int cs = scalar_is_int ? 1 : 2;
  return cs > category(t) ? (cs == 1 ? DType::Int64 : DType::Float32) : t;
}

// Unit roundoff; the smallest subnormal (a rounding floor near zero); a magnitude that leaves
// headroom below the largest finite value; the largest integer.
double unit(DType t) {
  switch (t) {
    case DType::BFloat16: return 0x1p-8;
    case DType::Float16: return 0x1p-11;
    case DType::Float32: return 0x1p-24;
    case DType::Float64: return 0x1p-53;
    default: return 0;
  }
}
double tiny(DType t) {
  switch (t) {
    case DType::Float16: return 0x1p-24;
    case DType::Float64: return 1e-300;
    default: return 0x1p-126;
  }
}
double limit(DType t) {
  switch (t) {
    case DType::Float16: return 3e4;
    case DType::Float64: return 1e300;
    default: return 1e37;
  }
}
double int_max(DType t) {
  return t == DType::Bool ? 1 : t == DType::Int32 ? 0x1p31 : 0x1p63;
}
int mantissa_bits(DType t) {
  switch (t) {
    case DType::BFloat16: return 8;
    case DType::Float16: return 11;
    case DType::Float32: return 24;
    default: return 53;
  }
}
// A transcendental's error in units of its result: a few ulps in float32 and float64; for the
// 16-bit types, computed wider and rounded once, little more than the rounding.
double trans_unit(DType t) {
  return t == DType::BFloat16 || t == DType::Float16 ? 1.5 * unit(t) : 4 * unit(t);
}
// Drift of a reordered sum of n terms, per unit of the sum of |terms|.
double drift(DType t, int64_t n) {
  return std::sqrt(static_cast<double>(std::max<int64_t>(n, 1))) * (t == DType::Float64 ? 1e-14 : 1e-6);
}
DType float_of(DType t) { return is_floating(t) ? t : DType::Float32; }

// A value of the program with what the generator knows about it.
struct Val {
  Tensor t;
  double mag = 0;      // bound on |element|
  double err = 0;      // bound on |computed - exact| on one backend
  bool exact = true;   // every correct backend gives the same bits
  bool input = false;  // made from host data (not an op result)
};

// v's metadata after conversion to dtype `to`, or false when the conversion could overflow or
// needs an exact source (float to int or bool).
bool converted(const Val& v, DType to, Val* out) {
  const DType from = v.t.dtype();
  *out = v;
  if (from == to) return true;
  if (!is_floating(to)) {  // truncation is discontinuous: only exact sources
    if (is_floating(from) && !v.exact) return false;
    out->exact = true;
    out->err = 0;
    out->mag = std::min(v.mag, int_max(to));
    return true;
  }
  if (v.mag > limit(to)) return false;
  if (!is_floating(from)) {
    const bool fits = v.mag <= std::ldexp(1.0, mantissa_bits(to));
    out->exact = v.exact && fits;
    out->err = fits ? 0 : 2 * unit(to) * v.mag;
    return true;
  }
  if (mantissa_bits(to) < mantissa_bits(from) || to == DType::Float16) {  // narrowing
    out->exact = false;
    out->err = v.err + unit(to) * v.mag + tiny(to);
  }
  return true;
}

bool broadcast(const Shape& a, const Shape& b, Shape* out) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> s(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    s[i] = da == 1 ? db : da;
  }
  *out = Shape(s);
  return r <= 4 && out->numel() <= kMaxNumel;
}

class ProgramGenerator {
 public:
  explicit ProgramGenerator(uint64_t seed, std::vector<std::string>* log = nullptr)
      : rng_(seed), data_seed_(static_cast<uint32_t>(seed * 2654435761u)), log_(log) {}

  // Traces one program (5-30 ops) and hands 2-4 of its values to `outs`; every other value
  // is dropped before the sync, so a backend may fuse through it.
  void build(Outs& outs) {
    const int64_t target = 5 + static_cast<int64_t>(below(26));
    allow_empty_ = chance(0.15);
    for (int64_t k = 1 + below(3); k > 0; --k) fresh_input(random_shape());
    for (int attempts = 0; ops_ < target && attempts < 2000; ++attempts) {
      const uint64_t c = below(100);
      const bool ok = c < 28   ? unary()
                      : c < 55 ? binary()
                      : c < 70 ? reduction()
                      : c < 92 ? layout()
                               : matmul_op();
      if (ok) rescale_last();
    }
    std::vector<size_t> picked = {pool_.size() - 1};
    const size_t want = 2 + below(3);
    for (int tries = 0; picked.size() < want && tries < 20; ++tries) {
      const size_t i = static_cast<size_t>(below(pool_.size()));
      if (!pool_[i].input && std::find(picked.begin(), picked.end(), i) == picked.end())
        picked.push_back(i);
    }
    for (size_t i : picked) {
      const Val& v = pool_[i];
      const DType dt = v.t.dtype();
      const std::string name = "%v" + std::to_string(i);
      if (v.exact || !is_floating(dt)) outs.exact(name, v.t);
      else outs.custom(name, v.t, Tol{unit(dt), 2 * v.err + 2 * tiny(dt)});
    }
    pool_.clear();
  }
  int64_t ops() const { return ops_; }

 private:
  uint64_t below(uint64_t n) { return rng_() % n; }
  bool chance(double p) { return static_cast<double>(rng_() >> 11) * 0x1p-53 < p; }
  int64_t between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(hi - lo + 1)); }

  // Extents 1-7, sometimes larger; 0 only in the programs that allow empty tensors (0 spreads
  // through broadcasting and would leave most programs with nothing to compute).
  int64_t extent() {
    if (chance(0.04)) return between(8, 40);
    return allow_empty_ && chance(0.15) ? 0 : between(1, 7);
  }
  Shape random_shape() {
    for (;;) {
      const uint64_t r = below(20);
      const int64_t rank = r < 2 ? 0 : r < 7 ? 1 : r < 13 ? 2 : r < 17 ? 3 : 4;
      std::vector<int64_t> s;
      for (int64_t d = 0; d < rank; ++d) s.push_back(extent());
      if (Shape(s).numel() <= kMaxNumel) return Shape(s);
    }
  }
  DType random_dtype() {
    const uint64_t r = below(20);
    return r < 7 ? DType::Float32 : r < 9 ? DType::Float64 : r < 11 ? DType::BFloat16
         : r < 13 ? DType::Float16 : r < 16 ? DType::Int32 : r < 18 ? DType::Int64 : DType::Bool;
  }

  bool emit(Val v, const char* what) {
    push(std::move(v), what);
    return true;
  }
  const Val& push(Val v, const char* what) {
    if (log_) {
      std::ostringstream os;
      os << "%v" << pool_.size() << " = " << what << " : " << TensorType{v.t.dtype(), v.t.shape()}
         << " mag " << v.mag << " err " << v.err << (v.exact ? " exact" : "");
      log_->push_back(os.str());
    }
    if (!v.input) ++ops_;
    pool_.push_back(std::move(v));
    return pool_.back();
  }

  // A host-data input (sometimes a seeded rand/randn draw, which every backend reproduces).
  const Val& fresh_input(const Shape& s, DType dt = DType::Float32, bool any_dtype = true) {
    if (any_dtype) dt = random_dtype();
    Val v;
    v.input = true;
    if (is_floating(dt) && chance(0.08)) {
      const bool normal = chance(0.5);
      v.t = normal ? randn(s, dt) : rand(s, dt);
      v.mag = normal ? 6 : 1;
      return push(std::move(v), normal ? "randn" : "rand");
    }
    const double range = dt == DType::Bool ? 1 : is_floating(dt) ? 2 : 5;
    v.t = input(dt, s, data_seed_++, -range, range);
    v.mag = range;
    return push(std::move(v), "input");
  }

  // A pool value, biased toward recent ones so that chains form.
  Val pick() {
    const size_t n = pool_.size();
    if (n > 3 && chance(0.6)) return pool_[n - 1 - below(3)];
    return pool_[below(n)];
  }

  // A second operand whose shape broadcasts with a's.
  Val partner(const Val& a) {
    Shape out;
    if (chance(0.45)) {
      std::vector<size_t> fits;
      for (size_t i = 0; i < pool_.size(); ++i)
        if (broadcast(a.t.shape(), pool_[i].t.shape(), &out)) fits.push_back(i);
      if (!fits.empty()) return pool_[fits[below(fits.size())]];
    }
    const DType dt = chance(0.6) ? a.t.dtype() : random_dtype();
    if (chance(0.1)) return fresh_input({}, dt, false);
    const Shape& s = a.t.shape();
    std::vector<int64_t> p(s.begin() + static_cast<int64_t>(below(s.size() + 1)), s.end());
    for (int64_t& e : p)
      if (chance(0.3)) e = 1;
    if (chance(0.2) && s.size() < 4) p.insert(p.begin(), between(1, 3));
    if (!broadcast(s, Shape(p), &out)) p.clear();
    return fresh_input(Shape(p), dt, false);
  }

  // Float results above kSoftMag are scaled by a power of two (exact but for f16 underflow).
  void rescale_last() {
    Val v = pool_.back();
    if (!is_floating(v.t.dtype()) || v.mag <= kSoftMag) return;
    const double s = std::ldexp(1.0, -static_cast<int>(std::ceil(std::log2(v.mag))));
    v.t = v.t * s;
    v.mag *= s;
    v.err *= s;
    v.exact = v.exact && v.t.dtype() != DType::Float16;
    v.input = false;
    push(std::move(v), "rescale");
  }

  bool unary();
  bool binary();
  bool reduction();
  bool layout();
  bool layout_cat();
  bool matmul_op();

  std::mt19937_64 rng_;
  uint32_t data_seed_;
  std::vector<std::string>* log_;
  std::vector<Val> pool_;
  int64_t ops_ = 0;
  bool allow_empty_ = false;
};

bool ProgramGenerator::unary() {
  const Val x = pick();
  const DType dt = x.t.dtype();
  const DType ft = float_of(dt);
  Val xf, r;
  if (!converted(x, ft, &xf)) return false;
  const double u = unit(ft), tu = trans_unit(ft), m = xf.mag;
  const bool is_bool = dt == DType::Bool;
  r.exact = false;
  switch (below(16)) {
    case 0:
    case 1:
    case 2: {  // neg, abs, relu: exact moves of the sign
      if (is_bool) return false;
      const uint64_t k = below(3);
      r = x;
      r.input = false;
      r.t = k == 0 ? neg(x.t) : k == 1 ? abs(x.t) : relu(x.t);
      return emit(r, k == 0 ? "neg" : k == 1 ? "abs" : "relu");
    }
    case 3:
      if (!x.exact) return false;
      r = {logical_not(x.t), 1, 0, true};
      return emit(r, "logical_not");
    case 4:
      if (m > 3) return false;
      r.t = exp(x.t);
      r.mag = std::exp(m);
      r.err = r.mag * (xf.err + tu) + tiny(ft);
      return emit(r, "exp");
    case 5:
    case 6:
    case 7: {  // tanh, sin, cos: 1-Lipschitz, bounded by 1
      const uint64_t k = below(3);
      r.t = k == 0 ? tanh(x.t) : k == 1 ? sin(x.t) : cos(x.t);
      r.mag = k == 2 ? 1 : std::min(m, 1.0);
      r.err = xf.err + tu + tiny(ft);
      return emit(r, k == 0 ? "tanh" : k == 1 ? "sin" : "cos");
    }
    case 8:
      if (m > 30) return false;
      r.t = sigmoid(x.t);
      r.mag = 1;
      r.err = xf.err / 4 + tu + 3 * u + tiny(ft);
      return emit(r, "sigmoid");
    case 9:
      r.t = gelu(x.t);
      r.mag = m;
      r.err = 1.2 * xf.err + (tu + 3 * u) * (m + 1) + tiny(ft);
      return emit(r, "gelu");
    case 10:
    case 11: {  // sqrt(|x| + 1) and log(|x| + 1): no domain errors, derivatives <= 1
      Tensor a = abs(to(x.t, ft)) + 1;
      const bool is_sqrt = below(2) == 0;
      r.t = is_sqrt ? sqrt(a) : log(a);
      r.mag = is_sqrt ? std::sqrt(m + 1) : std::log(m + 1);
      r.err = xf.err + u * (m + 1) + tu * std::max(r.mag, 1.0) + tiny(ft);
      return emit(r, is_sqrt ? "sqrt(|x|+1)" : "log(|x|+1)");
    }
    case 12: {  // square through pow; integers wrap exactly
      r.t = pow(x.t, 2);
      const DType rt = r.t.dtype();
      if (!is_floating(rt)) {
        r = {r.t, std::min(x.mag * x.mag, int_max(rt)), 0, true};
      } else {
        r.mag = m * m;
        r.err = 2 * m * xf.err + xf.err * xf.err + tu * r.mag + tiny(ft);
      }
      return emit(r, "pow 2");
    }
    case 13: {  // a host number: x * c, x + c, c - x, x / c
      static const double kConsts[] = {0.5, -2, 3, 1.5, -0.25, 2};
      const bool as_int = chance(0.4);
      const double c = as_int ? (chance(0.5) ? 2 : -3) : kConsts[below(6)];
      const DType rt = result_type(dt, as_int);
      const uint64_t form = below(4);
      const DType out = form == 3 && !is_floating(rt) ? DType::Float32 : rt;
      Val xc;
      if (!converted(x, out, &xc)) return false;
      Scalar sc = as_int ? Scalar(static_cast<int64_t>(c)) : Scalar(c);
      r.t = form == 0 ? x.t * sc : form == 1 ? x.t + sc : form == 2 ? sc - x.t : x.t / sc;
      const double ac = std::fabs(c);
      if (!is_floating(out)) {
        r = {r.t, std::min(form == 0 ? xc.mag * ac : xc.mag + ac, int_max(out)), 0, true};
      } else {
        r.mag = form == 0 ? xc.mag * ac : form == 3 ? xc.mag / ac : xc.mag + ac;
        r.err = (form == 0 ? ac : form == 3 ? 1 / ac : 1) * xc.err + unit(out) * r.mag + tiny(out);
      }
      return emit(r, "host scalar");
    }
    case 14: {  // clamp, one or both sides
      static const double kBounds[] = {0, 0.5, 1, 2};
      std::optional<double> lo, hi;
      if (chance(0.7)) lo = -kBounds[below(4)];
      if (!lo || chance(0.7)) hi = kBounds[below(4)];
      Val xc;
      if (!converted(x, result_type(dt, false), &xc)) return false;
      r = xc;
      r.input = false;
      r.t = clamp(x.t, lo, hi);
      if (hi) r.mag = std::min(r.mag, std::max(*hi, lo ? std::fabs(*lo) : 0.0));
      if (lo && !hi) r.mag = std::max(r.mag, std::fabs(*lo));
      return emit(r, "clamp");
    }
    default: {
      const DType to_dt = kAllDTypes[below(7)];
      if (!converted(x, to_dt, &r)) return false;
      r.input = false;
      r.t = to(x.t, to_dt);
      return emit(r, "to");
    }
  }
}

bool ProgramGenerator::binary() {
  const Val a = pick();
  const Val b = partner(a);
  Shape shape;
  if (!broadcast(a.t.shape(), b.t.shape(), &shape)) return false;
  const DType dt = result_type(a.t, b.t);
  Val ca, cb, r;
  if (!converted(a, dt, &ca) || !converted(b, dt, &cb)) return false;
  const double u = unit(dt);
  const bool integral = !is_floating(dt);
  const uint64_t k = below(9);
  if (k <= 3 && dt == DType::Bool) return false;
  switch (k) {
    case 0:
    case 1: {
      r.t = k == 0 ? a.t + b.t : a.t - b.t;
      r.mag = std::min(ca.mag + cb.mag, integral ? int_max(dt) : kInf);
      r.err = ca.err + cb.err + u * r.mag + tiny(dt);
      r.exact = integral;
      return emit(r, k == 0 ? "add" : "sub");
    }
    case 2:
      r.t = a.t * b.t;
      r.mag = std::min(ca.mag * cb.mag, integral ? int_max(dt) : kInf);
      r.err = ca.err * cb.mag + cb.err * ca.mag + ca.err * cb.err + u * r.mag + tiny(dt);
      r.exact = integral;
      return emit(r, "mul");
    case 3: {  // a / (|b| + 1): true division away from zero
      if (b.t.dtype() == DType::Bool) return false;
      Tensor d = abs(b.t) + 1;
      const DType out = float_of(result_type(a.t, d));
      Val dv{d, b.mag + 1, b.err + unit(d.dtype()) * (b.mag + 1), is_integral(d.dtype())};
      Val qa, qd;
      if (!converted(a, out, &qa) || !converted(dv, out, &qd)) return false;
      r.t = a.t / d;
      r.mag = qa.mag;
      r.err = qa.err + qa.mag * qd.err + unit(out) * qa.mag + tiny(out);
      r.exact = false;
      return emit(r, "div");
    }
    case 4:
    case 5:
      r.t = k == 4 ? maximum(a.t, b.t) : minimum(a.t, b.t);
      r.mag = std::max(ca.mag, cb.mag);
      r.err = std::max(ca.err, cb.err);
      r.exact = ca.exact && cb.exact;
      return emit(r, k == 4 ? "maximum" : "minimum");
    case 6: {
      if (!ca.exact || !cb.exact) return false;
      const uint64_t c = below(6);
      r.t = c == 0 ? a.t < b.t : c == 1 ? a.t <= b.t : c == 2 ? a.t > b.t
          : c == 3 ? a.t >= b.t : c == 4 ? a.t == b.t : a.t != b.t;
      r.mag = 1;
      return emit(r, "compare");
    }
    default: {  // where, on an exact condition
      Tensor cond;
      if (ca.exact && cb.exact && chance(0.5)) {
        cond = a.t > b.t;
      } else {
        for (const Val& v : pool_) {
          Shape s;
          if (v.exact && v.t.dtype() == DType::Bool && broadcast(shape, v.t.shape(), &s)) cond = v.t;
        }
        if (!cond.defined()) cond = fresh_input(a.t.shape(), DType::Bool, false).t;
      }
      Shape s;
      if (!broadcast(shape, cond.shape(), &s)) return false;
      r.t = where(cond, a.t, b.t);
      r.mag = std::max(ca.mag, cb.mag);
      r.err = std::max(ca.err, cb.err);
      r.exact = ca.exact && cb.exact;
      return emit(r, "where");
    }
  }
}

bool ProgramGenerator::reduction() {
  Val x = pick();
  const Shape& s = x.t.shape();
  const DType dt = x.t.dtype();
  const int64_t rank = s.rank();
  std::vector<int64_t> dims;
  int64_t n = 1;
  bool empty_axis = false;
  for (int64_t d = 0; d < rank; ++d) {
    if (!chance(0.5)) continue;
    dims.push_back(chance(0.3) ? d - rank : d);
    n *= s[d];
    empty_axis = empty_axis || s[d] == 0;
  }
  if (dims.empty()) {
    n = s.numel();
    empty_axis = n == 0;
  }
  const bool keepdim = chance(0.5);
  const uint64_t k = below(7);
  Val r;
  if (k <= 1) {  // sum (integers and bool accumulate in int64)
    if (!is_floating(dt)) {
      r = {sum(x.t, dims, keepdim), std::min(x.mag * static_cast<double>(n), 0x1p63), 0, true};
      return emit(r, "sum");
    }
    if (x.mag * static_cast<double>(n) > limit(dt)) return false;
    r.t = dims.empty() && !keepdim && chance(0.3) ? sum(x.t) : sum(x.t, dims, keepdim);
    r.mag = x.mag * static_cast<double>(n);
    r.err = static_cast<double>(n) * x.err + r.mag * drift(dt, n) + unit(dt) * r.mag + tiny(dt);
    r.exact = false;
    return emit(r, "sum");
  }
  if (k == 2) {  // mean of an empty axis is nan on every backend
    if (!is_floating(dt)) return false;
    r.t = mean(x.t, dims, keepdim);
    r.mag = x.mag;
    r.err = x.err + x.mag * drift(dt, n) + 2 * unit(dt) * x.mag + tiny(dt);
    r.exact = false;
    return emit(r, "mean");
  }
  if (k <= 4) {  // max, min select an element: exact when x is
    if (empty_axis) return false;
    r = x;
    r.input = false;
    r.t = k == 3 ? max(x.t, dims, keepdim) : min(x.t, dims, keepdim);
    return emit(r, k == 3 ? "max" : "min");
  }
  const int64_t d = rank == 0 ? 0 : between(-rank, rank - 1);
  const int64_t ext = rank == 0 ? 1 : s[d < 0 ? d + rank : d];
  if (k == 5) {  // argmax: ties and near-ties would flip on rounding, so exact inputs only
    if (!x.exact || dt == DType::Bool || ext == 0) return false;
    const bool flat = chance(0.25);
    if (flat && s.numel() == 0) return false;
    r = {flat ? argmax(x.t) : argmax(x.t, d, keepdim),
         static_cast<double>(flat ? s.numel() : ext), 0, true};
    return emit(r, "argmax");
  }
  Val xf;  // softmax: |ds| <= 2 max|dx|, plus the rounding of x - max and of the sum
  if (ext == 0 || !converted(x, float_of(dt), &xf)) return false;
  const DType ft = float_of(dt);
  r.t = softmax(x.t, d);
  r.mag = 1;
  r.err = 2 * xf.err + unit(ft) * (2 * xf.mag + 3) + trans_unit(ft) + drift(ft, ext) + tiny(ft);
  r.exact = false;
  return emit(r, "softmax");
}

bool ProgramGenerator::layout() {
  Val r = pick();
  r.input = false;
  const Tensor x = r.t;
  const Shape& s = x.shape();
  const int64_t rank = s.rank();
  auto axis = [&](int64_t rk) { return between(-rk, rk - 1); };
  switch (below(11)) {
    case 0: {
      if (rank < 2) return false;
      std::vector<int64_t> perm(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i) perm[i] = i;
      for (int64_t i = rank - 1; i > 0; --i) std::swap(perm[i], perm[below(i + 1)]);
      r.t = permute(x, perm);
      return emit(r, "permute");
    }
    case 1:
      r.t = rank == 0 ? transpose(x, 0, -1) : transpose(x, axis(rank), axis(rank));
      return emit(r, "transpose");
    case 2: {
      if (rank == 0) return false;
      const int64_t d = axis(rank), n = s[d < 0 ? d + rank : d];
      const int64_t step = chance(0.5) ? 1 : between(2, 3);
      r.t = slice(x, d, between(-n - 1, n), between(-n - 1, n + 2), step);
      return emit(r, "slice");
    }
    case 3: {
      if (rank == 0) return false;
      const int64_t d = axis(rank), n = s[d < 0 ? d + rank : d];
      if (n == 0) return false;
      r.t = select(x, d, between(-n, n - 1));
      return emit(r, "select");
    }
    case 4: {  // expand the 1s, maybe add leading dims
      std::vector<int64_t> target;
      for (int64_t k = below(3); k > 0 && static_cast<int64_t>(target.size()) + rank < 4; --k)
        target.push_back(between(1, 4));
      for (int64_t e : s) target.push_back(e == 1 ? between(allow_empty_ ? 0 : 1, 5) : chance(0.3) ? -1 : e);
      std::vector<int64_t> real = target;
      for (size_t i = 0; i < real.size(); ++i)
        if (real[i] == -1) real[i] = s[i - (real.size() - static_cast<size_t>(rank))];
      if (Shape(real).numel() > kMaxNumel) return false;
      r.t = expand(x, target);
      return emit(r, "expand");
    }
    case 5: {  // reshape or view to a random factorization of numel
      const int64_t n = s.numel();
      std::vector<int64_t> out;
      if (n == 0) {
        for (int64_t k = between(1, 3); k > 0; --k) out.push_back(between(0, 3));
        out[below(out.size())] = 0;
      } else {
        int64_t rest = n;
        const int64_t slots = between(n == 1 ? 0 : 1, 4);
        out.assign(static_cast<size_t>(slots), 1);
        for (int64_t p = 2; rest > 1 && slots > 0;) {
          if (rest % p != 0) {
            ++p;
            continue;
          }
          out[below(out.size())] *= p;
          rest /= p;
        }
        if (!out.empty() && chance(0.3)) out[below(out.size())] = -1;
      }
      r.t = chance(0.5) ? reshape(x, out) : view(x, out);
      return emit(r, "reshape");
    }
    case 6:
      if (rank >= 4) return false;
      r.t = unsqueeze(x, between(-rank - 1, rank));
      return emit(r, "unsqueeze");
    case 7:
      r.t = rank > 0 && chance(0.5) ? squeeze(x, axis(rank)) : squeeze(x);
      return emit(r, "squeeze");
    case 8: {
      if (rank == 0) {
        r.t = flatten(x);
        return emit(r, "flatten");
      }
      int64_t a = between(0, rank - 1), b = between(0, rank - 1);
      if (a > b) std::swap(a, b);
      r.t = flatten(x, a, b - (chance(0.3) ? rank : 0));
      return emit(r, "flatten");
    }
    default:
      return layout_cat();
  }
}

// cat and stack with pool values or fresh inputs that fit; dtypes promote.
bool ProgramGenerator::layout_cat() {
  const Val x = pick();
  const Shape& s = x.t.shape();
  const int64_t rank = s.rank();
  const bool stacking = chance(0.3);
  if ((!stacking && rank == 0) || (stacking && rank >= 4)) return false;
  const int64_t d = stacking ? between(-rank - 1, rank) : between(-rank, rank - 1);
  const int64_t dn = d < 0 ? d + rank : d;
  std::vector<Val> parts = {x};
  for (int64_t k = 1 + below(2); k > 0; --k) {
    std::vector<size_t> fits;
    for (size_t i = 0; i < pool_.size(); ++i) {
      const Shape& t = pool_[i].t.shape();
      bool ok = t.rank() == rank;
      for (int64_t j = 0; ok && j < rank; ++j) ok = t[j] == s[j] || (!stacking && j == dn);
      if (ok) fits.push_back(i);
    }
    if (!fits.empty() && chance(0.6)) {
      parts.push_back(pool_[fits[below(fits.size())]]);
    } else {
      Shape t = s;
      if (!stacking) t[dn] = between(allow_empty_ ? 0 : 1, 4);
      parts.push_back(fresh_input(t, x.t.dtype(), chance(0.5)));
    }
  }
  DType dt = parts[0].t.dtype();
  for (const Val& p : parts) dt = promote_types(dt, p.t.dtype());
  Val r{{}, 0, 0, true, false};
  std::vector<Tensor> ts;
  int64_t numel = 0;
  for (const Val& p : parts) {
    Val c;
    if (!converted(p, dt, &c)) return false;
    r.mag = std::max(r.mag, c.mag);
    r.err = std::max(r.err, c.err);
    r.exact = r.exact && c.exact;
    ts.push_back(p.t);
    numel += p.t.numel();
  }
  if (numel > kMaxNumel) return false;
  r.t = stacking ? stack(ts, d) : cat(ts, d);
  return emit(r, stacking ? "stack" : "cat");
}

bool ProgramGenerator::matmul_op() {
  const Val a = pick();
  const Shape& s = a.t.shape();
  const int64_t rank = s.rank();
  if (rank == 0) return false;
  const int64_t k_len = s[rank - 1];
  Val b;
  Tensor lhs = a.t;
  const uint64_t form = below(4);
  if (form == 0 && rank >= 2) {  // gram matrices: a @ a^T or a^T @ a
    const bool left = chance(0.5);
    lhs = left ? a.t : transpose(a.t, -1, -2);
    b = a;
    b.t = left ? transpose(a.t, -1, -2) : a.t;
  } else {
    // b = [K], [K, N] or [batch..., K, N], its batch dims a suffix of a's (some 1) or new
    // ones when a has none; with form 1, b is made as [.., N, K] and transposed.
    std::vector<int64_t> bs;
    const int64_t a_batch = std::max<int64_t>(rank - 2, 0);
    const uint64_t kind = below(3);
    if (kind == 2 && a_batch > 0 && chance(0.7)) {
      for (int64_t i = a_batch - between(1, a_batch); i < a_batch; ++i)
        bs.push_back(chance(0.3) ? 1 : s[i]);
    } else if (kind == 2 && a_batch == 0) {
      bs.push_back(between(1, 3));
    }
    const int64_t n = between(allow_empty_ ? 0 : 1, 6);
    if (kind == 0) bs.push_back(k_len);
    else if (form == 1) bs.insert(bs.end(), {n, k_len});
    else bs.insert(bs.end(), {k_len, n});
    const DType dt = chance(0.7) ? a.t.dtype() : random_dtype();
    b = fresh_input(Shape(bs), dt, false);
    if (form == 1 && kind != 0) b.t = transpose(b.t, -1, -2);
  }
  const DType dt = result_type(a.t, b.t);
  Val ca, cb;
  if (dt == DType::Bool || !converted(a, dt, &ca) || !converted(b, dt, &cb)) return false;
  const double kd = static_cast<double>(k_len);
  Val r;
  const double mag = kd * ca.mag * cb.mag;
  if (!is_floating(dt)) {
    r = {matmul(lhs, b.t), std::min(mag, int_max(dt)), 0, true};
  } else {
    if (mag > limit(dt)) return false;
    r.t = matmul(lhs, b.t);
    r.mag = mag;
    r.err = kd * (ca.err * cb.mag + cb.err * ca.mag + ca.err * cb.err) + mag * drift(dt, k_len) +
            unit(dt) * mag + tiny(dt);
    r.exact = false;
  }
  if (r.t.numel() > kMaxNumel) return false;
  return emit(r, "matmul");
}

// ---- the test --------------------------------------------------------------------------

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct ProgramRun {
  std::vector<Values> values;
  std::string error;  // what an exception said
};

ProgramRun run_program(uint64_t seed, int64_t* ops) {
  ProgramRun run;
  try {
    Program program = [&](Outs& outs) {
      ProgramGenerator gen(seed);
      gen.build(outs);
      if (ops) *ops += gen.ops();
    };
    run.values = run_on(std::string(runtime::current_backend().name()), program, seed);
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  return run;
}

// The IR and the generator's log of program `seed`, traced again without running it.
std::string describe(uint64_t seed) {
  std::vector<std::string> log;
  std::ostringstream os;
  try {
    manual_seed(seed);
    Outs outs;
    ProgramGenerator gen(seed, &log);
    gen.build(outs);
    std::vector<Tensor> ts;
    for (const Out& o : outs.items) ts.push_back(o.value);
    os << pending_ir(ts);
    for (const Out& o : outs.items)
      os << "  " << o.name << ": tol " << o.tol.rel << "*|ref| + " << o.tol.abs << "\n";
  } catch (const std::exception& e) {
    os << "(tracing threw: " << e.what() << ")\n";
  }
  os << "generator log:\n";
  for (const std::string& line : log) os << "  " << line << "\n";
  return os.str();
}

TEST_F(RandomPrograms, AgreeWithTheReferenceInterpreter) {
  const uint64_t count = env_or("LOOM_RANDOM_PROGRAMS", 1000);
  const uint64_t first = env_or("LOOM_RANDOM_SEED", 20240611);
  const std::string other = other_backend();
  const auto t0 = std::chrono::steady_clock::now();
  // All programs on ref, then all on the other backend: two backend switches in total.
  int64_t ops = 0;
  std::vector<ProgramRun> want, got;
  runtime::set_backend("ref");
  for (uint64_t i = 0; i < count; ++i) want.push_back(run_program(first + i, &ops));
  const auto t1 = std::chrono::steady_clock::now();
  runtime::set_backend(other);
  for (uint64_t i = 0; i < count; ++i) got.push_back(run_program(first + i, nullptr));
  const auto t2 = std::chrono::steady_clock::now();
  runtime::set_backend("ref");
  int failures = 0;
  int64_t outputs = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t seed = first + i;
    std::string report;
    if (!want[i].error.empty()) report += "ref threw: " + want[i].error + "\n";
    if (!got[i].error.empty()) report += other + " threw: " + got[i].error + "\n";
    if (report.empty()) report = compare_all(want[i].values, got[i].values);
    outputs += static_cast<int64_t>(want[i].values.size());
    if (report.empty()) continue;
    if (++failures <= 5) {
      ADD_FAILURE() << "random program " << i << " (LOOM_RANDOM_SEED=" << seed
                    << " LOOM_RANDOM_PROGRAMS=1), ref vs " << other << ":\n"
                    << report << describe(seed);
    }
  }
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("[random programs] %llu programs, %lld ops, %lld outputs, seeds %llu..: ref %.2f s, "
              "%s %.2f s; %d failing\n",
              static_cast<unsigned long long>(count), static_cast<long long>(ops),
              static_cast<long long>(outputs), static_cast<unsigned long long>(first),
              secs(t0, t1), other.c_str(), secs(t1, t2), failures);
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace loom::difftest
