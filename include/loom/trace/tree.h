// Trees ("pytrees"): nested containers of tensors that tracing tools take and return.
//
// A tree is a Tensor; a std::vector, std::array, std::pair or std::tuple of trees (the empty
// tuple is "nothing"); a std::map<std::string, tree>; or the dynamic loom::Tree, nested
// freely. flatten() lists the leaves in a fixed order (maps by key), with the path of each
// ("carry['sum']", "xs[1][0]") for error messages; structure() names the shape of the tree
// (for cache keys and for "the body changed the carry's structure" errors); unflatten()
// rebuilds a tree of the same structure from new leaves. Pure functions, thread-safe.
#pragma once

#include <array>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "loom/trace/tensor.h"

namespace loom {

// The dynamic tree: a tensor leaf, a list of trees or a dict of trees.
class Tree {
 public:
  using List = std::vector<Tree>;
  using Dict = std::map<std::string, Tree>;
  Tree() : v_(List{}) {}
  Tree(Tensor t) : v_(std::move(t)) {}  // NOLINT: a leaf
  Tree(List l) : v_(std::move(l)) {}    // NOLINT
  Tree(Dict d) : v_(std::move(d)) {}    // NOLINT
  bool is_leaf() const { return std::holds_alternative<Tensor>(v_); }
  bool is_list() const { return std::holds_alternative<List>(v_); }
  bool is_dict() const { return std::holds_alternative<Dict>(v_); }
  const Tensor& leaf() const { return std::get<Tensor>(v_); }
  const List& list() const { return std::get<List>(v_); }
  const Dict& dict() const { return std::get<Dict>(v_); }

