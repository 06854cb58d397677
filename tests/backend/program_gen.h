// A seeded generator of random well-typed loom programs for the differential tests: elementwise
// ops, reductions, layout ops and matrix products on random shapes of rank 0-4 (extents 1-7,
// sometimes larger, and 0 in some programs), mixing all 7 dtypes with PyTorch promotion.
//
//   ProgramGenerator gen(seed, /*bounds=*/true);
//   Outs outs;
//   gen.build(outs);  // traces the program; outs holds 2-4 of its values with tolerances
//
// The same seed traces the same program. With `bounds`, every float value also carries a
// float64 companion tensor `err` (computed by extra ops that the program's outputs do not
// depend on) bounding, element by element, one backend's distance from exact arithmetic; two
// backends may then differ by 2 * err. Build with bounds on the reference run only: the
// tolerances come from it, and the other backend runs the bare program. Values that every
// correct backend reproduces bit for bit (integers, bool, data movement and selection of such
// values) are `exact`; only exact values feed comparisons, argmax and float-to-int
// conversions, whose results would otherwise flip on a rounding difference. Not thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/diff_util.h"

namespace loom::difftest::gen {

inline constexpr int64_t kMaxNumel = 1024;  // keeps 1000 programs within seconds on ref
inline constexpr double kSoftMag = 64;      // floats above this are rescaled by a power of two

inline int category(DType d) { return d == DType::Bool ? 0 : is_integral(d) ? 1 : 2; }

// PyTorch's result type of a binary op (mirrors src/trace/ops.cpp), and of a tensor with a
// host number.
inline DType result_type(const Tensor& a, const Tensor& b) {
  if ((a.dim() > 0) == (b.dim() > 0)) return promote_types(a.dtype(), b.dtype());
  const Tensor& dimmed = a.dim() > 0 ? a : b;
  const Tensor& zero_dim = a.dim() > 0 ? b : a;
  return category(zero_dim.dtype()) > category(dimmed.dtype()) ? zero_dim.dtype() : dimmed.dtype();
}
inline DType result_type(DType t, bool scalar_is_int) {
  const int cs = scalar_is_int ? 1 : 2;
  return cs > category(t) ? (cs == 1 ? DType::Int64 : DType::Float32) : t;
}
inline DType float_of(DType t) { return is_floating(t) ? t : DType::Float32; }

// Unit roundoff; the smallest subnormal (a rounding floor near zero); a magnitude that leaves
// headroom below the largest finite value; the largest integer; significand bits.
inline double unit(DType t) {
  switch (t) {
    case DType::BFloat16: return 0x1p-8;
    case DType::Float16: return 0x1p-11;
    case DType::Float32: return 0x1p-24;
    case DType::Float64: return 0x1p-53;
    default: return 0;
  }
}
inline double tiny(DType t) {
  return t == DType::Float16 ? 0x1p-24 : t == DType::Float64 ? 1e-300 : 0x1p-126;
}
inline double limit(DType t) {
  return t == DType::Float16 ? 3e4 : t == DType::Float64 ? 1e300 : 1e37;
}
inline double int_max(DType t) {
  return t == DType::Bool ? 1 : t == DType::Int32 ? 0x1p31 : 0x1p63;
}
inline int mantissa_bits(DType t) {
  switch (t) {
    case DType::BFloat16: return 8;
    case DType::Float16: return 11;
    case DType::Float32: return 24;
    default: return 53;
  }
}
// A transcendental's error in units of its result: 8 ulps in float32 and float64 (vector
// math libraries promise 1-4); the 16-bit types compute wider and round once, which costs
// little more than the rounding.
inline double trans_unit(DType t) {
  return t == DType::BFloat16 || t == DType::Float16 ? 1.5 * unit(t) : 16 * unit(t);
}
// Drift of a reordered sum of n terms, per unit of the sum of |terms|: diff_util.h's
// sqrt(n) rule, or the worst case of any order, (n - 1) units of a float32 (float64)
// accumulator, where that is larger.
inline double drift(DType t, int64_t n) {
  const bool wide = t == DType::Float64;
  const double dn = static_cast<double>(std::max<int64_t>(n, 1));
  return std::max(std::sqrt(dn) * (wide ? 1e-14 : 1e-6), (dn - 1) * (wide ? 0x1p-53 : 0x1p-24));
}

// ---- error-bound arithmetic on float64 companions; undefined means zero -----------------

inline Tensor plus(const Tensor& a, const Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : a + b;
}
inline Tensor times(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() ? a * b : Tensor();
}
inline Tensor times(const Tensor& a, double c) { return a.defined() ? a * c : Tensor(); }
inline Tensor bmax(const Tensor& a, const Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : maximum(a, b);
}
// |x| in float64.
inline Tensor absf(const Tensor& x) { return abs(to(x, DType::Float64)); }
// The rounding of a result r of dtype dt: half an ulp and the subnormal floor.
inline Tensor rounding(const Tensor& r, double u, DType dt) { return absf(r) * u + tiny(dt); }

// A value of the program with what the generator knows about it.
struct Val {
  Tensor t;
  double mag = 0;      // bound on |element|: guards overflow, triggers rescaling
  Tensor err;          // float64, t's shape: bound on |computed - exact|; undefined = 0
  bool exact = true;   // every correct backend gives the same bits
  bool input = false;  // made from host data (not an op result)
};

inline bool broadcast(const Shape& a, const Shape& b, Shape* out) {
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
  ProgramGenerator(uint64_t seed, bool bounds, std::vector<std::string>* log = nullptr)
      : rng_(seed),
        data_seed_(static_cast<uint32_t>(seed * 2654435761u)),
        bounds_(bounds),
        log_(log) {}

  // Traces one program of 5-30 ops and hands 2-4 of its values to `outs`; every other value
  // is dropped before the caller syncs, so a backend may fuse through it.
  void build(Outs& outs) {
    const int64_t target = 5 + static_cast<int64_t>(below(26));
    allow_empty_ = chance(0.15);
    for (int64_t k = 1 + static_cast<int64_t>(below(3)); k > 0; --k) fresh_input(random_shape());
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
      if (v.exact || !is_floating(dt)) {
        outs.exact(name, v.t);
      } else {
        // |ref - other| <= err_ref + err_other; u * |ref| absorbs the output's own rounding.
        Tensor e = bounds_ ? plus(v.err, zeros(v.t.shape(), DType::Float64)) : Tensor();
        outs.custom(name, v.t, Tol{unit(dt), 2}, bounds_ ? e + 2 * tiny(dt) : Tensor());
      }
    }
    pool_.clear();
  }
  int64_t ops() const { return ops_; }

