// Control flow and trace-once: scan, while_loop, fori_loop and assume_pure.
//
//   auto [sum, history] = loom::scan(
//       [](const Tensor& acc, const Tensor& x) { Tensor a = acc + x; return std::pair{a, a}; },
//       loom::zeros({1}), loom::arange(1, 6));
//   auto [i, x] = loom::while_loop([](const Tensor& i, const Tensor&) { return i > 0; },
//                                  [](const Tensor& i, const Tensor& x) {
//                                    return std::tuple{i - 1, x + 1};
//                                  },
//                                  std::tuple{loom::tensor(int64_t{10}),
//                                  loom::tensor(int64_t{3})});
//   auto f = loom::assume_pure([](const Tensor& a, const Tensor& b, double c) {
//     return loom::matmul(a, b) + c;
//   });
//
// A loop body is traced once per call into a region of one graph node (scan, while), so the
// compiled program, and its compile time, do not grow with the trip count, and an unchanged
// body hits the compile cache on every later call. Bodies may read tensors from outside
// (captured: live inputs of the loop, read at their current value on every call); random
// ops inside draw fresh numbers in every iteration. Reading a value inside a body (item,
// to_vector, printing, sync) raises a TraceError naming the body and its call site.
//
// assume_pure(fn) traces fn once per signature (the wrapper, each tensor leaf's shape, dtype
// and requires_grad, the tree structure, and the values of the static, non-tensor,
// arguments); a later call with the same signature inserts the cached body as one call node
// without running fn. fn must be pure: a function whose trace depends on host state it does
// not take as a static argument gives stale results on hits; PureOptions::check_purity (or
// LOOM_CHECK_PURITY=1) re-traces on hits and raises a TraceError naming the first op that
// differs. Tensors fn captures from outside are bound by identity (in-place updates to them
// are seen; reassigning the variable to a new tensor is not: pass such tensors as arguments).
//
// Trees: wherever a function takes or returns tensors it may use the trees of tree.h.
// Thread-safety: as tracing (per thread); an assume_pure wrapper may be shared by threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "loom/trace/ops.h"
#include "loom/trace/tree.h"

