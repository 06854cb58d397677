// Helpers of the differential tests, which check the cpu backend against the reference
// interpreter through the public API. A test writes its program once, as a function that
// records outputs into an `Outs`; `expect_same` traces and runs it under "ref" and under the
// other backend (sync, then read every output, before switching) and compares element by
// element with a tolerance chosen per output:
//   exact        data movement, selection, conversion, integers, bool, random draws
//   arith        one rounding per op: f64 1e-9, f32 1e-5, f16 2e-3, bf16 2e-2 (rel and abs)
//   trans        transcendentals and composites of them: f32 2e-5, others as arith
//   reduced      sums over n terms: arith plus sqrt(n) * 1e-6 (f32, f16, bf16) or 1e-14 (f64)
//                times the sum of |terms| of each element, computed by the program itself
// NaN must meet NaN, and an infinity must meet the same infinity, under every tolerance.
// Inputs come from host vectors drawn with std::mt19937 from fixed seeds, so both runs see
// the same data. Not thread-safe (the backend selection is global).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/half.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"
#include "test_constants.h"

namespace loom::difftest {

using testing::kInf;
using testing::kNaN;
inline constexpr DType kAllDTypes[] = {DType::Bool,     DType::Int32,   DType::Int64,
                                       DType::BFloat16, DType::Float16, DType::Float32,
                                       DType::Float64};
inline constexpr DType kFloatDTypes[] = {DType::BFloat16, DType::Float16, DType::Float32,
                                         DType::Float64};
inline constexpr DType kNumericDTypes[] = {DType::Int32,   DType::Int64,   DType::BFloat16,
                                           DType::Float16, DType::Float32, DType::Float64};

// "f32[2,3]": a label for SCOPED_TRACE.
inline std::string str(DType dt, const Shape& s) { return TensorType{dt, s}.str(); }

// The backend compared with "ref".
inline std::string other_backend() { return "cpu"; }

// Fixture of every differential test: ref is selected for the test body, and the backend
// selected before the test (ref unless LOOM_BACKEND or the build's default say otherwise) is
// selected again afterwards, so later tests in the binary see what they would have seen.
class DiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = std::string(runtime::current_backend().name());
    runtime::set_backend("ref");
  }
  void TearDown() override { runtime::set_backend(previous_); }

 private:
  std::string previous_;
};

// ---- tolerances ------------------------------------------------------------------------

// |got - want| <= rel * |want| + abs * scale, with scale the element's sum of |terms| for
// reductions and 1 otherwise.
struct Tol {
  double rel = 0, abs = 0;
};

inline Tol arith_tol(DType dt) {
  switch (dt) {
    case DType::Float64: return {1e-9, 1e-9};
    case DType::Float32: return {1e-5, 1e-5};
    case DType::Float16: return {2e-3, 2e-3};
    case DType::BFloat16: return {2e-2, 2e-2};
    default: return {};
  }
}
inline Tol trans_tol(DType dt) { return dt == DType::Float32 ? Tol{2e-5, 2e-5} : arith_tol(dt); }
// Reordered accumulation of n terms drifts like sqrt(n) units of the accumulator's precision.
inline Tol reduced_tol(DType dt, int64_t n, bool transcendental = false) {
  Tol t = transcendental ? trans_tol(dt) : arith_tol(dt);
  const double unit = dt == DType::Float64 ? 1e-14 : 1e-6;
  if (is_floating(dt)) t.abs += std::sqrt(static_cast<double>(std::max<int64_t>(n, 1))) * unit;
  return t;
}

// ---- inputs ----------------------------------------------------------------------------

// v rounded to the nearest value that dtype dt holds exactly (ints truncate like convert).
inline double representable(DType dt, double v) {
  switch (dt) {
    case DType::Bool: return v != 0 ? 1 : 0;
    case DType::Int32:
    case DType::Int64: return std::trunc(v);
    case DType::BFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::Float16: return f16_to_float(float_to_f16(static_cast<float>(v)));
    case DType::Float32: return static_cast<float>(v);
    case DType::Float64: return v;
  }
  return v;
}

