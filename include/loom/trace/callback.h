// Host code inside compiled programs (as jax.pure_callback): a function over host arrays that
// loom calls when the program runs, with results of declared types.
//     loom::HostCallback twice("twice", [](const std::vector<loom::HostArray>& a) {
//       loom::HostArray r = loom::HostArray::zeros(a[0].type);
//       for (int64_t i = 0; i < r.numel(); ++i) r.data<float>()[i] = 2 * a[0].data<float>()[i];
//       return std::vector<loom::HostArray>{r};
//     });
//     Tensor y = loom::pure_callback(twice, {{x.dtype(), x.shape()}}, {x})[0];
// Legal wherever ops are: in scan, while, assume_pure and compile bodies. The callback runs on
// the thread that runs the program. It must be pure: loom may drop an unused call or merge
// two with the same arguments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/core/host_callback.h"
#include "loom/trace/tensor.h"

namespace loom {

// A registered host function. Its id is part of every graph that calls it: make it once (not
// once per step, which would compile every step).
class HostCallback {
 public:
  HostCallback(std::string name, HostFn fn);
  int64_t id() const { return id_; }
  const std::string& name() const { return name_; }

 private:
  int64_t id_;
  std::string name_;
};

struct CallbackOptions {
  // Makes the call differentiable: vjp(args..., results..., result adjoints...) returns one
  // array per argument, of the argument's type (zeros for one without a gradient).
  std::optional<HostCallback> vjp;
};

// The results of fn(args) as lazy tensors of result_types. A result of another type is an
// ExecError naming the callback and both types; an exception fn throws propagates unchanged
// and poisons only the tensors that depend on the call.
std::vector<Tensor> pure_callback(const HostCallback& fn, std::vector<TensorType> result_types,
                                  const std::vector<Tensor>& args, const CallbackOptions& opts = {},
                                  CallSite loc = std::source_location::current());

}  // namespace loom
