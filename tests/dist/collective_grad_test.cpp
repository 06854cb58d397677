// The collectives' VJPs against float64 central differences of the objective computed on the
// host: the sum of the ranks' objectives l_r = sum(w_r * y_r^2), or (replicated) the one
// objective every rank computes alike. Ranks as threads, 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "dist/dist_util.h"
#include "loom/loom.h"

namespace loom {
namespace {

using Vec = std::vector<double>;

struct Case {
  const char* name;
  std::function<Shape(int)> in_shape, out_shape;
  // y_r on the host from every rank's input.
  std::function<Vec(const std::vector<Vec>&, int r, int world)> host;
  std::function<Tensor(const Tensor&)> op;
  bool replicated = false;  // one objective, the same on every rank (w equal across ranks)
  bool shared_x = false;    // every rank holds the same x (a replicated input)
};

double xval(int r, int64_t i) { return std::sin(1.0 + r * 7 + i * 0.37); }
double wval(int r, int64_t i) { return std::cos(2.0 + r * 3 + i * 0.11); }

Vec elementwise(const std::vector<Vec>& xs, const std::function<double(double, double)>& f) {
  Vec y = xs[0];
  for (size_t k = 1; k < xs.size(); ++k)
    for (size_t i = 0; i < y.size(); ++i) y[i] = f(y[i], xs[k][i]);
  return y;
}

std::vector<Case> cases() {
  auto s23 = [](int) { return Shape{2, 3}; };
  auto plus = [](double a, double b) { return a + b; };
  std::vector<Case> cs;
  cs.push_back({"all_reduce_sum", s23, s23,
                [=](const std::vector<Vec>& xs, int, int) { return elementwise(xs, plus); },
                [](const Tensor& x) { return dist::all_reduce(x); }});
  cs.push_back({"all_reduce_mean", s23, s23,
                [=](const std::vector<Vec>& xs, int, int w) {
                  Vec y = elementwise(xs, plus);
                  for (double& v : y) v /= w;
                  return y;
                },
                [](const Tensor& x) { return dist::all_reduce(x, dist::ReduceOp::Mean); }});
  cs.push_back({"all_reduce_max", s23, s23,
                [](const std::vector<Vec>& xs, int, int) {
                  return elementwise(xs, [](double a, double b) { return std::max(a, b); });
                },
                [](const Tensor& x) { return dist::all_reduce(x, dist::ReduceOp::Max); }});
  cs.push_back({"all_reduce_min", s23, s23,
                [](const std::vector<Vec>& xs, int, int) {
                  return elementwise(xs, [](double a, double b) { return std::min(a, b); });
                },
                [](const Tensor& x) { return dist::all_reduce(x, dist::ReduceOp::Min); }});
  cs.push_back({"all_reduce_sum replicated", s23, s23,
                [=](const std::vector<Vec>& xs, int, int) { return elementwise(xs, plus); },
                [](const Tensor& x) { return dist::all_reduce(x, dist::ReduceOp::Sum, true); },
                true});
  auto gather_host = [](int dim) {
    return [dim](const std::vector<Vec>& xs, int, int w) {
      Vec y;
      const int64_t rows = dim == 0 ? 2 * w : 2, cols = dim == 0 ? 3 : 3 * w;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t k = dim == 0 ? i / 2 : j / 3;
          y.push_back(xs[static_cast<size_t>(k)]
                        [static_cast<size_t>(dim == 0 ? (i % 2) * 3 + j : i * 3 + j % 3)]);
        }
      return y;
    };
  };
  for (int dim : {0, 1}) {
    auto out = [dim](int w) { return dim == 0 ? Shape{2 * w, 3} : Shape{2, 3 * w}; };
    cs.push_back({dim == 0 ? "all_gather dim 0" : "all_gather dim 1", s23, out, gather_host(dim),
                  [dim](const Tensor& x) { return dist::all_gather(x, dim); }});
    cs.push_back({dim == 0 ? "all_gather dim 0 replicated" : "all_gather dim 1 replicated", s23,
                  out, gather_host(dim),
                  [dim](const Tensor& x) { return dist::all_gather(x, dim, true); }, true});
    cs.push_back({dim == 0 ? "reduce_scatter dim 0" : "reduce_scatter dim 1", out, s23,
                  [dim](const std::vector<Vec>& xs, int r, int w) {
                    Vec y;
                    const int64_t cols = dim == 0 ? 3 : 3 * w;
                    for (int64_t i = 0; i < 2; ++i)
                      for (int64_t j = 0; j < 3; ++j) {
                        const int64_t gi = dim == 0 ? r * 2 + i : i, gj = dim == 0 ? j : r * 3 + j;
                        double s = 0;
                        for (const Vec& x : xs) s += x[static_cast<size_t>(gi * cols + gj)];
                        y.push_back(s);
                      }
                    return y;
                  },
                  [dim](const Tensor& x) { return dist::reduce_scatter(x, dim); }});
  }
  cs.push_back({"grad_all_reduce", s23, s23,
                [](const std::vector<Vec>& xs, int r, int) { return xs[static_cast<size_t>(r)]; },
                [](const Tensor& x) { return dist::grad_all_reduce(x); }, false, true});
  return cs;
}

// The host objective for the ranks' inputs.
double objective(const Case& c, const std::vector<Vec>& xs, int world) {
  double total = 0;
  for (int r = 0; r < world; ++r) {
    Vec y = c.host(xs, c.shared_x ? r : r, world);
    for (size_t i = 0; i < y.size(); ++i)
      total += wval(c.replicated ? 0 : r, static_cast<int64_t>(i)) * y[i] * y[i];
    if (c.replicated) break;
  }
  return total;
}

void check_case(const Case& c, int r, int world) {
  SCOPED_TRACE(::testing::Message() << c.name << ", rank " << r << " of " << world);
  const Shape in = c.in_shape(world), out = c.out_shape(world);
  std::vector<Vec> xs(static_cast<size_t>(world));
  for (int k = 0; k < world; ++k)
    for (int64_t i = 0; i < in.numel(); ++i)
      xs[static_cast<size_t>(k)].push_back(xval(c.shared_x ? 0 : k, i));
  Vec w;
  for (int64_t i = 0; i < out.numel(); ++i) w.push_back(wval(c.replicated ? 0 : r, i));
  Tensor x = tensor(xs[static_cast<size_t>(r)], in).requires_grad_();
  Tensor y = c.op(x);
  Tensor l = sum(tensor(w, out) * y * y);
  l.backward();
  std::vector<double> g = x.grad().to_vector<double>();
  const double h = 1e-6;
  for (int64_t i = 0; i < in.numel(); ++i) {
    std::vector<Vec> p = xs, m = xs;
    for (int k = 0; k < world; ++k) {
      if (!c.shared_x && k != r) continue;
      p[static_cast<size_t>(k)][static_cast<size_t>(i)] += h;
      m[static_cast<size_t>(k)][static_cast<size_t>(i)] -= h;
    }
    const double fd = (objective(c, p, world) - objective(c, m, world)) / (2 * h);
    EXPECT_NEAR(g[static_cast<size_t>(i)], fd, 1e-6 * (1 + std::abs(fd))) << "element " << i;
  }
}

TEST(CollectiveGrad, EveryVjpMatchesFiniteDifferences) {
  for (int world : {2, 4})
    testing::thread_ranks(world, [&](int r) {
      for (const Case& c : cases()) check_case(c, r, world);
    });
}

}  // namespace
}  // namespace loom
