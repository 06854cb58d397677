// op_paths: ops that once ran far from their bound on the CPU backend, each against a
// baseline of the same size in the same run (and PyTorch's time where python3-torch exists):
//   a bfloat16 product [256,256]x[256,256] against the float32 one (it ran on the reference
//   loop, 250x slower, before half-precision products became float32 ones);
//   an embedding lookup of 2048 rows of 512 from a [50000,512] table, forward and backward
//   (index_select's adjoint was a one-hot product, O(rows x table)), against a copy of the
//   looked-up bytes;
//   log_softmax and argmax over [2048,1000] against exp of the same size (the row max and
//   the argmax reduced scalar);
//   a bias gradient's sum over rows against a sum over the last dim of the same tensor (each
//   column was walked with a stride);
//   normal draws against uniform ones of the same size (the normals' log and cos were scalar
//   libm calls), float64 exp, log and tanh and float32 pow against PyTorch (libm calls too);
//   float32 x ** 2 with a host exponent against x * x (the general pow, 12x slower, served
//   it); float32 sin and cos against exp (scalar libm calls in float64, 3 ms, until they had
//   their own reduction and polynomials).
#include "bench.h"
#include "loom/loom.h"

namespace loom::bench {
namespace {

// The median over `reps` of one traced-and-synced run of f.
double loom_ms(int reps, const std::function<Tensor()>& f) {
  f();
  loom::sync();
  return median_seconds(reps,
                        [&] {
                          Tensor r = f();
                          loom::sync();
                        }) *
         1e3;
}

std::vector<int64_t> tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7919 + 13) % vocab;
  return v;
}

