// DiskCache: file layout, verification, atomic writes, LRU eviction.
#include "loom/backend/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "loom/core/config.h"

namespace loom::backend {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'C', 'C', 'H', '1'};
constexpr const char* kSuffix = ".lco";

// Header fields (little-endian host layout; a foreign-endian file fails the magic or checksum).
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t key_lo, key_hi;
  uint64_t payload_bytes;
  uint64_t sum_lo, sum_hi;
  uint64_t reserved;
};
static_assert(sizeof(Header) == DiskCache::kHeaderBytes);

// XXH3-128 of the header up to the checksum fields, then of the payload.
Hash128 checksum(const Header& h, std::string_view payload) {
  Hasher128 hs;
  hs.add_bytes(&h, offsetof(Header, sum_lo));
  hs.add_bytes(payload.data(), payload.size());
  return hs.finish();
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_file(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0;
  if (ok) {
    out->resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out->size()) {
      ssize_t r = ::read(fd, out->data() + got, out->size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    out->resize(got);
  }
  ::close(fd);
  return ok;
}

std::atomic<uint64_t> g_tmp_counter{0};

}  // namespace

DiskCache& DiskCache::instance() {
  static DiskCache c;
  return c;
}

DiskCache::DiskCache() : DiskCache(config().cache_dir, config().cache_dir_mb << 20) {}

DiskCache::DiskCache(std::string dir, int64_t max_bytes) : max_bytes_(max_bytes) {
  set_dir(std::move(dir));
}

void DiskCache::set_dir(std::string dir) {
  std::lock_guard lock(mu_);
  dir_ = std::move(dir);
  bytes_estimate_ = -1;
  enabled_.store(!dir_.empty(), std::memory_order_relaxed);
}

std::string DiskCache::dir() const {
  std::lock_guard lock(mu_);
  return dir_;
}

void DiskCache::set_max_bytes(int64_t bytes) {
  std::lock_guard lock(mu_);
  max_bytes_ = std::max<int64_t>(0, bytes);
}

std::string DiskCache::path_of(const Hash128& key) const {
  std::lock_guard lock(mu_);
  return (fs::path(dir_) / (key.hex() + kSuffix)).string();
}

// True unless another thread or process removed the entry first (so each bad entry is
// counted once, by whoever removes it, when the preload and a load both find it).
bool DiskCache::remove_entry(const std::string& path) {
  return ::unlink(path.c_str()) == 0 || errno != ENOENT;
}

namespace {
// True when `file` is a whole entry of this format whose checksum holds (and whose key is
// *key, when given).
bool verify_entry(const std::string& file, const Hash128* key) {
  Header h;
  if (file.size() < DiskCache::kHeaderBytes) return false;
  std::memcpy(&h, file.data(), DiskCache::kHeaderBytes);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != DiskCache::kFormatVersion ||
      h.header_bytes != DiskCache::kHeaderBytes ||
      h.payload_bytes != file.size() - DiskCache::kHeaderBytes)
    return false;
  if (key && (h.key_lo != key->lo || h.key_hi != key->hi)) return false;
  std::string_view payload(file.data() + DiskCache::kHeaderBytes,
                           file.size() - DiskCache::kHeaderBytes);
  Hash128 sum = checksum(h, payload);
  return sum.lo == h.sum_lo && sum.hi == h.sum_hi;
}
}  // namespace

std::vector<std::pair<Hash128, std::string>> DiskCache::newest_entries(size_t max_count,
                                                                       size_t max_bytes) const {
  std::vector<std::pair<Hash128, std::string>> out;
  if (!enabled() || max_count == 0) return out;
  struct Item {
    fs::path path;
    fs::file_time_type mtime;
  };
  std::vector<Item> items;
  std::error_code ec;
  for (fs::directory_iterator it(dir(), ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->path().extension() != kSuffix) continue;
    auto mtime = fs::last_write_time(it->path(), e2);
    if (!e2) items.push_back({it->path(), mtime});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.mtime > b.mtime; });
  size_t bytes = 0;
  for (const Item& item : items) {
    if (out.size() >= max_count) break;
    std::string file;
    if (!read_file(item.path.string(), &file)) continue;
    if (!verify_entry(file, nullptr)) {  // truncated, corrupt, or another format (old hash)
      if (remove_entry(item.path.string())) rejected_++;
      continue;
    }
    if (bytes + file.size() > max_bytes) break;
    bytes += file.size();
    Header h;
    std::memcpy(&h, file.data(), kHeaderBytes);
    file.erase(0, kHeaderBytes);
    out.push_back({Hash128{h.key_lo, h.key_hi}, std::move(file)});
  }
  return out;
}