 private:
  uint64_t below(uint64_t n) { return rng_() % n; }
  bool chance(double p) { return static_cast<double>(rng_() >> 11) * 0x1p-53 < p; }
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1)));
  }

  // Extents 1-7, sometimes larger; 0 only in programs that allow empty tensors (0 spreads
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
    return r < 7    ? DType::Float32
           : r < 9  ? DType::Float64
           : r < 11 ? DType::BFloat16
           : r < 13 ? DType::Float16
           : r < 16 ? DType::Int32
           : r < 18 ? DType::Int64
                    : DType::Bool;
  }

  bool emit(Val v, const char* what) {
    if (v.err.defined() && !(v.err.shape() == v.t.shape()))
      v.err = expand(v.err, v.t.shape().vec());
    push(std::move(v), what);
    return true;
  }
  const Val& push(Val v, const char* what) {
    if (log_) {
      std::ostringstream os;
      os << "%v" << pool_.size() << " = " << what << " : " << TensorType{v.t.dtype(), v.t.shape()}
         << " mag " << v.mag << (v.exact ? " exact" : "");
      log_->push_back(os.str());
    }
    if (!v.input) ++ops_;
    pool_.push_back(std::move(v));
    return pool_.back();
  }

  // A host-data input, sometimes a seeded rand/randn draw (which every backend reproduces).
  const Val& fresh_input(const Shape& s, DType dt = DType::Float32, bool any_dtype = true) {
    if (any_dtype) dt = random_dtype();
    Val v;
    v.input = true;
    if (is_floating(dt) && chance(0.08)) {
      const bool normal = chance(0.5);
      v.t = normal ? randn(s, dt) : rand(s, dt);
      v.mag = normal ? 6 : 1;  // 24-bit uniforms keep Box-Muller below 5.8
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

  // A second operand whose shape broadcasts with a's: from the pool or fresh.
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

  // v's metadata after conversion to `to`, or false when the conversion could overflow or
  // needs an exact source (float to int or bool truncates: discontinuous).
  bool converted(const Val& v, DType to, Val* out) {
    const DType from = v.t.dtype();
    *out = v;
    if (from == to) return true;
    if (!is_floating(to)) {
      if (is_floating(from) && !v.exact) return false;
      *out = Val{v.t, std::min(v.mag, int_max(to)), {}, true, v.input};
      return true;
    }
    if (v.mag > limit(to)) return false;
    if (!is_floating(from)) {  // exact below 2^significand bits
      const bool fits = v.mag <= std::ldexp(1.0, mantissa_bits(to));
      out->exact = v.exact && fits;
      if (!fits && bounds_) out->err = rounding(v.t, 2 * unit(to), to);
      return true;
    }
    if (mantissa_bits(to) < mantissa_bits(from) || to == DType::Float16) {  // narrowing
      out->exact = false;
      if (bounds_) out->err = plus(v.err, rounding(v.t, unit(to), to));
    }
    return true;
  }

  // Float results above kSoftMag are scaled by a power of two (exact unless f16 underflows).
  void rescale_last() {
    Val v = pool_.back();
    if (!is_floating(v.t.dtype()) || v.mag <= kSoftMag) return;
    const double s = std::ldexp(1.0, -static_cast<int>(std::ceil(std::log2(v.mag))));
    v.t = v.t * s;
    v.mag *= s;
    if (bounds_) {
      v.err = times(v.err, s);
      const DType f16 = DType::Float16;
      if (v.t.dtype() == f16) v.err = plus(v.err, rounding(v.t, unit(f16), f16));
    }
    v.exact = v.exact && v.t.dtype() != DType::Float16;
    v.input = false;
    push(std::move(v), "rescale");
  }

  // The op families; each returns false (recording nothing that survives) when the op does
  // not fit the picked operands, and the caller draws again. Defined in
  // random_programs_test.cpp.
  bool unary();
  bool binary();
  bool reduction();
  bool layout();
  bool layout_cat();
  bool matmul_op();

  std::mt19937_64 rng_;
  uint32_t data_seed_;
  bool bounds_;
  std::vector<std::string>* log_;
  std::vector<Val> pool_;
  int64_t ops_ = 0;
  bool allow_empty_ = false;
};

}  // namespace loom::difftest::gen