// n values uniform in [lo, hi] (integers: whole numbers in [lo, hi]; bool: fair coin flips),
// exactly representable in dt. The mapping from generator bits is ours, not <random>'s
// distributions, so a seed means the same numbers with every standard library.
inline std::vector<double> host_values(DType dt, int64_t n, uint32_t seed, double lo = -2,
                                       double hi = 2) {
  std::mt19937 gen(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    const double u = static_cast<double>(gen()) / 4294967296.0;  // [0, 1)
    if (dt == DType::Bool)
      x = u < 0.5 ? 0 : 1;
    else if (is_integral(dt))
      x = std::floor(lo + u * (hi - lo + 1));
    else
      x = representable(dt, lo + u * (hi - lo));
  }
  return v;
}

// A tensor holding `values` (which dt must hold exactly; bf16 and f16 go through an exact
// conversion from float32, recorded in the program).
inline Tensor from_values(DType dt, Shape shape, const std::vector<double>& values) {
  switch (dt) {
    case DType::Bool: {
      std::vector<bool> b;
      for (double x : values) b.push_back(x != 0);
      return tensor(std::move(b), std::move(shape));
    }
    case DType::Int32: return tensor(std::vector<int32_t>(values.begin(), values.end()), shape);
    case DType::Int64: return tensor(std::vector<int64_t>(values.begin(), values.end()), shape);
    case DType::Float64: return tensor(values, std::move(shape));
    default: {
      std::vector<float> f(values.begin(), values.end());
      Tensor t = tensor(std::move(f), std::move(shape));
      return dt == DType::Float32 ? t : to(t, dt);
    }
  }
}
inline Tensor from_ints(DType dt, Shape shape, const std::vector<int64_t>& values) {
  if (dt == DType::Int32)
    return tensor(std::vector<int32_t>(values.begin(), values.end()), std::move(shape));
  return to(tensor(values, std::move(shape)), dt);
}

// A seeded random input of dtype dt.
inline Tensor input(DType dt, Shape shape, uint32_t seed, double lo = -2, double hi = 2) {
  std::vector<double> v = host_values(dt, shape.numel(), seed, lo, hi);
  return from_values(dt, std::move(shape), v);
}

// Whole numbers in [0, n) as indices of dtype dt (int32 or int64).
inline Tensor indices(DType dt, Shape shape, int64_t n, uint32_t seed) {
  return input(dt, std::move(shape), seed, 0, static_cast<double>(n - 1));
}

// |x| in float64: the per-term magnitudes whose sums scale a reduction's tolerance.
inline Tensor mag(const Tensor& x) { return abs(to(x, DType::Float64)); }

// ---- outputs and comparison ------------------------------------------------------------

struct Out {
  std::string name;
  Tensor value;
  Tol tol;
  Tensor scale;  // optional, read on the ref run only: the element's sum of |terms|
};

// What a program hands back for comparison.
class Outs {
 public:
  void exact(std::string name, Tensor t) {
    items.push_back({std::move(name), std::move(t), {}, {}});
  }
  void arith(std::string name, Tensor t) {
    Tol tol = arith_tol(t.dtype());
    items.push_back({std::move(name), std::move(t), tol, {}});
  }
  void trans(std::string name, Tensor t) {
    Tol tol = trans_tol(t.dtype());
    items.push_back({std::move(name), std::move(t), tol, {}});
  }
  // A sum-like result over n terms; abs_sum holds each element's sum of |terms| (t's shape).
  void reduced(std::string name, Tensor t, int64_t n, Tensor abs_sum) {
    Tol tol = reduced_tol(t.dtype(), n);
    items.push_back({std::move(name), std::move(t), tol, std::move(abs_sum)});
  }
  // A composite that normalizes over n terms (softmax, layer_norm): transcendental tolerance
  // plus the reduction's drift, relative to values of order one.
  void normalized(std::string name, Tensor t, int64_t n) {
    Tol tol = reduced_tol(t.dtype(), n, true);
    items.push_back({std::move(name), std::move(t), tol, {}});
  }
  void custom(std::string name, Tensor t, Tol tol, Tensor scale = {}) {
    items.push_back({std::move(name), std::move(t), tol, std::move(scale)});
  }
  std::vector<Out> items;
};

