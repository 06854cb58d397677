// The strides a reshape reads a strided view with (what lets a library or the attention
// kernel read a layout in place): against the addresses the reshape's row-major order gives
// each element, for layouts made by permuting, slicing and broadcasting a dense buffer.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/plan_impl.h"

namespace {

using loom::Shape;

// The address of row-major element i of a tensor of `shape` laid out with `strides`.
int64_t address(const Shape& shape, const std::vector<int64_t>& strides, int64_t i) {
  int64_t a = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    a += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return a;
}

// Whether some strides read `from` (laid out with `strides`) as `to`: every element's address
// is the same affine function of its coordinates in `to` (each dim's step is the address
// difference between neighbours along it, checked at every element).
bool affine(const Shape& from, const std::vector<int64_t>& strides, const Shape& to) {
  const int64_t n = from.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, step = 1;
    for (size_t d = to.size(); d-- > 0;) {
      const int64_t c = rest % to[d];
      rest /= to[d];
      if (c + 1 < to[d]) {
        // The neighbour along d against the first step along d.
        const int64_t first = address(from, strides, step) - address(from, strides, 0);
        const int64_t here = address(from, strides, i + step) - address(from, strides, i);
        if (here != first) return false;
      }
      step *= to[d];
    }
  }
  return true;
}

TEST(CpuReshapeViews, StridesGiveEveryElementsAddress) {
  std::mt19937 rng(7);
  int found = 0, refused = 0;
  for (int round = 0; round < 400; ++round) {
    // A dense buffer of 2-4 dims, then a permutation, a slice of one dim, maybe a broadcast.
    const int rank = 2 + static_cast<int>(rng() % 3);
    Shape base;
    for (int d = 0; d < rank; ++d) base.push_back(1 + static_cast<int64_t>(rng() % 4));
    std::vector<int64_t> st = loom::contiguous_strides(base);
    Shape shape = base;
    std::vector<int> perm(rank);
    for (int d = 0; d < rank; ++d) perm[d] = d;
    if (rng() % 2) std::shuffle(perm.begin(), perm.end(), rng);
    Shape ps;
    std::vector<int64_t> pst;
    for (int d : perm) {
      ps.push_back(shape[d]);
      pst.push_back(st[d]);
    }
    shape = ps;
    st = pst;
    if (rng() % 2) {
      const size_t d = rng() % shape.size();
      if (shape[d] > 1) shape[d] -= 1;  // a slice [0, n-1)
    }
    if (rng() % 4 == 0) {
      const size_t d = rng() % shape.size();
      if (shape[d] == 1) {
        shape[d] = 3;  // an expand
        st[d] = 0;
      }
    }
    // A target of the same size: the dims' sizes split or merged at random.
    std::vector<int64_t> sizes;
    for (int64_t s : shape) {
      if (s == 4 && rng() % 2) {
        sizes.push_back(2);
        sizes.push_back(2);
      } else {
        sizes.push_back(s);
      }
    }
    Shape to;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!to.empty() && rng() % 3 == 0) {
        to[to.size() - 1] *= sizes[i];
      } else {
        to.push_back(sizes[i]);
      }
      if (rng() % 6 == 0) to.push_back(1);
    }
    ASSERT_EQ(to.numel(), shape.numel());
    std::vector<int64_t> out;
    const bool ok = loom::cpu::detail::reshape_strides(shape, st, to, &out);
    if (ok) {
      ++found;
      for (int64_t i = 0; i < shape.numel(); ++i)
        ASSERT_EQ(address(to, out, i), address(shape, st, i)) << "round " << round << " at " << i;
    } else {
      ++refused;
      EXPECT_FALSE(affine(shape, st, to)) << "round " << round << ": a view exists";
    }
  }
  EXPECT_GT(found, 100);
  EXPECT_GT(refused, 10);
}

}  // namespace
