#pragma once
// The on-disk cache of compiled kernels (host .so files, cubins): bytes in, bytes out, keyed by
// the full text of everything that decides the bytes. Entries are published atomically and
// verified when read, so a crash, a full disk or a stray edit costs a recompile, never a load
// of wrong code.
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"

namespace kiln::runtime {

namespace detail {

inline std::string hex64(std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

// Word-at-a-time checksum of cache payloads (cubins can be megabytes; byte-wise FNV is slow).
inline std::uint64_t checksum64(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0x6a09e667f3bcc909ull ^ (n * 0x9e3779b97f4a7c15ull);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w * 0xff51afd7ed558ccdull;
    h = ((h << 31) | (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  h ^= tail * 0xff51afd7ed558ccdull;
  return kiln::detail::hash_mix(h);
}

/// One line on stderr, independent of KILN_LOGS: problems the user must know about.
inline void warn(const std::string& message) { std::fprintf(stderr, "kiln: warning: %s\n", message.c_str()); }

// mkdir -p with `mode` for every directory it creates.
inline bool make_dirs(const std::string& path, mode_t mode) {
  if (path.empty()) return false;
  for (std::size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      std::string prefix = path.substr(0, pos);
      if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

inline std::string absolute_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char buf[4096];
  if (!::getcwd(buf, sizeof buf)) return path;
  return std::string(buf) + "/" + path;
}

inline std::string home_dir() {
  std::string home = env::get("HOME");
  if (!home.empty()) return home;
  if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir) return pw->pw_dir;
  return {};
}

// Empty when `dir` is safe to load code from, else why not.
inline std::string unsafe_dir_reason(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return "cannot stat " + dir + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return dir + " is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != ::geteuid())
    return dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
           std::to_string(::geteuid()) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return dir + " is group or world writable (mode " + mode + ")";
  }
  return {};
}

inline void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Reads a whole regular file (not following a final symlink). False when it cannot.
inline bool read_whole_file(const std::string& path, std::string& out, struct stat* st_out = nullptr) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return false;
  }
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  if (st_out) *st_out = st;
  return true;
}

// Creates `path` exclusively (never through a symlink) with mode 0600 and writes `bytes`.
inline bool write_new_file(const std::string& path, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  bool ok = done == bytes.size();
  if (::close(fd) != 0) ok = false;
  if (!ok) ::unlink(path.c_str());
  return ok;
}

// A file name no other thread or process will pick: pid, a process-wide counter and the clock.
inline std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) + "." +
         hex64(kiln::detail::hash_mix(now ^ reinterpret_cast<std::uintptr_t>(&counter))).substr(0, 8);
}

}  // namespace detail

