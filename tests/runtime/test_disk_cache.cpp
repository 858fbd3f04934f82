#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/hash.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "runtime_test_util.hpp"

namespace kiln_test_runtime_disk_cache {

using kiln::runtime::DiskCache;
using kiln::runtime::reap_scratch_dirs;
using kiln_test::file_exists;
using kiln_test::list_dir;
using kiln_test::read_file;
using kiln_test::ScopedEnv;
using kiln_test::TempDir;
using kiln_test::write_file;

namespace {
const std::string kPayload = std::string(
                                 "\x7f"
                                 "ELF\0\0binary\xff payload",
                                 20) +
                             std::string(1000, 'z');

// Sets a file's (or directory's) access and modification times `seconds_ago` into the past,
// without following a symlink.
void age(const std::string& path, long seconds_ago) {
  timespec ts[2];
  ::clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= seconds_ago;
  ts[1] = ts[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW) == 0);
}

struct stat lstat_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st;
}

// A file of `size` bytes that occupies (almost) no disk: ftruncate past the end leaves a hole.
void make_sparse(const std::string& path, const std::string& head, off_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()));
  REQUIRE(::ftruncate(fd, size) == 0);
  ::close(fd);
}

std::string u64_bytes(std::uint64_t v) {
  std::string s;
  kiln::runtime::detail::put_u64(s, v);
  return s;
}

// load() run on another thread, waited for at most 20 s: a load that blocks fails the test
// instead of hanging the suite. `unblock` is called on timeout so the thread can finish.
template <class Unblock>
std::optional<std::string> load_with_timeout(const DiskCache& cache, const std::string& key, const std::string& ext,
                                             std::string* why, Unblock unblock) {
  auto f = std::async(std::launch::async, [&] { return cache.load(key, ext, why); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    unblock();
    f.wait();
    FAIL("DiskCache::load blocked for 20 s");
  }
  return f.get();
}
}  // namespace

TEST_CASE("runtime: DiskCache creates its directory 0700 and round-trips bytes") {
  TempDir tmp;
  std::string dir = tmp.path + "/a/b/kiln";
  DiskCache cache(dir);
  REQUIRE(cache.enabled());
  CHECK(cache.disabled_reason().empty());
  CHECK(cache.dir() == dir);
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  std::string key = "source text\ncompiler g++ 12\nflags -O3";
  CHECK_FALSE(cache.load(key, ".so").has_value());
  cache.store(key, ".so", kPayload);
  auto back = cache.load(key, ".so");
  REQUIRE(back.has_value());
  CHECK(*back == kPayload);

  // Entry name: hex of the 64-bit hash of the key, plus the extension; nothing else left over.
  std::string expected = dir + "/" + kiln::runtime::detail::hex64(kiln::detail::hash_string(key)) + ".so";
  CHECK(cache.path_for(key, ".so") == expected);
  CHECK(list_dir(dir) == std::vector<std::string>{expected.substr(dir.size() + 1)});
  // The entry holds the full key text, so it can be verified.
  CHECK(read_file(expected).find(key) != std::string::npos);

  // Extensions are separate namespaces; a second store replaces the first.
  CHECK_FALSE(cache.load(key, ".cubin").has_value());
  cache.store(key, ".so", "second");
  CHECK(cache.load(key, ".so").value() == "second");
  cache.store(key, ".so", "");
  CHECK(cache.load(key, ".so").value().empty());
}

