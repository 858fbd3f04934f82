#pragma once
// NVRTC, loaded at run time with dlopen (never linked), so one binary runs on machines with and
// without the CUDA toolkit. Compiles CUDA C++ source straight to a cubin for one exact
// architecture ("sm_90"), so the driver never JIT-compiles PTX when it loads the module.
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::runtime {

namespace nvrtc {
// Our own minimal declarations of the NVRTC C API, so kiln compiles without nvrtc.h.
using nvrtcResult = int;
struct _nvrtcProgram;
using nvrtcProgram = _nvrtcProgram*;
inline constexpr nvrtcResult NVRTC_SUCCESS = 0;
inline constexpr nvrtcResult NVRTC_ERROR_COMPILATION = 6;
}  // namespace nvrtc

namespace detail {

/// The NVRTC entry points kiln uses, resolved once from the library found at run time.
struct NvrtcApi {
  void* handle = nullptr;
  std::string path;    ///< the name or path that was loaded
  std::string file;    ///< the file the loader picked for it (absolute; empty if unknown)
  std::string reason;  ///< why loading failed (empty when it worked)
  int major = 0, minor = 0;

  const char* (*get_error_string)(nvrtc::nvrtcResult) = nullptr;
  nvrtc::nvrtcResult (*version)(int*, int*) = nullptr;
  nvrtc::nvrtcResult (*create_program)(nvrtc::nvrtcProgram*, const char*, const char*, int, const char* const*,
                                       const char* const*) = nullptr;
  nvrtc::nvrtcResult (*destroy_program)(nvrtc::nvrtcProgram*) = nullptr;
  nvrtc::nvrtcResult (*compile_program)(nvrtc::nvrtcProgram, int, const char* const*) = nullptr;
  nvrtc::nvrtcResult (*get_program_log_size)(nvrtc::nvrtcProgram, std::size_t*) = nullptr;
  nvrtc::nvrtcResult (*get_program_log)(nvrtc::nvrtcProgram, char*) = nullptr;
  nvrtc::nvrtcResult (*get_cubin_size)(nvrtc::nvrtcProgram, std::size_t*) = nullptr;
  nvrtc::nvrtcResult (*get_cubin)(nvrtc::nvrtcProgram, char*) = nullptr;
  // Optional (NVRTC >= 11.2): the architectures this NVRTC can target.
  nvrtc::nvrtcResult (*get_num_supported_archs)(int*) = nullptr;
  nvrtc::nvrtcResult (*get_supported_archs)(int*) = nullptr;

  bool ok() const { return handle != nullptr; }
};

/// Library names tried in order when KILN_NVRTC_PATH is unset.
inline std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  // A toolkit outside the loader's search path: take its libnvrtc.so* (not the builtins or
  // the .alt variants), newest name first.
  const std::string toolkit_lib = "/usr/local/cuda/lib64";
  std::vector<std::string> found;
  if (DIR* dir = ::opendir(toolkit_lib.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string file = entry->d_name;
      if (file.rfind("libnvrtc.so", 0) == 0) found.push_back(toolkit_lib + "/" + file);
    }
    ::closedir(dir);
  }
  std::sort(found.rbegin(), found.rend());
  names.insert(names.end(), found.begin(), found.end());
  return names;
}

/// Loads NVRTC from `paths` (the first that opens and has every required symbol wins).
inline NvrtcApi load_nvrtc(const std::vector<std::string>& paths) {
  NvrtcApi api;
  std::string tried;
  for (const auto& p : paths) {
    void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      tried += "\n  " + p + ": " + (e ? e : "dlopen failed");
      continue;
    }
    std::string missing;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    sym(api.get_error_string, "nvrtcGetErrorString");
    sym(api.version, "nvrtcVersion");
    sym(api.create_program, "nvrtcCreateProgram");
    sym(api.destroy_program, "nvrtcDestroyProgram");
    sym(api.compile_program, "nvrtcCompileProgram");
    sym(api.get_program_log_size, "nvrtcGetProgramLogSize");
    sym(api.get_program_log, "nvrtcGetProgramLog");
    sym(api.get_cubin_size, "nvrtcGetCUBINSize");
    sym(api.get_cubin, "nvrtcGetCUBIN");
    if (!missing.empty()) {
      tried += "\n  " + p + ": missing symbols " + missing;
      dlclose(h);
      continue;
    }
    api.get_num_supported_archs =
        reinterpret_cast<decltype(api.get_num_supported_archs)>(dlsym(h, "nvrtcGetNumSupportedArchs"));
    api.get_supported_archs = reinterpret_cast<decltype(api.get_supported_archs)>(dlsym(h, "nvrtcGetSupportedArchs"));
    if (api.version(&api.major, &api.minor) != nvrtc::NVRTC_SUCCESS) {
      tried += "\n  " + p + ": nvrtcVersion failed";
      dlclose(h);
      continue;
    }
    api.handle = h;
    api.path = p;
    api.reason.clear();
    link_map* map = nullptr;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) {
      // Its canonical path (realpath, as std::filesystem::canonical), else the name as loaded.
      char* canonical = ::realpath(map->l_name, nullptr);
      api.file = canonical ? std::string(canonical) : std::string(map->l_name);
      std::free(canonical);
    }
    return api;
  }
  api.reason = "NVRTC not found; tried:" + tried;
  return api;
}