/// A directory of verified cache entries. Each entry file is named by the hex of a 64-bit hash
/// of its key plus an extension, and holds a magic tag, the full key text, the payload length,
/// a checksum of the payload and the payload; anything that does not verify is a miss.
class DiskCache {
 public:
  /// A cache in `dir`, created (with parents) with mode 0700 when missing. Disabled, with one
  /// warning on stderr, when `dir` is a symlink, not a directory, group/world writable or
  /// owned by another user.
  explicit DiskCache(std::string dir) : dir_(detail::absolute_path(std::move(dir))) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    if (dir_.empty()) {
      disable("no cache directory given", true);
      return;
    }
    struct stat st {};
    if (::lstat(dir_.c_str(), &st) != 0 && !detail::make_dirs(dir_, 0700)) {
      disable("cannot create " + dir_ + ": " + std::strerror(errno), true);
      return;
    }
    std::string why = detail::unsafe_dir_reason(dir_);
    if (!why.empty()) disable(why, true);
  }

  /// A disabled cache (load always misses, store does nothing); `reason` says why.
  static DiskCache disabled(std::string reason) {
    DiskCache c;
    c.enabled_ = false;
    c.reason_ = std::move(reason);
    return c;
  }

  /// Configured from the environment as it is now: KILN_CACHE=0 disables it; the directory is
  /// KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  static DiskCache from_env() {
    if (!env::flag("KILN_CACHE", true)) return disabled("KILN_CACHE=0");
    std::string dir = env::get("KILN_CACHE_DIR");
    if (dir.empty()) {
      std::string xdg = env::get("XDG_CACHE_HOME");
      if (!xdg.empty() && xdg[0] == '/') {
        dir = xdg + "/kiln";
      } else {
        std::string home = detail::home_dir();
        if (home.empty()) {
          DiskCache c = disabled("no KILN_CACHE_DIR, XDG_CACHE_HOME or home directory");
          detail::warn("on-disk kernel cache disabled: " + c.reason_);
          return c;
        }
        dir = home + "/.cache/kiln";
      }
    }
    return DiskCache(dir);
  }

  /// The process-wide cache, configured from the environment on first use.
  static DiskCache& instance() {
    // Leaked on purpose: kernels may be loaded during static destruction of user objects.
    static DiskCache* cache = new DiskCache(from_env());
    return *cache;
  }

  /// Reconfigures this cache to `dir` (tests only: not safe while other threads use it).
  void set_dir_for_testing(std::string dir) { *this = DiskCache(std::move(dir)); }

  /// True when entries are read and written.
  bool enabled() const { return enabled_; }
  /// The directory (may be set even when disabled, e.g. when it was refused as unsafe).
  const std::string& dir() const { return dir_; }
  /// Why the cache is disabled; empty when enabled.
  const std::string& disabled_reason() const { return reason_; }

  /// Where the entry for `key` lives: dir/<hex of 64-bit hash of key><ext>.
  std::string path_for(const std::string& key, const std::string& ext) const {
    return dir_ + "/" + detail::hex64(kiln::detail::hash_string(key)) + ext;
  }

  /// The payload stored under exactly `key`, or nullopt. A truncated, corrupted or foreign
  /// (hash-colliding) entry is a miss and is removed.
  std::optional<std::string> load(const std::string& key, const std::string& ext) const {
    if (!enabled_) return std::nullopt;
    std::string path = path_for(key, ext);
    std::string data;
    struct stat st {};
    if (!detail::read_whole_file(path, data, &st)) return std::nullopt;
    std::string why = verify(data, key);
    if (!why.empty()) {
      log(LogChannel::cache, "disk cache: discarding " + path + ": " + why);
      // Remove it only if it is still the file we read: another process may just have
      // published a good entry under the same name.
      struct stat now {};
      if (::lstat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev)
        ::unlink(path.c_str());
      return std::nullopt;
    }
    return data.substr(kHeaderBytes + key.size());
  }

  /// Publishes `bytes` under `key`: written to a unique temporary file in the directory, then
  /// renamed over the entry, so readers see either the old entry or the whole new one. Failures
  /// (full disk, permissions) are logged and otherwise ignored: the cache is an optimisation.
  void store(const std::string& key, const std::string& ext, std::string_view bytes) const {
    if (!enabled_) return;
    std::string entry;
    entry.reserve(kHeaderBytes + key.size() + bytes.size());
    entry.append(kMagic, 8);
    detail::put_u64(entry, key.size());
    detail::put_u64(entry, bytes.size());
    detail::put_u64(entry, detail::checksum64(bytes.data(), bytes.size()));
    entry += key;
    entry.append(bytes.data(), bytes.size());

    std::string path = path_for(key, ext);
    std::string tmp = dir_ + "/.tmp." + detail::unique_suffix() + ext;
    if (!detail::write_new_file(tmp, entry)) {
      log(LogChannel::cache, "disk cache: cannot write " + tmp + ": " + std::strerror(errno));
      return;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      log(LogChannel::cache, "disk cache: cannot publish " + path + ": " + std::strerror(errno));
      ::unlink(tmp.c_str());
    }
  }

 private:
  static constexpr const char kMagic[9] = "KILNCE01";
  static constexpr std::size_t kHeaderBytes = 8 + 3 * 8;

  DiskCache() = default;

  void disable(std::string reason, bool warn) {
    enabled_ = false;
    reason_ = std::move(reason);
    if (warn) detail::warn("on-disk kernel cache disabled: " + reason_);
  }

  // Empty when `data` is a whole, intact entry for `key`, else what is wrong with it.
  static std::string verify(const std::string& data, const std::string& key) {
    if (data.size() < kHeaderBytes) return "truncated header";
    if (std::memcmp(data.data(), kMagic, 8) != 0) return "bad magic";
    std::uint64_t key_len = detail::get_u64(data.data() + 8);
    std::uint64_t payload_len = detail::get_u64(data.data() + 16);
    std::uint64_t sum = detail::get_u64(data.data() + 24);
    if (key_len != key.size() || data.size() - kHeaderBytes < key_len ||
        std::memcmp(data.data() + kHeaderBytes, key.data(), key.size()) != 0)
      return "stored key differs (hash collision or foreign entry)";
    if (data.size() - kHeaderBytes - key_len != payload_len) return "length mismatch (truncated entry)";
    if (detail::checksum64(data.data() + kHeaderBytes + key_len, payload_len) != sum) return "checksum mismatch";
    return {};
  }

  std::string dir_;
  std::string reason_;
  bool enabled_ = true;
};

/// A private directory (mode 0700, unique to this process) for generated sources and objects
/// on their way to dlopen: $TMPDIR or /tmp, or the cache directory when that temp directory is
/// mounted noexec. Removed at exit when empty (a failed compile's source stays for the user).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = env::get("TMPDIR", "/tmp");
    struct statvfs vfs {};
    if (::statvfs(base.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NOEXEC) && DiskCache::instance().enabled())
      base = DiskCache::instance().dir();
    std::string tmpl = base + "/kiln-XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      throw Error("kiln: cannot create a scratch directory under " + base + ": " + std::strerror(errno));
    return tmpl;
  }();
  static const bool registered = [] {
    std::atexit([] { ::rmdir(scratch_dir().c_str()); });
    return true;
  }();
  (void)registered;
  return dir;
}

}  // namespace kiln::runtime
