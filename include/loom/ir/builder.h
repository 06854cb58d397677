// Builder: creates checked nodes in a Graph.
//
// Each call infers the result type from the operands and attributes, checks it (throwing a
// ShapeError, DTypeError or Error that names the op, the operand types and what was
// expected), and, when hash-consing is on, returns an existing identical node instead of
// adding a new one, so that tracing gets common-subexpression elimination for free.
// Binary ops require operands of one dtype (callers promote); shapes broadcast like numpy.
// Not thread-safe; one Builder per Graph at a time.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::ir {

// Infers the result type of `op` on `operands` with `attrs`; `given` supplies the result type
// of kTypeGiven ops (for Convert, only its dtype is used). Throws on ill-typed input.
TensorType infer_type(const Graph& g, OpKind op, std::span<const Value> operands,
                      const Attrs& attrs, const TensorType* given);
// The result types of a control-flow op (kRegion) from its operands, attributes and regions
// (docs/ir.md: call, scan, while), or of a kMultiResult op (attention; no regions). Throws Error
// naming the op, the position and both types when a region does not fit its operands.
// infer_type rejects these ops: use this instead.
std::vector<TensorType> infer_region_types(const Graph& g, OpKind op,
                                           std::span<const Value> operands, const Attrs& attrs,
                                           std::span<const std::shared_ptr<const Graph>> regions);
using loom::check_shape;  // core/shape.h
// Broadcast shape of a and b (numpy rules); throws ShapeError naming `op`.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

class Builder {
 public:
  explicit Builder(Graph& g, bool hash_cons = true);

  Graph& graph() { return *g_; }
  const TensorType& type(Value v) const { return g_->type(v); }

  // The generic entry point: infer, check, hash-cons, append.
  Value make(OpKind op, std::span<const Value> operands, Attrs attrs = {},
             const TensorType* given = nullptr);

  Value parameter(const TensorType& t);  // next parameter index
  Value parameter(const TensorType& t, int64_t index);
  // A parameter of an index that no node has and that parameter() is never called with
  // (a host number's fresh slot): no earlier node equals it, and no later lookup needs it, so
  // it skips the hash-consing table (a reindex puts it in).
  Value unique_parameter(const TensorType& t, int64_t index);
  Value constant(double v, DType dt);  // 0-d
  Value iota(const TensorType& t, int64_t axis);
  Value unary(OpKind op, Value x);
  Value binary(OpKind op, Value a, Value b);
  Value where(Value cond, Value a, Value b);
  Value convert(Value x, DType dt);  // no node when the dtype already matches
  Value reduce(OpKind op, Value x, std::vector<int64_t> axes, bool keepdim);
  Value argmax(Value x, int64_t axis, bool keepdim);
  Value argsort(Value x, int64_t axis, bool descending);
  Value matmul(Value a, Value b);
  Value reshape(Value x, const Shape& shape);  // no node when the shape already matches
  Value permute(Value x, std::vector<int64_t> perm);
  Value expand(Value x, const Shape& shape);  // no node when the shape already matches
  Value slice(Value x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
  Value concat(std::span<const Value> xs, int64_t axis);
  Value gather(Value x, int64_t axis, Value index);
  Value index_select(Value x, int64_t axis, Value index);
  Value index_add(Value base, int64_t axis, Value index, Value src);
  Value random(OpKind op, Value key, const TensorType& t);

  // Creates a control-flow node (call, scan, while) owning `regions`, or a kMultiResult node
  // (no regions): infers and checks every result type (infer_region_types), appends the node
  // through add() (never merged with another node) and returns one Value per result.
  std::vector<Value> make_region(OpKind op, std::span<const Value> operands, Attrs attrs,
                                 std::vector<std::shared_ptr<const Graph>> regions);

  // Appends a node as is (control flow, multi-result nodes): no checks, never merged with
  // another node, but given its Merkle hash. Nodes must reach a hash-consing builder's graph
  // through the builder (make or add), never through Graph::add.
  NodeId add(Node n);

  // Whether a node of the graph uses node id (false when unknown: hash-consing off).
  bool used(NodeId id) const { return id < first_user_.size() && first_user_[id] != kNoUser; }

  // Rebuilds the hash-consing table and the Merkle hashes (after g changed elsewhere).
  void reindex();

  // With hash-consing on: the Merkle hash of a node, over its op, type, attributes and its
  // operands' Merkle hashes (not their ids). Parameters hash by type and index, so equal
  // hashes mean the same computation from the same parameters, whatever the node ids.
  // XXH3-128: the trace cache keys executables by these, so a collision would be a wrong run.
  const Hash128& merkle(NodeId id) const { return merkle_[id]; }
  Hash128 merkle(Value v) const {  // result k > 0 of a multi-result node: its own hash
    const Hash128& m = merkle_[v.node];
    if (v.index == 0) return m;
    return {hash_mix(m.lo ^ (0x9e3779b97f4a7c15ULL * v.index)), m.hi + v.index};
  }

 private:
  // Hash-conses the graph's last node (just appended): returns an identical earlier node
  // (dropping the last) or registers the last one.
  Value intern(NodeId id);
  Hash128 node_hash(const Node& n) const;
  bool same_node(const Node& a, const Node& b) const;
  // Whether an operand of n has no user yet: then no earlier node equals n.
  bool has_unused_operand(const Node& n) const;
  // How record() registers a node: in the table; left out until a second node uses the
  // operand whose first user it is (Deferred); or with no entry (None: control flow and
  // add()'s nodes are never merged into, a host number's parameter is never looked up).
  enum class Entry { Table, Deferred, None };
  // Registers node id (its Merkle hash already pushed): the first user of its operands, and
  // its table entry.
  void record(NodeId id, Entry e);
  void insert(const Hash128& h, NodeId id);
  void grow();

  Graph* g_;
  bool hash_cons_;
  std::vector<Hash128> merkle_;  // per node
  // Per node: the first node that uses it (kNoUser: none yet), and whether it is in the table
  // or needs no entry (0 only while Deferred). A node left out has an operand whose first user it
  // is; the next node using that operand puts it in the table before it looks itself up.
  static constexpr NodeId kNoUser = UINT32_MAX;
  std::vector<NodeId> first_user_;
  std::vector<uint8_t> in_table_;
  // Open addressing by the low half of the Merkle hash: node id and 32 bits of the high half
  // (so probes rarely touch the nodes); id kEmpty marks a free slot.
  struct Slot {
    NodeId id;
    uint32_t tag;
  };
  std::vector<Slot> table_;
  size_t used_ = 0;
};

}  // namespace loom::ir
