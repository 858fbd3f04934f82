#pragma once
// Helpers shared by the runtime tests: private temporary directories and environment edits
// that are undone at scope exit.
#include <dirent.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/runtime/cxx_compiler.hpp"

namespace kiln_test {

/// A fresh directory under /tmp, removed with its contents at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = "/tmp/kiln-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    ::nftw(
        path.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) {
          ::remove(p);
          return 0;
        },
        16, FTW_DEPTH | FTW_PHYS);
  }
};

/// Sets (or with nullopt unsets) an environment variable until scope exit.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, std::optional<std::string> value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

/// Names in `dir` (not "." or "..").
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

/// One compiler for all runtime tests, probed without touching any cache directory.
inline const kiln::runtime::CxxCompiler& test_compiler() {
  static std::unique_ptr<kiln::runtime::CxxCompiler> c = [] {
    std::string why;
    auto p = kiln::runtime::CxxCompiler::probe(kiln::env::get("KILN_CXX", "c++"), nullptr, &why);
    if (!p) throw std::runtime_error("runtime tests need a working C++ compiler: " + why);
    return p;
  }();
  return *c;
}

}  // namespace kiln_test