/// The process's NVRTC, loaded on first use from KILN_NVRTC_PATH or the default search.
inline const NvrtcApi& nvrtc_api() {
  static const NvrtcApi api = [] {
    std::string forced = env::get("KILN_NVRTC_PATH");
    // An explicit path that fails is an error, not a reason to pick up some other NVRTC.
    if (!forced.empty()) {
      NvrtcApi a = load_nvrtc({forced});
      if (!a.ok()) a.reason = "KILN_NVRTC_PATH=" + forced + ": " + a.reason;
      return a;
    }
    return load_nvrtc(nvrtc_candidates());
  }();
  return api;
}

/// The numbered listing that compile errors carry.
inline std::string numbered_source(const std::string& source) {
  std::string out;
  int line = 1;
  std::size_t start = 0;
  while (start < source.size()) {
    std::size_t end = source.find('\n', start);
    if (end == std::string::npos) end = source.size();
    std::string num = std::to_string(line++);
    out +=
        std::string(num.size() < 5 ? 5 - num.size() : 0, ' ') + num + " | " + source.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

/// True for "sm_90", "sm_80", "sm_90a", "sm_100a": the targets NVRTC makes cubins for.
inline bool valid_cubin_arch(const std::string& arch) {
  if (arch.size() < 5 || arch.compare(0, 3, "sm_") != 0) return false;
  std::size_t i = 3;
  while (i < arch.size() && arch[i] >= '0' && arch[i] <= '9') ++i;
  if (i < 5) return false;  // at least two digits
  return i == arch.size() || (i + 1 == arch.size() && (arch[i] == 'a' || arch[i] == 'f'));
}

}  // namespace detail

/// True when NVRTC was found and loaded.
inline bool nvrtc_available() { return detail::nvrtc_api().ok(); }

/// Why NVRTC is unavailable (every path tried and its error); empty when it loaded.
inline std::string nvrtc_unavailable_reason() { return detail::nvrtc_api().reason; }

/// NVRTC's version, "13.0"; throws DeviceError (with the reason) when NVRTC is unavailable.
inline std::string nvrtc_version() {
  const auto& api = detail::nvrtc_api();
  if (!api.ok()) throw DeviceError("kiln: " + api.reason);
  return std::to_string(api.major) + "." + std::to_string(api.minor);
}

/// The compute capabilities this NVRTC can compile for (e.g. {75, 80, 86, 89, 90, 100, ...}),
/// empty when NVRTC is too old to say.
inline std::vector<int> nvrtc_supported_archs() {
  const auto& api = detail::nvrtc_api();
  if (!api.ok()) throw DeviceError("kiln: " + api.reason);
  std::vector<int> archs;
  int n = 0;
  if (api.get_num_supported_archs && api.get_supported_archs &&
      api.get_num_supported_archs(&n) == nvrtc::NVRTC_SUCCESS && n > 0) {
    archs.resize(static_cast<std::size_t>(n));
    if (api.get_supported_archs(archs.data()) != nvrtc::NVRTC_SUCCESS) archs.clear();
  }
  return archs;
}

/// The options kiln always passes before the caller's: the exact architecture (so NVRTC emits
/// SASS, not PTX) and C++17. No fast-math: generated code gets CUDA's standard-accuracy math.
/// From NVRTC 12.4 on, -minimal leaves out the runtime API's declarations, textures and device
/// launches, which generated kernels never use: about a third of the front end's time.
///
/// KILN_NVRTC_FAST_COMPILE=min|mid|max (NVRTC 12.8 on) adds `--Ofast-compile=<level>`: NVRTC
/// trades the kernels' speed for its own (mid: about a third of the compile time of a large
/// unit). It is part of every cubin's key, so cubins of either setting never mix.
inline std::vector<std::string> nvrtc_default_options(const std::string& arch) {
  std::vector<std::string> o = {"--gpu-architecture=" + arch, "-std=c++17"};
  const auto& api = detail::nvrtc_api();
  if (api.ok() && (api.major > 12 || (api.major == 12 && api.minor >= 4))) o.push_back("-minimal");
  static const std::string fast = [] {
    std::string v = env::get("KILN_NVRTC_FAST_COMPILE", "");
    return v == "min" || v == "mid" || v == "max" ? v : std::string();
  }();
  if (!fast.empty() && api.ok() && (api.major > 12 || (api.major == 12 && api.minor >= 8)))
    o.push_back("--Ofast-compile=" + fast);
  return o;
}

/// Compiles `source` (program name `name`, which the log uses) for `arch` ("sm_90") and returns
/// the cubin bytes. `options` follow kiln's defaults (a later `-std=` wins); `headers` are
/// in-memory headers (include name, contents) that the source may `#include "name"`.
/// Throws CompileError with the NVRTC log and the numbered source when compilation fails,
/// DeviceError when NVRTC is unavailable.
inline std::string compile_cuda_to_cubin(const std::string& source, const std::string& name, const std::string& arch,
                                         const std::vector<std::string>& options = {},
                                         const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  const auto& api = detail::nvrtc_api();
  if (!api.ok()) throw DeviceError("kiln: cannot compile CUDA kernel '" + name + "': " + api.reason);
  if (!detail::valid_cubin_arch(arch))
    throw CompileError("kiln: NVRTC target '" + arch + "' for '" + name +
                       "' is not a real architecture like sm_90 (a cubin needs one)");

  std::vector<std::string> opts = nvrtc_default_options(arch);
  opts.insert(opts.end(), options.begin(), options.end());
  std::vector<const char*> opt_ptrs;
  for (const auto& o : opts) opt_ptrs.push_back(o.c_str());
  std::vector<const char*> header_src, header_names;
  for (const auto& [hname, hsrc] : headers) {
    header_names.push_back(hname.c_str());
    header_src.push_back(hsrc.c_str());
  }

  auto fail = [&](const char* fn, nvrtc::nvrtcResult r) {
    throw CompileError("kiln: " + std::string(fn) + " failed for '" + name + "': " + api.get_error_string(r));
  };
  nvrtc::nvrtcProgram prog = nullptr;
  nvrtc::nvrtcResult r = api.create_program(&prog, source.c_str(), name.c_str(), static_cast<int>(headers.size()),
                                            headers.empty() ? nullptr : header_src.data(),
                                            headers.empty() ? nullptr : header_names.data());
  if (r != nvrtc::NVRTC_SUCCESS) fail("nvrtcCreateProgram", r);
  // Destroys the program on every way out, including throws.
  struct Guard {
    const detail::NvrtcApi& api;
    nvrtc::nvrtcProgram& prog;
    ~Guard() {
      if (prog) api.destroy_program(&prog);
    }
  } guard{api, prog};

  nvrtc::nvrtcResult cr = api.compile_program(prog, static_cast<int>(opt_ptrs.size()), opt_ptrs.data());
  std::string log;
  std::size_t log_size = 0;
  if (api.get_program_log_size(prog, &log_size) == nvrtc::NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    if (api.get_program_log(prog, log.data()) != nvrtc::NVRTC_SUCCESS) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (cr != nvrtc::NVRTC_SUCCESS) {
    std::string opt_text;
    for (const auto& o : opts) opt_text += " " + o;
    throw CompileError("kiln: NVRTC " + std::to_string(api.major) + "." + std::to_string(api.minor) +
                           " failed to compile '" + name + "' for " + arch + " (" + api.get_error_string(cr) +
                           ")\noptions:" + opt_text + "\n--- NVRTC log ---\n" + log + "\n--- source ---\n" +
                           detail::numbered_source(source),
                       log);
  }
  std::size_t size = 0;
  r = api.get_cubin_size(prog, &size);
  if (r != nvrtc::NVRTC_SUCCESS) fail("nvrtcGetCUBINSize", r);
  if (size == 0) throw CompileError("kiln: NVRTC produced an empty cubin for '" + name + "' (" + arch + ")", log);
  std::string cubin(size, '\0');
  r = api.get_cubin(prog, cubin.data());
  if (r != nvrtc::NVRTC_SUCCESS) fail("nvrtcGetCUBIN", r);
  return cubin;
}

}  // namespace kiln::runtime

KILN_COLD_CODE_END
