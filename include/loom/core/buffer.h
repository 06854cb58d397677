// Buffer: RAII, 64-byte aligned, reference-counted storage for tensor data.
//
// Copies share the same memory (shared ownership); Buffer::allocate gives fresh memory.
// The byte count is fixed at allocation. Thread-safety: the handle is as safe as shared_ptr;
// the bytes are not synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace loom {

class Buffer {
 public:
  static constexpr size_t kAlignment = 64;

  Buffer() = default;
  // Fresh, zero-filled memory of `nbytes` bytes (nbytes may be 0).
  static Buffer allocate(size_t nbytes);

  void* data() { return storage_ ? storage_->ptr : nullptr; }
  const void* data() const { return storage_ ? storage_->ptr : nullptr; }
  template <class T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data());
  }
  size_t nbytes() const { return storage_ ? storage_->nbytes : 0; }
  bool defined() const { return storage_ != nullptr; }
  // Identity of the underlying storage (stable while any copy is alive).
  const void* id() const { return storage_.get(); }
  long use_count() const { return storage_.use_count(); }

 private:
  struct Storage {
    void* ptr = nullptr;
    size_t nbytes = 0;
    ~Storage();
  };
  std::shared_ptr<Storage> storage_;
};

}  // namespace loom
