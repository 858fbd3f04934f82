#pragma once
// Cubins and loaded CUDA modules, cached. A cubin is looked up in memory, then on disk, and only
// then compiled by NVRTC; its key is the full text of everything that decides its bytes (the
// source, the in-memory headers, the NVRTC version, the architecture, the options and kiln's
// version), so a hit can never be stale. NVRTC's version and architectures come from a probe
// record in the disk cache while the library file is unchanged, so a process whose kernels are
// all on disk never pays the tens of milliseconds that loading NVRTC costs. Loaded modules are
// kept per device for the life of the process (unloading one while a kernel from it may still
// be queued is never worth the risk).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/version.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/runtime/kernel_cache.hpp"
#include "kiln/runtime/nvrtc.hpp"
#include "kiln/runtime/source_log.hpp"

namespace kiln::runtime {

/// In-memory headers handed to NVRTC: (include name, contents).
using CudaHeaders = std::vector<std::pair<std::string, std::string>>;

namespace detail {

/// True when `bytes` starts like an ELF file (what a cubin is).
inline bool looks_like_cubin(const std::string& bytes) {
  return bytes.size() >= 4 && bytes[0] == '\x7f' && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
}

}  // namespace detail

/// The cubin architecture to compile for a device of compute capability `cc_major`.`cc_minor`,
/// given the architectures NVRTC supports (`archs`, empty when NVRTC cannot list them): the
/// exact one when supported, else the newest supported one of the same major version below it
/// (a cubin runs on later minor versions of its major). Throws DeviceError when there is none.
inline std::string cubin_arch_for(int cc_major, int cc_minor, const std::vector<int>& archs) {
  const int want = cc_major * 10 + cc_minor;
  if (archs.empty()) return "sm_" + std::to_string(want);  // NVRTC too old to list them: try
  int best = -1;
  for (int a : archs) {
    if (a == want) return "sm_" + std::to_string(want);
    if (a / 10 == cc_major && a < want && a > best) best = a;
  }
  if (best >= 0) return "sm_" + std::to_string(best);
  std::string list;
  for (int a : archs) list += " sm_" + std::to_string(a);
  throw DeviceError("kiln: NVRTC cannot compile for sm_" + std::to_string(want) + " (it supports" + list +
                    "); install a CUDA toolkit that knows this GPU or set KILN_NVRTC_PATH");
}

/// As above, asking the NVRTC of this process for its architectures.
inline std::string cubin_arch_for(int cc_major, int cc_minor) {
  return cubin_arch_for(cc_major, cc_minor, nvrtc_supported_archs());
}

namespace detail {

/// What a cubin cache key needs to know about NVRTC.
struct NvrtcIdentity {
  std::string version;     ///< "13.0"
  std::vector<int> archs;  ///< the compute capabilities it targets (may be empty)
  std::string file;        ///< the library file
  bool from_disk = false;  ///< read from the probe record, NVRTC not loaded for it
};

/// "size mtime inode" of a file, empty when it cannot be stat'ed.
inline std::string file_identity(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {};
  return std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + " " + std::to_string(st.st_ino);
}

// Everything that decides which file dlopen picks for NVRTC: the settings, the loader's search
// path and cache, and the executable (its RUNPATH takes part in the search).
inline std::string nvrtc_probe_key() {
  // The executable's path: the target of /proc/self/exe (readlink, as std::filesystem's
  // read_symlink; "" when it cannot be read).
  std::string exe(256, '\0');
  for (;;) {
    const ssize_t len = ::readlink("/proc/self/exe", exe.data(), exe.size());
    if (len < 0) {
      exe.clear();
      break;
    }
    if (static_cast<std::size_t>(len) < exe.size()) {
      exe.resize(static_cast<std::size_t>(len));
      break;
    }
    exe.resize(exe.size() * 2);
  }
  return "kiln-nvrtc-probe\nkiln " KILN_VERSION_STRING "\nexe " + exe + "\nKILN_NVRTC_PATH " +
         env::get("KILN_NVRTC_PATH") + "\nLD_LIBRARY_PATH " + env::get("LD_LIBRARY_PATH") + "\nld.so.cache " +
         file_identity("/etc/ld.so.cache");
}

inline std::string format_nvrtc_probe(const NvrtcIdentity& id) {
  std::string out = "file " + id.file + "\nid " + file_identity(id.file) + "\nversion " + id.version + "\narchs";
  for (int a : id.archs) out += " " + std::to_string(a);
  return out + "\n";
}

// The identity in a probe record, if the record is well formed and its library file is still
// the same file.
inline std::optional<NvrtcIdentity> parse_nvrtc_probe(const std::string& text) {
  NvrtcIdentity id;
  std::string file_id;
  bool have_version = false, have_archs = false;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) return std::nullopt;
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    auto space = line.find(' ');
    std::string field = line.substr(0, space), value = space == std::string::npos ? "" : line.substr(space + 1);
    if (field == "file")
      id.file = value;
    else if (field == "id")
      file_id = value;
    else if (field == "version")
      id.version = value, have_version = true;
    else if (field == "archs") {
      have_archs = true;
      std::size_t p = 0;
      while (p < value.size()) {
        std::size_t q = value.find(' ', p);
        if (q == std::string::npos) q = value.size();
        if (q > p) id.archs.push_back(std::atoi(value.substr(p, q - p).c_str()));
        p = q + 1;
      }
    }
  }
  if (!have_version || !have_archs || id.version.empty() || id.file.empty() || file_id.empty() ||
      file_identity(id.file) != file_id)
    return std::nullopt;
  id.from_disk = true;
  return id;
}

}  // namespace detail

