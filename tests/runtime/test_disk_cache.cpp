#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/hash.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "runtime_test_util.hpp"

using kiln::runtime::DiskCache;
using kiln_test::file_exists;
using kiln_test::list_dir;
using kiln_test::read_file;
using kiln_test::ScopedEnv;
using kiln_test::TempDir;
using kiln_test::write_file;

namespace {
const std::string kPayload = std::string("\x7f" "ELF\0\0binary\xff payload", 20) + std::string(1000, 'z');
}

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
