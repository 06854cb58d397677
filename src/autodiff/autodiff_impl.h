// Internals of the autodiff room.
#pragma once

#include "loom/autodiff/autodiff.h"

namespace loom::autodiff::detail {

// call, scan and while (control_flow.cpp).
std::vector<Adjoint> control_flow_vjp(ir::Builder& b, ir::NodeId id,
                                      std::span<const Adjoint> result_adjoints);

}  // namespace loom::autodiff::detail
