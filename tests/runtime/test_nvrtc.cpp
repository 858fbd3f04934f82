// NVRTC loaded at run time, CUDA source to cubins, compile errors, and the cubin cache.
// These run wherever libnvrtc is found (CI has it, no GPU needed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/core/stats.hpp"
#include "kiln/runtime/cuda_module.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/runtime/nvrtc.hpp"
#include "../support/child_process.hpp"
#include "runtime_test_util.hpp"

namespace kiln_test_runtime_nvrtc {

namespace {

using kiln::runtime::compile_cuda_to_cubin;

// A vectorised axpy (16-byte loads and stores with a scalar tail) and a warp-shuffle block
// reduction: the two shapes of code the CUDA backend generates most.
const char* const kKernels = R"(
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

extern "C" __global__ void axpy_f4(float a, const float* __restrict__ x, float* __restrict__ y, unsigned n) {
  const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  const unsigned n4 = n / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  for (unsigned i = tid; i < n4; i += stride) {
    float4 v = x4[i], w = y4[i];
    w.x = fmaf(a, v.x, w.x); w.y = fmaf(a, v.y, w.y); w.z = fmaf(a, v.z, w.z); w.w = fmaf(a, v.w, w.w);
    y4[i] = w;
  }
  for (unsigned i = n4 * 4 + tid; i < n; i += stride) y[i] = fmaf(a, x[i], y[i]);
}

extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, unsigned n) {
  __shared__ float partial[32];
  float acc = 0.f;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[i];
  acc = warp_sum(acc);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (blockDim.x + 31u) / 32u ? partial[lane] : 0.f;
    acc = warp_sum(acc);
    if (lane == 0) atomicAdd(out, acc);
  }
}
)";

// True when this machine has an NVRTC that the default search should find, so that failing to
// load it is a bug rather than a machine without the toolkit.
bool nvrtc_expected() {
  if (!kiln::env::get("KILN_NVRTC_PATH").empty()) return true;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/local/cuda/lib64", ec))
    if (e.path().filename().string().rfind("libnvrtc.so", 0) == 0) return true;
  return false;
}

// Skips (with a note) where there is no NVRTC; fails where there should be one.
bool have_nvrtc() {
  if (kiln::runtime::nvrtc_available()) return true;
  if (nvrtc_expected()) FAIL("NVRTC should load on this machine: " << kiln::runtime::nvrtc_unavailable_reason());
  MESSAGE("NVRTC not found, skipping: " << kiln::runtime::nvrtc_unavailable_reason());
  return false;
}

bool is_cuda_elf(const std::string& bytes) {
  // ELF magic, 64-bit class, e_machine (offset 18, little endian) == EM_CUDA (190).
  return bytes.size() > 64 &&
         std::memcmp(bytes.data(),
                     "\x7f"
                     "ELF",
                     4) == 0 &&
         bytes[4] == 2 && static_cast<unsigned char>(bytes[18]) == 190 && bytes[19] == 0;
}

}  // namespace

TEST_CASE("nvrtc: loads at run time and reports its version and architectures") {
  if (!have_nvrtc()) return;
  std::string v = kiln::runtime::nvrtc_version();
  auto dot = v.find('.');
  REQUIRE(dot != std::string::npos);
  CHECK(std::stoi(v.substr(0, dot)) >= 11);
  CHECK(kiln::runtime::nvrtc_unavailable_reason().empty());
  CHECK_FALSE(kiln::runtime::detail::nvrtc_api().path.empty());
  auto archs = kiln::runtime::nvrtc_supported_archs();
  if (!archs.empty()) {
    CHECK(std::find(archs.begin(), archs.end(), 80) != archs.end());
    CHECK(std::find(archs.begin(), archs.end(), 90) != archs.end());
  }
}

TEST_CASE("nvrtc: a path that does not exist is an error naming it") {
  auto api = kiln::runtime::detail::load_nvrtc({"/nonexistent/kiln/libnvrtc.so.99"});
  CHECK_FALSE(api.ok());
  CHECK(api.reason.find("/nonexistent/kiln/libnvrtc.so.99") != std::string::npos);
  // A library without NVRTC's symbols is refused, naming what is missing.
  auto wrong = kiln::runtime::detail::load_nvrtc({"libm.so.6"});
  CHECK_FALSE(wrong.ok());
  CHECK(wrong.reason.find("nvrtcCompileProgram") != std::string::npos);
}

