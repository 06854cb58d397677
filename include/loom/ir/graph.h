// The IR graph: nodes owned by an arena (a NodeStore: chunks that never move), referred to
// by index.
//
// A Node has an op, operands (Values: a node index and a result index), result types,
// attributes, and optional regions (immutable sub-graphs with their own parameters, used by
// control-flow ops). Operands always refer to earlier nodes, so index order is a topological
// order. Parameters are Parameter nodes whose `attrs.i` is their position in params().
// Outputs are the graph's results. Not thread-safe for mutation; a const Graph may be read
// from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/hash.h"
#include "loom/core/shape.h"
#include "loom/ir/op_kind.h"

namespace loom::ir {

using NodeId = uint32_t;

struct Value {
  NodeId node = 0;
  uint32_t index = 0;  // which result of the node
  friend bool operator==(const Value& a, const Value& b) {
    return a.node == b.node && a.index == b.index;
  }
};

// Attributes of a node; which fields an op uses, and their printed names, come from ops.def.
struct Attrs {
  SmallVector<int64_t, 6> ints;
  int64_t i = 0;
  double f = 0;
  bool flag = false;
  friend bool operator==(const Attrs& a, const Attrs& b);
};

class Graph;

struct Node {
  OpKind op = OpKind::Constant;
  SmallVector<Value, 3> operands;
  TensorType type;                     // result 0
  std::vector<TensorType> more_types;  // results 1.. (only ops with regions have them)
  Attrs attrs;
  std::vector<std::shared_ptr<const Graph>> regions;

  size_t num_results() const { return 1 + more_types.size(); }
  const TensorType& result_type(uint32_t i) const { return i == 0 ? type : more_types[i - 1]; }
};

// Typed attribute views, generated from ops.def's attribute columns: ScanAttrs::of(node)
// has members counts, length, reverse and remat. of() asserts the node's op. Placeholder
// members ('_...') name fields the op does not use.
#define LOOM_OP(Name, text, arity, traits, ints_, i_, flag_, f_) \
  struct Name##Attrs {                                           \
    const SmallVector<int64_t, 6>& ints_;                        \
    int64_t i_;                                                  \
    bool flag_;                                                  \
    double f_;                                                   \
    static Name##Attrs of(const Node& n) {                       \
      LOOM_ASSERT(n.op == OpKind::Name);                         \
      return {n.attrs.ints, n.attrs.i, n.attrs.flag, n.attrs.f}; \
    }                                                            \
  };
#include "loom/ir/ops.def"
#undef LOOM_OP

// The node arena: chunks of 64 nodes, allocated as the graph grows and never moved, so
// appending costs no copy of earlier nodes and a Node& stays valid while nodes are appended
// (only pop_back, clear and assignment end a node). Indexing is two loads, as cheap as a
// vector's but for the chunk table. Random-access iteration, as a vector's.
class NodeStore {
 public:
  NodeStore() = default;
  NodeStore(const NodeStore& o) { copy_from(o); }
  NodeStore(NodeStore&& o) noexcept
      : chunks_(std::move(o.chunks_)), size_(std::exchange(o.size_, 0)) {}
  NodeStore& operator=(const NodeStore& o);
  NodeStore& operator=(NodeStore&& o) noexcept;
  ~NodeStore() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Node& operator[](size_t i) { return chunks_[i >> kChunkLog][i & kChunkMask]; }
  const Node& operator[](size_t i) const { return chunks_[i >> kChunkLog][i & kChunkMask]; }
  Node& back() { return (*this)[size_ - 1]; }
  const Node& back() const { return (*this)[size_ - 1]; }
  // Constructs a default node at the end (a chunk is allocated when the last one is full).
  Node& emplace_back() {
    Node* p = ::new (slot_for_next()) Node();
    ++size_;
    return *p;
  }
  Node& push_back(Node&& n);
  Node& push_back(const Node& n);
  void pop_back();
  void clear();            // destroys the nodes, keeps the chunks
  void reserve(size_t n);  // allocates the chunks that n nodes need

  template <bool kConst>
  class Iter {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = Node;
    using difference_type = std::ptrdiff_t;
    using reference = std::conditional_t<kConst, const Node&, Node&>;
    using pointer = std::conditional_t<kConst, const Node*, Node*>;
    using Store = std::conditional_t<kConst, const NodeStore, NodeStore>;
    Iter() = default;
    Iter(Store* s, size_t i) : s_(s), i_(i) {}
    reference operator*() const { return (*s_)[i_]; }
    pointer operator->() const { return &(*s_)[i_]; }
    reference operator[](difference_type k) const { return (*s_)[i_ + k]; }
    Iter& operator++() { return ++i_, *this; }
    Iter operator++(int) { return Iter(s_, i_++); }
    Iter& operator--() { return --i_, *this; }
    Iter operator--(int) { return Iter(s_, i_--); }
    Iter& operator+=(difference_type k) { return i_ += k, *this; }
    Iter& operator-=(difference_type k) { return i_ -= k, *this; }
    friend Iter operator+(Iter a, difference_type k) { return a += k; }
    friend Iter operator+(difference_type k, Iter a) { return a += k; }
    friend Iter operator-(Iter a, difference_type k) { return a -= k; }
    friend difference_type operator-(const Iter& a, const Iter& b) {
      return static_cast<difference_type>(a.i_) - static_cast<difference_type>(b.i_);
    }
    friend bool operator==(const Iter& a, const Iter& b) { return a.i_ == b.i_; }
    friend auto operator<=>(const Iter& a, const Iter& b) { return a.i_ <=> b.i_; }
    size_t index() const { return i_; }

