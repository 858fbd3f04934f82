#pragma once
// Helpers shared by the kiln::compile tests: exact-enough equality of two tensors, a capture
// of the log lines written while it lives, and a private disk cache directory.
#include <doctest/doctest.h>

#include <stdlib.h>  // mkdtemp

#include <cstdio>
#include <cstdlib>
#include <string>

#include <kiln/kiln.hpp>
#include <kiln/runtime/disk_cache.hpp>

namespace kiln::testing {

/// Same shape and dtype, and every element equal within 1e-6 relative.
inline void check_equal(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (std::size_t i = 0; i < va.size(); ++i) CHECK(va[i] == doctest::Approx(vb[i]).epsilon(1e-6));
}

/// Captures the log lines of `channels` written while it lives.
struct LogCapture {
  std::FILE* f = std::tmpfile();
  explicit LogCapture(const char* channels) {
    set_logs(channels);
    set_log_output(f);
  }
  ~LogCapture() {
    set_log_output(nullptr);
    set_logs("");
    std::fclose(f);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    std::size_t k;
    while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, k);
    return s;
  }
};

/// Points the process's disk cache at a fresh directory (`dir` + "/cache") while it lives, with
/// every in-process cache cleared on the way in and out (kiln::reset()).
struct PrivateDiskCache {
  std::string dir;
  runtime::DiskCache saved = runtime::DiskCache::instance();
  explicit PrivateDiskCache(const char* prefix = "kiln_test") {
    std::string tmpl = std::string("/tmp/") + prefix + "_XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()));
    dir = tmpl;
    runtime::DiskCache::instance().set_dir_for_testing(dir + "/cache");
    kiln::reset();
  }
  ~PrivateDiskCache() {
    runtime::DiskCache::instance() = saved;
    kiln::reset();
    std::system(("rm -rf '" + dir + "'").c_str());
  }
  PrivateDiskCache(const PrivateDiskCache&) = delete;
  PrivateDiskCache& operator=(const PrivateDiskCache&) = delete;
};

}  // namespace kiln::testing
