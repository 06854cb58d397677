// Host functions that compiled code calls (pure_callback): a process-wide table of callbacks,
// each a name and a function over host arrays, keyed by the id that the IR's pure_callback
// node carries. Registered once and never removed, so a cached program's id stays valid.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loom/core/buffer.h"
#include "loom/core/shape.h"

namespace loom {

// A tensor's elements on the host, contiguous and row-major: what a host callback receives
// (valid during the call only) and what it returns.
struct HostArray {
  TensorType type;
  Buffer buffer;

  // A zero-filled array of type t.
  static HostArray zeros(TensorType t);
  template <class T>
  T* data() {
    return buffer.as<T>();
  }
  template <class T>
  const T* data() const {
    return buffer.as<T>();
  }
  int64_t numel() const { return type.numel(); }
};

// The function of a host callback: its arguments in, one array per declared result out.
using HostFn = std::function<std::vector<HostArray>(const std::vector<HostArray>& args)>;

namespace detail {

// Registers fn under `name` (for messages) and returns its id; thread-safe.
int64_t register_host_callback(std::string name, HostFn fn);
// Whether `id` names a registered callback, and its name.
bool host_callback_exists(int64_t id);
std::string host_callback_name(int64_t id);
// Calls callback `id` on args and copies its results into outs (buffers of the types `want`).
// A result of another type is an ExecError naming the callback and both types; an exception
// the function throws propagates unchanged.
void call_host_callback(int64_t id, const std::vector<HostArray>& args,
                        std::span<const TensorType> want, std::span<void* const> outs);

}  // namespace detail
}  // namespace loom
