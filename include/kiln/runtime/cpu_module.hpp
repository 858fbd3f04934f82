#pragma once
// Generated C++ source -> loaded shared library, through three levels: this process's memory,
// the on-disk cache, the host compiler.
#include <unistd.h>

#include <memory>
#include <string>

#include "kiln/core/duration.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/index_fault.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/version.hpp"
#include "kiln/runtime/cxx_compiler.hpp"
#include "kiln/runtime/source_log.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/runtime/dynlib.hpp"
#include "kiln/runtime/kernel_cache.hpp"

namespace kiln::runtime {

/// Compiled CPU modules by source. Thread-safe: threads asking for the same new source wait
/// for one compile. Counts stats().memory_hits, disk_hits and compiles; logs hits and misses
/// on the `cache` channel and each newly loaded source on `output_code`.
class CpuModuleCache {
 public:
  /// The process-wide cache, using DiskCache::instance() and CxxCompiler::find().
  static CpuModuleCache& instance() {
    // Leaked on purpose: unloading kernels during static destruction would pull code from under
    // OpenMP worker threads and user objects that still hold kernel pointers.
    static CpuModuleCache* cache = new CpuModuleCache(&DiskCache::instance(), CxxCompiler::find());
    return *cache;
  }

  /// A cache over `disk` (nullptr: none) building with `compiler` (nullptr: get() of a new
  /// source throws CompileError).
  CpuModuleCache(const DiskCache* disk, const CxxCompiler* compiler) : disk_(disk), compiler_(compiler) {}

  /// The loaded module built from `source`. Throws CompileError (with the compiler's log and
  /// the path of the source) when it does not compile or no compiler exists.
  std::shared_ptr<SharedLibrary> get(const std::string& source) {
    bool created = false;
    // The compiler, its flags and kiln's version are fixed for one cache object, so the source
    // alone identifies a module here; the disk key spells everything out.
    auto lib = modules_.get_or_create(
        source, [&] { return build(source); }, &created);
    if (!created) {
      kiln::detail::counters().memory_hits.fetch_add(1, std::memory_order_relaxed);
      if (log_enabled(LogChannel::cache))
        log(LogChannel::cache, "cpu module " + detail::hex64(kiln::detail::hash_string(source)) + ": memory hit");
    }
    // A module that gathers reports range faults to the process's record (core/index_fault.hpp).
    if (created)
      if (void* slot = lib->find_symbol("kiln_index_fault")) *static_cast<long long**>(slot) = kiln::detail::host_index_fault();
    return lib;
  }

  /// The full text the disk cache is keyed by: kiln's version, the target machine, the
  /// compiler's identity, its flags and the source.
  std::string key_text(const std::string& source) const {
    std::string key = std::string("kiln ") + KILN_VERSION_STRING + " cpu module\narch: " + CxxCompiler::host_arch();
    if (compiler_) key += "\ncompiler: " + compiler_->identity() + "\nflags: " + detail::join_words(compiler_->flags());
    key += "\n----\n";
    key += source;
    return key;
  }

  /// Forgets the loaded modules (handles already given out stay valid).
  void clear() { modules_.clear(); }

  /// Modules held in memory.
  std::size_t size() const { return modules_.size(); }

  /// The compiler used for new modules (nullptr when none works).
  const CxxCompiler* compiler() const { return compiler_; }

 private:
  std::shared_ptr<SharedLibrary> build(const std::string& source) {
    using clock = std::chrono::steady_clock;
    auto start = clock::now();
    auto ms_since = [&] {
      return std::to_string(std::chrono::duration<double, std::milli>(clock::now() - start).count()) + " ms";
    };
    const std::string key = key_text(source);
    const std::string tag = detail::hex64(kiln::detail::hash_string(key));

    if (disk_ && disk_->enabled()) {
      if (auto bytes = disk_->load(key, ".so")) {
        // dlopen needs a file; a private copy (never the entry itself) so a concurrent rewrite
        // of the entry cannot change the code being mapped.
        std::string path = scratch_dir() + "/kiln_" + tag + "-" + detail::unique_suffix() + ".so";
        if (detail::write_new_file(path, *bytes)) {
          try {
            auto lib = std::make_shared<SharedLibrary>(path);
            ::unlink(path.c_str());
            kiln::detail::counters().disk_hits.fetch_add(1, std::memory_order_relaxed);
            log(LogChannel::cache,
                "cpu module " + tag + ": disk hit " + disk_->path_for(key, ".so") + " (" + ms_since() + ")");
            log_output_code(disk_, "cpu module " + tag + " from the disk cache", tag, ".cpp", source);
            return lib;
          } catch (const Error& e) {
            ::unlink(path.c_str());
            log(LogChannel::cache, "cpu module " + tag + ": disk entry does not load, recompiling: " + e.what());
          }
        }
      }
    }

    if (!compiler_) throw CompileError("kiln: no working C++ compiler (set KILN_CXX) to build a CPU kernel");
    std::string out = scratch_dir() + "/kiln_" + tag + "-" + detail::unique_suffix() + ".so";
    std::string src = detail::replace_extension(out, ".cpp");
    log_output_code(disk_, "cpu module " + tag, tag, ".cpp", source);
    compiler_->compile(source, out);  // a CompileError leaves the source in place for the user
    kiln::detail::counters().compiles.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<SharedLibrary> lib;
    try {
      lib = std::make_shared<SharedLibrary>(out);
    } catch (...) {
      ::unlink(out.c_str());
      ::unlink(src.c_str());
      throw;
    }
    // Stored only once it loaded: the disk cache must never hold a module that cannot.
    if (disk_ && disk_->enabled()) {
      std::string bytes;
      if (detail::read_whole_file(out, bytes)) disk_->store(key, ".so", bytes);
    }
    ::unlink(out.c_str());
    ::unlink(src.c_str());
    log(LogChannel::cache, "cpu module " + tag + ": compiled (" + ms_since() + ")");
    return lib;
  }

  const DiskCache* disk_;
  const CxxCompiler* compiler_;
  OnceCache<std::string, std::shared_ptr<SharedLibrary>> modules_;
};

}  // namespace kiln::runtime