using Program = std::function<void(Outs&)>;

// One output's values as read after sync on one backend.
struct Values {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  Tol tol;
  std::vector<double> f;      // floating outputs
  std::vector<int64_t> i;     // integer and bool outputs (exact)
  std::vector<double> scale;  // empty when the output has none
};

// Traces `program` with `backend` selected, syncs, and reads every output.
inline std::vector<Values> run_on(const std::string& backend, const Program& program,
                                  uint64_t seed = 1234) {
  // Only a switch replaces the backend, so runs on one backend share its JIT and caches.
  if (runtime::current_backend().name() != backend) runtime::set_backend(backend);
  manual_seed(seed);
  Outs outs;
  program(outs);
  sync();
  std::vector<Values> vals;
  for (Out& o : outs.items) {
    Values v{o.name, o.value.dtype(), o.value.shape(), o.tol, {}, {}, {}};
    if (is_floating(v.dtype))
      v.f = o.value.to_vector<double>();
    else
      v.i = o.value.to_vector<int64_t>();
    if (o.scale.defined()) v.scale = o.scale.to_vector<double>();
    vals.push_back(std::move(v));
  }
  return vals;
}

inline std::string index_text(int64_t e, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    c[d] = s[d] > 0 ? e % s[d] : 0;
    e = s[d] > 0 ? e / s[d] : 0;
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < c.size(); ++d) os << (d ? "," : "") << c[d];
  return os.str() + "]";
}

// Does got match want under tol (scaled by scale)? NaN meets NaN; infinities meet exactly.
inline bool close_enough(double want, double got, const Tol& tol, double scale) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return want == got;
  return std::fabs(got - want) <= tol.rel * std::fabs(want) + tol.abs * scale;
}

// The mismatches of one output (at most `limit` listed), or "" when it matches.
inline std::string compare_output(const Values& want, const Values& got, int limit = 6) {
  std::ostringstream os;
  if (want.dtype != got.dtype || !(want.shape == got.shape)) {
    os << want.name << ": type differs: ref " << TensorType{want.dtype, want.shape} << ", other "
       << TensorType{got.dtype, got.shape} << "\n";
    return os.str();
  }
  int64_t bad = 0;
  const int64_t n = want.shape.numel();
  os.precision(17);
  for (int64_t e = 0; e < n; ++e) {
    const size_t k = static_cast<size_t>(e);
    if (!is_floating(want.dtype)) {
      if (want.i[k] == got.i[k]) continue;
      if (bad++ < limit)
        os << want.name << index_text(e, want.shape) << " (" << want.dtype << "): ref " << want.i[k]
           << ", other " << got.i[k] << "\n";
      continue;
    }
    const double scale = want.scale.empty() ? 1.0 : want.scale[k];
    if (close_enough(want.f[k], got.f[k], want.tol, scale)) continue;
    if (bad++ < limit) {
      os << want.name << index_text(e, want.shape) << " (" << want.dtype << "): ref " << want.f[k]
         << ", other " << got.f[k] << " (|diff| " << std::fabs(got.f[k] - want.f[k]) << ", allowed "
         << want.tol.rel << "*|ref| + " << want.tol.abs << "*" << scale << ")\n";
    }
  }
  if (bad > limit) os << want.name << ": " << bad - limit << " more mismatches of " << n << "\n";
  return os.str();
}

inline std::string compare_all(const std::vector<Values>& want, const std::vector<Values>& got) {
  if (want.size() != got.size()) return "the runs returned different numbers of outputs\n";
  std::string report;
  for (size_t k = 0; k < want.size(); ++k) report += compare_output(want[k], got[k]);
  return report;
}

// Runs `program` on ref and on the other backend and expects every output to match.
inline void expect_same(const Program& program, uint64_t seed = 1234) {
  std::vector<Values> want = run_on("ref", program, seed);
  std::vector<Values> got = run_on(other_backend(), program, seed);
  runtime::set_backend("ref");
  std::string report = compare_all(want, got);
  EXPECT_TRUE(report.empty()) << "ref vs " << other_backend() << ":\n" << report;
}

}  // namespace loom::difftest