std::vector<Figure> op_paths() {
  std::vector<Figure> f;
  constexpr int kReps = 9;
  Tensor a = loom::randn({256, 256}), b = loom::randn({256, 256});
  Tensor ah = loom::to(a, bfloat16), bh = loom::to(b, bfloat16);
  loom::sync();
  const double f32 = loom_ms(41, [&] { return loom::matmul(a, b); });  // sub-millisecond
  const double bf16 = loom_ms(41, [&] { return loom::matmul(ah, bh); });
  f.push_back({"matmul_f32_ms", f32, "ms", "[256,256]x[256,256]"});
  f.push_back({"matmul_bf16_ms", bf16, "ms", "the same in bfloat16 (float32 product, rounded)"});
  f.push_back({"bf16_over_f32", bf16 / f32, "x", "the conversions' share"});

  constexpr int64_t kVocab = 50000, kDim = 512, kRows = 2048;
  Tensor table = loom::randn({kVocab, kDim}).requires_grad_();
  Tensor idx = loom::tensor(tokens(kRows, kVocab), {4, kRows / 4});
  Tensor g = loom::randn({4, kRows / 4, kDim}), rows = loom::randn({kRows, kDim});
  loom::sync();
  const double fwd = loom_ms(kReps, [&] { return loom::embedding(idx, table); });
  const double fwd_bwd = loom_ms(kReps, [&] {
    table.reset_grad();
    loom::sum(loom::embedding(idx, table) * g).backward();
    return table.grad();
  });
  const double copy = loom_ms(kReps, [&] { return rows * 1.0; });
  f.push_back({"embedding_ms", fwd, "ms", "2048 rows of 512 from [50000,512]"});
  f.push_back({"embedding_fwd_bwd_ms", fwd_bwd, "ms", "forward, backward into the table"});
  f.push_back({"copy_2048x512_ms", copy, "ms", "same run: x * 1 over the looked-up bytes"});
  const double torch_emb = torch_figure(
      "\nimport torch, time\nw = torch.randn(50000, 512, requires_grad=True)\n"
      "i = (torch.arange(2048) * 7919 + 13) % 50000\ng = torch.randn(2048, 512)\nts = []\n"
      "for r in range(9):\n  t0 = time.perf_counter()\n  w.grad = None\n"
      "  (torch.nn.functional.embedding(i, w) * g).sum().backward()\n"
      "  ts.append(time.perf_counter() - t0)\nts.sort()\nprint('ms', ts[4] * 1e3)\n",
      "ms");
  if (torch_emb > 0) {
    f.push_back({"torch_embedding_fwd_bwd_ms", torch_emb, "ms", "same run: PyTorch 1.13"});
    f.push_back({"embedding_fwd_bwd_vs_torch", fwd_bwd / torch_emb, "x", "< 1: faster"});
  }
  table.reset_grad();

  Tensor logits = loom::randn({2048, 1000});
  loom::sync();
  const double lsm = loom_ms(kReps, [&] { return loom::log_softmax(logits, 1); });
  const double ex = loom_ms(kReps, [&] { return loom::exp(logits); });
  f.push_back({"log_softmax_ms", lsm, "ms", "[2048,1000], last dim"});
  f.push_back({"exp_ms", ex, "ms", "same run: exp over the same elements"});
  f.push_back({"log_softmax_over_exp", lsm / ex, "x", "two passes and a log per row"});
  const double am = loom_ms(kReps, [&] { return loom::argmax(logits, 1); });
  f.push_back({"argmax_ms", am, "ms", "[2048,1000], last dim (was 14 ms: a scalar loop)"});
  f.push_back({"argmax_over_exp", am / ex, "x", "a max pass and a first-index pass"});

  Tensor dy = loom::randn({4, 512, 512});
  loom::sync();
  const double cols = loom_ms(kReps, [&] { return loom::sum(dy, {0, 1}); });
  const double rows_sum = loom_ms(kReps, [&] { return loom::sum(dy, {2}); });
  f.push_back({"column_sum_ms", cols, "ms", "a bias gradient: [4,512,512] summed over dims 0, 1"});
  f.push_back({"row_sum_ms", rows_sum, "ms", "same run: the same tensor summed over its last dim"});
  f.push_back({"column_over_row_sum", cols / rows_sum, "x", "was ~25 (a strided walk per column)"});

  const double normal = loom_ms(kReps, [&] { return loom::randn({4, 512, 512}); });
  const double uniform = loom_ms(kReps, [&] { return loom::rand({4, 512, 512}); });
  f.push_back({"randn_ms", normal, "ms", "[4,512,512] standard normals (was 19 ms: scalar libm)"});
  f.push_back({"rand_ms", uniform, "ms", "same run: uniforms of the same size"});
  f.push_back({"randn_over_rand", normal / uniform, "x", "Box-Muller's log, cos and sqrt"});

  // float64 exp and log, float32 pow: libm calls per element until backend/cpu/math.cpp had
  // its own (2.9, 3.3 and 3.1 ms then, on a 2-core Xeon).
  Tensor pos = loom::rand({4, 512, 512}) + 0.5, expo = loom::rand({4, 512, 512}) * 4 - 2;
  Tensor pos64 = loom::to(pos, float64);
  loom::sync();
  const double exp64 = loom_ms(kReps, [&] { return loom::exp(pos64); });
  const double log64 = loom_ms(kReps, [&] { return loom::log(pos64); });
  Tensor wide64 = loom::to(expo, float64) * 2;  // [-4, 4): expm1's cases and exp's
  loom::sync();
  const double tanh64 = loom_ms(kReps, [&] { return loom::tanh(wide64); });
  const double powf32 = loom_ms(kReps, [&] { return loom::pow(pos, expo); });
  const double exp32 = loom_ms(kReps, [&] { return loom::exp(pos); });
  f.push_back({"exp_f64_ms", exp64, "ms", "[4,512,512] float64"});
  f.push_back({"log_f64_ms", log64, "ms", "[4,512,512] float64"});
  f.push_back({"tanh_f64_ms", tanh64, "ms", "[4,512,512] float64 in [-4, 4)"});
  f.push_back({"pow_f32_ms", powf32, "ms", "[4,512,512] float32 tensor ** tensor"});
  f.push_back({"pow_over_exp_f32", powf32 / exp32, "x", "same run: against float32 exp"});
  // A host exponent is a graph input (no recompile per value); the kernel checks it for 2.
  const double square = loom_ms(kReps, [&] { return loom::pow(expo, 2.0); });
  const double cube = loom_ms(kReps, [&] { return loom::pow(pos, 3.0); });
  const double mul = loom_ms(kReps, [&] { return expo * expo; });
  f.push_back({"pow_2_f32_ms", square, "ms", "[4,512,512] float32 x ** 2 (host exponent)"});
  f.push_back({"pow_3_f32_ms", cube, "ms", "the same executable's general path: x ** 3"});
  f.push_back({"pow_2_over_mul", square / mul, "x", "same run: against x * x"});
  Tensor wide = expo * 50;  // [-100, 100): every quadrant, reductions of several turns
  loom::sync();
  const double sin32 = loom_ms(kReps, [&] { return loom::sin(wide); });
  const double cos32 = loom_ms(kReps, [&] { return loom::cos(wide); });
  f.push_back({"sin_f32_ms", sin32, "ms", "[4,512,512] float32 in [-100, 100)"});
  f.push_back({"cos_f32_ms", cos32, "ms", "[4,512,512] float32 in [-100, 100)"});
  f.push_back({"sin_over_exp_f32", sin32 / exp32, "x", "same run: against float32 exp"});

  const std::string torch_code =
      "\nimport torch, time\nx = torch.rand(4, 512, 512) + 0.5\ny = torch.rand(4, 512, 512) * 4 - 2"
      "\nxd = x.double()\n"
      "def med(f):\n  ts = []\n  for r in range(9):\n    t0 = time.perf_counter()\n    f()\n"
      "    ts.append(time.perf_counter() - t0)\n  ts.sort()\n  return ts[4] * 1e3\n"
      "print('randn', med(lambda: torch.randn(4, 512, 512)))\n"
      "print('exp64', med(lambda: xd.exp()))\nprint('log64', med(lambda: xd.log()))\n"
      "yd = y.double() * 2\nprint('tanh64', med(lambda: yd.tanh()))\n"
      "print('pow', med(lambda: x.pow(y)))\nprint('square', med(lambda: y ** 2))\n"
      "w = y * 50\nprint('sin', med(lambda: w.sin()))\nprint('cos', med(lambda: w.cos()))\n";
  const struct {
    const char* key;
    const char* name;
    double loom;
  } vs[] = {{"randn", "randn", normal},  {"exp64", "exp_f64", exp64},
            {"log64", "log_f64", log64}, {"tanh64", "tanh_f64", tanh64},
            {"pow", "pow_f32", powf32},  {"square", "pow_2_f32", square},
            {"sin", "sin_f32", sin32},   {"cos", "cos_f32", cos32}};
  const std::string torch_out = torch_output(torch_code);  // one run prints them all
  for (const auto& v : vs) {
    const double t = figure_in(torch_out, v.key);
    if (t <= 0) continue;
    f.push_back({std::string("torch_") + v.name + "_ms", t, "ms", "same run: PyTorch 1.13"});
    f.push_back({std::string(v.name) + "_vs_torch", v.loom / t, "x", "< 1: faster"});
  }
  return f;
}

Register r(
    "op_paths",
    "bf16 products, embedding fwd+bwd, log_softmax, column sums, randn vs same-size baselines",
    op_paths);

}  // namespace
}  // namespace loom::bench
