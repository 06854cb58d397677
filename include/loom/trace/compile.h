// compile(step): one graph per call, cut before and after, with guards against surprises.
//
//   auto train_step = loom::compile([&](const Tensor& x, const Tensor& y) {
//     Tensor loss = loom::cross_entropy(model(x), y);
//     loss.backward();
//     opt.step();
//     opt.zero_grad();
//     return loss;
//   }, {.name = "train_step", .trace_once = true});
//
// Options: `name` labels the step in errors and logs. `full_graph = true` raises a TraceError
// when anything inside reads a value (item, to_vector, printing, sync). `max_different_graphs
// = N` raises, naming the first differing op (IR text) against the closest earlier graph,
// when the step produces more than N distinct graphs. `trace_once = true` gives assume_pure's
// contract to the whole step: after the first call per signature (the arguments' tree
// structure, leaf shapes and dtypes, and static values) the step is not traced again; the
// compiled graph runs on the arguments and on the current values of the tensors it read, and
// its in-place updates (parameters, optimizer state) are written back, into the old buffers
// when nothing else holds them (donated). Host numbers read inside (a learning rate) are then
// fixed at their first value, and updates must be in place (copy_, add_), as the optimizers'
// are; random ops draw fresh numbers on every call. A backward inside the step accumulates
// into the leaves' grads of each call (or starts them where none), as eager does.
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "loom/trace/control_flow.h"

namespace loom {

struct CompileOptions {
  std::string name;
  bool full_graph = false;
  int max_different_graphs = 0;  // 0: no limit
  bool trace_once = false;
};

namespace detail {
class StepCache;
std::shared_ptr<StepCache> make_step_cache(CompileOptions opts, CallSite loc);
// Runs one step: `fn` traces it (returning its flat results); on a trace_once hit fn is not
// called and the results come from the replay. *like receives the result tree's shape.
std::vector<Tensor> run_step(StepCache& cache, CallKey key, const FlatFn& fn,
                             std::shared_ptr<const void>* like);
}  // namespace detail

template <class Fn>
class Compiled {
 public:
  Compiled(Fn fn, std::shared_ptr<detail::StepCache> cache)
      : fn_(std::move(fn)), cache_(std::move(cache)) {}

  template <class... Args>
  auto operator()(const Args&... args) {
    using Ret = std::decay_t<std::invoke_result_t<Fn&, const Args&...>>;
    static_assert(detail::is_tree<Ret>::value || std::is_void_v<Ret>,
                  "loom::compile: the step must return a tree of tensors (or nothing)");
    std::shared_ptr<const void> like;
    detail::FlatFn trace = [&](const std::vector<Tensor>&) {
      if constexpr (std::is_void_v<Ret>) {
        fn_(args...);
        return detail::flatten_result(std::tuple<>{}, &like);
      } else {
        return detail::flatten_result(fn_(args...), &like);
      }
    };
    const std::tuple<const Args&...> refs(args...);
    std::vector<Tensor> out = detail::run_step(*cache_, detail::call_key(refs), trace, &like);
    if constexpr (!std::is_void_v<Ret>)
      return tree::unflatten(*static_cast<const Ret*>(like.get()), out);
  }

 private:
  Fn fn_;
  std::shared_ptr<detail::StepCache> cache_;
};

template <class Fn>
Compiled<std::decay_t<Fn>> compile(Fn&& fn, CompileOptions opts = {},
                                   std::source_location loc = std::source_location::current()) {
  return Compiled<std::decay_t<Fn>>(std::forward<Fn>(fn),
                                    detail::make_step_cache(std::move(opts), loc));
}

}  // namespace loom
