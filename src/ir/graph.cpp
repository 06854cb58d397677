// Graph storage and pruning. prune runs on every sync of a lazy tensor, so it makes one
// backward marking sweep (operands always precede their users) and one forward copy.
#include "loom/ir/graph.h"

#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "loom/core/error.h"

namespace loom::ir {

bool operator==(const Attrs& a, const Attrs& b) {
  // f compares by bits: a NaN constant equals itself, and 0.0 differs from -0.0.
  return a.i == b.i && a.flag == b.flag && std::memcmp(&a.f, &b.f, sizeof a.f) == 0 &&
         a.ints == b.ints;
}

NodeStore& NodeStore::operator=(const NodeStore& o) {
  if (this != &o) {
    clear();
    copy_from(o);
  }
  return *this;
}

NodeStore& NodeStore::operator=(NodeStore&& o) noexcept {
  if (this != &o) {
    release();
    chunks_ = std::move(o.chunks_);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

namespace {

// Chunks freed on this thread, for its next graphs: a scan or while body is traced into a fresh
// graph on every call, and allocating its chunk (18 KB, past malloc's small bins) made malloc
// consolidate its free lists each time (a 1000-step cumsum call: ~7% of its host time). At
// most kCachedChunks are kept; `state` guards graphs destroyed after the cache at thread exit.
struct ChunkCache {
  static constexpr size_t kCachedChunks = 16;
  enum State : uint8_t { Unmade, Alive, Gone };
  static thread_local State state;
  std::vector<void*> free;
  ChunkCache() {
    free.reserve(kCachedChunks);
    state = Alive;
  }
  ~ChunkCache() {
    state = Gone;
    for (void* p : free) ::operator delete(p);
  }
};
thread_local ChunkCache::State ChunkCache::state = ChunkCache::Unmade;
thread_local ChunkCache t_chunks;

void* take_chunk(size_t bytes) {
  // The first use on a thread constructs its cache; after the thread's exit destroyed it, none.
  if (ChunkCache::state != ChunkCache::Gone && !t_chunks.free.empty()) {
    void* p = t_chunks.free.back();
    t_chunks.free.pop_back();
    return p;
  }
  return ::operator new(bytes);
}

void give_chunk(void* p) noexcept {
  if (ChunkCache::state == ChunkCache::Alive && t_chunks.free.size() < ChunkCache::kCachedChunks) {
    t_chunks.free.push_back(p);  // within the reserved capacity: no allocation, no throw
    return;
  }
  ::operator delete(p);
}

}  // namespace

void NodeStore::add_chunk() {
  LOOM_CHECK(size_ < (size_t{1} << 32), "[graph] more than 2^32 nodes");
  if (chunks_.size() == chunks_.capacity()) chunks_.reserve(2 * chunks_.size() + 4);
  chunks_.push_back(static_cast<Node*>(take_chunk(sizeof(Node) * kChunkSize)));
}

Node& NodeStore::push_back(Node&& n) {
  Node* p = ::new (slot_for_next()) Node(std::move(n));
  ++size_;
  return *p;
}

Node& NodeStore::push_back(const Node& n) {
  Node* p = ::new (slot_for_next()) Node(n);
  ++size_;
  return *p;
}

void NodeStore::pop_back() {
  LOOM_ASSERT(size_ > 0);
  std::destroy_at(&(*this)[size_ - 1]);
  --size_;
}

void NodeStore::clear() {
  while (size_ > 0) pop_back();
}

void NodeStore::reserve(size_t n) {
  chunks_.reserve((n + kChunkMask) >> kChunkLog);
  while (chunks_.size() < ((n + kChunkMask) >> kChunkLog)) add_chunk();
}

void NodeStore::copy_from(const NodeStore& o) {
  reserve(o.size_);
  for (size_t i = 0; i < o.size_; ++i) push_back(o[i]);
}

void NodeStore::release() noexcept {
  for (size_t i = 0; i < size_; ++i) std::destroy_at(&(*this)[i]);
  size_ = 0;
  for (Node* c : chunks_) give_chunk(c);
  chunks_.clear();
}

NodeId Graph::add(Node&& n) {
  auto id = static_cast<NodeId>(nodes_.size());
  if (n.op == OpKind::Parameter) params_.push_back(id);
  nodes_.push_back(std::move(n));
  return id;
}

Node& Graph::emplace_back(OpKind op) {
  auto id = static_cast<NodeId>(nodes_.size());
  if (op == OpKind::Parameter) params_.push_back(id);
  Node& n = nodes_.emplace_back();
  n.op = op;
  return n;
}

void Graph::pop_back() {
  if (nodes_.back().op == OpKind::Parameter) params_.pop_back();
  nodes_.pop_back();
}

void Graph::clear() {
  nodes_.clear();
  params_.clear();
  outputs_.clear();
}

void Graph::compact(std::span<const NodeId> keep, std::vector<NodeId>& remap) {
  remap.assign(nodes_.size(), std::numeric_limits<NodeId>::max());
  params_.clear();
  outputs_.clear();
  NodeId next = 0;
  for (NodeId id : keep) {
    LOOM_ASSERT(id >= next && id < nodes_.size());  // ascending: moves only go down
    Node& n = nodes_[id];
    for (Value& v : n.operands) {
      LOOM_ASSERT(remap[v.node] != std::numeric_limits<NodeId>::max());
      v.node = remap[v.node];
    }
    if (id != next) nodes_[next] = std::move(n);
    if (nodes_[next].op == OpKind::Parameter) params_.push_back(next);
    remap[id] = next++;
  }
  while (nodes_.size() > next) nodes_.pop_back();
}

namespace {
// Marks map[id] = 1 for every node the roots need (map: zeros of g.size()); returns how many.
size_t mark_live(const Graph& g, std::span<const Value> roots, std::vector<NodeId>& map) {
  for (Value v : roots) {
    LOOM_ASSERT(v.node < g.size());
    map[v.node] = 1;
  }
  size_t live = 0;
  for (size_t id = g.size(); id-- > 0;) {
    if (!map[id]) continue;
    ++live;
    for (Value v : g.node(static_cast<NodeId>(id)).operands) map[v.node] = 1;
  }
  return live;
}
}  // namespace

size_t count_live(const Graph& g, std::span<const Value> roots) {
  std::vector<NodeId> map(g.size(), 0);
  return mark_live(g, roots, map);
}

Graph prune(const Graph& g, std::span<const Value> roots, bool renumber_params,
            std::vector<NodeId>* remap) {
  constexpr NodeId kDropped = std::numeric_limits<NodeId>::max();
  const size_t n = g.size();
  // One table marks and then remaps: 0 = dead, 1 = live, then the new id (or kDropped).
  std::vector<NodeId> map(n, 0);
  const size_t live = mark_live(g, roots, map);
  Graph out;
  if (live == n && !renumber_params) {  // nothing to drop: a plain copy is the fastest
    out = g;
    out.outputs().assign(roots.begin(), roots.end());
    if (remap) {
      remap->resize(n);
      for (size_t id = 0; id < n; ++id) (*remap)[id] = static_cast<NodeId>(id);
    }
    return out;
  }
  out.reserve(live);
  int64_t next_param = 0;
  for (size_t id = 0; id < n; ++id) {
    if (!map[id]) {
      map[id] = kDropped;
      continue;
    }
    // Copy straight into the arena, then rewire: one Node copy per kept node.
    NodeId new_id = out.add(g.node(static_cast<NodeId>(id)));
    Node& node = out.mutable_node(new_id);
    for (Value& v : node.operands) v.node = map[v.node];
    if (node.op == OpKind::Parameter && renumber_params) node.attrs.i = next_param++;
    map[id] = new_id;
  }
  out.outputs().reserve(roots.size());
  for (Value v : roots) out.outputs().push_back({map[v.node], v.index});
  if (remap) *remap = std::move(map);
  return out;
}

}  // namespace loom::ir