/// Cubins by source (memory, disk, NVRTC) and kernels by cubin and device.
class CudaModuleCache {
 public:
  /// A cache whose cubins persist in `disk` (which must outlive it).
  explicit CudaModuleCache(DiskCache& disk) : disk_(&disk) {}
  CudaModuleCache(const CudaModuleCache&) = delete;
  CudaModuleCache& operator=(const CudaModuleCache&) = delete;

  /// The process-wide cache, on DiskCache::instance().
  static CudaModuleCache& instance() {
    // Leaked on purpose, like the contexts whose modules it holds.
    static CudaModuleCache* cache = new CudaModuleCache(DiskCache::instance());
    return *cache;
  }

  /// What the keys need to know about NVRTC: its version and architectures. Loading NVRTC takes
  /// tens of milliseconds, more than a whole disk-cache hit may, so the answer is kept in a
  /// probe record in the disk cache, valid while the library file that the loader would pick
  /// (same settings, search path, loader cache and executable) is the same file. Throws
  /// DeviceError when NVRTC must be loaded and is unavailable.
  const detail::NvrtcIdentity& nvrtc_identity() {
    std::call_once(identity_once_, [&] {
      std::string key = detail::nvrtc_probe_key();
      if (auto record = disk_->load(key, ".nvrtc")) {
        if (auto id = detail::parse_nvrtc_probe(*record)) {
          identity_ = std::move(*id);
          log(LogChannel::cache, "NVRTC " + identity_.version + " (" + identity_.file + ") known from the disk cache");
          return;
        }
      }
      identity_ = probe_nvrtc();
      if (!identity_.file.empty()) disk_->store(key, ".nvrtc", detail::format_nvrtc_probe(identity_));
    });
    return identity_;
  }