   private:
    Store* s_ = nullptr;
    size_t i_ = 0;
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;
  iterator begin() { return {this, 0}; }
  iterator end() { return {this, size_}; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }

 private:
  static constexpr size_t kChunkLog = 6, kChunkSize = size_t{1} << kChunkLog,
                          kChunkMask = kChunkSize - 1;
  Node* slot_for_next() {  // raw storage for node size_
    if ((size_ >> kChunkLog) == chunks_.size()) [[unlikely]]
      add_chunk();
    return chunks_[size_ >> kChunkLog] + (size_ & kChunkMask);
  }
  void add_chunk();
  void copy_from(const NodeStore& o);
  void release() noexcept;  // destroys the nodes and frees the chunks

  std::vector<Node*> chunks_;  // each kChunkSize nodes of raw storage
  size_t size_ = 0;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = default;
  Graph(Graph&&) noexcept = default;
  Graph& operator=(const Graph&) = default;
  Graph& operator=(Graph&&) noexcept = default;

  // Appends a node as is (no checks; use Builder to create checked nodes).
  NodeId add(Node&& n);
  NodeId add(const Node& n) { return add(Node(n)); }
  // Appends a default node of `op` to be filled in place (the builder's hot path), and
  // removes the last node again.
  Node& emplace_back(OpKind op);
  void pop_back();
  const Node& node(NodeId id) const { return nodes_[id]; }
  Node& mutable_node(NodeId id) { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  const NodeStore& nodes() const { return nodes_; }
  const TensorType& type(Value v) const { return nodes_[v.node].result_type(v.index); }

  // Parameter nodes in parameter order.
  const std::vector<NodeId>& params() const { return params_; }
  std::vector<Value>& outputs() { return outputs_; }
  const std::vector<Value>& outputs() const { return outputs_; }
  void clear();
  void reserve(size_t n) { nodes_.reserve(n); }
  // Keeps only the nodes `keep` (ascending ids, each node's operands among them), moved down
  // in place to ids 0..keep.size()-1 with their operands renumbered; remap receives old id ->
  // new id (UINT32_MAX if dropped). The chunks stay allocated, so a graph that compacts and
  // grows again reuses its memory instead of faulting in fresh pages. Outputs are cleared.
  void compact(std::span<const NodeId> keep, std::vector<NodeId>& remap);

 private:
  NodeStore nodes_;
  std::vector<NodeId> params_;
  std::vector<Value> outputs_;
};

// A new graph with only the nodes that `roots` need, in the same relative order. Parameters
// keep their index unless `renumber_params` (then they are numbered in order of first
// appearance). remap, when given, receives old node id -> new node id (UINT32_MAX if dropped).
Graph prune(const Graph& g, std::span<const Value> roots, bool renumber_params = false,
            std::vector<NodeId>* remap = nullptr);
// How many nodes `roots` need (prune keeps exactly these); g.size() when nothing is dead.
size_t count_live(const Graph& g, std::span<const Value> roots);

// The 128-bit structural fingerprint: ops, attributes, types, operand wiring, parameter
// indices, outputs and regions. Independent of node ids, names, pointers and map order.
Hash128 fingerprint(const Graph& g);
// The fingerprint of a region (an immutable shared graph), memoized per thread while the
// region lives: a node that reuses a cached body does not rehash it.
Hash128 region_fingerprint(const std::shared_ptr<const Graph>& region);
// The first difference between two graphs' IR texts. For a node (or what follows the nodes)
// both lines ("%7 = add(%5, %6) : f32[4]" against "%7 = mul(%5, %6) : f32[4]"); for the
// header, the first parameter that differs ("%3: f32[4]" against "%3: f32[8]", "(none)" on
// the side that lacks it), never the whole header line. For error messages and explanations.
struct GraphDifference {
  enum class Kind { None, Parameter, Node, Outputs };
  Kind kind = Kind::None;
  int64_t index = -1;  // Parameter: its position; Node: its printed number (%index); else -1
  std::string before, after;
  explicit operator bool() const { return kind != Kind::None; }
  // "`before` became `after`", or "" when the texts are equal.
  std::string str() const;
};
GraphDifference first_difference(const Graph& before, const Graph& after);
// Structural equality, the contract the fingerprint approximates (same result as comparing
// fingerprints, barring collisions).
bool structurally_equal(const Graph& a, const Graph& b);

// Checks every node's operands, arity and types against the type rules; throws Error naming
// the node on the first violation.
void verify(const Graph& g);

// IR text: "graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4]\n  return %1\n}".
std::string to_text(const Graph& g);
std::ostream& operator<<(std::ostream& os, const Graph& g);
// A Graphviz picture: `digraph loom { ... }` with one node per IR node (`n<id>`, labelled
// with its op, attributes and type; parameters are ellipses, outputs have a double border),
// one edge per operand, and each region as a cluster (`r<k>n<id>`).
std::string to_dot(const Graph& g);
// Parses IR text; throws ParseError with line and column on malformed input and
// ShapeError/DTypeError/Error when a node is ill-typed.
Graph parse(std::string_view text);

}  // namespace loom::ir
