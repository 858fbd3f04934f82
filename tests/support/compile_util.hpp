#pragma once
// Helpers shared by the kiln::compile tests: exact-enough equality of two tensors and a
// capture of the log lines written while it lives.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include <kiln/kiln.hpp>

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

}  // namespace kiln::testing
