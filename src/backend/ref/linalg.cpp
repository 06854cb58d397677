// Reference kernel of matmul: [..., M, K] x [..., K, N] -> [broadcast(...), M, N], the naive
// triple loop per batch, accumulating in double (floats) or wrapping int64 (integers).
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

double dot_float(const Array& a, int64_t a0, const Array& b, int64_t b0, int64_t k_len,
                 int64_t n_len) {
  double acc = 0;
  for (int64_t k = 0; k < k_len; ++k) acc += a.get_f(a0 + k) * b.get_f(b0 + k * n_len);
  return acc;
}

int64_t dot_int(const Array& a, int64_t a0, const Array& b, int64_t b0, int64_t k_len,
                int64_t n_len) {
  uint64_t acc = 0;
  for (int64_t k = 0; k < k_len; ++k) {
    acc += static_cast<uint64_t>(a.get_i(a0 + k)) * static_cast<uint64_t>(b.get_i(b0 + k * n_len));
  }
  return static_cast<int64_t>(acc);
}

void matmul_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const Array &a = in[0], &b = in[1];
  const Shape &sa = a.shape(), &sb = b.shape(), &so = out.shape();
  LOOM_ASSERT(sa.size() >= 2 && sb.size() >= 2 && so.size() >= 2);
  const int64_t m_len = sa[sa.size() - 2], k_len = sa.back(), n_len = sb.back();
  LOOM_ASSERT(sb[sb.size() - 2] == k_len);
  const Shape batch = batch_of(so);
  const BroadcastIndex ia(batch, batch_of(sa)), ib(batch, batch_of(sb));
  const bool floating = is_floating(a.dtype());
  for (int64_t bi = 0; bi < batch.numel(); ++bi) {
    const int64_t a_base = ia(bi) * m_len * k_len, b_base = ib(bi) * k_len * n_len;
    for (int64_t m = 0; m < m_len; ++m) {
      for (int64_t n = 0; n < n_len; ++n) {
        const int64_t o = (bi * m_len + m) * n_len + n;
        const int64_t a0 = a_base + m * k_len, b0 = b_base + n;
        if (floating) {
          out.set_f(o, dot_float(a, a0, b, b0, k_len, n_len));
        } else {
          out.set_i(o, dot_int(a, a0, b, b0, k_len, n_len));
        }
      }
    }
  }
}

}  // namespace

void register_linalg_kernels(KernelTable& t) { t.set(OpKind::MatMul, matmul_kernel); }

}  // namespace loom::detail::ref
