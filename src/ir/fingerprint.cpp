// Structural fingerprint and equality. Both number the nodes canonically (parameters in
// order, then a depth-first post-order from the outputs), so neither depends on node ids:
// the same computation appended in another topological order fingerprints the same. Nodes
// that no output needs, other than parameters, take no part; they cannot change a result.
// The fingerprint runs on every sync miss of the trace cache, so a node costs a few words of
// XXH3-128 input (Hasher128).
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/ir/graph.h"

namespace loom::ir {

namespace {

constexpr uint32_t kUnvisited = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kOnStack = kUnvisited - 1;

// Calls visit(id) once for each parameter (in params() order) and then for each node the
// outputs need, in the post-order of a depth-first search from the outputs, operands left to
// right; number[id] is the node's position in that order (kUnvisited if not visited). The
// search keeps an explicit stack: operands are pushed in reverse, and an entry with kPost set
// visits its node once the operands above it are done.
template <class Visit>
void canonical_walk(const Graph& g, std::vector<uint32_t>& number, Visit&& visit) {
  constexpr uint32_t kPost = 1u << 31;
  LOOM_ASSERT(g.size() < kPost);
  number.assign(g.size(), kUnvisited);
  uint32_t next = 0;
  for (NodeId p : g.params()) {
    number[p] = next++;
    visit(p);
  }
  std::vector<uint32_t> stack;
  for (Value out : g.outputs()) {
    LOOM_ASSERT(out.node < g.size());
    stack.push_back(out.node);
    while (!stack.empty()) {
      uint32_t top = stack.back();
      stack.pop_back();
      if (top & kPost) {
        NodeId id = top & ~kPost;
        number[id] = next++;
        visit(id);
        continue;
      }
      if (number[top] != kUnvisited) continue;  // done, or on the stack (a cycle: not followed)
      number[top] = kOnStack;
      stack.push_back(top | kPost);
      const Node& n = g.node(top);
      for (size_t k = n.operands.size(); k-- > 0;) {
        NodeId o = n.operands[k].node;
        LOOM_ASSERT(o < g.size());
        if (number[o] == kUnvisited) stack.push_back(o);
      }
    }
  }
}

uint64_t f_bits(double f) {
  uint64_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

uint64_t value_word(const std::vector<uint32_t>& number, Value v) {
  return (uint64_t{number[v.node]} << 32) | v.index;
}

void hash_type(Hasher128& h, const TensorType& t) {
  h.add(static_cast<uint64_t>(t.dtype) | (static_cast<uint64_t>(t.shape.size()) << 8));
  for (int64_t d : t.shape) h.add(static_cast<uint64_t>(d));
}

// Feeds fields of one width (16, 32 or 64 bits) to the hasher, several to a word.
class Packer {
 public:
  Packer(Hasher128& h, int width) : h_(h), width_(width) {}
  void put(uint64_t v) {
    acc_ |= v << fill_;
    fill_ += width_;
    if (fill_ == 64) flush();
  }
  void flush() {
    if (fill_) h_.add(acc_);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  Hasher128& h_;
  int width_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// One self-delimiting record per node in as few words as possible (XXH3's cost grows with
// its input). The head word holds the op, dtype, flags, the counts
// of what follows when they are small (else they follow in full words), and the width of the
// packed stream of extents, operand numbers and (when any is not 0) operand result indices.
// The attribute ints, i and f (each only when not 0) follow in full words.
void hash_node(Hasher128& h, const Node& n, const std::vector<uint32_t>& number) {
  const Attrs& a = n.attrs;
  const uint64_t fb = f_bits(a.f);
  const size_t rank = n.type.shape.size(), num_ops = n.operands.size();
  const size_t counts[] = {rank, a.ints.size(), num_ops, n.more_types.size(), n.regions.size()};
  const bool small =
      (rank | a.ints.size() | num_ops | n.more_types.size() | n.regions.size()) < 256;
  uint64_t widest = 0, indices = 0;
  for (int64_t d : n.type.shape) widest |= static_cast<uint64_t>(d);
  for (Value v : n.operands) widest |= number[v.node], indices |= v.index;
  widest |= indices;
  const int width = widest < (1ull << 16) ? 16 : widest < (1ull << 32) ? 32 : 64;
  uint64_t head = static_cast<uint64_t>(n.op) | (static_cast<uint64_t>(n.type.dtype) << 8) |
                  (uint64_t{a.flag} << 12) | (uint64_t{a.i != 0} << 13) |
                  (uint64_t{fb != 0} << 14) | (uint64_t{small} << 15) |
                  (uint64_t{indices != 0} << 16) | (static_cast<uint64_t>(width / 16) << 17);
  if (small) {
    for (int k = 0; k < 5; ++k) head |= static_cast<uint64_t>(counts[k]) << (20 + 8 * k);
    h.add(head);
  } else {
    h.add(head);
    for (size_t c : counts) h.add(c);
  }
  Packer p(h, width);
  for (int64_t d : n.type.shape) p.put(static_cast<uint64_t>(d));
  for (Value v : n.operands) p.put(number[v.node]);
  if (indices) {
    for (Value v : n.operands) p.put(v.index);
  }
  p.flush();
  for (int64_t x : a.ints) h.add(static_cast<uint64_t>(x));
  if (a.i != 0) h.add(static_cast<uint64_t>(a.i));
  if (fb != 0) h.add(fb);
  for (const TensorType& t : n.more_types) hash_type(h, t);
  for (const auto& r : n.regions) h.add(region_fingerprint(r));
}

bool same_values(const std::vector<uint32_t>& na, const Value* a, const std::vector<uint32_t>& nb,
                 const Value* b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (a[i].index != b[i].index || na[a[i].node] != nb[b[i].node]) return false;
  }
  return true;
}

bool same_node(const Node& x, const std::vector<uint32_t>& nx, const Node& y,
               const std::vector<uint32_t>& ny) {
  if (x.op != y.op || !(x.type == y.type) || !(x.attrs == y.attrs) ||
      x.operands.size() != y.operands.size() || x.more_types != y.more_types ||
      x.regions.size() != y.regions.size())
    return false;
  if (!same_values(nx, x.operands.data(), ny, y.operands.data(), x.operands.size())) return false;
  for (size_t i = 0; i < x.regions.size(); ++i) {
    if (x.regions[i] != y.regions[i] && !structurally_equal(*x.regions[i], *y.regions[i]))
      return false;
  }
  return true;
}

}  // namespace

Hash128 region_fingerprint(const std::shared_ptr<const Graph>& r) {
  // Regions are immutable and shared, so a fingerprint stays valid while its graph lives;
  // the weak pointer tells a live entry from one whose address was reused.
  struct Entry {
    std::weak_ptr<const Graph> graph;
    Hash128 hash;
  };
  thread_local std::unordered_map<const Graph*, Entry> memo;
  auto it = memo.find(r.get());
  if (it != memo.end() && it->second.graph.lock() == r) return it->second.hash;
  Hash128 h = fingerprint(*r);
  if (memo.size() >= 4096) memo.clear();
  memo[r.get()] = Entry{r, h};
  return h;
}

Hash128 fingerprint(const Graph& g) {
  Hasher128 h;
  h.add(g.params().size());
  std::vector<uint32_t> number;
  canonical_walk(g, number, [&](NodeId id) { hash_node(h, g.node(id), number); });
  h.add(g.outputs().size());
  for (Value v : g.outputs()) h.add(value_word(number, v));
  return h.finish();
}

bool structurally_equal(const Graph& a, const Graph& b) {
  if (&a == &b) return true;
  if (a.params().size() != b.params().size() || a.outputs().size() != b.outputs().size())
    return false;
  std::vector<uint32_t> na, nb;
  std::vector<NodeId> order_a, order_b;
  canonical_walk(a, na, [&](NodeId id) { order_a.push_back(id); });
  canonical_walk(b, nb, [&](NodeId id) { order_b.push_back(id); });
  if (order_a.size() != order_b.size()) return false;
  for (size_t k = 0; k < order_a.size(); ++k) {
    if (!same_node(a.node(order_a[k]), na, b.node(order_b[k]), nb)) return false;
  }
  return same_values(na, a.outputs().data(), nb, b.outputs().data(), a.outputs().size());
}

}  // namespace loom::ir
