// Helpers for tests that build control-flow regions with the Builder.
#pragma once

#include <memory>
#include <vector>

#include "loom/ir/builder.h"

namespace loom::ir::testing {

using Region = std::shared_ptr<const Graph>;

// A region with parameters of `params` whose outputs `body(builder, params)` builds.
template <class Body>
Region region(std::vector<TensorType> params, Body&& body) {
  auto r = std::make_shared<Graph>();
  Builder b(*r);
  std::vector<Value> ps;
  for (const TensorType& t : params) ps.push_back(b.parameter(t));
  r->outputs() = body(b, ps);
  return r;
}

inline Attrs scan_attrs(int64_t carries, int64_t xs, int64_t length, bool reverse = false) {
  Attrs a;
  a.ints = {carries, xs};
  a.i = length;
  a.flag = reverse;
  return a;
}

// A while carrying the first `carried` operands (the rest are captured).
inline Attrs while_attrs(int64_t carried) {
  Attrs a;
  a.ints = {carried};
  return a;
}

}  // namespace loom::ir::testing
