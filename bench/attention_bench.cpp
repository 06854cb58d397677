// `loom-bench attention`: scaled_dot_product_attention forward + backward (B 4, H 8, D 64,
// float32, not causal) at T = 1024 and 4096, fused (one attention node, no [T, T] buffer)
// against the composite loom ran before it (scores written out: matmul, softmax, matmul) in the
// same run, and the fused op's peak memory at T = 4096 against the closed form. With --peers,
// torch 2.9's F.scaled_dot_product_attention (its CPU flash kernel) beside it.
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "loom/core/buffer.h"
#include "loom/loom.h"

namespace loom::bench {
namespace {

constexpr int64_t kB = 4, kH = 8, kD = 64;

// One forward + backward of attention over fresh leaves; `fused` false: the composite.
void attention_step(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& w,
                    bool fused) {
  Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
         v = v0.detach().requires_grad_();
  Tensor y;
  if (fused) {
    y = scaled_dot_product_attention(q, k, v);
  } else {
    Tensor s = matmul(q, transpose(k, -2, -1)) * (1.0 / 8.0);
    y = matmul(softmax(s, -1), v);
  }
  sum(y * w).backward();
  sync();
}

struct Timing {
  double fused_ms, composite_ms;
};

// Medians of `reps` steps each: the fused steps, then the composite's (not interleaved: a fused
// step right after a composite one pays for the gigabytes of scores it freed).
Timing time_both(int64_t T, int reps, bool composite) {
  manual_seed(1);
  Tensor q = randn({kB, kH, T, kD}), k = randn({kB, kH, T, kD}), v = randn({kB, kH, T, kD}),
         w = randn({kB, kH, T, kD});
  sync();
  auto timed = [&](bool fused) {
    attention_step(q, k, v, w, fused);  // warm-up: the compile, the buffers
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      const double t0 = seconds();
      attention_step(q, k, v, w, fused);
      t.push_back(seconds() - t0);
    }
    return median(t) * 1e3;
  };
  const double fused_ms = timed(true);
  return {fused_ms, composite ? timed(false) : -1};
}

// The fused step's peak bytes at T over the closed form: q, k, v, the output's weights, the
// output, the log-sum-exp, delta and three gradients.
double peak_over_closed_form(int64_t T) {
  manual_seed(2);
  Tensor q = randn({kB, kH, T, kD}), k = randn({kB, kH, T, kD}), v = randn({kB, kH, T, kD}),
         w = randn({kB, kH, T, kD});
  sync();
  const double before = static_cast<double>(Buffer::live_bytes());
  Buffer::reset_peak();
  attention_step(q, k, v, w, true);
  const double tensor = kB * kH * T * kD * 4.0, row = kB * kH * T * 4.0;
  const double inputs = 4 * tensor, made = 4 * tensor + 2 * row;
  return (static_cast<double>(Buffer::peak_bytes()) - before + inputs) / (inputs + made);
}

std::vector<Figure> attention() {
  const Timing t1 = time_both(1024, 5, true);
  const Timing t4 = time_both(4096, 3, true);
  const double peak = peak_over_closed_form(4096);
  char note[160];
  std::snprintf(note, sizeof note, "same run; goal: fused at least 3x faster at T = 4096 (%.2fx)",
                t4.composite_ms / t4.fused_ms);
  return {
      {"fwd_bwd_T1024_ms", t1.fused_ms, "ms",
       "fused attention forward + backward, B 4, H 8, T 1024, D 64, median of 5"},
      {"composite_fwd_bwd_T1024_ms", t1.composite_ms, "ms", "same run: scores written out"},
      {"fwd_bwd_T4096_ms", t4.fused_ms, "ms", "the same at T 4096, median of 3"},
      {"composite_fwd_bwd_T4096_ms", t4.composite_ms, "ms", note},
      {"peak_over_closed_form_T4096", peak, "x",
       "fused step's peak live bytes over q, k, v, weights, out, lse, delta, grads; goal <= 1.2"},
  };
}

Register r1("attention",
            "scaled_dot_product_attention fwd+bwd, fused vs the composite, T 1024 and 4096",
            attention);

}  // namespace
}  // namespace loom::bench
