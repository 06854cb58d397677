// Reverse-mode autodiff over the IR: one VJP rule per op (src/autodiff/rules.cpp), written
// with builder ops so that it reads like the math, and the backward sweep that applies them.
//
//   // g holds the forward; b builds into it (the adjoint nodes join the same graph)
//   std::vector<Adjoint> grads = autodiff::backward(b, {loss}, {one}, {w, x});
//
// Rules take the adjoints of a node's results and give the adjoints of its operands, each
// with the operand's type (broadcasting is undone by summing). Integer, boolean, comparison,
// random and index-valued ops are "not differentiable": their operands get no adjoint.
// Control flow: a call's VJP is a call of the body's VJP region (built once per body and
// cached); a scan's is a reverse scan over residuals the forward saves (or, with remat,
// recomputes); a while loop has none (an AutodiffError points to fori_loop and scan).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "loom/ir/builder.h"

namespace loom::autodiff {

using Adjoint = std::optional<ir::Value>;

enum class RuleKind { Differentiable, NotDifferentiable, ControlFlow };
// How `op` is differentiated (the registry test checks that every op has an answer).
RuleKind rule_kind(ir::OpKind op);

// The operand adjoints of node `id` of b's graph given its results' adjoints (nullopt: zero).
std::vector<Adjoint> vjp(ir::Builder& b, ir::NodeId id, std::span<const Adjoint> result_adjoints);

// Backward sweep over b's graph: seeds are the adjoints of `roots`; returns the adjoint of
// each of `wrt` (nullopt when no path leads there). `active` (optional, indexed by node id)
// limits the sweep to nodes that may carry gradient; nodes in `stop` are leaves (not
// differentiated through).
std::vector<Adjoint> backward(ir::Builder& b, std::span<const ir::Value> roots,
                              std::span<const ir::Value> seeds, std::span<const ir::Value> wrt,
                              const std::vector<uint8_t>* active = nullptr);

// (Both take their shape by value: builder calls may move the graph's nodes.)
// Sums g over the dims that broadcasting added to reach g's shape from `shape`.
ir::Value unbroadcast(ir::Builder& b, ir::Value g, Shape shape);
// A tensor of zeros of type t.
ir::Value zeros(ir::Builder& b, TensorType t);

// The VJP region of a region graph (a call body or a scan body): parameters are the body's
// parameters followed by one adjoint per body output; outputs are one adjoint per body
// parameter (zeros where there is none). Cached per body while the body lives.
std::shared_ptr<const ir::Graph> vjp_region(const std::shared_ptr<const ir::Graph>& body);

}  // namespace loom::autodiff