  /// The full key text of a cubin: everything that decides its bytes.
  std::string cubin_key(const std::string& source, const std::string& arch,
                        const std::vector<std::string>& options = {}, const CudaHeaders& headers = {}) {
    std::string key =
        "kiln-cubin\nkiln " KILN_VERSION_STRING "\nnvrtc " + nvrtc_identity().version + "\narch " + arch + "\noptions";
    for (const auto& o : nvrtc_default_options(arch)) key += " " + o;
    for (const auto& o : options) key += " " + o;
    // Lengths make the concatenation unambiguous.
    for (const auto& [name, text] : headers)
      key += "\nheader " + name + " " + std::to_string(text.size()) + "\n" + text;
    key += "\nsource " + std::to_string(source.size()) + "\n" + source;
    return key;
  }

  /// The cubin of `source` for `arch` ("sm_90"): from memory, else from the disk cache, else
  /// compiled by NVRTC (and stored on disk). `name` is the program name NVRTC's log uses. Counts
  /// stats().memory_hits / disk_hits / compiles; logs on KILN_LOGS=cache and prints the source
  /// on KILN_LOGS=output_code when it was not in memory. Throws CompileError on a compile error.
  std::string get_cubin(const std::string& source, const std::string& arch,
                        const std::vector<std::string>& options = {}, const CudaHeaders& headers = {},
                        const std::string& name = "kiln_kernel.cu") {
    std::string key = cubin_key(source, arch, options, headers);
    // The short id only names the entry in logs: made when a log line needs it.
    auto id = [&] { return detail::hex64(kiln::detail::hash_string(key)); };
    bool created = false;
    auto cubin = cubins_.get_or_create(
        key,
        [&]() -> std::shared_ptr<const std::string> {
          if (log_enabled(LogChannel::output_code))
            log_output_code(disk_, "CUDA source " + name + " [" + id() + "] for " + arch, id(), ".cu", source);
          if (auto hit = disk_->load(key, ".cubin"); hit && detail::looks_like_cubin(*hit)) {
            kiln::detail::counters().disk_hits++;
            log(LogChannel::cache,
                "cubin disk hit " + id() + " (" + name + ", " + arch + ", " + std::to_string(hit->size()) + " bytes)");
            return std::make_shared<const std::string>(std::move(*hit));
          }
          auto t0 = std::chrono::steady_clock::now();
          std::string bytes = compile_cuda_to_cubin(source, name, arch, options, headers);
          double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          kiln::detail::counters().compiles++;
          char ms_text[32];
          std::snprintf(ms_text, sizeof ms_text, "%.1f", ms);
          log(LogChannel::cache, "cubin compiled " + id() + " (" + name + ", " + arch + ", " +
                                     std::to_string(bytes.size()) + " bytes) by NVRTC in " + ms_text + " ms");
          // A probe record that named another NVRTC than the one that compiled (a library
          // replaced in a way the record could not see) must not put this cubin under its key.
          if (nvrtc_version() == nvrtc_identity().version)
            disk_->store(key, ".cubin", bytes);
          else
            log(LogChannel::cache, "cubin " + id() + " not stored: NVRTC is " + nvrtc_version() + ", the key says " +
                                       nvrtc_identity().version);
          return std::make_shared<const std::string>(std::move(bytes));
        },
        &created);
    if (!created) {
      kiln::detail::counters().memory_hits++;
      if (log_enabled(LogChannel::cache))
        log(LogChannel::cache, "cubin memory hit " + id() + " (" + name + ", " + arch + ")");
    }
    return *cubin;
  }

