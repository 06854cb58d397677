#include "loom/core/host_callback.h"

#include <cstring>
#include <deque>
#include <mutex>

#include "loom/core/error.h"

namespace loom {
namespace {

struct Entry {
  std::string name;
  HostFn fn;
};

// Never destroyed: programs cached until exit hold ids, and a callback may own interpreter
// objects that must not be released after the interpreter has gone.
struct Registry {
  std::mutex mu;
  std::deque<Entry> entries;  // stable addresses: a call runs without the lock
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

const Entry* find(int64_t id) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (id < 0 || static_cast<size_t>(id) >= r.entries.size()) return nullptr;
  return &r.entries[static_cast<size_t>(id)];
}

}  // namespace

HostArray HostArray::zeros(TensorType t) {
  check_shape("HostArray", t.shape);
  Buffer b = Buffer::allocate(static_cast<size_t>(t.nbytes()));
  return HostArray{std::move(t), std::move(b)};
}

namespace detail {

int64_t register_host_callback(std::string name, HostFn fn) {
  LOOM_CHECK(fn != nullptr, "[pure_callback] the callback '", name, "' has no function");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.entries.push_back(Entry{std::move(name), std::move(fn)});
  return static_cast<int64_t>(r.entries.size() - 1);
}

bool host_callback_exists(int64_t id) { return find(id) != nullptr; }

std::string host_callback_name(int64_t id) {
  const Entry* e = find(id);
  return e ? e->name : str_cat("#", id);
}

void call_host_callback(int64_t id, const std::vector<HostArray>& args,
                        std::span<const TensorType> want, std::span<void* const> outs) {
  const Entry* e = find(id);
  if (!e)
    throw ExecError("pure_callback", str_cat("[pure_callback] no host callback #", id,
                                             " is registered in this process"));
  std::vector<HostArray> got = e->fn(args);
  auto types = [&] {
    std::string s;
    for (const TensorType& t : want) s += (s.empty() ? "" : ", ") + t.str();
    return s;
  };
  if (got.size() != want.size())
    throw ExecError("pure_callback",
                    str_cat("[pure_callback] the callback '", e->name, "' returned ", got.size(),
                            " array(s); expected ", want.size(), " (", types(),
                            "; a returned tuple or list holds one array per result)"));
  for (size_t k = 0; k < want.size(); ++k) {
    const HostArray& r = got[k];
    if (!(r.type == want[k]))
      throw ExecError(
          "pure_callback",
          str_cat("[pure_callback] the callback '", e->name, "' returned ", r.type, " as result ",
                  k, "; expected ", want[k], " (results: ", types(), ")"));
    const size_t bytes = static_cast<size_t>(want[k].nbytes());
    if (bytes == 0) continue;
    if (r.buffer.nbytes() < bytes)
      throw ExecError(
          "pure_callback",
          str_cat("[pure_callback] the callback '", e->name, "' returned result ", k, " of type ",
                  r.type, " with ", r.buffer.nbytes(), " bytes of data; it needs ", bytes));
    std::memcpy(outs[k], r.buffer.data(), bytes);
  }
}

}  // namespace detail
}  // namespace loom
