#pragma once
// The on-disk cache of compiled kernels (host .so files, cubins): bytes in, bytes out, keyed by
// the full text of everything that decides the bytes. Entries are published atomically and
// verified when read, so a crash, a full disk or a stray edit costs a recompile, never a load
// of wrong code.
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/process.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::runtime {

namespace detail {

using kiln::detail::hex64;

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

// The bound on a cache's total size unless KILN_CACHE_MAX_BYTES says otherwise, and on one
// entry's. No entry kiln writes comes near kMaxEntryBytes (a cubin or .so of many kernels is
// megabytes); a header that claims more is damage, and refusing it before allocating keeps a
// planted multi-gigabyte (sparse) file from exhausting memory in every process that reads it.
inline constexpr std::uint64_t kDefaultCacheMaxBytes = std::uint64_t{2} << 30;
inline constexpr std::uint64_t kMaxEntryBytes = std::uint64_t{256} << 20;
// What a killed process leaves behind (a store's temporary file, a scratch directory) is
// removed by later processes once it is this old: no store or compile comes near an hour,
// and a live process's scratch directory is protected by its lock whatever its age.
inline constexpr std::chrono::seconds kStaleAge{3600};

// "2G", "512M", "64k", "1000000" (k, M, G, T are powers of 1024; an optional trailing "B" or
// "iB"). nullopt when it is not a size.
inline std::optional<std::uint64_t> parse_byte_size(std::string_view s) {
  std::uint64_t v = 0;
  std::size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (~std::uint64_t{0} - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(s[i] - '0');
  }
  if (i == 0) return std::nullopt;
  std::string_view unit = s.substr(i);
  int shift = 0;
  if (!unit.empty() && unit[0] != 'B') {
    switch (unit[0]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      default:
        return std::nullopt;
    }
    unit.remove_prefix(1);
    if (unit == "iB") unit = {};
  }
  if (!unit.empty() && unit != "B") return std::nullopt;
  if (shift != 0 && v > (~std::uint64_t{0} >> shift)) return std::nullopt;
  return v << shift;
}

// File names kiln itself makes; cleanup only ever touches these. An entry: 16 lowercase hex
// digits and an extension. A store's temporary: .tmp.<pid>.<counter>.<8 hex><extension>. A
// scratch directory: kiln-XXXXXX as mkdtemp fills it.
inline bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

inline bool is_extension(std::string_view s) {
  if (s.size() < 2 || s.size() > 16 || s[0] != '.') return false;
  for (char c : s.substr(1))
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

inline bool is_entry_name(std::string_view n) {
  if (n.size() < 18) return false;
  for (std::size_t i = 0; i < 16; ++i)
    if (!is_hex_digit(n[i])) return false;
  return is_extension(n.substr(16));
}

inline bool is_temp_name(std::string_view n) {
  if (n.substr(0, 5) != ".tmp.") return false;
  n.remove_prefix(5);
  for (int field = 0; field < 2; ++field) {
    std::size_t digits = 0;
    while (digits < n.size() && n[digits] >= '0' && n[digits] <= '9') ++digits;
    if (digits == 0 || digits == n.size() || n[digits] != '.') return false;
    n.remove_prefix(digits + 1);
  }
  if (n.size() < 8) return false;
  for (std::size_t i = 0; i < 8; ++i)
    if (!is_hex_digit(n[i])) return false;
  return is_extension(n.substr(8));
}

inline bool is_scratch_name(std::string_view n) {
  if (n.size() != 11 || n.substr(0, 5) != "kiln-") return false;
  for (char c : n.substr(5))
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

// What kiln puts in a scratch directory: generated sources and libraries, probes, the lock.
inline bool is_scratch_file_name(std::string_view n) {
  return n == ".lock" || n.substr(0, 5) == "kiln_" || n.substr(0, 6) == "probe-";
}

inline const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "an unknown kind of file";
}

inline std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// True when `st` was last modified more than `age` ago.
inline bool older_than(const struct stat& st, std::chrono::seconds age) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::int64_t now_ns = static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  return now_ns - mtime_ns(st) > static_cast<std::int64_t>(age.count()) * 1000000000;
}

// Reads up to `n` bytes at `offset`; fewer only at the end of the file or on an error.
inline std::size_t pread_full(int fd, char* buf, std::size_t n, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

// Names in the directory open as `dir_fd` that `keep` accepts (the descriptor stays open).
template <class Pred>
std::vector<std::string> list_names(int dir_fd, Pred keep) {
  std::vector<std::string> names;
  int scan_fd = ::dup(dir_fd);
  if (scan_fd < 0) return names;
  DIR* d = ::fdopendir(scan_fd);
  if (!d) {
    ::close(scan_fd);
    return names;
  }
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != ".." && keep(n)) names.emplace_back(n);
  }
  ::closedir(d);
  return names;
}

// Reads a whole regular file of at most `max_bytes` (not following a final symlink, never
// waiting on a FIFO). False when it cannot.
inline bool read_whole_file(const std::string& path, std::string& out, struct stat* st_out = nullptr,
                            std::uint64_t max_bytes = kMaxEntryBytes) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)};
  if (fd.fd < 0) return false;
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) > max_bytes)
    return false;
  out.resize(static_cast<std::size_t>(st.st_size));
  out.resize(pread_full(fd.fd, out.data(), out.size(), 0));
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