TEST_CASE("runtime: DiskCache treats truncated, corrupted and foreign entries as misses and removes them") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  REQUIRE(cache.enabled());
  const std::string key = "the key";
  const std::string path = cache.path_for(key, ".so");

  SUBCASE("truncated payload") {
    cache.store(key, ".so", kPayload);
    std::string bytes = read_file(path);
    write_file(path, bytes.substr(0, bytes.size() - 7));
  }
  SUBCASE("truncated header") {
    cache.store(key, ".so", kPayload);
    write_file(path, read_file(path).substr(0, 12));
  }
  SUBCASE("one payload byte flipped") {
    cache.store(key, ".so", kPayload);
    std::string bytes = read_file(path);
    bytes[bytes.size() - 500] ^= 0x01;
    write_file(path, bytes);
  }
  SUBCASE("bytes appended") {
    cache.store(key, ".so", kPayload);
    write_file(path, read_file(path) + "extra");
  }
  SUBCASE("bad magic") {
    cache.store(key, ".so", kPayload);
    std::string bytes = read_file(path);
    bytes[0] = 'X';
    write_file(path, bytes);
  }
  SUBCASE("an entry for another key under this name (hash collision)") {
    cache.store("another key", ".so", kPayload);
    REQUIRE(::rename(cache.path_for("another key", ".so").c_str(), path.c_str()) == 0);
  }
  SUBCASE("empty file") { write_file(path, ""); }

  REQUIRE(file_exists(path));
  CHECK_FALSE(cache.load(key, ".so").has_value());
  CHECK_FALSE(file_exists(path));
  // And it is rebuilt by the next store.
  cache.store(key, ".so", kPayload);
  CHECK(cache.load(key, ".so").value() == kPayload);
}

TEST_CASE("runtime: DiskCache refuses unsafe directories") {
  TempDir tmp;
  std::string good = tmp.path + "/good";
  REQUIRE(::mkdir(good.c_str(), 0700) == 0);
  std::string why;

  SUBCASE("a symbolic link") {
    std::string link = tmp.path + "/link";
    REQUIRE(::symlink(good.c_str(), link.c_str()) == 0);
    DiskCache cache(link);
    CHECK_FALSE(cache.enabled());
    why = cache.disabled_reason();
    CHECK(why.find("symbolic link") != std::string::npos);
    cache.store("k", ".so", "bytes");
    CHECK_FALSE(cache.load("k", ".so").has_value());
  }
  SUBCASE("world writable") {
    REQUIRE(::chmod(good.c_str(), 0777) == 0);
    DiskCache cache(good);
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("writable") != std::string::npos);
  }
  SUBCASE("group writable") {
    REQUIRE(::chmod(good.c_str(), 0770) == 0);
    DiskCache cache(good);
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("writable") != std::string::npos);
  }
  SUBCASE("owned by another user") {
    if (::geteuid() != 0) {
      MESSAGE("not root: cannot chown, owner check not exercised");
      return;
    }
    REQUIRE(::chown(good.c_str(), 12345, 12345) == 0);
    DiskCache cache(good);
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("owned by uid 12345") != std::string::npos);
  }
  SUBCASE("a regular file") {
    write_file(tmp.path + "/file", "x");
    DiskCache cache(tmp.path + "/file");
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("not a directory") != std::string::npos);
  }
  // Nothing was written into the refused directory.
  CHECK(list_dir(good).empty());
}

TEST_CASE("runtime: DiskCache::from_env follows KILN_CACHE, KILN_CACHE_DIR, XDG_CACHE_HOME, HOME") {
  TempDir tmp;
  SUBCASE("KILN_CACHE=0 disables it") {
    ScopedEnv off("KILN_CACHE", "0");
    ScopedEnv dir("KILN_CACHE_DIR", tmp.path + "/c");
    DiskCache cache = DiskCache::from_env();
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("KILN_CACHE=0") != std::string::npos);
    CHECK_FALSE(file_exists(tmp.path + "/c"));
  }
  SUBCASE("KILN_CACHE_DIR first") {
    ScopedEnv on("KILN_CACHE", "1");
    ScopedEnv dir("KILN_CACHE_DIR", tmp.path + "/c");
    ScopedEnv xdg("XDG_CACHE_HOME", tmp.path + "/xdg");
    DiskCache cache = DiskCache::from_env();
    CHECK(cache.enabled());
    CHECK(cache.dir() == tmp.path + "/c");
  }
  SUBCASE("then $XDG_CACHE_HOME/kiln") {
    ScopedEnv on("KILN_CACHE", std::nullopt);
    ScopedEnv dir("KILN_CACHE_DIR", std::nullopt);
    ScopedEnv xdg("XDG_CACHE_HOME", tmp.path + "/xdg");
    DiskCache cache = DiskCache::from_env();
    CHECK(cache.enabled());
    CHECK(cache.dir() == tmp.path + "/xdg/kiln");
  }
  SUBCASE("then ~/.cache/kiln") {
    ScopedEnv dir("KILN_CACHE_DIR", std::nullopt);
    ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
    ScopedEnv home("HOME", tmp.path + "/home");
    DiskCache cache = DiskCache::from_env();
    CHECK(cache.enabled());
    CHECK(cache.dir() == tmp.path + "/home/.cache/kiln");
  }
  SUBCASE("set_dir_for_testing reconfigures") {
    DiskCache cache = DiskCache::disabled("test");
    CHECK_FALSE(cache.enabled());
    cache.set_dir_for_testing(tmp.path + "/t");
    CHECK(cache.enabled());
    CHECK(cache.dir() == tmp.path + "/t");
  }
}