namespace loom {

struct ScanOptions {
  bool reverse = false;  // run from the last slice to the first; ys[t] still pairs with xs[t]
  int64_t length = -1;   // the trip count; required when xs has no tensors
  bool remat = false;    // autodiff: recompute each step in the backward instead of saving
};

struct PureOptions {
  bool check_purity = false;  // re-trace on every hit and raise if the trace changed
};

namespace detail {

enum class ScopeKind { Loop, Pure };

// Where a tool was called from, for error messages: "the body of scan called at f.cpp:12".
struct Site {
  const char* api;
  const char* role;  // "body", "cond", "function"
  CallSite loc;
};

// A body traced into a region: its graph and what it captured. Opaque here.
struct Body;
using BodyPtr = std::shared_ptr<const Body>;
using FlatFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// The non-template cores (src/trace/control_flow.cpp) take and return flat leaf lists.
// scan: fn gets [index, carry leaves..., x slice leaves...] and returns [new carries..., ys...].
std::vector<Tensor> scan_flat(const Site& site, const ScanOptions& opts, const FlatFn& fn,
                              const std::vector<Tensor>& init,
                              const std::vector<std::string>& init_paths,
                              const std::vector<Tensor>& xs,
                              const std::vector<std::string>& xs_paths);
// while: cond and body get the carried leaves; cond returns one tensor, body the new leaves.
std::vector<Tensor> while_flat(const Site& site, const FlatFn& cond, const FlatFn& body,
                               const std::vector<Tensor>& carried,
                               const std::vector<std::string>& paths);
[[noreturn]] void structure_changed(const Site& site, const std::string& what,
                                    const std::string& before, const std::string& after);

// assume_pure's cache (one per wrapper, or per callable type for capture-less lambdas).
class PureCache;
std::shared_ptr<PureCache> make_pure_cache(const PureOptions& opts, CallSite loc);
// A static argument, type-erased: hashed and compared by value.
struct StaticArg {
  size_t hash = 0;
  const std::type_info* type = nullptr;
  std::shared_ptr<const void> value;
  bool (*equal)(const void*, const void*) = nullptr;
  std::string (*print)(const void*) = nullptr;  // the value as text, when printable
  size_t arg = 0;                               // its position among the call's arguments
};
// A call's arguments split for a cache: the argument types and tree structures, the static
// values, and the tensor leaves (call_key below builds it). The leaves' tree paths
// ("args[0]['x']") are recorded as the arguments and the function that flattens them with
// paths, run only when a miss is explained (a hit builds no path strings); valid while the
// call that made the key runs.
struct CallKey {
  std::string signature;
  std::vector<StaticArg> statics;
  std::vector<Tensor> leaves;
  const void* args = nullptr;
  std::vector<std::string> (*paths_of)(const void* args) = nullptr;
  std::vector<std::string> leaf_paths() const {
    return paths_of ? paths_of(args) : std::vector<std::string>{};
  }
};
// What caches of traced calls (assume_pure, compile's trace_once) compare: the signature, the
// static values, and each leaf's type and requires_grad. `what` names the API in errors.
struct CallSignature {
  std::string signature;
  std::vector<StaticArg> statics;
  std::vector<TensorType> types;
  std::vector<uint8_t> grads;
  std::vector<std::string> paths;    // each leaf's tree path (CallKey::leaf_paths), on a miss
  std::vector<std::string> layouts;  // compile's leaves' layouts when one is sharded, else empty
  uint64_t hash = 0;
  bool operator==(const CallSignature& o) const;
};
CallSignature call_signature(CallKey& key, const char* what);  // moves key.statics
// Notes the cause of a cache miss for the recompile explanation: which static argument, leaf
// type (by tree path, "args[0]['x']") or requires_grad differs from the closest of `earlier`.
// `where` names the cache ("assume_pure function at f.cpp:12").
void note_call_miss(const std::string& where, const std::vector<const CallSignature*>& earlier,
                    const CallSignature& sig);
// Looks up the call's signature; on a miss traces `fn` (which also stores the result tree's
// shape into *like). Returns the outputs of the inserted call.
std::vector<Tensor> pure_call(PureCache& cache, CallKey key, const FlatFn& fn,
                              std::shared_ptr<const void>* like);

// Trees of tensors, as opposed to static arguments.
template <class T>
struct is_tree : std::false_type {};
template <>
struct is_tree<Tensor> : std::true_type {};
template <>
struct is_tree<Tree> : std::true_type {};
template <class T>
struct is_tree<std::vector<T>> : is_tree<T> {};
template <class T, size_t N>
struct is_tree<std::array<T, N>> : is_tree<T> {};
template <class T>
struct is_tree<std::map<std::string, T>> : is_tree<T> {};
template <class A, class B>
struct is_tree<std::pair<A, B>> : std::bool_constant<is_tree<A>::value && is_tree<B>::value> {};
template <class... Ts>
struct is_tree<std::tuple<Ts...>> : std::bool_constant<(is_tree<Ts>::value && ...)> {};

// Static arguments are stored by value; string literals as std::string.
template <class T>
using stored_arg_t =
    std::conditional_t<!is_tree<T>::value && std::is_convertible_v<const T&, std::string_view>,
                       std::string, T>;

template <class T>
concept Hashable = requires(const T& a, const T& b) {
  { std::hash<T>{}(a) } -> std::convertible_to<size_t>;
  { a == b } -> std::convertible_to<bool>;
};

template <class T>
StaticArg make_static(const T& v) {
  static_assert(Hashable<T>,
                "loom::assume_pure: an argument that is not a tree of tensors is a static "
                "argument, part of the cache key, so its type needs std::hash and operator== "
                "(numbers, enums and std::string have them)");
  StaticArg a;
  a.hash = std::hash<T>{}(v);
  a.type = &typeid(T);
  a.value = std::make_shared<const T>(v);
  a.equal = [](const void* x, const void* y) {
    return static_cast<bool>(*static_cast<const T*>(x) == *static_cast<const T*>(y));
  };
  if constexpr (std::is_enum_v<T>) {
    a.print = [](const void* x) {
      return std::to_string(static_cast<std::underlying_type_t<T>>(*static_cast<const T*>(x)));
    };
  } else if constexpr (std::is_same_v<T, std::string>) {
    a.print = [](const void* x) { return "\"" + *static_cast<const std::string*>(x) + "\""; };
  } else if constexpr (requires(std::ostream& os, const T& v) { os << v; }) {
    a.print = [](const void* x) { return loom::detail::str_cat(*static_cast<const T*>(x)); };
  }
  return a;
}

// Splits one argument into the signature, the static values and the tensor leaves.
template <class T>
void pure_arg(const T& a, size_t arg, CallKey* key) {
  if constexpr (is_tree<T>::value) {
    key->signature += tree::structure(a);
    tree::flatten(a, &key->leaves);
  } else {
    key->signature += "s";
    if constexpr (!std::is_same_v<stored_arg_t<T>, T>)
      key->statics.push_back(make_static(stored_arg_t<T>(a)));
    else
      key->statics.push_back(make_static(a));
    key->statics.back().arg = arg;
  }
  key->signature += ';';
}

// The tree paths of the tensor leaves of `args` (a std::tuple<const Args&...>), in leaf order.
template <class... Args>
std::vector<std::string> call_leaf_paths(const void* args) {
  std::vector<Tensor> leaves;
  std::vector<std::string> paths;
  size_t arg = 0;
  auto add = [&](const auto& a) {
    if constexpr (is_tree<std::decay_t<decltype(a)>>::value)
      tree::flatten(a, &leaves, &paths, "args[" + std::to_string(arg) + "]");
    ++arg;
  };
  std::apply([&](const auto&... a) { (add(a), ...); },
             *static_cast<const std::tuple<const Args&...>*>(args));
  return paths;
}

// `args` must outlive the key's use (the caller's std::forward_as_tuple of its arguments).
template <class... Args>
CallKey call_key(const std::tuple<const Args&...>& args) {
  CallKey key;
  key.signature = typeid(std::tuple<Args...>).name();
  key.signature += '|';
  size_t arg = 0;
  std::apply([&](const auto&... a) { (pure_arg(a, arg++, &key), ...); }, args);
  key.args = &args;
  key.paths_of = &call_leaf_paths<Args...>;
  return key;
}

// The leaves of a function's result; *like receives the result tree's shape (leaves undefined).
template <class Ret>
std::vector<Tensor> flatten_result(const Ret& r, std::shared_ptr<const void>* like) {
  std::vector<Tensor> out;
  tree::flatten(r, &out);
  *like = std::make_shared<const Ret>(tree::unflatten(r, std::vector<Tensor>(out.size())));
  return out;
}

// Rebuilds one argument for the traced call: trees get the body's parameters.
template <class T>
stored_arg_t<T> pure_rebuild(const T& a, const std::vector<Tensor>& params, size_t* pos) {
  if constexpr (is_tree<T>::value)
    return tree::unflatten(a, params, pos);
  else
    return stored_arg_t<T>(a);
}

// True when R converts to the one type of Ts (a body that returns a lone carried value).
template <class R, class... Ts>
struct single_convertible : std::false_type {};
template <class R, class T>
struct single_convertible<R, T> : std::is_convertible<R, T> {};

// Body results as the carried tuple: a tuple as is, a lone value for one carried value.
template <class Tuple, class R>
Tuple as_carried(R&& r) {
  if constexpr (std::tuple_size_v<Tuple> == 1 &&
                single_convertible<std::decay_t<R>, std::tuple_element_t<0, Tuple>>::value)
    return Tuple{std::forward<R>(r)};
  else
    return Tuple(std::forward<R>(r));
}

template <class Ret>
void take_pair(const Ret&) {
  static_assert(std::tuple_size_v<Ret> == 2,
                "loom::scan: the body returns a pair (or 2-tuple) {new carry, y}; use "
                "std::tuple<>{} as y when there is none");
}

template <class Tuple>
std::vector<std::string> leaf_paths(const Tuple& t, const std::string& prefix,
                                    std::vector<Tensor>* leaves) {
  std::vector<std::string> paths;
  tree::flatten(t, leaves, &paths, prefix);
  return paths;
}

}  // namespace detail

// scan: carry, ys = fn(carry, x) over the leading dim of every xs leaf; each y leaf is
// stacked along a new dim 0. Returns {final carry, ys}. A zero-length scan returns init and
// ys with a leading 0.
template <class Fn, class Carry, class Xs>
auto scan(Fn&& fn, const Carry& init, const Xs& xs, ScanOptions opts = {},
          std::source_location loc = std::source_location::current()) {
  using Ret = std::decay_t<std::invoke_result_t<Fn&, const Carry&, const Xs&>>;
  using NewCarry = std::decay_t<std::tuple_element_t<0, Ret>>;
  using Y = std::decay_t<std::tuple_element_t<1, Ret>>;
  static_assert(std::is_convertible_v<NewCarry, Carry>,
                "loom::scan: the body must return a carry of the init's type");
  static_assert(
      detail::is_tree<Carry>::value && detail::is_tree<Xs>::value && detail::is_tree<Y>::value,
      "loom::scan: init, xs and the body's y must be trees of tensors");
  const detail::Site site{"scan", "body", loc};
  std::vector<Tensor> init_leaves, xs_leaves;
  std::vector<std::string> init_paths = detail::leaf_paths(init, "carry", &init_leaves);
  std::vector<std::string> xs_paths = detail::leaf_paths(xs, "xs", &xs_leaves);
  const size_t nc = init_leaves.size();
  std::shared_ptr<Y> y_like;
  detail::FlatFn flat = [&](const std::vector<Tensor>& p) {
    std::vector<Tensor> cp(p.begin() + 1, p.begin() + 1 + static_cast<long>(nc));
    std::vector<Tensor> xp(p.begin() + 1 + static_cast<long>(nc), p.end());
    Ret r = fn(tree::unflatten(init, cp), tree::unflatten(xs, xp));
    detail::take_pair(r);
    Carry c = std::get<0>(r);
    if (tree::structure(c) != tree::structure(init))
      detail::structure_changed(site, "carry", tree::structure(init), tree::structure(c));
    std::vector<Tensor> out;
    tree::flatten(c, &out);
    std::vector<Tensor> ys;
    tree::flatten(std::get<1>(r), &ys);
    y_like = std::make_shared<Y>(tree::unflatten(std::get<1>(r), std::vector<Tensor>(ys.size())));
    out.insert(out.end(), ys.begin(), ys.end());
    return out;
  };
  std::vector<Tensor> res =
      detail::scan_flat(site, opts, flat, init_leaves, init_paths, xs_leaves, xs_paths);
  std::vector<Tensor> carry_out(res.begin(), res.begin() + static_cast<long>(nc));
  std::vector<Tensor> ys_out(res.begin() + static_cast<long>(nc), res.end());
  return std::pair<Carry, Y>{tree::unflatten(init, carry_out), tree::unflatten(*y_like, ys_out)};
}

// while_loop: while cond(carried...) { carried = body(carried...) }. cond returns a bool
// scalar tensor; body returns the new carried values (a tuple of the same trees and types).
template <class Cond, class BodyFn, class... Ts>
std::tuple<Ts...> while_loop(Cond&& cond, BodyFn&& body, const std::tuple<Ts...>& carried,
                             std::source_location loc = std::source_location::current()) {
  static_assert(detail::is_tree<std::tuple<Ts...>>::value,
                "loom::while_loop: the carried values must be trees of tensors");
  const detail::Site site{"while_loop", "body", loc};
  std::vector<Tensor> leaves;
  std::vector<std::string> paths = detail::leaf_paths(carried, "carried", &leaves);
  detail::FlatFn flat_cond = [&](const std::vector<Tensor>& p) {
    Tensor c = std::apply(cond, tree::unflatten(carried, p));
    return std::vector<Tensor>{c};
  };
  detail::FlatFn flat_body = [&](const std::vector<Tensor>& p) {
    std::tuple<Ts...> next =
        detail::as_carried<std::tuple<Ts...>>(std::apply(body, tree::unflatten(carried, p)));
    if (tree::structure(next) != tree::structure(carried))
      detail::structure_changed(site, "carried values", tree::structure(carried),
                                tree::structure(next));
    std::vector<Tensor> out;
    tree::flatten(next, &out);
    return out;
  };
  return tree::unflatten(carried, detail::while_flat(site, flat_cond, flat_body, leaves, paths));
}

// A fori_loop bound: an integer, or an integer scalar tensor (a bound known only at run
// time makes the loop a while loop). Records the call site.
struct LoopBound {
  LoopBound(int64_t v, std::source_location loc = std::source_location::current())  // NOLINT
      : value(v), loc(loc) {}
  LoopBound(int v, std::source_location loc = std::source_location::current())  // NOLINT
      : value(v), loc(loc) {}
  LoopBound(double v, std::source_location loc = std::source_location::current())  // NOLINT
      : value(0), fvalue(v), is_float(true), loc(loc) {}
  LoopBound(Tensor t, std::source_location loc = std::source_location::current())  // NOLINT
      : tensor(std::move(t)), loc(loc) {}
  int64_t value = 0;
  double fvalue = 0;
  bool is_float = false;
  Tensor tensor;
  std::source_location loc;
};

namespace detail {
// Checks the bounds; returns true when both are host integers.
bool fori_static(const LoopBound& lower, const LoopBound& upper);
// i + lower as an int64 scalar (inside the body).
Tensor fori_index(const Tensor& index, const LoopBound& lower);
}  // namespace detail

// fori_loop: for i in [lower, upper): carried = body(i, carried...); i is an int64 scalar
// tensor. lower >= upper runs no trip. Integer bounds make it a scan (differentiable);
// tensor bounds a while loop.
template <class BodyFn, class... Ts>
std::tuple<Ts...> fori_loop(LoopBound lower, LoopBound upper, BodyFn&& body, const Ts&... carried) {
  static_assert(sizeof...(Ts) >= 1, "loom::fori_loop: carry at least one value");
  std::tuple<Ts...> init{carried...};
  auto step = [&](const Tensor& i, const std::tuple<Ts...>& c) {
    return detail::as_carried<std::tuple<Ts...>>(
        std::apply([&](const auto&... xs) { return body(i, xs...); }, c));
  };
  if (detail::fori_static(lower, upper)) {
    const detail::Site site{"fori_loop", "body", lower.loc};
    std::vector<Tensor> leaves;
    std::vector<std::string> paths = detail::leaf_paths(init, "carried", &leaves);
    detail::FlatFn flat = [&](const std::vector<Tensor>& p) {
      std::tuple<Ts...> next =
          step(detail::fori_index(p[0], lower),
               tree::unflatten(init, std::vector<Tensor>(p.begin() + 1, p.end())));
      if (tree::structure(next) != tree::structure(init))
        detail::structure_changed(site, "carried values", tree::structure(init),
                                  tree::structure(next));
      std::vector<Tensor> out;
      tree::flatten(next, &out);
      return out;
    };
    ScanOptions opts;
    opts.length = std::max<int64_t>(0, upper.value - lower.value);
    return tree::unflatten(init, detail::scan_flat(site, opts, flat, leaves, paths, {}, {}));
  }
  Tensor lo = lower.tensor.defined() ? lower.tensor : loom::tensor(lower.value);
  Tensor hi = upper.tensor.defined() ? upper.tensor : loom::tensor(upper.value);
  auto r = while_loop([&](const Tensor& i, const std::tuple<Ts...>&) { return i < hi; },
                      [&](const Tensor& i, const std::tuple<Ts...>& c) {
                        return std::tuple<Tensor, std::tuple<Ts...>>{i + int64_t{1}, step(i, c)};
                      },
                      std::tuple<Tensor, std::tuple<Ts...>>{loom::to(lo, DType::Int64), init},
                      lower.loc);
  return std::get<1>(r);
}

// assume_pure: see the top of this file.
template <class Fn>
class Pure {
 public:
  Pure(Fn fn, std::shared_ptr<detail::PureCache> cache)
      : fn_(std::move(fn)), cache_(std::move(cache)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    using Ret = std::decay_t<std::invoke_result_t<const Fn&, const Args&...>>;
    static_assert(detail::is_tree<Ret>::value,
                  "loom::assume_pure: the function must return a tree of tensors");
    std::shared_ptr<const void> like;
    detail::FlatFn trace = [&](const std::vector<Tensor>& params) {
      size_t pos = 0;
      // Braced initialization evaluates left to right: parameters are taken in order.
      std::tuple<detail::stored_arg_t<Args>...> rebuilt{
          detail::pure_rebuild(args, params, &pos)...};
      return detail::flatten_result(std::apply(fn_, rebuilt), &like);
    };
    const std::tuple<const Args&...> refs(args...);
    std::vector<Tensor> out = detail::pure_call(*cache_, detail::call_key(refs), trace, &like);
    return tree::unflatten(*static_cast<const Ret*>(like.get()), out);
  }

