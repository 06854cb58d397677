// The fingerprint exchange before collectives (dist_check.h) and the wrapper executable that
// runs it before every run of a graph holding collectives.
#include "loom/runtime/dist_check.h"

#include <cstring>
#include <map>

#include "loom/core/error.h"

namespace loom::runtime {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

// "name\nIR text" -> its parts.
void split_detail(const std::string& d, std::string* name, std::string* ir) {
  size_t nl = d.find('\n');
  *name = d.substr(0, nl);
  *ir = nl == std::string::npos ? "" : d.substr(nl + 1);
}

std::string explain(const std::vector<std::string>& tags, const std::vector<std::string>& details) {
  // Groups of ranks by tag, in order of their lowest rank.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < tags.size(); ++r) {
    if (!groups.count(tags[r])) order.push_back(tags[r]);
    groups[tags[r]].push_back(static_cast<int>(r));
  }
  std::string msg = "[dist] the ranks are not running the same collectives: ";
  for (size_t k = 0; k < order.size(); ++k) {
    const std::vector<int>& rs = groups[order[k]];
    std::string name, ir;
    split_detail(details[static_cast<size_t>(rs[0])], &name, &ir);
    const bool one = rs.size() == 1;
    msg += (k ? "; " : "") + ranks_text(rs) +
           (ir.empty() ? (one ? " calls " : " call ")
                       : (one ? " runs the graph " : " run the graph ")) +
           name;
  }
  // The first differing op between the first two groups' graphs, when both are graphs.
  std::string n0, ir0, n1, ir1;
  split_detail(details[static_cast<size_t>(groups[order[0]][0])], &n0, &ir0);
  split_detail(details[static_cast<size_t>(groups[order[1]][0])], &n1, &ir1);
  if (!ir0.empty() && !ir1.empty()) {
    try {
      ir::GraphDifference d = ir::first_difference(ir::parse(ir0), ir::parse(ir1));
      if (d)
        msg += ". First difference (" + ranks_text(groups[order[0]]) + " against " +
               ranks_text(groups[order[1]]) + "): " + d.str();
    } catch (const Error& e) {
      msg += std::string(". (the IR texts did not parse: ") + e.what() + ")";
    }
  } else {
    const std::string& g = ir0.empty() ? ir1 : ir0;
    size_t at = g.find("all_");
    if (at == std::string::npos) at = g.find("reduce_scatter");
    if (at != std::string::npos) {
      size_t b = g.rfind('\n', at), e = g.find('\n', at);
      msg += ". The graph's first collective: " +
             g.substr(b == std::string::npos ? 0 : b + 1,
                      e == std::string::npos ? std::string::npos : e - b - 1);
    }
  }
  msg +=
      ". Every rank must run the same graphs in the same order (read a value on every rank, "
      "or on none)";
  return msg;
}

// True when every rank passed the same tag: one all_reduce(max) of the tag's 128-bit digest
// and its complement, so that each rank sees the largest and the smallest digest; every rank
// reaches the same answer. A Gloo group on one host runs it through its shared-memory
// segment: after a busy step Gloo's TCP exchange took 2-10 ms to wake both ranks (a tag of a
// few bytes, 2 ranks on this machine's 2 cores), the segment 5-140 us.
bool same_tag_everywhere(dist::Communicator& c, const std::string& tag) {
  const Hash128 h = hash128(tag.data(), tag.size());
  const uint64_t mine[4] = {h.lo, h.hi, ~h.lo, ~h.hi};
  int64_t w[4];
  std::memcpy(w, mine, sizeof w);
  c.all_reduce(w, 4, DType::Int64, dist::ReduceOp::Max);  // max of h and of ~h (= ~min of h)
  return std::memcmp(w, mine, sizeof w) == 0;
}

}  // namespace

void check_sync_point(dist::Communicator& c, const SyncPoint& mine) {
  if (c.size() == 1 || same_tag_everywhere(c, mine.tag)) return;
  // They differ: every rank learns which rank passed which tag, then what each was doing.
  std::vector<std::string> tags = c.exchange(mine.tag);
  bool same = true;
  for (const std::string& t : tags) same = same && t == tags[0];
  if (same) return;
  std::vector<std::string> details = c.exchange(mine.name + "\n" + mine.ir);
  throw DistError(explain(tags, details) + " (seen on rank " + std::to_string(c.rank()) + ")");
}

bool has_collectives(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (ir::has_trait(n.op, ir::kCollective)) return true;
    for (const auto& r : n.regions)
      if (r && has_collectives(*r)) return true;
  }
  return false;
}

}  // namespace loom::runtime