TEST_CASE("runtime: DiskCache readers never see a partly written entry") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  const std::string key = "contended";
  const std::string a(200000, 'a'), b(300000, 'b');
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, seen{0};
  std::thread writer([&] {
    for (int i = 0; i < 60; ++i) cache.store(key, ".bin", (i % 2) ? a : b);
    stop = true;
  });
  std::thread reader([&] {
    while (!stop) {
      if (auto v = cache.load(key, ".bin")) {
        ++seen;
        if (*v != a && *v != b) ++bad;
      }
    }
  });
  writer.join();
  reader.join();
  CHECK(bad == 0);
  CHECK(cache.load(key, ".bin").value() == a);
  // No temporary files are left behind.
  CHECK(list_dir(tmp.path).size() == 1);
}

TEST_CASE("runtime: DiskCache refuses what is not a regular file at an entry's path, without blocking") {
  TempDir tmp;
  DiskCache cache(tmp.path + "/c");
  REQUIRE(cache.enabled());
  const std::string key = "the key";
  const std::string path = cache.path_for(key, ".so");
  std::string why;
  bool replaced_by_store = true;

  SUBCASE("a FIFO: opening it for reading must not wait for a writer") {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    auto got = load_with_timeout(cache, key, ".so", &why, [&] {
      // A writer lets a blocked open (and read) return.
      int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
    });
    CHECK_FALSE(got.has_value());
    CHECK(why.find("FIFO") != std::string::npos);
    CHECK(S_ISFIFO(lstat_of(path).st_mode));  // refused, not removed
  }
  SUBCASE("a symbolic link, even to an intact entry for this very key") {
    cache.store(key, ".so", kPayload);
    const std::string elsewhere = tmp.path + "/elsewhere.so";
    REQUIRE(::rename(path.c_str(), elsewhere.c_str()) == 0);
    REQUIRE(::symlink(elsewhere.c_str(), path.c_str()) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    CHECK(why.find("symbolic link") != std::string::npos);
    CHECK(S_ISLNK(lstat_of(path).st_mode));
    CHECK(read_file(elsewhere).find(kPayload) != std::string::npos);  // the target is untouched
  }
  SUBCASE("a symbolic link to a device") {
    REQUIRE(::symlink("/dev/zero", path.c_str()) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    CHECK(why.find("symbolic link") != std::string::npos);
  }
  SUBCASE("a directory") {
    REQUIRE(::mkdir(path.c_str(), 0700) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    CHECK(why.find("directory") != std::string::npos);
    CHECK(S_ISDIR(lstat_of(path).st_mode));
    replaced_by_store = false;  // rename cannot replace a directory: the key stays a miss
  }

  // A store publishes over the FIFO or symlink (rename replaces the name, never the target).
  cache.store(key, ".so", kPayload);
  auto back = cache.load(key, ".so", &why);
  CHECK(back.has_value() == replaced_by_store);
  if (replaced_by_store) CHECK(*back == kPayload);
}

TEST_CASE("runtime: DiskCache misses are logged on the cache channel") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  const std::string path = cache.path_for("k", ".so");
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  kiln::set_log_output(out);
  kiln::set_logs("cache");
  std::string why;
  auto got = load_with_timeout(cache, "k", ".so", &why, [&] {
    int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  });
  write_file(tmp.path + "/" + kiln::runtime::detail::hex64(kiln::detail::hash_string("k2")) + ".so", "junk");
  CHECK_FALSE(cache.load("k2", ".so").has_value());
  kiln::set_logs(kiln::env::get("KILN_LOGS"));
  kiln::set_log_output(nullptr);
  CHECK_FALSE(got.has_value());
  std::string text(4096, '\0');
  std::rewind(out);
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  CHECK(text.find("[kiln:cache] disk cache: refusing " + path + ": a FIFO") != std::string::npos);
  CHECK(text.find("[kiln:cache] disk cache: discarding") != std::string::npos);
  CHECK(text.find("truncated header (removed)") != std::string::npos);
}

TEST_CASE("runtime: DiskCache sizes an entry by its verified header, so a giant file is a miss and is removed") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  const std::string key = "the key";
  const std::string path = cache.path_for(key, ".so");
  const off_t giant = off_t{64} << 30;  // 64 GiB, sparse: reading it whole would exhaust memory
  std::string expect;

  SUBCASE("a 64 GiB sparse file of zeros") {
    make_sparse(path, "", giant);
    expect = "bad magic";
  }
  SUBCASE("an intact entry's bytes, extended to 64 GiB") {
    cache.store(key, ".so", kPayload);
    make_sparse(path, read_file(path), giant);
    expect = "length mismatch";
  }
  SUBCASE("a header that claims a 64 GiB payload, in a file of that size") {
    std::string head =
        std::string("KILNCE01") + u64_bytes(key.size()) + u64_bytes(std::uint64_t{64} << 30) + u64_bytes(0) + key;
    make_sparse(path, head, static_cast<off_t>(head.size()) + giant);
    expect = "oversize header";
  }
  SUBCASE("a header that claims a 64 GiB key, in a small file") {
    write_file(path, std::string("KILNCE01") + u64_bytes(std::uint64_t{64} << 30) + u64_bytes(10) + u64_bytes(0) +
                         std::string(100, 'k'));
    expect = "oversize header";
  }
  SUBCASE("a header whose sizes overflow when added") {
    write_file(path,
               std::string("KILNCE01") + u64_bytes(key.size()) + u64_bytes(~std::uint64_t{0} - 8) + u64_bytes(0) + key);
    expect = "oversize header";
  }

  std::string why;
  CHECK_FALSE(cache.load(key, ".so", &why).has_value());
  CHECK(why.find(expect) != std::string::npos);
  CHECK(why.find("(removed)") != std::string::npos);
  CHECK_FALSE(file_exists(path));
  cache.store(key, ".so", kPayload);
  CHECK(cache.load(key, ".so").value() == kPayload);
}

TEST_CASE("runtime: DiskCache leaves files of another user alone") {
  // As root a file can be given to another user (nobody, 65534) to check this; other users
  // cannot make such a file, and the owner checks are not exercised.
  if (::geteuid() != 0) {
    MESSAGE("not root: cannot chown a file to another user, owner checks not exercised");
    return;
  }
  TempDir tmp;
  DiskCache cache(tmp.path + "/c");
  const std::string key = "the key";
  const std::string path = cache.path_for(key, ".so");
  const uid_t nobody = 65534;
  std::string why;

  SUBCASE("a corrupted entry is a miss, not removed") {
    cache.store(key, ".so", kPayload);
    std::string bytes = read_file(path);
    bytes[bytes.size() - 3] ^= 0x10;
    write_file(path, bytes);
    REQUIRE(::chown(path.c_str(), nobody, nobody) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    CHECK(why.find("owned by uid 65534") != std::string::npos);
    CHECK(file_exists(path));
  }
  SUBCASE("an intact entry is not loaded (it is not this user's code) and not removed") {
    cache.store(key, ".so", kPayload);
    REQUIRE(::chown(path.c_str(), nobody, nobody) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    CHECK(why.find("owned by uid 65534") != std::string::npos);
    CHECK(file_exists(path));
  }
  SUBCASE("a giant file is not removed, by load or by eviction") {
    make_sparse(path, "", off_t{64} << 30);
    REQUIRE(::chown(path.c_str(), nobody, nobody) == 0);
    CHECK_FALSE(cache.load(key, ".so", &why).has_value());
    cache.evict();
    CHECK(file_exists(path));
  }
  SUBCASE("eviction skips it") {
    write_file(path, std::string(5000, 'x'));
    REQUIRE(::chown(path.c_str(), nobody, nobody) == 0);
    DiskCache tiny(cache.dir(), 1);  // a 1-byte bound: every entry of ours goes
    tiny.store("mine", ".so", kPayload);
    CHECK_FALSE(file_exists(cache.path_for("mine", ".so")));
    CHECK(file_exists(path));
  }
  SUBCASE("stale temporary files and scratch directories are not reaped") {
    const std::string tmpfile = cache.dir() + "/.tmp.1234.0.0123abcd.so";
    const std::string scratch = cache.dir() + "/kiln-Nobody";
    write_file(tmpfile, "partial");
    REQUIRE(::mkdir(scratch.c_str(), 0700) == 0);
    write_file(scratch + "/kiln_x.cpp", "int x;");
    REQUIRE(::chown(tmpfile.c_str(), nobody, nobody) == 0);
    REQUIRE(::chown(scratch.c_str(), nobody, nobody) == 0);
    age(tmpfile, 7200);
    age(scratch, 7200);
    CHECK(cache.reap_stale() == 0);
    CHECK(file_exists(tmpfile));
    CHECK(file_exists(scratch + "/kiln_x.cpp"));
  }
}

TEST_CASE("runtime: DiskCache removes what killed processes left, nothing fresh, foreign or in use") {
  TempDir tmp;
  DiskCache cache(tmp.path + "/c");
  REQUIRE(cache.enabled());
  const std::string c = cache.dir();
  const std::string base = tmp.path + "/tmp";  // stands in for $TMPDIR
  REQUIRE(::mkdir(base.c_str(), 0700) == 0);
  auto make_scratch = [](const std::string& dir, mode_t mode = 0700) {
    REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
    REQUIRE(::chmod(dir.c_str(), mode) == 0);
    write_file(dir + "/kiln_0123456789abcdef-1.2.abcd0123.cpp", "int f();");
    write_file(dir + "/probe-1.2.abcd0123.so", "ELF");
    write_file(dir + "/.lock", "");
  };

  SUBCASE("orphan temporary files of interrupted stores") {
    const std::string stale = c + "/.tmp.4242.7.89abcdef.so", fresh = c + "/.tmp.4243.0.01234567.cubin";
    const std::string other = c + "/.tmp.notes", entry = cache.path_for("k", ".so");
    write_file(stale, "partial");
    write_file(fresh, "partial");
    write_file(other, "not kiln's name");
    cache.store("k", ".so", kPayload);
    for (const auto& p : {stale, other, entry}) age(p, 7200);
    CHECK(cache.reap_stale() == 1);
    CHECK_FALSE(file_exists(stale));
    CHECK(file_exists(fresh));  // a store may be writing it right now
    CHECK(file_exists(other));
    CHECK(cache.load("k", ".so").value() == kPayload);  // entries are never reaped, whatever their age
  }
  SUBCASE("scratch directories under the temp directory") {
    const std::string stale = base + "/kiln-AbC123", fresh = base + "/kiln-Fresh1";
    make_scratch(stale);
    make_scratch(fresh);
    age(stale, 7200);
    CHECK(reap_scratch_dirs(base) == 1);
    CHECK_FALSE(file_exists(stale));
    CHECK(file_exists(fresh + "/probe-1.2.abcd0123.so"));
    // A shorter bound reaps the fresh one too once it is older than that.
    age(fresh, 120);
    CHECK(reap_scratch_dirs(base, std::chrono::seconds(60)) == 1);
    CHECK_FALSE(file_exists(fresh));
  }
  SUBCASE("a scratch directory in the cache directory (temp mounted noexec)") {
    make_scratch(c + "/kiln-Zz9Yy8");
    age(c + "/kiln-Zz9Yy8", 7200);
    CHECK(cache.reap_stale() == 1);
    CHECK_FALSE(file_exists(c + "/kiln-Zz9Yy8"));
  }
  SUBCASE("an old scratch directory whose process is alive (it holds the lock)") {
    const std::string dir = base + "/kiln-Alive1";
    make_scratch(dir);
    int lock = ::open((dir + "/.lock").c_str(), O_RDWR);
    REQUIRE(lock >= 0);
    REQUIRE(::flock(lock, LOCK_EX) == 0);
    age(dir, 7200);
    CHECK(reap_scratch_dirs(base) == 0);
    CHECK(file_exists(dir + "/kiln_0123456789abcdef-1.2.abcd0123.cpp"));
    ::close(lock);  // the process ends: its lock goes with it
    CHECK(reap_scratch_dirs(base) == 1);
    CHECK_FALSE(file_exists(dir));
  }
  SUBCASE("this process's own scratch directory, however long since it changed") {
    const std::string& mine = kiln::runtime::scratch_dir();
    const std::string parent = mine.substr(0, mine.rfind('/'));
    age(mine, 7200);
    reap_scratch_dirs(parent);
    CHECK(file_exists(mine + "/.lock"));
    timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
    ::utimensat(AT_FDCWD, mine.c_str(), now, 0);
  }
  SUBCASE("only kiln's names and kiln's directories") {
    make_scratch(base + "/kiln-Mixed1");
    write_file(base + "/kiln-Mixed1/user-notes.txt", "keep me");
    make_scratch(base + "/kiln-test-abcdef");  // a test's TempDir, not a scratch directory
    make_scratch(base + "/kiln-abc");
    make_scratch(base + "/kiln-Open77", 0755);  // mkdtemp makes 0700; this one someone else made
    REQUIRE(::symlink((base + "/kiln-Mixed1").c_str(), (base + "/kiln-Link00").c_str()) == 0);
    for (const char* n : {"/kiln-Mixed1", "/kiln-test-abcdef", "/kiln-abc", "/kiln-Open77", "/kiln-Link00"})
      age(base + n, 7200);
    CHECK(reap_scratch_dirs(base) == 0);
    CHECK(list_dir(base + "/kiln-Mixed1") == std::vector<std::string>{"user-notes.txt"});
    CHECK(list_dir(base + "/kiln-test-abcdef").size() == 3);
    CHECK(list_dir(base + "/kiln-abc").size() == 3);
    CHECK(list_dir(base + "/kiln-Open77").size() == 3);
    CHECK(file_exists(base + "/kiln-Link00"));
  }
}

TEST_CASE("runtime: DiskCache keeps the most recently used entries within its size bound") {
  TempDir tmp;
  const std::string payload(1000, 'p');
  const std::uint64_t entry_bytes = 32 + std::string("key 0").size() + payload.size();
  auto key = [](int i) { return "key " + std::to_string(i); };

  SUBCASE("least recently used first, a hit counts as a use (bound from KILN_CACHE_MAX_BYTES)") {
    ScopedEnv on("KILN_CACHE", "1");
    ScopedEnv dir("KILN_CACHE_DIR", tmp.path);
    ScopedEnv max("KILN_CACHE_MAX_BYTES", std::to_string(entry_bytes * 4 + entry_bytes / 2));
    DiskCache cache = DiskCache::from_env();
    REQUIRE(cache.max_bytes() == entry_bytes * 4 + entry_bytes / 2);
    for (int i = 0; i < 4; ++i) cache.store(key(i), ".so", payload);
    for (int i = 0; i < 4; ++i) {
      REQUIRE(file_exists(cache.path_for(key(i), ".so")));
      age(cache.path_for(key(i), ".so"), 400 - 100 * i);  // key 0 oldest ... key 3 newest
    }
    REQUIRE(cache.load(key(0), ".so").value() == payload);  // now key 0 is the newest
    cache.store(key(4), ".so", payload);                    // 5 entries > 4.5: evict down to 90% of the bound
    CHECK(file_exists(cache.path_for(key(0), ".so")));
    CHECK_FALSE(file_exists(cache.path_for(key(1), ".so")));
    CHECK(file_exists(cache.path_for(key(2), ".so")));
    CHECK(file_exists(cache.path_for(key(3), ".so")));
    CHECK(file_exists(cache.path_for(key(4), ".so")));
  }
  SUBCASE("down to 90% of the bound, oldest first") {
    DiskCache cache(tmp.path, entry_bytes * 10);
    for (int i = 0; i < 10; ++i) cache.store(key(i), ".so", payload);
    for (int i = 0; i < 10; ++i) age(cache.path_for(key(i), ".so"), 1000 - 10 * i);
    cache.store("key x", ".so", payload);  // 11 entries: down to 9
    for (int i = 0; i < 2; ++i) CHECK_FALSE(file_exists(cache.path_for(key(i), ".so")));
    for (int i = 2; i < 10; ++i) CHECK(file_exists(cache.path_for(key(i), ".so")));
    CHECK(file_exists(cache.path_for("key x", ".so")));
  }
  SUBCASE("eviction only unlinks: a reader holding an entry open still reads all of it") {
    DiskCache cache(tmp.path, entry_bytes * 2);
    cache.store(key(0), ".so", payload);
    const std::string path = cache.path_for(key(0), ".so");
    age(path, 100);
    int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    cache.store(key(1), ".so", payload);
    cache.store(key(2), ".so", payload);
    CHECK_FALSE(file_exists(path));
    std::string bytes(entry_bytes + 10, '\0');
    CHECK(::pread(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(entry_bytes));
    ::close(fd);
  }
  SUBCASE("oversized files at entry names go, whatever the bound") {
    DiskCache cache(tmp.path, 0);
    cache.store(key(0), ".so", payload);
    const std::string planted = tmp.path + "/0123456789abcdef.so";
    make_sparse(planted, "", off_t{64} << 30);
    CHECK(cache.evict() == 1);
    CHECK_FALSE(file_exists(planted));
    CHECK(file_exists(cache.path_for(key(0), ".so")));
  }
  SUBCASE("no bound (0) evicts nothing") {
    DiskCache cache(tmp.path, 0);
    for (int i = 0; i < 20; ++i) cache.store(key(i), ".so", payload);
    CHECK(list_dir(tmp.path).size() == 20);
  }
  SUBCASE("KILN_CACHE_MAX_BYTES sets the bound") {
    ScopedEnv dir("KILN_CACHE_DIR", tmp.path + "/c");
    ScopedEnv on("KILN_CACHE", "1");
    {
      ScopedEnv max("KILN_CACHE_MAX_BYTES", std::nullopt);
      CHECK(DiskCache::from_env().max_bytes() == (std::uint64_t{2} << 30));
    }
    {
      ScopedEnv max("KILN_CACHE_MAX_BYTES", "64M");
      CHECK(DiskCache::from_env().max_bytes() == (std::uint64_t{64} << 20));
    }
    {
      ScopedEnv max("KILN_CACHE_MAX_BYTES", "0");
      CHECK(DiskCache::from_env().max_bytes() == 0);
    }
    {
      ScopedEnv max("KILN_CACHE_MAX_BYTES", "lots");
      CHECK(DiskCache::from_env().max_bytes() == (std::uint64_t{2} << 30));
    }
    using kiln::runtime::detail::parse_byte_size;
    CHECK(parse_byte_size("1000").value() == 1000);
    CHECK(parse_byte_size("1k").value() == 1024);
    CHECK(parse_byte_size("3MiB").value() == (std::uint64_t{3} << 20));
    CHECK(parse_byte_size("2GB").value() == (std::uint64_t{2} << 30));
    CHECK(parse_byte_size("16T").value() == (std::uint64_t{16} << 40));
    CHECK(parse_byte_size("512B").value() == 512);
    CHECK_FALSE(parse_byte_size("").has_value());
    CHECK_FALSE(parse_byte_size("G").has_value());
    CHECK_FALSE(parse_byte_size("12x").has_value());
    CHECK_FALSE(parse_byte_size("1iB").has_value());
    CHECK_FALSE(parse_byte_size("99999999999999999999").has_value());
    CHECK_FALSE(parse_byte_size("99999999999T").has_value());
  }
}

}  // namespace kiln_test_runtime_disk_cache