void DiskCache::note_hit(const Hash128& key) {
  hits_++;
  ::utimensat(AT_FDCWD, path_of(key).c_str(), nullptr, 0);  // LRU: this entry was just used
}

std::optional<std::string> DiskCache::load(const Hash128& key, bool count_miss) {
  if (!enabled()) return std::nullopt;
  const std::string path = path_of(key);
  std::string file;
  if (!read_file(path, &file)) {
    if (count_miss) misses_++;
    return std::nullopt;
  }
  // Truncated, corrupt, another format version or another key: never used.
  if (!verify_entry(file, &key)) {
    if (remove_entry(path)) rejected_++;
    if (count_miss) misses_++;
    return std::nullopt;
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // LRU: this entry was just used
  hits_++;
  file.erase(0, kHeaderBytes);
  return file;
}

bool DiskCache::store(const Hash128& key, std::string_view payload) {
  if (!enabled()) return false;
  std::string dir = this->dir();
  std::error_code ec;
  fs::create_directories(dir, ec);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.header_bytes = kHeaderBytes;
  h.key_lo = key.lo;
  h.key_hi = key.hi;
  h.payload_bytes = payload.size();
  Hash128 sum = checksum(h, payload);
  h.sum_lo = sum.lo;
  h.sum_hi = sum.hi;
  const std::string path = (fs::path(dir) / (key.hex() + kSuffix)).string();
  char tmp_name[96];
  std::snprintf(tmp_name, sizeof tmp_name, ".tmp-%ld-%llu-%s", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(g_tmp_counter++), key.hex().c_str());
  const std::string tmp = (fs::path(dir) / tmp_name).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  if (ok) {
    ok = write_all(fd, reinterpret_cast<const char*>(&h), kHeaderBytes) &&
         write_all(fd, payload.data(), payload.size());
    ok = (::close(fd) == 0) && ok;
    ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) ::unlink(tmp.c_str());
  }
  if (!ok) {
    write_failures_++;
    return false;
  }
  writes_++;
  evict_if_needed(static_cast<int64_t>(kHeaderBytes + payload.size()));
  return true;
}

void DiskCache::reject(const Hash128& key) {
  if (remove_entry(path_of(key))) rejected_++;
}

// Scans the directory only when the running estimate passes the bound (or was never taken),
// then removes the least recently used entries down to 90 % of it. Temporary files of writers
// that died (older than an hour) go too.
void DiskCache::evict_if_needed(int64_t added) {
  std::lock_guard lock(mu_);
  if (bytes_estimate_ >= 0) {
    bytes_estimate_ += added;
    if (bytes_estimate_ <= max_bytes_) return;
  }
  struct Item {
    fs::path path;
    int64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Item> items;
  int64_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    auto mtime = fs::last_write_time(p, e2);
    if (e2) continue;
    if (name.rfind(".tmp-", 0) == 0) {
      if (now - mtime > std::chrono::hours(1)) fs::remove(p, e2);
      continue;
    }
    if (p.extension() != kSuffix) continue;
    auto size = fs::file_size(p, e2);
    if (e2) continue;
    items.push_back({p, static_cast<int64_t>(size), mtime});
    total += static_cast<int64_t>(size);
  }
  if (total > max_bytes_) {
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.mtime < b.mtime; });
    const int64_t target = max_bytes_ / 10 * 9;
    for (const Item& it : items) {
      if (total <= target) break;
      std::error_code e2;
      if (fs::remove(it.path, e2)) {
        total -= it.bytes;
        evictions_++;
      }
    }
  }
  bytes_estimate_ = total;
}

DiskCacheStats DiskCache::stats() const {
  return {hits_.load(),           misses_.load(),   writes_.load(),
          write_failures_.load(), rejected_.load(), evictions_.load()};
}

void DiskCache::reset_stats() {
  for (auto* a : {&hits_, &misses_, &writes_, &write_failures_, &rejected_, &evictions_})
    a->store(0);
}

}  // namespace loom::backend
