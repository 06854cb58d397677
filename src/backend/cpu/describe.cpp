// The canonical description of a kernel: its cache key, and the order of its buffers.
// Built with plain appends (no streams): describing is on every compile's path, warm or not.
// describe_all first hashes what the text would say (the same walk, hashing each token
// instead of printing it), and prints the text once per distinct hash: a graph's kernels
// are mostly repeats (50 identical decoder layers give one text).
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/codegen_impl.h"
#include "loom/core/hash.h"

namespace loom::cpu::detail {

namespace {

class Describer {
 public:
  // hash != nullptr: the walk feeds *hash with the tokens and leaves the text empty.
  Describer(const ir::Graph& g, const Plan& p, const KernelSpec& k, Hasher128* hash = nullptr)
      : g_(g), p_(p), k_(k), hash_(hash) {}

  KernelDescription run() {
    if (!hash_) out_.reserve(1024);
    put("outer");
    put_dims(k_.outer);
    put(" chunk");
    put(k_.chunk);
    put(";");
    for (size_t si = 0; si < k_.stages.size(); ++si) {
      const Stage& s = k_.stages[si];
      stage_of_.push_back({s.node, static_cast<int>(si)});
      put(s.reduce ? "R" : "E");
      put_dims(s.shape);
      put("r");
      put_dims(s.reduced);
      if (s.columns > 0) {
        put("c");
        put(s.columns);
      }
      put(" o");
      put(s.out_offset);
      put_dims(s.out_strides);
      put(" ->");
      put(static_cast<int64_t>(buf(s.out_buf)));
      put(" = ");
      NodeId root = s.reduce ? g_.node(s.node).operands[0].node : s.node;
      if (s.reduce) {
        op_text(s.node);
        put(" ");
      }
      expr(root, si, !s.reduce && p_.buf_of[s.node] == s.out_buf);
      put(";");
    }
    desc_.text = std::move(out_);
    return std::move(desc_);
  }

 private:
  // Each token as text, or as a tagged word of the hash: equal token streams give equal
  // texts, so equal hashes (barring a 128-bit collision) mean equal texts.
  void put(std::string_view s) {
    if (hash_) {
      uint64_t w = s.size();
      for (size_t i = 0; i < s.size(); ++i) w = w * 131 + static_cast<unsigned char>(s[i]);
      hash_->add(w ^ 0x736c69746572616cULL);
      return;
    }
    out_ += s;
  }
  void put(int64_t v) {
    if (hash_) return hash_->add(static_cast<uint64_t>(v));
    char b[24];
    out_.append(b, std::to_chars(b, b + sizeof b, v).ptr);
  }
  // Shortest text that reads back as the same double: kernels with constants that differ in
  // any bit must not share a description (and so a compiled function).
  void put(double v) {
    if (hash_) return hash_->add_double(v == 0 ? 0.0 : v);  // 0 and -0 print differently
    char b[32];
    out_.append(b, std::to_chars(b, b + sizeof b, v).ptr);
  }
  template <class Dims>
  void put_dims(const Dims& d) {
    put("[");
    for (size_t i = 0; i < d.size(); ++i) {
      if (i) put(",");
      put(static_cast<int64_t>(d[i]));
    }
    put("]");
  }
  void put_type(const TensorType& t) {
    put(short_name(t.dtype));
    put_dims(t.shape);
  }

  // Kernels touch a handful of buffers and nodes: linear lookups beat hashing here. The
  // latest entry for a key wins.
  template <class K>
  static const int* find(const std::vector<std::pair<K, int>>& v, K key) {
    for (size_t j = v.size(); j-- > 0;)
      if (v[j].first == key) return &v[j].second;
    return nullptr;
  }

  int buf(int plan_buf) {
    if (plan_buf < 0) return -1;
    for (size_t j = 0; j < desc_.bufs.size(); ++j)
      if (desc_.bufs[j] == plan_buf) return static_cast<int>(j);
    desc_.bufs.push_back(plan_buf);
    return static_cast<int>(desc_.bufs.size()) - 1;
  }

  void op_text(NodeId n) {
    const ir::Node& node = g_.node(n);
    if (hash_)
      hash_->add(static_cast<uint64_t>(node.op) ^ 0x6f70000000000000ULL);
    else
      put(ir::op_name(node.op));
    put(":");
    put_type(node.type);
    put("[");
    for (int64_t v : node.attrs.ints) {
      put(v);
      put(",");
    }
    put("|");
    put(node.attrs.i);
    put(node.attrs.flag ? "|1|" : "|0|");
    put(node.attrs.f);
    put("]");
  }

  // Expressions are trees of node references; a shared node is written once and referred to
  // by its number afterwards, so the text is linear in the DAG.
  void expr(NodeId n, size_t stage, bool is_root) {
    const ir::Node& node = g_.node(n);
    bool leaf = p_.buf_of[n] >= 0 && !is_root;
    const int* seen = find(numbered_, n);
    if (seen && !leaf) {
      put("#");
      put(static_cast<int64_t>(*seen));
      return;
    }
    if (leaf) {
      const int* st = find(stage_of_, n);
      if (st && static_cast<size_t>(*st) < stage && k_.stages[*st].reduce) {
        put("S");
        put(static_cast<int64_t>(*st));
      } else {
        put("B");
        put(static_cast<int64_t>(buf(p_.buf_of[n])));
      }
      put(":");
      put_type(node.type);
      return;
    }
    const int id = static_cast<int>(numbered_.size());
    numbered_.push_back({n, id});
    put("{");
    put(static_cast<int64_t>(id));
    put("}");
    op_text(n);
    put("(");
    for (const ir::Value& v : node.operands) {
      expr(v.node, stage, false);
      put(",");
    }
    put(")");
  }

  const ir::Graph& g_;
  const Plan& p_;
  const KernelSpec& k_;
  Hasher128* hash_;
  std::string out_;
  KernelDescription desc_;
  std::vector<std::pair<NodeId, int>> numbered_;
  std::vector<std::pair<NodeId, int>> stage_of_;
};

}  // namespace

KernelDescription describe(const ir::Graph& g, const Plan& p, const KernelSpec& k) {
  return Describer(g, p, k).run();
}

std::vector<KernelDescription> describe_all(const ir::Graph& g, const Plan& p) {
  std::vector<KernelDescription> out;
  out.reserve(p.kernels.size());
  struct HashOf {
    size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo); }
  };
  std::unordered_map<Hash128, size_t, HashOf> first;  // hash -> the kernel that printed it
  for (const KernelSpec& k : p.kernels) {
    Hasher128 h;
    KernelDescription d = Describer(g, p, k, &h).run();
    auto [it, fresh] = first.try_emplace(h.finish(), out.size());
    d.text = fresh ? Describer(g, p, k).run().text : out[it->second].text;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace loom::cpu::detail
