// philox_normal_from_words (loom/core/philox.h): Box-Muller with loom's own float64 log and cos.
// Compiled without floating-point contraction (src/CMakeLists.txt): every multiply-add that
// fuses is an explicit std::fma, and the CPU backend's generated code
// (backend/cpu/emitter_elementwise.cpp, `normal_from_words`, and math.cpp's `log_f64_reduced`,
// which is also its float64 log) performs the same operations in the same order, so the two agree
// bit for bit. Both arguments are reduced with integer arithmetic, exactly:
//   u1 = n 2^-24 with n in [1, 2^24]: n = f 2^k with f in (sqrt(1/2), sqrt(2)], so
//        log u1 = (k - 24) ln 2 + log f;
//   u2 = m 2^-24: the quarter turn q = m >> 22 and the rest r = m mod 2^22 give
//        2 pi u2 = q pi/2 + 2 pi r 2^-24, the rest folded to x = 2 pi min(r, 2^22 - r) 2^-24
//        in [0, pi/4], where sin and cos are polynomials.
#include "loom/core/philox.h"

#include <bit>
#include <cmath>

namespace loom {

namespace {
using K = detail::NormalConstants;

// c[0] + z (c[1] + z (...)), highest power innermost.
template <size_t N>
double horner(const double (&c)[N], double z) {
  double r = c[N - 1];
  for (size_t i = N - 1; i-- > 0;) r = std::fma(r, z, c[i]);
  return r;
}

// 2^-k for k in [0, 1023], exactly.
double pow2_neg(int k) { return std::bit_cast<double>(static_cast<uint64_t>(1023 - k) << 52); }

// log(n 2^-24), n in [1, 2^24]: fdlibm's log in its order, as Math::log_f64_reduced emits it.
double log_of_24_bits(uint32_t n) {
  const int k = 31 - std::countl_zero(n);
  double f = static_cast<double>(n) * pow2_neg(k);  // [1, 2)
  int e = k - 24;
  if (f > K::kSqrt2) {
    f = f * 0.5;
    e = e + 1;
  }
  const double g = f - 1.0;
  const double s = g / (2.0 + g);
  const double z = s * s, w = z * z;
  const double odd[4] = {K::kLog[0], K::kLog[2], K::kLog[4], K::kLog[6]};
  const double even[3] = {K::kLog[1], K::kLog[3], K::kLog[5]};
  const double r = z * horner(odd, w) + w * horner(even, w);
  const double hfsq = 0.5 * (g * g);
  const double ef = static_cast<double>(e);
  const double inner = s * (hfsq + r) + ef * K::kLn2Lo;
  return ef * K::kLn2Hi - ((hfsq - inner) - g);
}

double cos_of_turn(uint32_t m) {  // cos(2 pi m 2^-24), m in [0, 2^24)
  const uint32_t q = m >> 22, r = m & 0x3fffffu;
  const bool fold = r > (1u << 21);
  const double x = static_cast<double>(fold ? (1u << 22) - r : r) * K::kTurn;
  const double z = x * x;
  const double sin_x = std::fma(x * z, horner(K::kSin, z), x);
  const double cos_x = std::fma(z * z, horner(K::kCos, z), 1.0 - 0.5 * z);
  // cos(q pi/2 + t): cos t, -sin t, -cos t, sin t; t = pi/2 - x when folded.
  const bool use_sin = ((q & 1u) != 0) != fold;
  const double v = use_sin ? sin_x : cos_x;
  return q == 1 || q == 2 ? -v : v;
}
}  // namespace

double philox_normal_from_words(uint32_t w1, uint32_t w2) {
  const double radius = std::sqrt(-2.0 * log_of_24_bits((w1 >> 8) + 1));
  return radius * cos_of_turn(w2 >> 8);
}

}  // namespace loom
