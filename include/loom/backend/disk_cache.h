// DiskCache: the persistent compile cache, a directory of verified entries (compiled code).
//
//   backend::DiskCache& dc = backend::DiskCache::instance();   // LOOM_CACHE_DIR, or:
//   dc.set_dir("/var/cache/loom");
//   if (auto bytes = dc.load(key)) use(*bytes); else dc.store(key, compile());
//
// One file per key, `<key hex>.lco`: a 64-byte header (magic, format version, header size,
// key, payload size, an XXH3-128 checksum of header and payload) and the payload. Writes go to
// a temporary file in the same directory that is then renamed over the entry, so a reader sees
// the old entry, the new one, or none, never a partial one; two processes may share the
// directory. A load verifies everything; a truncated, corrupt, foreign or stale entry is
// counted in `rejected`, removed, and reported as a miss. The directory is bounded
// (LOOM_CACHE_DIR_MB, default 1024 MiB): after a write that takes it over the bound, the
// least recently used entries (file mtime, touched on every hit) are removed. Failures to
// create, write or rename count in `write_failures` and never throw.
// Thread-safe: every member may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/hash.h"

namespace loom::backend {

struct DiskCacheStats {
  int64_t hits = 0;            // entries loaded (verified)
  int64_t misses = 0;          // lookups that found no usable entry
  int64_t writes = 0;          // entries written
  int64_t write_failures = 0;  // entries that could not be written (directory unwritable, ...)
  int64_t rejected = 0;        // entries found truncated, corrupt, foreign or stale: removed
  int64_t evictions = 0;       // entries removed to keep the directory under its bound
};

class DiskCache {
 public:
  // Bump when the file layout or a hash changes; entries of other versions are rejected
  // (counted in `rejected`). 2: keys and checksums are XXH3-128 (1: loom's own hasher).
  static constexpr uint32_t kFormatVersion = 2;
  static constexpr size_t kHeaderBytes = 64;

  // The process's cache (LOOM_CACHE_DIR, LOOM_CACHE_DIR_MB): the one loom compiles against.
  static DiskCache& instance();
  // A cache of its own over `dir`, bounded to `max_bytes` (tools and tests: it shares no
  // counters or directory with instance(), which the JIT's start-up thread reads).
  DiskCache(std::string dir, int64_t max_bytes);

  // Sets the directory ("" turns the cache off). It is created on the first write.
  void set_dir(std::string dir);
  std::string dir() const;
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_max_bytes(int64_t bytes);

  // The verified payload stored under `key`, or nullopt (a miss; a bad entry is removed).
  // `count_miss` false: a probe for an entry that may well be absent (the JIT's tiered-up
  // objects) counts a hit, or a rejection, but no miss.
  std::optional<std::string> load(const Hash128& key, bool count_miss = true);
  // Stores `payload` under `key` atomically; false (counted) when it cannot be written.
  bool store(const Hash128& key, std::string_view payload);
  // The verified entries (key, payload) most recently used, newest first: at most
  // `max_count` of them and `max_bytes` in all, without touching them or counting hits (the
  // JIT preloads them at start-up, on a background thread). Entries among them that fail
  // verification (corrupt, or another format version: written with the old hash) are
  // counted in `rejected` and removed, as a load does.
  std::vector<std::pair<Hash128, std::string>> newest_entries(size_t max_count,
                                                              size_t max_bytes) const;
  // Counts a hit on `key` served from memory (a preloaded entry) and marks it used (LRU).
  void note_hit(const Hash128& key);
  // A payload that verified but that its user could not use (the JIT refused it): counted
  // in `rejected` and removed.
  void reject(const Hash128& key);
  // The file of `key` (for tests and tools).
  std::string path_of(const Hash128& key) const;

  DiskCacheStats stats() const;
  void reset_stats();

 private:
  DiskCache();
  void evict_if_needed(int64_t added);
  static bool remove_entry(const std::string& path);

  mutable std::mutex mu_;
  std::string dir_;
  std::atomic<bool> enabled_{false};
  int64_t max_bytes_ = 0;
  int64_t bytes_estimate_ = -1;  // -1: not yet scanned
  std::atomic<int64_t> hits_{0}, misses_{0}, writes_{0}, write_failures_{0}, evictions_{0};
  mutable std::atomic<int64_t> rejected_{0};  // also counted by the const newest_entries
};

}  // namespace loom::backend