  /// The kernel `kernel_name` (an `extern "C"` name) of `cubin`, loaded on cuda:`device`. Each
  /// cubin is loaded once per device and each function looked up once.
  cu::CUfunction function(const std::string& cubin, const std::string& kernel_name, int device) {
    CudaContext& ctx = cuda_context(device);
    const auto& api = detail::cuda_driver_state().api;
    std::lock_guard<std::mutex> lock(mu_);
    if (modules_.size() <= static_cast<std::size_t>(device)) modules_.resize(static_cast<std::size_t>(device) + 1);
    auto& per_device = modules_[static_cast<std::size_t>(device)];
    auto it = per_device.find(cubin);
    if (it == per_device.end()) {
      ctx.make_current();
      cu::CUmodule module = nullptr;
      detail::cuda_check(api.module_load_data(&module, cubin.data()), "cuModuleLoadData", [&] {
        return "loading a " + std::to_string(cubin.size()) + "-byte cubin (kernel '" + kernel_name +
               "') on cuda:" + std::to_string(device) + " (" + ctx.name + ", " + ctx.arch() +
               "); driver supports CUDA " + cuda_driver_version() + ", NVRTC is " +
               (nvrtc_available() ? nvrtc_version() : "unavailable") +
               (detail::looks_like_cubin(cubin) ? "" : "; the bytes are not an ELF cubin");
      });
      it = per_device.emplace(cubin, Module{module, {}}).first;
      // A module that gathers reports range faults to the device's record (core/index_fault.hpp).
      cu::CUdeviceptr slot = 0;
      std::size_t slot_bytes = 0;
      if (api.module_get_global &&
          api.module_get_global(&slot, &slot_bytes, module, "kiln_index_fault") == cu::CUDA_SUCCESS &&
          slot_bytes == sizeof(cu::CUdeviceptr)) {
        const cu::CUdeviceptr record = ctx.index_fault_record();
        detail::cuda_check(api.memcpy_htod_async(slot, &record, sizeof record, ctx.stream), "cuMemcpyHtoDAsync",
                           "setting a module's index fault record");
        detail::cuda_check(api.stream_synchronize(ctx.stream), "cuStreamSynchronize",
                           "setting a module's index fault record");
      }
    }
    auto& fns = it->second.functions;
    if (auto f = fns.find(kernel_name); f != fns.end()) return f->second;
    ctx.make_current();
    cu::CUfunction fn = nullptr;
    detail::cuda_check(api.module_get_function(&fn, it->second.module, kernel_name.c_str()), "cuModuleGetFunction",
                       [&] {
                         return "looking up kernel '" + kernel_name + "' on cuda:" + std::to_string(device) +
                                " (is it declared extern \"C\" __global__?)";
                       });
    fns.emplace(kernel_name, fn);
    return fn;
  }

  /// `source` compiled for cuda:`device`'s architecture (cached as get_cubin does) and its
  /// kernel `kernel_name` loaded there.
  cu::CUfunction get_function(const std::string& source, const std::string& kernel_name, int device,
                              const std::vector<std::string>& options = {}, const CudaHeaders& headers = {}) {
    const CudaContext& ctx = cuda_context(device);
    std::string arch = cubin_arch_for(ctx.cc_major, ctx.cc_minor, nvrtc_identity().archs);
    return function(get_cubin(source, arch, options, headers, kernel_name + ".cu"), kernel_name, device);
  }

  /// Cubins held in memory.
  std::size_t cubins_in_memory() const { return cubins_.size(); }

  /// Forgets the in-memory cubins (loaded modules stay loaded); for tests of the disk cache.
  void clear_memory() { cubins_.clear(); }

 private:
  struct Module {
    cu::CUmodule module;
    std::unordered_map<std::string, cu::CUfunction> functions;
  };

  static detail::NvrtcIdentity probe_nvrtc() {
    detail::NvrtcIdentity id;
    id.version = nvrtc_version();  // loads NVRTC; throws DeviceError when it is unavailable
    id.archs = nvrtc_supported_archs();
    id.file = detail::nvrtc_api().file;
    log(LogChannel::cache, "NVRTC " + id.version + " loaded from " + (id.file.empty() ? "?" : id.file));
    return id;
  }

  DiskCache* disk_;
  std::once_flag identity_once_;
  detail::NvrtcIdentity identity_;
  OnceCache<std::string, std::shared_ptr<const std::string>> cubins_;
  std::mutex mu_;
  std::vector<std::unordered_map<std::string, Module>> modules_;  // per device, by cubin bytes
};

}  // namespace kiln::runtime