// Removes the scratch directory `name` of the directory open as `parent_fd` when a killed
// process left it: a directory of this user's, mode 0700 (as mkdtemp makes it), unchanged for
// `age` and not locked by a live process. Only files of kiln's own names are removed from it,
// and the directory itself only once that leaves it empty. True when it is gone.
inline bool reap_scratch_dir(int parent_fd, const std::string& name, std::chrono::seconds age) {
  struct stat st {};
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != 0700 || !older_than(st, age))
    return false;
  FdGuard dir{::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  struct stat opened {};
  if (dir.fd < 0 || ::fstat(dir.fd, &opened) != 0 || opened.st_ino != st.st_ino || opened.st_dev != st.st_dev)
    return false;
  // A live process holds an exclusive flock on its directory's .lock for its whole life, and
  // the kernel drops it however the process dies (SIGKILL included), so a lock we can take
  // means its owner is gone. Holding it while removing keeps a second reaper waiting out too;
  // one that comes after the lock file is gone only removes what is left of a dead directory.
  FdGuard lock{::openat(dir.fd, ".lock", O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)};
  if (lock.fd >= 0 && ::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) return false;
  for (const std::string& file : list_names(dir.fd, is_scratch_file_name)) {
    struct stat f {};
    if (::fstatat(dir.fd, file.c_str(), &f, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(f.st_mode))
      ::unlinkat(dir.fd, file.c_str(), 0);
  }
  return ::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0;
}

// $TMPDIR, else /tmp: where scratch directories go unless it is mounted noexec.
inline std::string temp_base() { return env::get("TMPDIR", "/tmp"); }

}  // namespace detail

/// Removes the scratch directories (kiln-XXXXXX) under `base` that killed processes left
/// behind: this user's, unchanged for more than `age` and not in use by a live process (each
/// process holds a lock on its own). Only files kiln writes there are removed. Returns how
/// many directories were removed. Called once per process on `$TMPDIR` (else /tmp).
inline std::size_t reap_scratch_dirs(const std::string& base, std::chrono::seconds age = detail::kStaleAge) {
  detail::FdGuard dir{::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) return 0;
  std::size_t removed = 0;
  for (const std::string& name : detail::list_names(dir.fd, detail::is_scratch_name)) {
    if (detail::reap_scratch_dir(dir.fd, name, age)) {
      ++removed;
      log(LogChannel::cache, "disk cache: removed stale scratch directory " + base + "/" + name);
    }
  }
  return removed;
}

namespace detail {
// What this process knows of its cache's total size between scans of the directory; shared
// by copies of one DiskCache.
struct EvictionState {
  std::mutex mu;
  bool scanned = false;
  std::uint64_t estimate = 0;    // bytes of entries at the last scan, plus what was stored since
  std::uint64_t since_scan = 0;  // bytes this process stored since the last scan
};
}  // namespace detail

