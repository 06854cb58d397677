// scan_layers: homogeneous layers run as one scan, so tracing and compiling cost one layer
// whatever the depth (the seed's Example 3).
//
//   Tensor y = loom::scan_layers(layers, x);                 // each layer's forward in turn
//   auto c = loom::scan_layers(layers, carry, [&](loom::nn::Module& layer, const Carry& c) {
//     return step(layer, c, mask);                            // tree carries, extra inputs
//   });
//
// Every layer must have the parameters and buffers of layer 0 (same dotted names, shapes and
// dtypes); a mismatch raises naming the layer and the tensor. The layers' tensors are stacked
// along a new dim 0 (one copy per step, part of the step's graph) and layer 0 runs in the
// scan body with each step's slices bound in place of its own tensors (functional_call), so
// gradients reach every layer's own parameters. An empty list returns the input. `remat` as in
// scan.
#pragma once

#include <source_location>
#include <string>
#include <vector>

#include "loom/nn/nn.h"
#include "loom/trace/bind.h"
#include "loom/trace/control_flow.h"

namespace loom {

struct ScanLayersOptions {
  bool remat = false;
};

namespace detail {
struct StackedLayers {
  std::vector<Tensor> targets;     // layer 0's parameters and buffers
  std::vector<std::string> names;  // their dotted names
  std::vector<Tensor> stacked;     // [num_layers, ...] each
};
StackedLayers stack_layers(const nn::ModuleList& layers);
}  // namespace detail

template <class Carry, class Fn>
Carry scan_layers(const nn::ModuleList& layers, const Carry& init, Fn&& fn,
                  ScanLayersOptions opts = {},
                  std::source_location loc = std::source_location::current()) {
  if (layers.size() == 0) return init;
  detail::StackedLayers st = detail::stack_layers(layers);
  std::shared_ptr<nn::Module> layer0 = layers[0];
  auto body = [&](const Carry& c, const std::vector<Tensor>& slices) {
    detail::TensorBinding bound(st.targets, slices, st.names, "scan_layers");
    Carry next = fn(*layer0, c);
    return std::pair{next, std::tuple<>{}};
  };
  ScanOptions so;
  so.remat = opts.remat;
  return scan(body, init, st.stacked, so, loc).first;
}

inline Tensor scan_layers(const nn::ModuleList& layers, const Tensor& x,
                          ScanLayersOptions opts = {},
                          std::source_location loc = std::source_location::current()) {
  return scan_layers(
      layers, x, [](nn::Module& layer, const Tensor& h) { return layer.forward(h); }, opts, loc);
}

}  // namespace loom