 private:
  Fn fn_;
  std::shared_ptr<detail::PureCache> cache_;
};

template <class Fn>
Pure<std::decay_t<Fn>> assume_pure(Fn&& fn, PureOptions opts = {},
                                   std::source_location loc = std::source_location::current()) {
  using F = std::decay_t<Fn>;
  // A capture-less lambda is one function whatever the object: its cache is per type, so
  // `assume_pure([](...) {...})(x)` written inside a loop still traces once.
  if constexpr (std::is_empty_v<F> && std::is_default_constructible_v<F>) {
    static const std::shared_ptr<detail::PureCache> shared = detail::make_pure_cache(opts, loc);
    return Pure<F>(std::forward<Fn>(fn),
                   opts.check_purity ? detail::make_pure_cache(opts, loc) : shared);
  } else {
    return Pure<F>(std::forward<Fn>(fn), detail::make_pure_cache(opts, loc));
  }
}

// custom_vjp (as jax.custom_vjp, over lists of tensors): fwd(args) -> {outputs, residuals},
// bwd(residuals, output adjoints) -> one adjoint per argument (undefined: zeros). Each use
// traces both into one call whose VJP is bwd's trace (README, docs/architecture.md).
using VjpForward = std::function<std::pair<std::vector<Tensor>, std::vector<Tensor>>(
    const std::vector<Tensor>& args)>;
using VjpBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& residuals,
                                                      const std::vector<Tensor>& grads)>;
class CustomVjp {
 public:
  CustomVjp(detail::FlatFn fn, VjpForward fwd, VjpBackward bwd,
            CallSite loc = std::source_location::current())
      : fn_(std::move(fn)), fwd_(std::move(fwd)), bwd_(std::move(bwd)), loc_(loc) {}
  std::vector<Tensor> operator()(const std::vector<Tensor>& args) const;

 private:
  detail::FlatFn fn_;
  VjpForward fwd_;
  VjpBackward bwd_;
  CallSite loc_;
};
inline CustomVjp custom_vjp(detail::FlatFn fn, VjpForward fwd, VjpBackward bwd,
                            CallSite loc = std::source_location::current()) {
  return CustomVjp(std::move(fn), std::move(fwd), std::move(bwd), loc);
}

}  // namespace loom
