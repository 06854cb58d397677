// Shardings: block arithmetic over a mesh and the `shard` node's attribute encoding
// (loom/ir/sharding.h).
#include "loom/ir/sharding.h"

#include "loom/core/error.h"

namespace loom::ir {

namespace {

// The coordinate of `rank` on each mesh axis (row-major).
std::vector<int64_t> coords(const std::vector<int64_t>& mesh, int64_t rank) {
  std::vector<int64_t> c(mesh.size());
  for (size_t a = mesh.size(); a-- > 0;) {
    c[a] = rank % mesh[a];
    rank /= mesh[a];
  }
  return c;
}

}  // namespace

void check_mesh(const char* op, const std::vector<int64_t>& mesh) {
  int64_t n = 1;
  for (int64_t m : mesh)
    LOOM_CHECK(m >= 1 && m <= (int64_t{1} << 24) && !__builtin_mul_overflow(n, m, &n) &&
                   n <= (int64_t{1} << 24),
               "[", op, "] mesh extents must be at least 1 and hold at most 2^24 ranks, got ", m);
}

bool Sharding::replicated() const {
  if (partial) return false;
  for (uint32_t d : dims)
    if (d) return false;
  return true;
}

int64_t Sharding::shards(size_t dim) const { return group_size(mesh, dims[dim]); }

int64_t Sharding::size() const { return group_size(mesh, ~0u); }

int64_t group_size(const std::vector<int64_t>& mesh, uint32_t axes) {
  int64_t n = 1;
  for (size_t a = 0; a < mesh.size(); ++a)
    if (axes >> a & 1u) n *= mesh[a];
  return n;
}

int64_t group_index(const std::vector<int64_t>& mesh, uint32_t axes, int64_t rank) {
  const std::vector<int64_t> c = coords(mesh, rank);
  int64_t k = 0;
  for (size_t a = 0; a < mesh.size(); ++a)
    if (axes >> a & 1u) k = k * mesh[a] + c[a];
  return k;
}

std::vector<int64_t> group_ranks(const std::vector<int64_t>& mesh, uint32_t axes, int64_t rank) {
  std::vector<int64_t> out;
  const int64_t world = group_size(mesh, ~0u);
  const std::vector<int64_t> mine = coords(mesh, rank);
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<int64_t> c = coords(mesh, r);
    bool same = true;
    for (size_t a = 0; a < mesh.size(); ++a) same = same && ((axes >> a & 1u) || c[a] == mine[a]);
    if (same) out.push_back(r);
  }
  // Row-major order of the whole mesh is block order within the group (axes ascend).
  return out;
}

Attrs encode_sharding(const Sharding& s, bool stored) {
  Attrs a;
  a.ints.push_back(static_cast<int64_t>(s.mesh.size()));
  for (int64_t m : s.mesh) a.ints.push_back(m);
  for (uint32_t d : s.dims) a.ints.push_back(d);
  a.flag = stored;
  return a;
}

Sharding decode_sharding(const Attrs& a, int64_t rank) {
  Sharding s;
  LOOM_CHECK(!a.ints.empty() && a.ints[0] >= 1 && a.ints[0] <= 16 &&
                 static_cast<int64_t>(a.ints.size()) == 1 + a.ints[0] + rank,
             "[shard] expected [mesh rank, mesh..., one axis mask per dim of a rank-", rank,
             " operand]");
  const size_t k = static_cast<size_t>(a.ints[0]);
  for (size_t i = 0; i < k; ++i) s.mesh.push_back(a.ints[1 + i]);
  check_mesh("shard", s.mesh);
  uint32_t used = 0;
  for (size_t d = 1 + k; d < a.ints.size(); ++d) {
    const int64_t m = a.ints[d];
    LOOM_CHECK(m >= 0 && m < (int64_t{1} << k) && (used & m) == 0, "[shard] dim ", d - 1 - k,
               "'s axis mask ", m, " must name mesh axes of a rank-", k,
               " mesh, each axis at most once over all dims");
    used |= static_cast<uint32_t>(m);
    s.dims.push_back(static_cast<uint32_t>(m));
  }
  return s;
}

Shape local_shape(const Shape& global, const Sharding& s) {
  Shape out = global;
  for (size_t d = 0; d < out.size(); ++d) out[d] /= s.shards(d);
  return out;
}

std::string to_string(const Sharding& s) {
  std::string out = "mesh=[";
  for (size_t a = 0; a < s.mesh.size(); ++a) out += (a ? "," : "") + std::to_string(s.mesh[a]);
  out += "] (";
  for (size_t d = 0; d < s.dims.size(); ++d) {
    if (d) out += ", ";
    if (!s.dims[d]) {
      out += "None";
      continue;
    }
    std::string axes;
    int n = 0;
    for (size_t a = 0; a < s.mesh.size(); ++a)
      if (s.dims[d] >> a & 1u) axes += (n++ ? "," : "") + std::to_string(a);
    out += n == 1 ? axes : "(" + axes + ")";
  }
  out += ")";
  if (s.partial) out += " partial over axes mask " + std::to_string(s.partial);
  return out;
}

}  // namespace loom::ir
