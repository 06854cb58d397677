// Random differential programs: the generator of tests/backend/program_gen.h traces seeded
// random programs, which run on the reference interpreter and on the cpu backend and must
// agree (exactly, or within the per-element error bounds that the generator derives on the
// reference run). This file holds the generator's op families, each with its bound rule, and
// the test.
//
// LOOM_RANDOM_PROGRAMS=n sets the number of programs (default 1000), LOOM_RANDOM_SEED the
// first seed; program i uses seed + i, and a mismatch prints both and the program's IR.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/program.h"
#include "backend/program_gen.h"
#include "loom/runtime/engine.h"

namespace loom::difftest::gen {

// Error bounds below are in float64 and element by element (|x| is the computed value, which
// is close enough to the exact one for a bound): u is the result's unit roundoff, tu its
// transcendental unit, ea the operand's bound.
bool ProgramGenerator::unary() {
  const Val x = pick();
  const DType dt = x.t.dtype();
  const DType ft = float_of(dt);
  Val xf, r;
  if (!converted(x, ft, &xf)) return false;
  const double u = unit(ft), tu = trans_unit(ft), m = xf.mag;
  const Tensor& ea = xf.err;
  r.exact = false;
  switch (below(16)) {
    case 0:
    case 1:
    case 2: {  // neg, abs, relu: exact, 1-Lipschitz
      if (dt == DType::Bool) return false;
      const uint64_t k = below(3);
      r = x;
      r.input = false;
      r.t = k == 0 ? neg(x.t) : k == 1 ? abs(x.t) : relu(x.t);
      return emit(r, k == 0 ? "neg" : k == 1 ? "abs" : "relu");
    }
    case 3:
      if (!x.exact) return false;
      return emit({logical_not(x.t), 1, {}, true}, "logical_not");
    case 4:  // |exp(x + d) - exp(x)| <= exp(x) (exp(|d|) - 1)
      if (m > 3) return false;
      r.t = exp(x.t);
      r.mag = std::exp(m);
      if (bounds_) {
        r.err = plus(ea.defined() ? absf(r.t) * (exp(ea) - 1) : Tensor(), rounding(r.t, tu, ft));
      }
      return emit(r, "exp");
    case 5:
    case 6:
    case 7: {  // tanh, sin, cos: 1-Lipschitz; an absolute floor for zeros of sin and cos
      const uint64_t k = below(3);
      r.t = k == 0 ? tanh(x.t) : k == 1 ? sin(x.t) : cos(x.t);
      r.mag = k == 2 ? 1 : std::min(m, 1.0);
      const double floor = trans_unit(ft == DType::Float64 ? ft : DType::Float32);
      if (bounds_) r.err = plus(ea, rounding(r.t, tu, ft) + floor);
      return emit(r, k == 0 ? "tanh" : k == 1 ? "sin" : "cos");
    }
    case 8:  // 1 / (exp(-x) + 1): slope <= 1/4, four roundings
      if (m > 30) return false;
      r.t = sigmoid(x.t);
      r.mag = 1;
      if (bounds_) r.err = plus(times(ea, 0.25), rounding(r.t, tu + 3 * u, ft));
      return emit(r, "sigmoid");
    case 9:  // x/2 (1 + erf(x / sqrt 2)): slope <= 1.13
      r.t = gelu(x.t);
      r.mag = m;
      if (bounds_) r.err = plus(times(ea, 1.2), (absf(x.t) + 1) * (tu + 3 * u));
      return emit(r, "gelu");
    case 10:
    case 11: {  // sqrt(|x| + 1) and log(|x| + 1): no domain errors, slopes <= 1
      const bool is_sqrt = below(2) == 0;
      Tensor a = abs(to(x.t, ft)) + 1;
      r.t = is_sqrt ? sqrt(a) : log(a);
      r.mag = is_sqrt ? std::sqrt(m + 1) : std::log(m + 1);
      if (bounds_) {  // the rounding of |x| + 1, through the slope
        Tensor arg = is_sqrt ? absf(a) * (u / 2) : Tensor();
        r.err = plus(plus(times(ea, is_sqrt ? 0.5 : 1.0), arg),
                     rounding(r.t, tu, ft) + (is_sqrt ? 0.0 : u));
      }
      return emit(r, is_sqrt ? "sqrt(|x|+1)" : "log(|x|+1)");
    }
    case 12: {  // square through pow; integers wrap exactly
      r.t = pow(x.t, 2);
      const DType rt = r.t.dtype();
      if (!is_floating(rt))
        return emit({r.t, std::min(x.mag * x.mag, int_max(rt)), {}, true}, "pow 2");
      r.mag = m * m;
      if (bounds_) {
        r.err = plus(plus(times(absf(x.t) * 2, ea), times(ea, ea)), rounding(r.t, tu, ft));
      }
      return emit(r, "pow 2");
    }
    case 13: {  // a host number: x * c, x + c, c - x, x / c
      static const double kConsts[] = {0.5, -2, 3, 1.5, -0.25, 2};
      const bool as_int = chance(0.4);
      const double c = as_int ? (chance(0.5) ? 2 : -3) : kConsts[below(6)];
      const uint64_t form = below(4);
      const DType rt = result_type(dt, as_int);
      const DType out = form == 3 && !is_floating(rt) ? DType::Float32 : rt;
      Val xc;
      if (!converted(x, out, &xc)) return false;
      Scalar sc = as_int ? Scalar(static_cast<int64_t>(c)) : Scalar(c);
      // c - x with a bool x converts x first (torch refuses subtraction with a bool operand)
      const Tensor xs = form == 2 && dt == DType::Bool ? to(x.t, rt) : x.t;
      r.t = form == 0 ? x.t * sc : form == 1 ? x.t + sc : form == 2 ? sc - xs : x.t / sc;
      const double ac = std::fabs(c);
      const double mag = form == 0 ? xc.mag * ac : form == 3 ? xc.mag / ac : xc.mag + ac;
      if (!is_floating(out)) return emit({r.t, std::min(mag, int_max(out)), {}, true}, "scalar");
      r.mag = mag;
      if (bounds_) {
        const double slope = form == 0 ? ac : form == 3 ? 1 / ac : 1;
        r.err = plus(times(xc.err, slope), rounding(r.t, unit(out), out));
      }
      return emit(r, "scalar");
    }
    case 14: {  // clamp, one or both sides: exact, 1-Lipschitz
      static const double kBounds[] = {0, 0.5, 1, 2};
      std::optional<double> lo, hi;
      if (chance(0.7)) lo = -kBounds[below(4)];
      if (!lo || chance(0.7)) hi = kBounds[below(4)];
      if (!converted(x, result_type(dt, false), &r)) return false;
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
  r.exact = integral;
  switch (k) {
    case 0:
    case 1:
      // torch refuses subtraction with a bool operand: such a pair is converted first
      r.t = k == 0 ? a.t + b.t : to(a.t, dt) - to(b.t, dt);
      r.mag = std::min(ca.mag + cb.mag, integral ? int_max(dt) : kInf);
      if (bounds_ && !integral) r.err = plus(plus(ca.err, cb.err), rounding(r.t, u, dt));
      return emit(r, k == 0 ? "add" : "sub");
    case 2:  // |ab - a'b'| <= ea |b| + eb |a| + 2 ea eb
      r.t = a.t * b.t;
      r.mag = std::min(ca.mag * cb.mag, integral ? int_max(dt) : kInf);
      if (bounds_ && !integral) {
        r.err = plus(plus(times(ca.err, absf(b.t)), times(cb.err, absf(a.t))),
                     plus(times(times(ca.err, cb.err), 2.0), rounding(r.t, u, dt)));
      }
      return emit(r, "mul");
    case 3: {  // a / (|b| + 1): true division, away from zero
      if (b.t.dtype() == DType::Bool) return false;
      Tensor d = abs(b.t) + 1;
      const DType out = float_of(result_type(a.t, d));
      Val dv{d, b.mag + 1, {}, !is_floating(d.dtype())};
      if (bounds_ && is_floating(d.dtype()))
        dv.err = plus(b.err, rounding(d, unit(d.dtype()), d.dtype()));
      Val qa, qd;
      if (!converted(a, out, &qa) || !converted(dv, out, &qd)) return false;
      r.t = a.t / d;
      r.mag = qa.mag;
      r.exact = false;
      if (bounds_) {  // |a/d - a'/d'| <= ea / |d| + |a| ed / |d|^2 (|d| >= 1)
        Tensor ad = absf(d);
        r.err = plus(plus(times(qa.err, 1 / ad), times(qd.err, absf(a.t) / (ad * ad))),
                     rounding(r.t, unit(out), out));
      }
      return emit(r, "div");
    }
    case 4:
    case 5:
      r.t = k == 4 ? maximum(a.t, b.t) : minimum(a.t, b.t);
      r.mag = std::max(ca.mag, cb.mag);
      if (bounds_) r.err = bmax(ca.err, cb.err);
      r.exact = ca.exact && cb.exact;
      return emit(r, k == 4 ? "maximum" : "minimum");
    case 6: {
      if (!ca.exact || !cb.exact) return false;
      const uint64_t c = below(6);
      Tensor t = c == 0   ? a.t < b.t
                 : c == 1 ? a.t <= b.t
                 : c == 2 ? a.t > b.t
                 : c == 3 ? a.t >= b.t
                 : c == 4 ? a.t == b.t
                          : a.t != b.t;
      return emit({t, 1, {}, true}, "compare");
    }
    default: {  // where, on an exact condition
      Tensor cond;
      if (ca.exact && cb.exact && chance(0.5)) {
        cond = a.t > b.t;
      } else {
        for (const Val& v : pool_) {
          Shape s;
          const bool fits = broadcast(shape, v.t.shape(), &s);
          if (v.exact && v.t.dtype() == DType::Bool && fits) cond = v.t;
        }
        if (!cond.defined()) cond = fresh_input(a.t.shape(), DType::Bool, false).t;
      }
      Shape s;
      if (!broadcast(shape, cond.shape(), &s)) return false;
      r.t = where(cond, a.t, b.t);
      r.mag = std::max(ca.mag, cb.mag);
      if (bounds_) r.err = bmax(ca.err, cb.err);
      r.exact = ca.exact && cb.exact;
      return emit(r, "where");
    }
  }
}

bool ProgramGenerator::reduction() {
  const Val x = pick();
  const Shape& s = x.t.shape();
  const DType dt = x.t.dtype();
  const int64_t rank = s.rank();
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (!chance(0.5)) continue;
    dims.push_back(chance(0.3) ? d - rank : d);
    n *= s[d];
  }
  if (dims.empty()) n = s.numel();
  const bool keepdim = chance(0.5);
  const double u = unit(dt), dn = static_cast<double>(n);
  const uint64_t k = below(7);
  Val r;
  r.exact = false;
  if (k <= 1) {  // sum: integers and bool accumulate in int64
    if (!is_floating(dt))
      return emit({sum(x.t, dims, keepdim), std::min(x.mag * dn, 0x1p63), {}, true}, "sum");
    if (x.mag * dn > limit(dt)) return false;
    r.t = dims.empty() && !keepdim && chance(0.3) ? sum(x.t) : sum(x.t, dims, keepdim);
    r.mag = x.mag * dn;
    if (bounds_) {
      r.err = plus(x.err.defined() ? sum(x.err, dims, keepdim) : Tensor(),
                   sum(absf(x.t), dims, keepdim) * drift(dt, n) + rounding(r.t, u, dt));
    }
    return emit(r, "sum");
  }
  if (k == 2) {  // mean; an empty one would be nan, which the op harness (tests/ops) covers
    if (!is_floating(dt) || n == 0) return false;
    r.t = mean(x.t, dims, keepdim);
    r.mag = x.mag;
    if (bounds_) {
      r.err = plus(x.err.defined() ? mean(x.err, dims, keepdim) : Tensor(),
                   mean(absf(x.t), dims, keepdim) * drift(dt, n) + rounding(r.t, 2 * u, dt));
    }
    return emit(r, "mean");
  }
  if (k <= 4) {  // max, min select an element: exact when x is
    if (n == 0) return false;
    r = x;
    r.input = false;
    r.t = k == 3 ? max(x.t, dims, keepdim) : min(x.t, dims, keepdim);
    if (bounds_ && x.err.defined()) r.err = max(x.err, dims, keepdim);
    return emit(r, k == 3 ? "max" : "min");
  }
  const int64_t d = rank == 0 ? 0 : between(-rank, rank - 1);
  const int64_t ext = rank == 0 ? 1 : s[d < 0 ? d + rank : d];
  if (k == 5) {  // argmax: a near-tie would flip on rounding, so exact inputs only
    if (!x.exact || dt == DType::Bool || ext == 0) return false;
    const bool flat = chance(0.25);
    if (flat && s.numel() == 0) return false;
    Tensor t = flat ? argmax(x.t) : argmax(x.t, d, keepdim);
    return emit({t, static_cast<double>(flat ? s.numel() : ext), {}, true}, "argmax");
  }
  // softmax: |ds_i| <= 2 s_i max|dx| <= 2 max|dx|; relative rounding: x - max (2u |x| each
  // side), exp and the sum (tu + drift), the division (u)
  Val xf;
  if (ext == 0 || !converted(x, float_of(dt), &xf)) return false;
  const DType ft = float_of(dt);
  r.t = softmax(to(x.t, ft), d);  // softmax takes floats only (as torch)
  r.mag = 1;
  if (bounds_) {
    Tensor rel = max(absf(x.t), {d}, true) * (4 * unit(ft)) +
                 (2 * trans_unit(ft) + 3 * unit(ft) + drift(ft, ext));
    r.err =
        plus(xf.err.defined() ? max(xf.err, {d}, true) * 2 : Tensor(), absf(r.t) * rel + tiny(ft));
  }
  return emit(r, "softmax");
}

// Layout ops move elements: exact when x is; the bound moves along (same op on err). Every
// random parameter is drawn before the op is applied, so both runs draw the same numbers.
bool ProgramGenerator::layout() {
  Val r = pick();
  r.input = false;
  const Shape s = r.t.shape();
  const int64_t rank = s.rank();
  auto axis = [&](int64_t rk) { return between(-rk, rk - 1); };
  auto apply = [&](auto op, const char* what) {
    r.t = op(r.t);
    if (r.err.defined()) r.err = op(r.err);
    return emit(r, what);
  };
  switch (below(11)) {
    case 0: {
      if (rank < 2) return false;
      std::vector<int64_t> perm(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i) perm[i] = i;
      for (int64_t i = rank - 1; i > 0; --i) std::swap(perm[i], perm[below(i + 1)]);
      return apply([&](const Tensor& t) { return permute(t, perm); }, "permute");
    }
    case 1: {
      const int64_t a = rank == 0 ? 0 : axis(rank), b = rank == 0 ? -1 : axis(rank);
      return apply([&](const Tensor& t) { return transpose(t, a, b); }, "transpose");
    }
    case 2: {
      if (rank == 0) return false;
      const int64_t d = axis(rank), n = s[d < 0 ? d + rank : d];
      const int64_t step = chance(0.5) ? 1 : between(2, 3);
      const int64_t lo = between(-n - 1, n), hi = between(-n - 1, n + 2);
      return apply([&](const Tensor& t) { return slice(t, d, lo, hi, step); }, "slice");
    }
    case 3: {
      if (rank == 0) return false;
      const int64_t d = axis(rank), n = s[d < 0 ? d + rank : d];
      if (n == 0) return false;
      const int64_t i = between(-n, n - 1);
      return apply([&](const Tensor& t) { return select(t, d, i); }, "select");
    }
    case 4: {  // expand the 1s, maybe add leading dims
      std::vector<int64_t> target;
      for (int64_t k = below(3); k > 0 && static_cast<int64_t>(target.size()) + rank < 4; --k)
        target.push_back(between(1, 4));
      for (int64_t e : s)
        target.push_back(e == 1 ? between(allow_empty_ ? 0 : 1, 5) : chance(0.3) ? -1 : e);
      std::vector<int64_t> real = target;
      for (size_t i = 0; i < real.size(); ++i)
        if (real[i] == -1) real[i] = s[i - (real.size() - static_cast<size_t>(rank))];
      if (Shape(real).numel() > kMaxNumel) return false;
      return apply([&](const Tensor& t) { return expand(t, target); }, "expand");
    }
    case 5: {  // reshape or view to a random factorization of numel
      const int64_t n = s.numel();
      std::vector<int64_t> out;
      if (n == 0) {
        for (int64_t k = between(1, 3); k > 0; --k) out.push_back(between(0, 3));
        out[below(out.size())] = 0;
      } else {
        out.assign(static_cast<size_t>(between(n == 1 ? 0 : 1, 4)), 1);
        for (int64_t p = 2, rest = n; rest > 1;) {
          if (rest % p != 0) {
            ++p;
          } else {
            out[below(out.size())] *= p;
            rest /= p;
          }
        }
        if (!out.empty() && chance(0.3)) out[below(out.size())] = -1;
      }
      const bool as_view = chance(0.5);
      // view where torch could view the layout (a transposed operand may not be), else reshape
      return apply(
          [&](const Tensor& t) {
            if (as_view) {
              try {
                return view(t, out);
              } catch (const loom::ShapeError&) {
              }
            }
            return reshape(t, out);
          },
          "reshape");
    }
    case 6: {
      if (rank >= 4) return false;
      const int64_t d = between(-rank - 1, rank);
      return apply([&](const Tensor& t) { return unsqueeze(t, d); }, "unsqueeze");
    }
    case 7: {
      const bool one = rank > 0 && chance(0.5);
      const int64_t d = one ? axis(rank) : 0;
      return apply([&](const Tensor& t) { return one ? squeeze(t, d) : squeeze(t); }, "squeeze");
    }
    case 8: {
      int64_t a = rank == 0 ? 0 : between(0, rank - 1), b = rank == 0 ? 0 : between(0, rank - 1);
      if (a > b) std::swap(a, b);
      if (rank > 0 && chance(0.3)) b -= rank;
      return apply([&](const Tensor& t) { return rank == 0 ? flatten(t) : flatten(t, a, b); },
                   "flatten");
    }
    default: return layout_cat();
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
  for (int64_t k = 1 + static_cast<int64_t>(below(2)); k > 0; --k) {
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
  Val r{{}, 0, {}, true, false};
  std::vector<Tensor> ts, es;
  bool any_err = false;
  int64_t numel = 0;
  for (Val& p : parts) {
    Val c;
    if (!converted(p, dt, &c)) return false;
    r.mag = std::max(r.mag, c.mag);
    r.exact = r.exact && c.exact;
    ts.push_back(p.t);
    es.push_back(c.err);
    any_err = any_err || c.err.defined();
    numel += p.t.numel();
  }
  if (numel > kMaxNumel) return false;
  r.t = stacking ? stack(ts, d) : cat(ts, d);
  if (bounds_ && any_err) {
    for (size_t i = 0; i < es.size(); ++i)
      if (!es[i].defined()) es[i] = zeros(ts[i].shape(), DType::Float64);
    r.err = stacking ? stack(es, d) : cat(es, d);
  }
  return emit(r, stacking ? "stack" : "cat");
}

bool ProgramGenerator::matmul_op() {
  const Val a = pick();
  const int64_t rank = a.t.dim();
  if (rank == 0) return false;
  const Shape s = a.t.shape();
  const int64_t k_len = s[rank - 1];
  auto tr = [](Val v) {  // v^T, bound included
    v.t = transpose(v.t, -1, -2);
    if (v.err.defined()) v.err = transpose(v.err, -1, -2);
    return v;
  };
  Val lhs = a, rhs;
  const uint64_t form = below(4);
  if (form == 0 && rank >= 2) {  // gram matrices: a @ a^T or a^T @ a
    const bool left = chance(0.5);
    lhs = left ? a : tr(a);
    rhs = left ? tr(a) : a;
  } else {
    // b = [K], [K, N] or [batch..., K, N], its batch dims a suffix of a's (some 1) or a new
    // one when a has none; with form 1, b is made as [.., N, K] and transposed.
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
    if (kind == 0)
      bs.push_back(k_len);
    else if (form == 1)
      bs.insert(bs.end(), {n, k_len});
    else
      bs.insert(bs.end(), {k_len, n});
    rhs = fresh_input(Shape(bs), chance(0.7) ? a.t.dtype() : random_dtype(), false);
    if (form == 1 && kind != 0) rhs = tr(rhs);
  }
  const DType dt = result_type(lhs.t, rhs.t);
  Val ca, cb;
  if (dt == DType::Bool || !converted(lhs, dt, &ca) || !converted(rhs, dt, &cb)) return false;
  const double mag = static_cast<double>(k_len) * ca.mag * cb.mag;
  if (is_floating(dt) && mag > limit(dt)) return false;
  Tensor t = matmul(to(lhs.t, dt), to(rhs.t, dt));  // matmul does not promote (as torch)
  if (t.numel() > kMaxNumel) return false;
  if (!is_floating(dt)) return emit({t, std::min(mag, int_max(dt)), {}, true}, "matmul");
  Val r{t, mag, {}, false, false};
  if (bounds_) {  // |a| eb + ea |b| + 2 ea eb + drift(K) |a| |b|, then the rounding
    Tensor aa = absf(lhs.t), ab = absf(rhs.t);
    Tensor e = matmul(aa, ab) * drift(dt, k_len) + rounding(t, unit(dt), dt);
    if (cb.err.defined()) e = e + matmul(aa, cb.err);
    if (ca.err.defined()) e = e + matmul(ca.err, ab);
    if (ca.err.defined() && cb.err.defined()) e = e + matmul(ca.err, cb.err) * 2;
    r.err = e;
  }
  return emit(r, "matmul");
}

}  // namespace loom::difftest::gen

namespace loom::difftest {
namespace {

using RandomPrograms = DiffTest;
using gen::ProgramGenerator;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct ProgramRun {
  std::vector<Values> values;
  std::string error;  // what an exception said
};

// Program `seed` on the selected backend; bounds (for the tolerances) only on ref.
ProgramRun run_program(uint64_t seed, bool bounds, int64_t* ops) {
  ProgramRun run;
  try {
    Program program = [&](Outs& outs) {
      ProgramGenerator g(seed, bounds);
      g.build(outs);
      if (ops) *ops += g.ops();
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
    ProgramGenerator g(seed, false, &log);
    g.build(outs);
    std::vector<Tensor> ts;
    for (const Out& o : outs.items) ts.push_back(o.value);
    os << "outputs, in order of the return:";
    for (const Out& o : outs.items) os << " " << o.name;
    os << "\n" << pending_ir(ts);
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
  // Every program on ref, then every program on the other backend: two switches in all.
  int64_t ops = 0;
  std::vector<ProgramRun> want, got;
  const auto t0 = std::chrono::steady_clock::now();
  runtime::set_backend("ref");
  for (uint64_t i = 0; i < count; ++i) want.push_back(run_program(first + i, true, &ops));
  const auto t1 = std::chrono::steady_clock::now();
  runtime::set_backend(other);
  for (uint64_t i = 0; i < count; ++i) got.push_back(run_program(first + i, false, nullptr));
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
      ADD_FAILURE() << "random program " << i << ": rerun with LOOM_RANDOM_SEED=" << seed
                    << " LOOM_RANDOM_PROGRAMS=1; ref vs " << other << ":\n"
                    << report << describe(seed);
    }
  }
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf(
      "[random programs] %llu programs, %lld ops, %lld outputs, seeds %llu..: ref %.2f s, "
      "%s %.2f s; %d failing\n",
      static_cast<unsigned long long>(count), static_cast<long long>(ops),
      static_cast<long long>(outputs), static_cast<unsigned long long>(first), secs(t0, t1),
      other.c_str(), secs(t1, t2), failures);
  EXPECT_EQ(failures, 0);
}

// The cpu backend's step graph (steps of a small program run as a dependency graph on the
// pool's threads) against the same programs run step by step: every output bit for bit, since
// each kernel, product part and fallback computes the same values in either order. Every
// program runs in both modes, one switch each; the graph must have run for many of them.
TEST_F(RandomPrograms, TheStepGraphMatchesStepByStepRunsBitForBit) {
  if (other_backend() != "cpu") GTEST_SKIP() << "the step graph is the cpu backend's";
  const uint64_t count = std::min<uint64_t>(env_or("LOOM_RANDOM_PROGRAMS", 1000), 300);
  const uint64_t first = env_or("LOOM_RANDOM_SEED", 20240611);
  std::vector<ProgramRun> runs[2];
  int64_t graph_runs[2] = {0, 0};
  runtime::set_backend("cpu");
  for (int mode = 0; mode < 2; ++mode) {
    cpu::set_step_graph(mode == 1 ? cpu::StepGraphMode::Always : cpu::StepGraphMode::Off);
    runtime::clear_compile_cache();
    const int64_t before = cpu::step_graph_runs();
    for (uint64_t i = 0; i < count; ++i)
      runs[mode].push_back(run_program(first + i, false, nullptr));
    graph_runs[mode] = cpu::step_graph_runs() - before;
  }
  cpu::set_step_graph(cpu::StepGraphMode::Auto);
  runtime::clear_compile_cache();
  runtime::set_backend("ref");
  EXPECT_EQ(graph_runs[0], 0);
  EXPECT_GE(graph_runs[1], static_cast<int64_t>(count / 10))
      << "the step graph ran for few programs: the test no longer covers it";
  int failures = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const ProgramRun &a = runs[0][i], &b = runs[1][i];
    std::string report;
    if (a.error != b.error)
      report = "step by step threw '" + a.error + "', the graph '" + b.error + "'";
    for (size_t k = 0; report.empty() && k < a.values.size(); ++k) {
      const Values &x = a.values[k], &y = b.values[k];
      const bool same =
          x.i == y.i && x.f.size() == y.f.size() &&
          (x.f.empty() || std::memcmp(x.f.data(), y.f.data(), x.f.size() * sizeof(double)) == 0);
      if (!same) report = "output " + x.name + " differs";
    }
    if (!report.empty() && ++failures <= 5)
      ADD_FAILURE() << "random program " << i << " (LOOM_RANDOM_SEED=" << first + i
                    << " LOOM_RANDOM_PROGRAMS=1): " << report << "\n"
                    << describe(first + i);
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace loom::difftest