 private:
  std::variant<Tensor, List, Dict> v_;
};

namespace tree {

template <class T>
struct Traits;  // specialized below for every supported container

template <class T>
void flatten(const T& t, std::vector<Tensor>* leaves, std::vector<std::string>* paths = nullptr,
             const std::string& path = "") {
  Traits<T>::flatten(t, leaves, paths, path);
}
template <class T>
std::string structure(const T& t) {
  return Traits<T>::structure(t);
}
// A tree shaped like `like` whose leaves are leaves[*pos], leaves[*pos + 1], ...
template <class T>
T unflatten(const T& like, const std::vector<Tensor>& leaves, size_t* pos) {
  return Traits<T>::unflatten(like, leaves, pos);
}
template <class T>
T unflatten(const T& like, const std::vector<Tensor>& leaves) {
  size_t pos = 0;
  T r = Traits<T>::unflatten(like, leaves, &pos);
  LOOM_CHECK(pos == leaves.size(), "[tree] ", leaves.size(), " leaves for a tree of ", pos);
  return r;
}

template <>
struct Traits<Tensor> {
  static void flatten(const Tensor& t, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    leaves->push_back(t);
    if (paths) paths->push_back(path);
  }
  static std::string structure(const Tensor&) { return "T"; }
  static Tensor unflatten(const Tensor&, const std::vector<Tensor>& leaves, size_t* pos) {
    LOOM_CHECK(*pos < leaves.size(), "[tree] too few leaves to rebuild the tree");
    return leaves[(*pos)++];
  }
};

namespace detail {
// Sequences: vector, array (indexed children).
template <class Seq>
struct SeqTraits {
  static void flatten(const Seq& s, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    for (size_t i = 0; i < s.size(); ++i)
      tree::flatten(s[i], leaves, paths, path + "[" + std::to_string(i) + "]");
  }
  static std::string structure(const Seq& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + tree::structure(s[i]);
    return r + "]";
  }
};
}  // namespace detail

template <class T>
struct Traits<std::vector<T>> : detail::SeqTraits<std::vector<T>> {
  static std::vector<T> unflatten(const std::vector<T>& like, const std::vector<Tensor>& leaves,
                                  size_t* pos) {
    std::vector<T> r;
    r.reserve(like.size());
    for (const T& x : like) r.push_back(tree::unflatten(x, leaves, pos));
    return r;
  }
};

template <class T, size_t N>
struct Traits<std::array<T, N>> : detail::SeqTraits<std::array<T, N>> {
  static std::array<T, N> unflatten(const std::array<T, N>& like, const std::vector<Tensor>& leaves,
                                    size_t* pos) {
    std::array<T, N> r;
    for (size_t i = 0; i < N; ++i) r[i] = tree::unflatten(like[i], leaves, pos);
    return r;
  }
};

template <class T>
struct Traits<std::map<std::string, T>> {
  using M = std::map<std::string, T>;
  static void flatten(const M& m, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    for (const auto& [k, v] : m) tree::flatten(v, leaves, paths, path + "['" + k + "']");
  }
  static std::string structure(const M& m) {
    std::string r = "{";
    bool first = true;
    for (const auto& [k, v] : m) {
      r += (first ? "" : ",") + k + ":" + tree::structure(v);
      first = false;
    }
    return r + "}";
  }
  static M unflatten(const M& like, const std::vector<Tensor>& leaves, size_t* pos) {
    M r;
    for (const auto& [k, v] : like) r.emplace(k, tree::unflatten(v, leaves, pos));
    return r;
  }
};

template <class... Ts>
struct Traits<std::tuple<Ts...>> {
  using Tup = std::tuple<Ts...>;
  static void flatten(const Tup& t, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    size_t i = 0;
    std::apply(
        [&](const auto&... x) {
          (tree::flatten(x, leaves, paths, path + "[" + std::to_string(i++) + "]"), ...);
        },
        t);
  }
  static std::string structure(const Tup& t) {
    std::string r = "(";
    size_t i = 0;
    std::apply([&](const auto&... x) { ((r += (i++ ? "," : "") + tree::structure(x)), ...); }, t);
    return r + ")";
  }
  static Tup unflatten(const Tup& like, const std::vector<Tensor>& leaves, size_t* pos) {
    // Braced initialization evaluates left to right, so leaves are consumed in order.
    return std::apply([&](const auto&... x) { return Tup{tree::unflatten(x, leaves, pos)...}; },
                      like);
  }
};

template <class A, class B>
struct Traits<std::pair<A, B>> {
  using P = std::pair<A, B>;
  static void flatten(const P& p, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    tree::flatten(p.first, leaves, paths, path + "[0]");
    tree::flatten(p.second, leaves, paths, path + "[1]");
  }
  static std::string structure(const P& p) {
    return "(" + tree::structure(p.first) + "," + tree::structure(p.second) + ")";
  }
  static P unflatten(const P& like, const std::vector<Tensor>& leaves, size_t* pos) {
    A a = tree::unflatten(like.first, leaves, pos);
    B b = tree::unflatten(like.second, leaves, pos);
    return P{std::move(a), std::move(b)};
  }
};

template <>
struct Traits<Tree> {
  static void flatten(const Tree& t, std::vector<Tensor>* leaves, std::vector<std::string>* paths,
                      const std::string& path) {
    if (t.is_leaf())
      tree::flatten(t.leaf(), leaves, paths, path);
    else if (t.is_list())
      tree::flatten(t.list(), leaves, paths, path);
    else
      tree::flatten(t.dict(), leaves, paths, path);
  }
  static std::string structure(const Tree& t) {
    if (t.is_leaf()) return "T";
    return t.is_list() ? tree::structure(t.list()) : tree::structure(t.dict());
  }
  static Tree unflatten(const Tree& like, const std::vector<Tensor>& leaves, size_t* pos) {
    if (like.is_leaf()) return Tree(tree::unflatten(like.leaf(), leaves, pos));
    if (like.is_list()) return Tree(tree::unflatten(like.list(), leaves, pos));
    return Tree(tree::unflatten(like.dict(), leaves, pos));
  }
};

}  // namespace tree
}  // namespace loom
