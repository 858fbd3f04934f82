#pragma once
// NCCL, loaded at run time with dlopen (never linked), as the CUDA driver, NVRTC and cuBLASLt
// are: one binary runs with and without it, and only a process group over CUDA tensors needs it.
// KILN_NCCL_PATH names the library (and then nothing else is tried); otherwise libnccl.so.2,
// then libnccl.so.
//
// The declarations are our own (ncclResult_t and the enums as int, the communicator opaque),
// so kiln compiles without nccl.h; each value names the nccl.h enum it is taken from (NCCL 2.x,
// stable since 2.10, which added ncclAvg and ncclBfloat16, the oldest version kiln accepts).
#include <cstddef>
#include <string>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/duration.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/dynlib.hpp"

namespace kiln::runtime::nccl {

// ---- nccl.h ----------------------------------------------------------------------------------
using ncclResult_t = int;  // enum ncclResult_t
inline constexpr ncclResult_t ncclSuccess = 0;
inline constexpr ncclResult_t ncclInProgress = 7;

using ncclDataType_t = int;  // enum ncclDataType_t
inline constexpr ncclDataType_t ncclInt8 = 0;
inline constexpr ncclDataType_t ncclUint8 = 1;
inline constexpr ncclDataType_t ncclInt32 = 2;
inline constexpr ncclDataType_t ncclInt64 = 4;
inline constexpr ncclDataType_t ncclFloat16 = 6;
inline constexpr ncclDataType_t ncclFloat32 = 7;
inline constexpr ncclDataType_t ncclFloat64 = 8;
inline constexpr ncclDataType_t ncclBfloat16 = 9;

using ncclRedOp_t = int;  // enum ncclRedOp_t
inline constexpr ncclRedOp_t ncclSum = 0;
inline constexpr ncclRedOp_t ncclProd = 1;
inline constexpr ncclRedOp_t ncclMax = 2;
inline constexpr ncclRedOp_t ncclMin = 3;
inline constexpr ncclRedOp_t ncclAvg = 4;

struct ncclComm;
using ncclComm_t = ncclComm*;

/// NCCL_UNIQUE_ID_BYTES (128): the id rank 0 makes and every rank passes to ncclCommInitRank
/// (passed by value, as nccl.h's struct is).
struct ncclUniqueId {
  char internal[128];
};

/// NCCL's entry points kiln calls.
struct NcclApi {
  ncclResult_t (*get_version)(int*) = nullptr;                                    // ncclGetVersion
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;                         // ncclGetUniqueId
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;  // ncclCommInitRank
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;                             // ncclCommDestroy
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;                               // ncclCommAbort
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*) = nullptr;      // ncclCommGetAsyncError
  const char* (*get_error_string)(ncclResult_t) = nullptr;                        // ncclGetErrorString
  const char* (*get_last_error)(ncclComm_t) = nullptr;                            // ncclGetLastError (2.13+, optional)
  ncclResult_t (*all_reduce)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cu::CUstream) = nullptr;  // ncclAllReduce
  ncclResult_t (*broadcast)(const void*, void*, std::size_t, ncclDataType_t, int, ncclComm_t,
                            cu::CUstream) = nullptr;  // ncclBroadcast
  ncclResult_t (*reduce_scatter)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                 cu::CUstream) = nullptr;  // ncclReduceScatter
  ncclResult_t (*all_gather)(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t,
                             cu::CUstream) = nullptr;  // ncclAllGather
  ncclResult_t (*group_start)() = nullptr;             // ncclGroupStart
  ncclResult_t (*group_end)() = nullptr;               // ncclGroupEnd
};

using NcclState = RuntimeLibrary<NcclApi>;

/// Loads NCCL from `path` and resolves every entry point. Never throws: a failure is described
/// in the returned state's `reason`. Touches no GPU.
inline NcclState load_nccl(const std::string& path) {
  NcclState s;
  s.path = path;
  const auto t0 = std::chrono::steady_clock::now();
  s.library = open_library(path, s.reason);
  if (!s.library) return s;
  NcclApi& a = s.api;
  SymbolResolver sym(*s.library);
  sym(a.get_version, "ncclGetVersion");
  sym(a.get_unique_id, "ncclGetUniqueId");
  sym(a.comm_init_rank, "ncclCommInitRank");
  sym(a.comm_destroy, "ncclCommDestroy");
  sym(a.comm_abort, "ncclCommAbort");
  sym(a.comm_get_async_error, "ncclCommGetAsyncError");
  sym(a.get_error_string, "ncclGetErrorString");
  sym(a.get_last_error, "ncclGetLastError", false);
  sym(a.all_reduce, "ncclAllReduce");
  sym(a.broadcast, "ncclBroadcast");
  sym(a.reduce_scatter, "ncclReduceScatter");
  sym(a.all_gather, "ncclAllGather");
  sym(a.group_start, "ncclGroupStart");
  sym(a.group_end, "ncclGroupEnd");
  if (const std::string& missing = sym.missing(); !missing.empty()) {
    s.reason = "the library '" + path + "' is not a usable NCCL: it lacks " + missing;
    return s;
  }
  int version = 0;
  // ncclGetVersion's number is major·10000 + minor·100 + patch since 2.9: 22105 is 2.21.5.
  if (a.get_version(&version) != ncclSuccess) {
    s.reason = "ncclGetVersion failed for '" + path + "'";
    return s;
  }
  s.version = static_cast<std::size_t>(version);
  if (version < 21000) {
    s.reason = "the NCCL at '" + path + "' is version " + library_version_text(static_cast<std::size_t>(version)) +
               "; kiln needs 2.10 or newer (ncclAvg, ncclBfloat16)";
    return s;
  }
  s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

/// The library names tried in order when KILN_NCCL_PATH is unset.
inline std::vector<std::string> nccl_candidates() { return {"libnccl.so.2", "libnccl.so"}; }

/// KILN_NCCL_PATH when set (and nothing else), else the candidates in turn. Reads the
/// environment now; nccl_state() calls it once per process.
inline NcclState load_nccl_from_env() {
  return load_library_from_env<NcclState>("KILN_NCCL_PATH", nccl_candidates(), load_nccl,
                                          "NCCL not found (install libnccl2 or set KILN_NCCL_PATH)");
}

/// The process's NCCL, loaded on first use (thread-safe, once); never unloaded.
inline const NcclState& nccl_state() {
  static const NcclState* state = [] {
    auto* s = new NcclState(load_nccl_from_env());
    log_library_load("NCCL", *s);
    return s;
  }();
  return *state;
}

/// The NCCL data type of a kiln dtype (bool travels as uint8).
inline ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case DType::Bool:
      return ncclUint8;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

}  // namespace kiln::runtime::nccl