/// A directory of verified cache entries. Each entry file is named by the hex of a 64-bit hash
/// of its key plus an extension, and holds a magic tag, the full key text, the payload length,
/// a checksum of the payload and the payload; anything that does not verify is a miss. The
/// total size of the entries is bounded (least recently used entries are evicted first).
class DiskCache {
 public:
  /// A cache in `dir`, created (with parents) with mode 0700 when missing, whose entries are
  /// kept to about `max_bytes` in all (0: no bound). Disabled, with one warning on stderr,
  /// when `dir` is a symlink, not a directory, group/world writable or owned by another user.
  explicit DiskCache(std::string dir, std::uint64_t max_bytes = detail::kDefaultCacheMaxBytes)
      : dir_(detail::absolute_path(std::move(dir))), max_bytes_(max_bytes) {
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
  /// KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; KILN_CACHE_MAX_BYTES
  /// bounds its size (default 2G; 0: no bound).
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
    std::uint64_t max_bytes = detail::kDefaultCacheMaxBytes;
    std::string spec = env::get("KILN_CACHE_MAX_BYTES");
    if (!spec.empty()) {
      if (auto v = detail::parse_byte_size(spec))
        max_bytes = *v;
      else
        detail::warn("KILN_CACHE_MAX_BYTES=" + spec +
                     " is not a size (e.g. 2G, 512M, 1000000); the cache is bounded to 2G");
    }
    return DiskCache(dir, max_bytes);
  }

  /// The process-wide cache, configured from the environment on first use, which also removes
  /// what killed processes left behind (see reap_stale and reap_scratch_dirs).
  static DiskCache& instance() {
    // Leaked on purpose: kernels may be loaded during static destruction of user objects.
    static DiskCache* cache = [] {
      auto* c = new DiskCache(from_env());
      // Once per process and cheap (one readdir of each directory, a stat only of names kiln
      // makes): without it every SIGKILLed compile or store would leave its files for good.
      c->reap_stale();
      reap_scratch_dirs(detail::temp_base());
      return c;
    }();
    return *cache;
  }

  /// Reconfigures this cache to `dir` (tests only: not safe while other threads use it).
  void set_dir_for_testing(std::string dir) { *this = DiskCache(std::move(dir), max_bytes_); }

  /// True when entries are read and written.
  bool enabled() const { return enabled_; }
  /// The directory (may be set even when disabled, e.g. when it was refused as unsafe).
  const std::string& dir() const { return dir_; }
  /// Why the cache is disabled; empty when enabled.
  const std::string& disabled_reason() const { return reason_; }
  /// The bound on the total size of the entries, in bytes (0: none).
  std::uint64_t max_bytes() const { return max_bytes_; }

  /// Where the entry for `key` lives: dir/<hex of 64-bit hash of key><ext>.
  std::string path_for(const std::string& key, const std::string& ext) const {
    return dir_ + "/" + detail::hex64(kiln::detail::hash_string(key)) + ext;
  }