TEST_CASE("nvrtc: the axpy and block-reduction kernels compile to cubins for sm_90 and sm_80") {
  if (!have_nvrtc()) return;
  for (const char* arch : {"sm_90", "sm_80"}) {
    CAPTURE(arch);
    std::string cubin = compile_cuda_to_cubin(kKernels, "kernels.cu", arch, {}, {});
    CHECK(is_cuda_elf(cubin));
    CHECK(cubin.find("axpy_f4") != std::string::npos);
    CHECK(cubin.find("block_sum") != std::string::npos);
  }
  // Different targets give different machine code.
  CHECK(compile_cuda_to_cubin(kKernels, "kernels.cu", "sm_90") !=
        compile_cuda_to_cubin(kKernels, "kernels.cu", "sm_80"));
}

TEST_CASE("nvrtc: KILN_NVRTC_FAST_COMPILE passes --Ofast-compile to every compile and into the cubin key") {
  if (!have_nvrtc()) return;
  const auto& api = kiln::runtime::detail::nvrtc_api();
  const bool supported = api.major > 12 || (api.major == 12 && api.minor >= 8);
  auto has_fast = [] {
    auto o = kiln::runtime::nvrtc_default_options("sm_90");
    return std::find(o.begin(), o.end(), std::string("--Ofast-compile=mid")) != o.end();
  };
  if (const char* child = std::getenv("KILN_TEST_FAST_COMPILE_CHILD")) {
    // The setting is read once per process: this child starts with it set (to "mid", or to a
    // level NVRTC does not have, which is ignored).
    const bool set = std::string(child) == "mid";
    CHECK(has_fast() == (set && supported));
    if (!set) return;
    std::string cubin = compile_cuda_to_cubin(kKernels, "kernels.cu", "sm_90", {}, {});
    CHECK(is_cuda_elf(cubin));
    auto& cache = kiln::runtime::CudaModuleCache::instance();
    CHECK((cache.cubin_key(kKernels, "sm_90").find("--Ofast-compile=mid") != std::string::npos) == supported);
    MESSAGE("fast-compile child done");
    return;
  }
  CHECK_FALSE(has_fast());
  auto r = kiln::testing::run_test_child("nvrtc: KILN_NVRTC_FAST_COMPILE*",
                                         {"KILN_NVRTC_FAST_COMPILE=mid", "KILN_TEST_FAST_COMPILE_CHILD=mid"});
  INFO("child output:\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("fast-compile child done") != std::string::npos);
  // Anything but min, mid or max is ignored.
  auto bad = kiln::testing::run_test_child("nvrtc: KILN_NVRTC_FAST_COMPILE*",
                                           {"KILN_NVRTC_FAST_COMPILE=fast", "KILN_TEST_FAST_COMPILE_CHILD=ignored"});
  INFO("child output:\n" << bad.output);
  CHECK(bad.exit_code == 0);
}

TEST_CASE("nvrtc: in-memory headers are found by #include") {
  if (!have_nvrtc()) return;
  const std::string src =
      "#include \"kiln_helpers.cuh\"\n"
      "extern \"C\" __global__ void twice(float* y) { y[threadIdx.x] = kiln_twice(y[threadIdx.x]); }\n";
  const std::string header = "__device__ __forceinline__ float kiln_twice(float v) { return 2.f * v; }\n";
  std::string cubin = compile_cuda_to_cubin(src, "twice.cu", "sm_90", {}, {{"kiln_helpers.cuh", header}});
  CHECK(is_cuda_elf(cubin));
  CHECK(cubin.find("twice") != std::string::npos);
  // Without the header it does not compile, and the log says which include failed.
  try {
    compile_cuda_to_cubin(src, "twice.cu", "sm_90");
    FAIL("compiled without its header");
  } catch (const kiln::CompileError& e) {
    CHECK(e.log().find("kiln_helpers.cuh") != std::string::npos);
  }
}

TEST_CASE("nvrtc: a syntax error throws CompileError with the log and the numbered source") {
  if (!have_nvrtc()) return;
  const std::string src =
      "extern \"C\" __global__ void broken(float* y) {\n"
      "  float v = y[threadIdx.x]\n"  // missing ';'
      "  y[threadIdx.x] = v * 2.f;\n"
      "}\n";
  try {
    compile_cuda_to_cubin(src, "broken.cu", "sm_90");
    FAIL("a syntax error compiled");
  } catch (const kiln::CompileError& e) {
    std::string what = e.what();
    CHECK_FALSE(e.log().empty());
    CHECK(e.log().find("broken.cu") != std::string::npos);  // NVRTC names the program in its log
    CHECK(what.find(e.log()) != std::string::npos);
    CHECK(what.find("sm_90") != std::string::npos);
    CHECK(what.find("    2 |   float v = y[threadIdx.x]") != std::string::npos);
    CHECK(what.find("    4 | }") != std::string::npos);
  }
}

TEST_CASE("nvrtc: a target that is not a real architecture is refused before compiling") {
  if (!have_nvrtc()) return;
  CHECK_THROWS_AS(compile_cuda_to_cubin(kKernels, "kernels.cu", "compute_90"), kiln::CompileError);
  CHECK_THROWS_AS(compile_cuda_to_cubin(kKernels, "kernels.cu", "90"), kiln::CompileError);
  CHECK(kiln::runtime::detail::valid_cubin_arch("sm_90a"));
  CHECK(kiln::runtime::detail::valid_cubin_arch("sm_100"));
  CHECK_FALSE(kiln::runtime::detail::valid_cubin_arch("sm_9"));
  CHECK_FALSE(kiln::runtime::detail::valid_cubin_arch("sm_90x"));
}

TEST_CASE("nvrtc: numbered source listing") {
  CHECK(kiln::runtime::detail::numbered_source("a\nb") == "    1 | a\n    2 | b\n");
  CHECK(kiln::runtime::detail::numbered_source("a\n") == "    1 | a\n");
  CHECK(kiln::runtime::detail::numbered_source("a\n\nb") == "    1 | a\n    2 | \n    3 | b\n");
  CHECK(kiln::runtime::detail::numbered_source("").empty());
}

TEST_CASE("nvrtc: cubin architecture for a device") {
  if (!have_nvrtc()) return;
  auto archs = kiln::runtime::nvrtc_supported_archs();
  if (archs.empty()) return;
  auto has = [&](int a) { return std::find(archs.begin(), archs.end(), a) != archs.end(); };
  if (has(90)) CHECK(kiln::runtime::cubin_arch_for(9, 0) == "sm_90");
  // A newer minor version of a major NVRTC knows runs the newest older cubin of that major.
  if (has(90) && !has(91) && !has(92)) CHECK(kiln::runtime::cubin_arch_for(9, 2) == "sm_90");
  // Nothing NVRTC can target runs on a device older than all it supports.
  if (!has(30) && !has(32)) CHECK_THROWS_AS(kiln::runtime::cubin_arch_for(3, 2), kiln::DeviceError);
}

TEST_CASE("nvrtc: cubin cache in memory and on disk") {
  if (!have_nvrtc()) return;
  using kiln::runtime::CudaModuleCache;
  using kiln::runtime::DiskCache;
  kiln_test::TempDir dir;
  DiskCache disk(dir.path);
  REQUIRE(disk.enabled());
  // A source no other test compiles, so the counters below see only this test's work.
  const std::string src = std::string(kKernels) + "\n// cubin cache test " + dir.path + "\n";
  auto before = kiln::stats();

  CudaModuleCache cache(disk);
  std::string first = cache.get_cubin(src, "sm_90");
  CHECK(is_cuda_elf(first));
  CHECK(kiln::stats().compiles == before.compiles + 1);
  std::string key = cache.cubin_key(src, "sm_90");
  CHECK(kiln_test::file_exists(disk.path_for(key, ".cubin")));

  // Same process, same key: memory.
  CHECK(cache.get_cubin(src, "sm_90") == first);
  CHECK(kiln::stats().memory_hits == before.memory_hits + 1);
  CHECK(kiln::stats().compiles == before.compiles + 1);

  // A new cache on the same directory (as a new process would be): disk.
  CudaModuleCache fresh(disk);
  CHECK(fresh.get_cubin(src, "sm_90") == first);
  CHECK(kiln::stats().disk_hits == before.disk_hits + 1);
  CHECK(kiln::stats().compiles == before.compiles + 1);

  // The architecture and the options are part of the key.
  CHECK(cache.cubin_key(src, "sm_80") != key);
  CHECK(cache.cubin_key(src, "sm_90", {"-lineinfo"}) != key);
  CHECK(cache.cubin_key(src, "sm_90", {}, {{"h.cuh", "x"}}) != key);
  CHECK(key.find("nvrtc " + kiln::runtime::nvrtc_version()) != std::string::npos);
  CHECK(key.find("kiln " KILN_VERSION_STRING) != std::string::npos);
  std::string other = fresh.get_cubin(src, "sm_80");
  CHECK(is_cuda_elf(other));
  CHECK(other != first);
  CHECK(kiln::stats().compiles == before.compiles + 2);

  // An entry that is not a cubin (say, written by a buggy older kiln under a colliding key
  // format) is not handed to the driver: it is recompiled.
  disk.store(key, ".cubin", "not a cubin");
  CudaModuleCache third(disk);
  CHECK(third.get_cubin(src, "sm_90") == first);
  CHECK(kiln::stats().compiles == before.compiles + 3);

  // A failed compile leaves nothing behind in memory, and the next call tries again.
  CHECK_THROWS_AS(fresh.get_cubin("this is not CUDA", "sm_90"), kiln::CompileError);
  CHECK_THROWS_AS(fresh.get_cubin("this is not CUDA", "sm_90"), kiln::CompileError);
}

TEST_CASE("nvrtc: what the cubin keys need of NVRTC is kept on disk, so a cache hit need not load it") {
  if (!have_nvrtc()) return;
  using kiln::runtime::CudaModuleCache;
  using kiln::runtime::DiskCache;
  namespace d = kiln::runtime::detail;
  kiln_test::TempDir dir;
  DiskCache disk(dir.path);
  const std::string probe_key = d::nvrtc_probe_key();

  CudaModuleCache first(disk);
  const auto& probed = first.nvrtc_identity();
  CHECK_FALSE(probed.from_disk);
  CHECK(probed.version == kiln::runtime::nvrtc_version());
  CHECK(probed.archs == kiln::runtime::nvrtc_supported_archs());
  CHECK(probed.file == d::nvrtc_api().file);
  CHECK(kiln_test::file_exists(disk.path_for(probe_key, ".nvrtc")));

  // A new cache (a new process) reads the record instead of asking NVRTC.
  CudaModuleCache second(disk);
  const auto& recorded = second.nvrtc_identity();
  CHECK(recorded.from_disk);
  CHECK(recorded.version == probed.version);
  CHECK(recorded.archs == probed.archs);
  CHECK(second.cubin_key("x", "sm_90") == first.cubin_key("x", "sm_90"));

  // A record whose library file has changed since is not believed.
  disk.store(probe_key, ".nvrtc", "file " + probed.file + "\nid 1 2.3 4\nversion 99.9\narchs 90\n");
  CudaModuleCache third(disk);
  CHECK_FALSE(third.nvrtc_identity().from_disk);
  CHECK(third.nvrtc_identity().version == probed.version);

  // Records are parsed strictly.
  const std::string good = d::format_nvrtc_probe(probed);
  CHECK(d::parse_nvrtc_probe(good).has_value());
  CHECK_FALSE(d::parse_nvrtc_probe(good.substr(0, good.size() - 1)).has_value());  // no final newline
  CHECK_FALSE(d::parse_nvrtc_probe("file " + probed.file + "\nversion 1.0\narchs 90\n").has_value());  // no id
  CHECK_FALSE(d::parse_nvrtc_probe("").has_value());
}

}  // namespace kiln_test_runtime_nvrtc
