// Buffer: RAII, 64-byte aligned, reference-counted storage for tensor data.
//
// Copies share the same memory (shared ownership); Buffer::allocate gives fresh memory.
// The byte count is fixed at allocation. Blocks of 64 KiB and more come from a process-wide
// caching pool: a freed block is kept for the next allocation of the same size (up to
// LOOM_POOL_MB, default a quarter of physical memory, in all; a block that does not fit
// evicts the blocks of the least recently used sizes), so steady-state steps do not call the
// system allocator or fault in fresh pages. Thread-safety: the handle is as safe as
// shared_ptr; the pool takes a lock; the bytes are not synchronized.
#pragma once

#include <atomic>
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
  // Memory of `nbytes` bytes with unspecified contents (for results about to be written).
  static Buffer allocate_uninitialized(size_t nbytes);
  // Bytes held by the caching pool now (free blocks), and blocks served from it so far.
  static size_t pool_free_bytes();
  static size_t pool_hits();
  // The pool's bound in bytes (LOOM_POOL_MB); lowering it frees blocks down to it.
  static size_t pool_limit();
  static void set_pool_limit(size_t bytes);
  // Bytes held by live buffers now, and the most since reset_peak() (the runtime's own
  // measure of memory, for benchmarks: it excludes the pool's free blocks).
  static size_t live_bytes();
  static size_t peak_bytes();
  static void reset_peak();

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
  // Memory owned elsewhere counts one more user: loom never donates (writes results into) it.
  long use_count() const { return storage_ ? storage_.use_count() + (storage_->owner ? 1 : 0) : 0; }

  // Foreign memory (a numpy array, a DLPack tensor) shared without copying: `owner` keeps it
  // alive and is released when the last copy of the Buffer goes. `data` must be aligned to
  // the element size of the tensors that view it.
  static Buffer wrap(void* data, size_t nbytes, std::shared_ptr<void> owner);
  // Memory that code outside loom may write while loom holds it: wrapped foreign memory, or
  // a buffer handed out without a copy (numpy's view of a tensor). A pending op that reads
  // such a tensor reads a copy taken when the op was traced, as an eager framework would.
  bool shared() const {
    return storage_ && (storage_->owner || storage_->exported.load(std::memory_order_relaxed));
  }
  void mark_shared() {
    if (storage_) storage_->exported.store(true, std::memory_order_relaxed);
  }

 private:
  struct Storage {
    void* ptr = nullptr;
    size_t nbytes = 0;
    size_t capacity = 0;                // bytes of the block (a pool size class)
    std::shared_ptr<void> owner;        // set for wrapped foreign memory (then capacity is 0)
    std::atomic<bool> exported{false};  // handed out without a copy (mark_shared)
    ~Storage();
  };
  std::shared_ptr<Storage> storage_;
};

}  // namespace loom