  /// The payload stored under exactly `key`, or nullopt; `*miss_reason` (when given) says why
  /// not ("absent" for no entry). Whatever is at the entry's path, this neither blocks nor
  /// allocates more than the entry's verified size: a FIFO, symlink, directory or other
  /// non-regular file is refused and left alone; a truncated, oversized, corrupted or foreign
  /// (hash-colliding) entry is a miss and is removed when it is this user's regular file. A
  /// hit marks the entry as recently used (its modification time), for eviction.
  std::optional<std::string> load(const std::string& key, const std::string& ext,
                                  std::string* miss_reason = nullptr) const {
    auto miss = [&](std::string why) -> std::optional<std::string> {
      if (miss_reason) *miss_reason = std::move(why);
      return std::nullopt;
    };
    if (!enabled_) return miss("disabled: " + reason_);
    const std::string path = path_for(key, ext);
    auto refuse = [&](const std::string& why) {
      log(LogChannel::cache, "disk cache: refusing " + path + ": " + why);
      return miss(why);
    };
    auto discard = [&](const std::string& why, const struct stat& st) {
      std::string outcome = remove_bad(path, st);
      log(LogChannel::cache, "disk cache: discarding " + path + ": " + why + " (" + outcome + ")");
      return miss(why + " (" + outcome + ")");
    };

    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    // O_NOFOLLOW: an entry is a file of ours, never a link to somewhere else.
    detail::FdGuard fd{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)};
    if (fd.fd < 0) {
      const int err = errno;
      if (err == ENOENT) return miss("absent");
      if (err == ELOOP) return refuse("a symbolic link");
      struct stat st {};
      if (err == EACCES && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
        return discard("cannot read it (permission denied)", st);
      return refuse(std::string("cannot open: ") + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return refuse(std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return refuse(std::string(detail::file_kind(st.st_mode)) + ", not a regular file");
    if (st.st_uid != ::geteuid())
      return refuse("owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
                    std::to_string(::geteuid()) + ")");

    // The header (sizes, checksum) is checked against the file's size before anything is
    // allocated for the key or the payload.
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < kHeaderBytes) return discard("truncated header", st);
    char header[kHeaderBytes];
    if (detail::pread_full(fd.fd, header, kHeaderBytes, 0) != kHeaderBytes) return discard("truncated header", st);
    if (std::memcmp(header, kMagic, 8) != 0) return discard("bad magic", st);
    const std::uint64_t key_len = detail::get_u64(header + 8);
    const std::uint64_t payload_len = detail::get_u64(header + 16);
    const std::uint64_t sum = detail::get_u64(header + 24);
    if (key_len > detail::kMaxEntryBytes || payload_len > detail::kMaxEntryBytes ||
        kHeaderBytes + key_len + payload_len > detail::kMaxEntryBytes)
      return discard("oversize header (claims a " + std::to_string(key_len) + "-byte key and a " +
                         std::to_string(payload_len) + "-byte payload; entries are at most " +
                         std::to_string(detail::kMaxEntryBytes) + " bytes)",
                     st);
    if (key_len != key.size()) return discard("stored key differs (hash collision or foreign entry)", st);
    if (kHeaderBytes + key_len + payload_len != file_size)
      return discard("length mismatch (header says " + std::to_string(kHeaderBytes + key_len + payload_len) +
                         " bytes, the file has " + std::to_string(file_size) + ")",
                     st);

    std::string stored_key, payload;
    try {
      stored_key.resize(key_len);
      payload.resize(payload_len);
    } catch (const std::bad_alloc&) {
      return refuse("cannot allocate " + std::to_string(key_len + payload_len) + " bytes to read it");
    }
    if (detail::pread_full(fd.fd, stored_key.data(), key_len, kHeaderBytes) != key_len ||
        detail::pread_full(fd.fd, payload.data(), payload_len, kHeaderBytes + key_len) != payload_len)
      return discard("length mismatch (shorter than its header says)", st);
    if (stored_key != key) return discard("stored key differs (hash collision or foreign entry)", st);
    if (detail::checksum64(payload.data(), payload.size()) != sum) return discard("checksum mismatch", st);

    // Recency for eviction, as ccache does it: the modification time, set on every hit
    // (atime is not reliable under relatime or noatime mounts).
    ::futimens(fd.fd, nullptr);
    return payload;
  }

  /// Publishes `bytes` under `key`: written to a unique temporary file in the directory, then
  /// renamed over the entry, so readers see either the old entry or the whole new one. Failures
  /// (full disk, permissions) are logged and otherwise ignored: the cache is an optimisation.
  /// May evict least recently used entries to keep the cache within max_bytes().
  void store(const std::string& key, const std::string& ext, std::string_view bytes) const {
    if (!enabled_) return;
    const std::string path = path_for(key, ext);
    if (kHeaderBytes + key.size() + bytes.size() > detail::kMaxEntryBytes) {
      log(LogChannel::cache, "disk cache: not storing " + path + ": " + std::to_string(bytes.size()) +
                                 " bytes is more than an entry may hold");
      return;
    }
    std::string entry;
    entry.reserve(kHeaderBytes + key.size() + bytes.size());
    entry.append(kMagic, 8);
    detail::put_u64(entry, key.size());
    detail::put_u64(entry, bytes.size());
    detail::put_u64(entry, detail::checksum64(bytes.data(), bytes.size()));
    entry += key;
    entry.append(bytes.data(), bytes.size());

    std::string tmp = dir_ + "/.tmp." + detail::unique_suffix() + ext;
    if (!detail::write_new_file(tmp, entry)) {
      log(LogChannel::cache, "disk cache: cannot write " + tmp + ": " + std::strerror(errno));
      return;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      log(LogChannel::cache, "disk cache: cannot publish " + path + ": " + std::strerror(errno));
      ::unlink(tmp.c_str());
      return;
    }
    note_stored(entry.size());
  }

  /// When the entries total more than max_bytes(), removes the least recently used ones (the
  /// oldest modification times: a hit touches its entry) until they total at most 90% of it.
  /// Safe beside other processes using the directory: entries are only ever unlinked, never
  /// truncated, so a reader that already opened one reads it whole. Entries too large to be
  /// valid are removed whatever the total. Returns how many entries were removed.
  std::size_t evict() const {
    if (!enabled_) return 0;
    std::lock_guard<std::mutex> lock(eviction_->mu);
    return evict_locked();
  }

  /// Removes what killed processes left in this cache's directory: temporary files of
  /// interrupted stores (.tmp.*) and scratch directories (kiln-XXXXXX, see reap_scratch_dirs),
  /// when this user's and unchanged for more than `age`. Returns how many were removed.
  std::size_t reap_stale(std::chrono::seconds age = detail::kStaleAge) const {
    if (!enabled_) return 0;
    detail::FdGuard dir{::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
    if (dir.fd < 0) return 0;
    std::size_t removed = 0;
    for (const std::string& name : detail::list_names(dir.fd, detail::is_temp_name)) {
      struct stat st {};
      if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
          st.st_uid == ::geteuid() && detail::older_than(st, age) && ::unlinkat(dir.fd, name.c_str(), 0) == 0) {
        ++removed;
        log(LogChannel::cache, "disk cache: removed stale temporary file " + dir_ + "/" + name);
      }
    }
    return removed + reap_scratch_dirs(dir_, age);
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

  // Removes a bad entry, but only when it is still the file that was read (another process
  // may just have published a good entry under the name), a regular file and this user's.
  // Says what happened, for the log.
  static std::string remove_bad(const std::string& path, const struct stat& read) {
    struct stat now {};
    if (::lstat(path.c_str(), &now) != 0) return "already gone";
    if (now.st_ino != read.st_ino || now.st_dev != read.st_dev) return "replaced meanwhile, kept";
    if (!S_ISREG(now.st_mode)) return "not a regular file, kept";
    if (now.st_uid != ::geteuid()) return "owned by uid " + std::to_string(now.st_uid) + ", kept";
    if (::unlink(path.c_str()) != 0) return std::string("cannot remove: ") + std::strerror(errno);
    return "removed";
  }

  // Called after each store. A scan costs a readdir and a stat per entry: noise beside the
  // compile each store follows, but not worth doing for every store of a busy process. Other
  // processes add entries this one does not see, so it scans at its first store and again
  // after storing a sixteenth of the bound, as well as whenever its estimate passes the bound.
  void note_stored(std::uint64_t bytes) const {
    if (max_bytes_ == 0) return;
    std::lock_guard<std::mutex> lock(eviction_->mu);
    detail::EvictionState& s = *eviction_;
    s.estimate += bytes;
    s.since_scan += bytes;
    if (s.scanned && s.estimate <= max_bytes_ && s.since_scan < max_bytes_ / 16) return;
    evict_locked();
  }

  std::size_t evict_locked() const {
    detail::EvictionState& s = *eviction_;
    detail::FdGuard dir{::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
    if (dir.fd < 0) return 0;
    struct Item {
      std::string name;
      std::uint64_t size;
      std::int64_t mtime;
      ino_t ino;
    };
    std::vector<Item> items;
    std::uint64_t total = 0;
    std::size_t removed = 0;
    for (std::string& name : detail::list_names(dir.fd, detail::is_entry_name)) {
      struct stat st {};
      if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
          st.st_uid != ::geteuid())
        continue;
      const auto size = static_cast<std::uint64_t>(st.st_size);
      if (size > detail::kMaxEntryBytes) {
        // Not an entry kiln wrote (a planted or sparse file): it would only ever be a miss, and
        // counting it would evict every real entry.
        if (::unlinkat(dir.fd, name.c_str(), 0) == 0) {
          ++removed;
          log(LogChannel::cache, "disk cache: removed " + dir_ + "/" + name + ": " + std::to_string(size) +
                                     " bytes is more than an entry may hold");
        }
        continue;
      }
      items.push_back(Item{std::move(name), size, detail::mtime_ns(st), st.st_ino});
      total += size;
    }
    if (max_bytes_ != 0 && total > max_bytes_) {
      std::sort(items.begin(), items.end(),
                [](const Item& a, const Item& b) { return a.mtime != b.mtime ? a.mtime < b.mtime : a.name < b.name; });
      const std::uint64_t target = max_bytes_ / 10 * 9;
      std::uint64_t freed = 0;
      std::size_t evicted = 0;
      for (const Item& item : items) {
        if (total <= target) break;
        // Skip an entry that was used (touched) or republished since the scan.
        struct stat now {};
        if (::fstatat(dir.fd, item.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != item.ino ||
            detail::mtime_ns(now) != item.mtime)
          continue;
        if (::unlinkat(dir.fd, item.name.c_str(), 0) == 0) {
          total -= item.size;
          freed += item.size;
          ++evicted;
        }
      }
      removed += evicted;
      log(LogChannel::cache, "disk cache: evicted " + std::to_string(evicted) + " least recently used entries (" +
                                 std::to_string(freed) + " bytes) from " + dir_ + "; " + std::to_string(total) +
                                 " bytes left, bound " + std::to_string(max_bytes_));
    }
    s.scanned = true;
    s.estimate = total;
    s.since_scan = 0;
    return removed;
  }

  std::string dir_;
  std::string reason_;
  bool enabled_ = true;
  std::uint64_t max_bytes_ = detail::kDefaultCacheMaxBytes;
  std::shared_ptr<detail::EvictionState> eviction_ = std::make_shared<detail::EvictionState>();
};

/// A private directory (mode 0700, unique to this process) for generated sources and objects
/// on their way to dlopen: $TMPDIR or /tmp, or the cache directory when that temp directory is
/// mounted noexec. Removed at exit when empty (a failed compile's source stays for the user);
/// what a killed process leaves is removed by a later one (reap_scratch_dirs).
inline const std::string& scratch_dir() {
  static const pid_t creator = ::getpid();
  static const std::string dir = [] {
    std::string base = detail::temp_base();
    struct statvfs vfs {};
    if (::statvfs(base.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NOEXEC) && DiskCache::instance().enabled())
      base = DiskCache::instance().dir();
    std::string tmpl = base + "/kiln-XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      throw Error("kiln: cannot create a scratch directory under " + base + ": " + std::strerror(errno));
    // Held for the life of the process (the descriptor is left open on purpose, and not
    // inherited by the compilers it starts): it tells reap_scratch_dirs in other processes
    // that this directory is in use, however long this process goes without compiling.
    int lock = ::open((tmpl + "/.lock").c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0)
      log(LogChannel::cache, "scratch directory " + tmpl + ": cannot lock it (" + std::strerror(errno) +
                                 "); other processes may remove it after " + std::to_string(detail::kStaleAge.count()) +
                                 " s without a compile");
    return tmpl;
  }();
  static const bool registered = [] {
    std::atexit([] {
      // A forked child that never exec'd runs this too; the directory is its parent's.
      if (::getpid() != creator) return;
      ::unlink((scratch_dir() + "/.lock").c_str());
      ::rmdir(scratch_dir().c_str());
    });
    return true;
  }();
  (void)registered;
  return dir;
}

}  // namespace kiln::runtime

KILN_COLD_CODE_END
