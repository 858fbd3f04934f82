#pragma once
// The step executor: a graph holding library ops (matrix products, scatters) runs as its step
// plan (sched/steps.hpp): each segment of generated kernels bound once (a PreparedGraph), each
// library call by the device's library (a CBLAS on the host, cuBLASLt on the GPU), each scatter
// by its generated scatter kernels (codegen/scatter.hpp), the
// temporaries between them allocated on the graph's device before the first step that uses
// them and released after the last (stream-ordered on CUDA, so a release waits for nothing
// and a later step's temporary reuses the memory).
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/backend/dispatch.hpp"
#include "kiln/codegen/attention.hpp"
#include "kiln/codegen/scan.hpp"
#include "kiln/codegen/scatter.hpp"
#include "kiln/codegen/sort.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/index_fault.hpp"
#include "kiln/runtime/autotune.hpp"
#include "kiln/runtime/cblas.hpp"
#include "kiln/runtime/cublaslt.hpp"
#include "kiln/runtime/cudnn.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln::backend {

namespace detail {

/// Whether plans give products the epilogues of a training step (sched::plan_steps'
/// `training_epilogues`: through a row split, GELU_AUX, DGELU). On by default: on an H200 they
/// took a GELU MLP block's forward and backward (B2) from 10.29 to 10.08 ms and a GPT step from
/// 22.5 to 21.7 ms (docs/performance-gpu.md). KILN_CUBLASLT_TRAINING_EPILOGUES=0
/// plans those as generated kernels instead (to compare, or to rule the epilogues out).
inline bool training_epilogues() { return env::flag("KILN_CUBLASLT_TRAINING_EPILOGUES", true); }

inline runtime::GemmEpilogue gemm_epilogue(const sched::LibraryCall& c) {
  using E = runtime::GemmEpilogue;
  switch (c.activation) {
    case sched::Activation::None:
      return c.bias ? E::Bias : E::None;
    case sched::Activation::Relu:
      return c.bias ? E::ReluBias : E::Relu;
    case sched::Activation::GeluTanh:
      if (c.aux >= 0) return c.bias ? E::GeluAuxBias : E::GeluAux;
      return c.bias ? E::GeluBias : E::Gelu;
    case sched::Activation::GeluTanhGrad:
      return E::DGelu;
  }
  return E::None;
}

/// Runs one library product over its batch dims: the innermost batch dim whose strides merge
/// is the library's batch; any others are looped over here. `tune` (max-autotune, GPU): the
/// library's top candidate algorithms are timed on these buffers and the fastest kept.
inline void run_library_call(const sched::LibraryCall& c, const char* a, const char* b, char* out, const void* bias,
                             Device device, bool tune = false, runtime::cu::CUstream stream = nullptr,
                             void* aux = nullptr) {
  const std::size_t r = c.shape.size();
  const Strides &sa = c.a.strides, &sb = c.b.strides, &so = c.out.strides;
  struct Dim {
    std::int64_t size, a, b, o;
  };
  std::vector<Dim> batch;  // outer to inner, size-1 dims dropped, mergeable neighbours merged
  for (std::size_t d = 0; d + 2 < r; ++d) {
    if (c.shape[d] == 1) continue;
    Dim x{c.shape[d], sa[d], sb[d], so[d]};
    if (!batch.empty()) {
      Dim& p = batch.back();
      if (p.a == x.a * x.size && p.b == x.b * x.size && p.o == x.o * x.size) {
        p = Dim{p.size * x.size, x.a, x.b, x.o};
        continue;
      }
    }
    batch.push_back(x);
  }
  runtime::GemmShape s;
  s.dtype = s.out_dtype = c.dtype;
  s.m = c.shape[r - 2];
  s.n = c.shape[r - 1];
  s.k = c.a_shape[r - 1];
  s.a_rs = sa[r - 2], s.a_cs = sa[r - 1], s.b_rs = sb[r - 2], s.b_cs = sb[r - 1];
  s.d_rs = so[r - 2];
  s.epilogue = gemm_epilogue(c);
  s.bias_dtype = c.bias_dtype;
  if (c.aux >= 0) s.aux_rs = s.n;  // the planner gives the GELU's input contiguous memory
  s.allow_tf32 = c.dtype == DType::Float32 && runtime::float32_matmul_precision_setting().load() != 0;
  s.a_from = c.a_from;
  s.b_from = c.b_from;
  if (!batch.empty()) {
    s.batch = batch.back().size;
    s.a_bs = batch.back().a, s.b_bs = batch.back().b, s.d_bs = batch.back().o;
    batch.pop_back();
  }
  // Byte offsets of the looped batch dims: each operand in the dtype its memory holds.
  const std::int64_t isz = static_cast<std::int64_t>(itemsize(c.dtype));
  const std::int64_t isz_a = static_cast<std::int64_t>(itemsize(c.a_from.value_or(c.dtype)));
  const std::int64_t isz_b = static_cast<std::int64_t>(itemsize(c.b_from.value_or(c.dtype)));
  std::vector<std::int64_t> at(batch.size(), 0);
  for (;;) {
    std::int64_t oa = 0, ob = 0, oo = 0;
    for (std::size_t d = 0; d < batch.size(); ++d) {
      oa += at[d] * batch[d].a;
      ob += at[d] * batch[d].b;
      oo += at[d] * batch[d].o;
    }
    if (device.is_cpu())
      runtime::cpu_gemm(s, a + oa * isz_a, b + ob * isz_b, out + oo * isz, bias, aux);
    else if (tune)
      runtime::cublaslt_autotune(s, a + oa * isz, b + ob * isz, out + oo * isz, bias, device.index, aux);
    else
      runtime::cublaslt_matmul(s, a + oa * isz, b + ob * isz, out + oo * isz, bias, device.index, stream, aux);
    std::size_t d = batch.size();
    while (d > 0 && ++at[d - 1] == batch[d - 1].size) at[--d] = 0;
    if (d == 0) break;
  }
}

/// Launches one of kiln's own step kernels (scatter, scan, sort) as `blocks` blocks of `block`
/// threads with `shared_bytes` of dynamic shared memory and its one by-value argument `params`,
/// on `stream` (a capture) or kiln's stream.
inline void launch_step_blocks(runtime::cu::CUfunction fn, std::int64_t blocks, std::int64_t block,
                               std::int64_t shared_bytes, void** params, Device device, runtime::cu::CUstream stream,
                               const char* what) {
  if (blocks <= 0) return;
  const runtime::CudaContext& ctx = runtime::cuda_context(device.index);
  const auto& api = runtime::detail::cuda_driver_state().api;
  ctx.make_current();
  runtime::detail::cuda_check(
      api.launch_kernel(fn, static_cast<unsigned>(blocks), 1, 1, static_cast<unsigned>(block), 1, 1,
                        static_cast<unsigned>(shared_bytes), stream ? stream : ctx.stream, params, nullptr),
      "cuLaunchKernel", [&] { return std::string(what) + " kernel on cuda:" + std::to_string(device.index); });
  if (!stream) kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
}

/// Launches one of kiln's own step kernels over `threads` threads, 256 a block.
inline void launch_step_kernel(runtime::cu::CUfunction fn, std::int64_t threads, void** params, Device device,
                               runtime::cu::CUstream stream, const char* what) {
  if (threads > 0) launch_step_blocks(fn, (threads + 255) / 256, 256, 0, params, device, stream, what);
}

/// A scatter step's compiled code: the CPU's function, or the GPU's three kernels.
struct ScatterKernels {
  codegen::ScatterSource source;
  std::shared_ptr<runtime::SharedLibrary> library;
  int (*cpu)(void* const*, int) = nullptr;
  runtime::cu::CUfunction check = nullptr, init = nullptr, scatter = nullptr;
  runtime::cu::CUfunction reserve = nullptr, place = nullptr, order = nullptr;  ///< sorted runs' counting sort
};

inline ScatterKernels build_scatter(const sched::ScatterCall& c, Device device) {
  ScatterKernels k;
  if (device.is_cpu()) {
    k.source = codegen::generate_cpu_scatter(c, "kiln_scatter");
    k.library = runtime::CpuModuleCache::instance().get(k.source.source);
    k.cpu = reinterpret_cast<int (*)(void* const*, int)>(k.library->symbol(k.source.entry.c_str()));
    return k;
  }
  k.source = codegen::generate_cuda_scatter(c, "kiln_scatter");
  auto& cache = runtime::CudaModuleCache::instance();
  k.check = cache.get_function(k.source.source, k.source.check, device.index);
  k.scatter = cache.get_function(k.source.source, k.source.scatter, device.index);
  if (k.source.sorted_runs) {
    if (!k.source.linked) {
      k.reserve = cache.get_function(k.source.source, k.source.reserve, device.index);
      k.place = cache.get_function(k.source.source, k.source.place, device.index);
      k.order = cache.get_function(k.source.source, k.source.order, device.index);
    }
  } else {
    k.init = cache.get_function(k.source.source, k.source.init, device.index);
  }
  return k;
}

/// Runs a scatter's kernels `k` over {base, index, src, out} (`flag`: the GPU's range flag, an int of
/// device memory); `stream` (GPU): queue it there (a CUDA graph capture), not on kiln's stream.
inline void run_scatter(const ScatterKernels& k, void* const (&operands)[4], void* flag, Device device,
                        runtime::cu::CUstream stream = nullptr) {
  if (device.is_cpu()) {
    if (k.cpu(operands, detail::cpu_threads()) != 0) kiln::detail::raise_host_index_fault();
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const runtime::CudaContext& ctx = runtime::cuda_context(device.index);
  const auto& api = runtime::detail::cuda_driver_state().api;
  ctx.make_current();
  runtime::cu::CUstream on = stream ? stream : ctx.stream;
  runtime::detail::cuda_check(api.memset_d8_async(runtime::detail::device_address(flag), 0,
                                                  static_cast<std::size_t>(k.source.zero_bytes), on),
                              "cuMemsetD8Async", "clearing a scatter's range flag");
  struct {
    void* p[5];
  } a{{operands[0], operands[1], operands[2], operands[3], flag}};
  void* params[] = {&a};
  launch_step_kernel(k.check, k.source.index_elements, params, device, stream, "a scatter's check");
  if (k.source.sorted_runs) {
    // Counted runs: each target's places reserved, each position placed, each run ordered
    // (linked runs were built by the check).
    if (!k.source.linked) {
      launch_step_blocks(k.reserve, k.source.reserve_blocks, 1024, 0, params, device, stream,
                         "a scatter's run reservation");
      launch_step_kernel(k.place, k.source.positions, params, device, stream, "a scatter's placement");
      launch_step_kernel(k.order, k.source.positions, params, device, stream, "a scatter's run order");
    }
  } else {
    launch_step_kernel(k.init, k.source.out_elements, params, device, stream, "a scatter's init");
  }
  launch_step_kernel(k.scatter, k.source.scatter_threads, params, device, stream, "a scatter's");
}

/// A scan or sort step's compiled code (one unit, one entry): the CPU's function or the GPU's kernel.
template <class Source>
struct RowStepKernels {
  Source source;
  std::shared_ptr<runtime::SharedLibrary> library;
  int (*cpu)(void* const*, int) = nullptr;
  runtime::cu::CUfunction kernel = nullptr;
};
using ScanKernels = RowStepKernels<codegen::ScanSource>;
using SortKernels = RowStepKernels<codegen::SortSource>;

/// `source`'s entry compiled for `device` (through the module caches); `empty`: nothing to run,
/// nothing compiled.
template <class Source>
RowStepKernels<Source> bind_row_step(Source source, Device device, bool empty = false) {
  RowStepKernels<Source> k;
  k.source = std::move(source);
  if (empty) return k;
  if (device.is_cpu()) {
    k.library = runtime::CpuModuleCache::instance().get(k.source.source);
    k.cpu = reinterpret_cast<int (*)(void* const*, int)>(k.library->symbol(k.source.entry.c_str()));
  } else {
    k.kernel = runtime::CudaModuleCache::instance().get_function(k.source.source, k.source.entry, device.index);
  }
  return k;
}

inline ScanKernels build_scan(const sched::ScanCall& c, Device device) {
  return bind_row_step(device.is_cpu() ? codegen::generate_cpu_scan(c, "kiln_scan")
                                       : codegen::generate_cuda_scan(c, "kiln_scan"),
                       device);
}

/// On the CPU, runs step `k`'s function over {src, out} and says so; on a GPU, does nothing.
template <class Source>
bool ran_on_host(const RowStepKernels<Source>& k, void* src, void* out, Device device) {
  if (!device.is_cpu()) return false;
  void* const operands[2] = {src, out};
  k.cpu(operands, detail::cpu_threads());
  kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

/// Runs scan `c` from `src` into `out`; `stream` (GPU): queue it there (a CUDA graph capture).
inline void run_scan(const ScanKernels& k, void* src, void* out, Device device, runtime::cu::CUstream stream = nullptr) {
  if (ran_on_host(k, src, out, device)) return;
  struct {
    void* p[2];
  } a{{src, out}};
  void* params[] = {&a};
  launch_step_kernel(k.kernel, k.source.threads, params, device, stream, "a scan");
}

inline SortKernels build_sort(const sched::SortCall& c, Device device) {
  SortKernels k = bind_row_step(device.is_cpu() ? codegen::generate_cpu_sort(c, "kiln_sort")
                                                : codegen::generate_cuda_sort(c, "kiln_sort"),
                                device, c.rows() == 0);
  if (k.kernel && k.source.shared_bytes > 48 * 1024)
    runtime::set_max_dynamic_shared(runtime::cuda_context(device.index), k.kernel,
                                    static_cast<int>(k.source.shared_bytes));
  return k;
}

/// Runs sort `k` from `src` into `out` (`scratch`: the GPU's rows in global memory, or null);
/// `stream` (GPU): queue it there (a CUDA graph capture).
inline void run_sort(const SortKernels& k, void* src, void* out, void* scratch, Device device,
                     runtime::cu::CUstream stream = nullptr) {
  if (k.source.rows == 0 || ran_on_host(k, src, out, device)) return;
  struct {
    void* p[3];
  } a{{src, out, scratch}};
  void* params[] = {&a};
  launch_step_blocks(k.kernel, k.source.grid, k.source.block, k.source.shared_bytes, params, device, stream, "a sort");
}

/// An attention step's code: cuDNN's plan where cuDNN takes the call (GPU), else the CPU's entries
/// or the GPU's generated kernels, run in order.
struct AttentionKernels {
  codegen::AttentionSource source;
  std::shared_ptr<runtime::SharedLibrary> library;
  std::vector<int (*)(void* const*, int)> cpu;
  std::vector<runtime::cu::CUfunction> kernels;
  std::shared_ptr<const runtime::CudnnAttentionPlan> cudnn;
  /// With a cuDNN forward plan: the kernel that keeps its rows whose scores are all -inf at
  /// torch's values, run after it (codegen::cuda_library_attention_rows).
  codegen::AttentionSource rows;
  runtime::cu::CUfunction rows_kernel = nullptr;
  /// With a cuDNN backward plan: the kernel that copies the forward's lse into the plan's
  /// scratch with +inf for -inf, run before it (codegen::cuda_library_attention_backward_stats).
  codegen::AttentionSource stats;
  runtime::cu::CUfunction stats_kernel = nullptr;
  /// With a cuDNN plan: the generated kernels, built on first need (a run whose pointers break
  /// the plan's 16-byte alignment).
  struct Fallback;
  std::shared_ptr<Fallback> fallback;
};
struct AttentionKernels::Fallback {
  std::once_flag once;
  sched::AttentionCall call;
  AttentionKernels kernels;
};

/// Whether `c` is a problem cuDNN's fused attention may take, as `p`; else `why` says why not.
inline bool cudnn_attention_problem(const sched::AttentionCall& c, int device, runtime::CudnnAttentionProblem& p,
                                    std::string& why) {
  if (c.dtype != DType::Float16 && c.dtype != DType::BFloat16) {
    why = std::string("its dtype is ") + dtype_name(c.dtype) + ", not a half type";
    return false;
  }
  if (c.has_mask) return why = "it has a mask", false;
  // cuDNN's dropout draws its own numbers: kiln's mask (the one a written-out dropout of the
  // same key draws) is the generated kernels'.
  if (c.has_dropout()) return why = "it has dropout", false;
  if (c.batch == 0 || c.heads == 0 || c.q_len == 0 || c.kv_len == 0 || c.head_dim == 0 || c.value_dim == 0)
    return why = "it is empty", false;
  if (c.group() != 1) return why = "its keys have fewer heads than its queries", false;
  if (c.head_dim % 8 != 0 || c.value_dim % 8 != 0 || c.head_dim > 256 || c.value_dim > 256)
    return why = "its feature dims are not multiples of 8 up to 256", false;
  const bool backward = c.kind == sched::AttentionCall::Backward;
  const sched::Slot* slots[8] = {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv};
  const int needed = backward ? 5 : 4;
  if (backward && !c.wants(c.lse)) return why = "its backward has no saved lse", false;
  if (c.wants(c.lse) && c.lse.strides != Strides{c.heads * c.q_len, c.q_len, 1})
    return why = "its lse is not a contiguous [B, H, L]", false;
  for (int i = 0; i < 8; ++i) {
    const sched::Slot& s = *slots[i];
    if (!c.wants(s)) {
      if (i < needed)
        return why = "an operand cuDNN needs is absent (the forward's output, or the backward's dout)", false;
      continue;
    }
    if (s.strides.size() != 4 || s.strides[3] != 1) return why = "an operand's last dim is not contiguous", false;
    for (int d = 0; d < 3; ++d) {
      if (s.strides[static_cast<std::size_t>(d)] % 8 != 0)
        return why = "an operand's strides are not multiples of 16 bytes", false;
      p.strides[i][d] = s.strides[static_cast<std::size_t>(d)];
    }
  }
  p.backward = backward;
  p.dtype = c.dtype;
  p.batch = c.batch;
  p.heads = c.heads;
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.head_dim = c.head_dim;
  p.value_dim = c.value_dim;
  p.causal = c.causal;
  p.scale = c.scale;
  p.wants_lse = c.wants(c.lse);
  p.wants[0] = c.wants(c.dq);
  p.wants[1] = c.wants(c.dk);
  p.wants[2] = c.wants(c.dv);
  p.device = device;
  return true;
}

/// KILN_ATTENTION: "generated" keeps every attention on kiln's own kernels.
inline bool attention_library_allowed() { return env::get("KILN_ATTENTION", "auto") != "generated"; }

inline void build_generated_attention(const sched::AttentionCall& c, Device device, AttentionKernels& k) {
  if (device.is_cpu()) {
    k.source = codegen::generate_cpu_attention(c, "kiln_attention");
    if (k.source.entries.empty()) return;
    k.library = runtime::CpuModuleCache::instance().get(k.source.source);
    for (const auto& e : k.source.entries)
      k.cpu.push_back(reinterpret_cast<int (*)(void* const*, int)>(k.library->symbol(e.name.c_str())));
    return;
  }
  k.source = codegen::generate_cuda_attention(c, "kiln_attention");
  auto& cache = runtime::CudaModuleCache::instance();
  for (const auto& e : k.source.entries) {
    k.kernels.push_back(cache.get_function(k.source.source, e.name, device.index));
    if (e.shared_bytes > 48 * 1024)
      runtime::set_max_dynamic_shared(runtime::cuda_context(device.index), k.kernels.back(),
                                      static_cast<int>(e.shared_bytes));
  }
}

/// A GPU attention goes to cuDNN when it loads and takes the problem (its Hopper kernels are
/// several times faster than the generated ones), else to the generated kernels; a `schedule`
/// log line says which, and why.
inline AttentionKernels build_attention(const sched::AttentionCall& c, Device device) {
  AttentionKernels k;
  if (!device.is_cpu() && attention_library_allowed()) {
    runtime::CudnnAttentionProblem p;
    std::string why;
    if (cudnn_attention_problem(c, device.index, p, why)) {
      k.cudnn = runtime::cudnn_attention_plan(p, &why);
      if (k.cudnn) {
        if (c.kind == sched::AttentionCall::Forward) {
          k.rows = codegen::cuda_library_attention_rows(c, "kiln_attention_rows");
          k.rows_kernel = runtime::CudaModuleCache::instance().get_function(k.rows.source, k.rows.entries.front().name,
                                                                            device.index);
        } else {
          k.stats = codegen::cuda_library_attention_backward_stats(c, "kiln_attention_stats");
          k.stats_kernel = runtime::CudaModuleCache::instance().get_function(
              k.stats.source, k.stats.entries.front().name, device.index);
        }
        log(LogChannel::schedule, p.str() + ": cuDNN's fused attention");
        k.fallback = std::make_shared<AttentionKernels::Fallback>();
        k.fallback->call = c;
        return k;
      }
    }
    log(LogChannel::schedule,
        std::string(c.kind == sched::AttentionCall::Backward ? "attention backward" : "attention") +
            ": kiln's kernels, not cuDNN's: " + why);
  }
  build_generated_attention(c, device, k);
  return k;
}

/// Runs attention `k` over its argument list (codegen/c/attention.hpp); `stream` (GPU): queue
/// it there (a CUDA graph capture); `tune`: max-autotune's first run (cuDNN's configurations
/// are timed on these arguments first).
inline void run_attention(const AttentionKernels& k, const std::vector<void*>& args, Device device,
                          runtime::cu::CUstream stream = nullptr, bool tune = false) {
  if (k.cudnn) {
    if (k.cudnn->fits(args)) {
      // Both fix-ups take two pointers: the lse and the output (forward), or the forward's lse
      // and the copy the plan reads (backward).
      auto fix_up = [&](runtime::cu::CUfunction kernel, const codegen::AttentionSource& source, void* a0, void* a1) {
        struct {
          void* p[2];
        } a{{a0, a1}};
        void* params[] = {&a};
        const auto& e = source.entries.front();
        launch_step_blocks(kernel, e.grid, e.block, 0, params, device, stream, "an attention's fix-up");
      };
      auto copy_stats = [&] {
        if (k.stats_kernel) fix_up(k.stats_kernel, k.stats, args[6], k.cudnn->stats(args));
      };
      if (tune) k.cudnn->autotune(args, copy_stats);
      copy_stats();
      k.cudnn->run(args, stream);
      if (k.rows_kernel) fix_up(k.rows_kernel, k.rows, k.cudnn->stats(args), args[4]);
      if (!stream) kiln::detail::counters().library_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    std::call_once(k.fallback->once, [&] { build_generated_attention(k.fallback->call, device, k.fallback->kernels); });
    return run_attention(k.fallback->kernels, args, device, stream);
  }
  if (device.is_cpu()) {
    for (auto fn : k.cpu) {
      fn(args.data(), detail::cpu_threads());
      kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  // The kernels take the pointers as one struct by value: its bytes are the argument.
  struct {
    void* p[12];
  } a{};
  for (std::size_t i = 0; i < args.size() && i < 12; ++i) a.p[i] = args[i];
  void* params[] = {&a};
  for (std::size_t i = 0; i < k.kernels.size(); ++i) {
    const auto& e = k.source.entries[i];
    launch_step_blocks(k.kernels[i], e.grid, e.block, e.shared_bytes, params, device, stream, "an attention");
  }
}

}  // namespace detail

/// A graph's steps bound to their executors: built once per structure, run many times.
///
/// max-autotune on the GPU, where the plan fuses an epilogue into a library call: the plan
/// without fused epilogues (the plain product, the epilogue in the generated kernel after it)
/// is built too, both are timed on the first run's inputs (into private outputs), and the
/// fused one is kept unless the other is clearly faster; the choice is kept in memory and in
/// the disk cache.
class StepProgram {
 public:
  /// One plan with its segments bound.
  struct Variant {
    sched::StepPlan plan;
    std::vector<std::unique_ptr<PreparedGraph>> segments;
    std::vector<detail::ScatterKernels> scatters;
    std::vector<detail::ScanKernels> scans;
    std::vector<detail::SortKernels> sorts;
    std::vector<detail::AttentionKernels> attentions;
    const char* name = "fused";
    /// Per step of plan.order: the temporaries it is the first to use (allocated just before
    /// it) and the last (released just after it), so a run holds only the temporaries live
    /// across the step it is at, not all of them.
    std::vector<std::vector<int>> allocate_before, release_after;
  };

  StepProgram(const ir::Graph& g, Mode mode, CpuLaunchOptions launch)
      : graph_(g), autotune_(launch.autotune && g.device.is_cuda()) {
    const bool cuda = g.device.is_cuda(), fuse = cuda || launch.host_epilogues;
    variants_.push_back(make_variant(
        sched::plan_steps(g, fuse, launch.host_epilogues || detail::training_epilogues()), mode, launch,
        fuse ? "fused" : "plain"));
    if (autotune_ && fuses_an_epilogue(variants_[0]->plan))
      variants_.push_back(make_variant(sched::plan_steps(g, false), mode, launch, "unfused"));
    chosen_.store(variants_[0].get(), std::memory_order_release);
    if (log_enabled(LogChannel::schedule)) log(LogChannel::schedule, "steps:\n" + variants_[0]->plan.str());
  }

  void run(const RunArgs& args) const {
    // max-autotune: the first run times each call's candidate algorithms on its buffers (the
    // choice is kept with the call's descriptors) and picks the faster variant.
    const bool tune = autotune_ && !tuned_.exchange(true);
    if (tune) choose(args);
    run_variant(*chosen_.load(std::memory_order_acquire), args, tune);
  }

  /// The plan in use (the chosen one once the first max-autotune run has timed them).
  const sched::StepPlan& plan() const { return chosen().plan; }
  const Variant& chosen() const { return *chosen_.load(std::memory_order_acquire); }
  const ir::Graph& graph() const { return graph_; }
  bool autotuned() const { return autotune_; }

  /// Runs `v`, each temporary allocated before the first step that uses it and released after
  /// the last (stream-ordered on the GPU: a release is queued behind the work that reads it, and
  /// the pool hands the memory to a later step's temporaries). A training step's backward runs
  /// as one plan; holding every gradient it passes through until the end of the run would make
  /// its peak the sum of them.
  void run_variant(const Variant& v, const RunArgs& args, bool tune) const {
    std::vector<StoragePtr> temps(v.plan.temps.size());
    for (std::size_t i = 0; i < v.plan.order.size(); ++i) {
      for (int t : v.allocate_before[i]) temps[static_cast<std::size_t>(t)] = allocate_temp(v.plan, t);
      run_step(v, v.plan.order[i], args, temps, tune);
      for (int t : v.release_after[i]) temps[static_cast<std::size_t>(t)].reset();
    }
  }

  void run_step(const Variant& v, const sched::Step& st, const RunArgs& args, const std::vector<StoragePtr>& temps,
                bool tune) const {
    const auto i = static_cast<std::size_t>(st.index);
    switch (st.kind) {
      case sched::Step::Call:
        return run_call(v.plan.calls[i], args, temps, tune, nullptr);
      case sched::Step::Scatter:
        return run_scatter_step(v, i, args, temps, nullptr);
      case sched::Step::Scan:
        return run_scan_step(v, i, args, temps, nullptr);
      case sched::Step::Sort:
        return run_sort_step(v, i, args, temps, nullptr);
      case sched::Step::Attention:
        return run_attention_step(v, i, args, temps, nullptr, tune);
      case sched::Step::Kernels:
        return v.segments[i]->run(segment_args(v.plan.segments[i], args, temps));
    }
  }

  StoragePtr allocate_temp(const sched::StepPlan& plan, int t) const {
    const sched::StepTemp& tt = plan.temps[static_cast<std::size_t>(t)];
    return backend::allocate(static_cast<std::size_t>(tt.shape.numel()) * itemsize(tt.dtype), graph_.device);
  }

  /// Every temporary at once (a captured CUDA graph needs fixed addresses for the whole run).
  std::vector<StoragePtr> allocate_temps(const sched::StepPlan& plan) const {
    std::vector<StoragePtr> temps;
    temps.reserve(plan.temps.size());
    for (std::size_t t = 0; t < plan.temps.size(); ++t) temps.push_back(allocate_temp(plan, static_cast<int>(t)));
    return temps;
  }

  /// Where slot `s` is for a run over `args` with temporaries `temps`.
  static char* address(const sched::Slot& s, const RunArgs& args, const std::vector<StoragePtr>& temps) {
    switch (s.kind) {
      case sched::Slot::Leaf:
        return const_cast<char*>(static_cast<const char*>(args.inputs[static_cast<std::size_t>(s.index)])) +
               s.byte_offset;
      case sched::Slot::Output:
        return static_cast<char*>(args.outputs[static_cast<std::size_t>(s.index)]) + s.byte_offset;
      case sched::Slot::Temp:
        return static_cast<char*>(temps[static_cast<std::size_t>(s.index)]->data) + s.byte_offset;
      case sched::Slot::None:
        break;
    }
    throw InternalError("kiln: step plan: an unbound slot");
  }

  static RunArgs segment_args(const sched::Segment& seg, const RunArgs& args, const std::vector<StoragePtr>& temps) {
    RunArgs a;
    for (const auto& l : seg.leaves) a.inputs.push_back(address(l, args, temps));
    for (const auto& o : seg.outputs) a.outputs.push_back(address(o, args, temps));
    return a;
  }

  /// Scatter `i` of variant `v`; `stream` (GPU): queue it there (a CUDA graph capture).
  void run_scatter_step(const Variant& v, std::size_t i, const RunArgs& args, const std::vector<StoragePtr>& temps,
                        runtime::cu::CUstream stream) const {
    const sched::ScatterCall& c = v.plan.scatters[i];
    void* const operands[4] = {c.base_constant ? nullptr : address(c.base, args, temps), address(c.index, args, temps),
                               address(c.src, args, temps), address(c.out, args, temps)};
    detail::run_scatter(v.scatters[i], operands, temps[static_cast<std::size_t>(c.flag)]->data, graph_.device,
                        stream);
  }

  /// Scan `i` of variant `v`; `stream` (GPU): queue it there (a CUDA graph capture).
  void run_scan_step(const Variant& v, std::size_t i, const RunArgs& args, const std::vector<StoragePtr>& temps,
                     runtime::cu::CUstream stream) const {
    const sched::ScanCall& c = v.plan.scans[i];
    detail::run_scan(v.scans[i], address(c.src, args, temps), address(c.result, args, temps), graph_.device, stream);
  }

  /// Sort `i` of variant `v`; `stream` (GPU): queue it there (a CUDA graph capture).
  void run_sort_step(const Variant& v, std::size_t i, const RunArgs& args, const std::vector<StoragePtr>& temps,
                     runtime::cu::CUstream stream) const {
    const sched::SortCall& c = v.plan.sorts[i];
    detail::run_sort(v.sorts[i], address(c.src, args, temps), address(c.result, args, temps),
                     c.scratch >= 0 ? temps[static_cast<std::size_t>(c.scratch)]->data : nullptr, graph_.device,
                     stream);
  }

  /// Attention `i` of variant `v`; `stream` (GPU): queue it there (a CUDA graph capture).
  /// `tune` (max-autotune's first run): cuDNN's engine configurations are timed first.
  void run_attention_step(const Variant& v, std::size_t i, const RunArgs& args, const std::vector<StoragePtr>& temps,
                          runtime::cu::CUstream stream, bool tune = false) const {
    const sched::AttentionCall& c = v.plan.attentions[i];
    auto at = [&](const sched::Slot& s) -> void* {
      return s.kind == sched::Slot::None ? nullptr : static_cast<void*>(address(s, args, temps));
    };
    std::vector<void*> a{at(c.q), at(c.k), at(c.v), at(c.mask)};
    if (c.kind == sched::AttentionCall::Forward) {
      a.push_back(at(c.out));
      a.push_back(at(c.lse));
    } else {
      for (const sched::Slot* s : {&c.out, &c.dout, &c.lse, &c.dq, &c.dk, &c.dv}) a.push_back(at(*s));
      a.push_back(temps[static_cast<std::size_t>(c.delta)]->data);
    }
    a.push_back(at(c.seed));
    detail::run_attention(v.attentions[i], a, graph_.device, stream, tune);
  }

  /// One library call; `stream` (GPU): queue it there (a CUDA graph capture), not on kiln's stream.
  void run_call(const sched::LibraryCall& c, const RunArgs& args, const std::vector<StoragePtr>& temps, bool tune,
                runtime::cu::CUstream stream) const {
    detail::run_library_call(c, address(c.a, args, temps), address(c.b, args, temps), address(c.out, args, temps),
                             c.bias ? address(c.bias_slot, args, temps) : nullptr, graph_.device, tune, stream,
                             c.aux >= 0 ? address(c.aux_slot, args, temps) : nullptr);
    if (!stream) kiln::detail::counters().library_calls.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  static bool fuses_an_epilogue(const sched::StepPlan& p) {
    for (const auto& c : p.calls)
      if (c.bias || c.activation != sched::Activation::None) return true;
    return false;
  }

  std::unique_ptr<Variant> make_variant(sched::StepPlan plan, Mode mode, CpuLaunchOptions launch,
                                        const char* name) const {
    auto v = std::make_unique<Variant>();
    v->plan = std::move(plan);
    v->name = name;
    const std::size_t steps = v->plan.order.size();
    v->allocate_before.assign(steps, {});
    v->release_after.assign(steps, {});
    std::vector<int> first(v->plan.temps.size(), -1), last(v->plan.temps.size(), -1);
    for (std::size_t i = 0; i < steps; ++i)
      for (int t : v->plan.temps_of(v->plan.order[i])) {
        if (first[static_cast<std::size_t>(t)] < 0) first[static_cast<std::size_t>(t)] = static_cast<int>(i);
        last[static_cast<std::size_t>(t)] = static_cast<int>(i);
      }
    for (std::size_t t = 0; t < first.size(); ++t)
      if (first[t] >= 0) {
        v->allocate_before[static_cast<std::size_t>(first[t])].push_back(static_cast<int>(t));
        v->release_after[static_cast<std::size_t>(last[t])].push_back(static_cast<int>(t));
      }
    for (const auto& seg : v->plan.segments)
      v->segments.push_back(std::make_unique<PreparedGraph>(seg.graph, mode, launch));
    // The segments' kernels compile side by side now, not one per segment as the first run
    // meets them (max-autotune compiles its candidates when it times them). Meanwhile a thread
    // of its own loads cuBLASLt for the plan's products and makes the attentions' cuDNN plans:
    // on a machine that has not read those libraries from disk yet, loading cuBLASLt and a
    // process's first cuDNN plan take about half a second and a second.
    const bool precompile = graph_.device.is_cuda() && mode != Mode::Eager && !launch.autotune;
    std::vector<detail::AttentionKernels> attentions(v->plan.attentions.size());
    std::exception_ptr attention_error;
    auto build_attentions = [&] {
      try {
        for (std::size_t i = 0; i < attentions.size(); ++i)
          attentions[i] = detail::build_attention(v->plan.attentions[i], graph_.device);
      } catch (...) {
        attention_error = std::current_exception();
      }
    };
    if (precompile) {
      std::vector<const ir::Graph*> graphs;
      for (const auto& seg : v->plan.segments) graphs.push_back(&seg.graph);
      struct JoinedThread {  // joined however the scope ends
        std::thread thread;
        ~JoinedThread() {
          if (thread.joinable()) thread.join();
        }
      } libraries;
      if (!attentions.empty() || !v->plan.calls.empty())
        libraries.thread = std::thread([&] {
          if (!v->plan.calls.empty()) runtime::cublaslt_available();  // loads it; never throws
          build_attentions();
        });
      precompile_cuda_graphs(graphs);
    } else {
      build_attentions();
    }
    if (attention_error) std::rethrow_exception(attention_error);
    for (const auto& sc : v->plan.scatters) v->scatters.push_back(detail::build_scatter(sc, graph_.device));
    for (const auto& sc : v->plan.scans) v->scans.push_back(detail::build_scan(sc, graph_.device));
    for (const auto& sc : v->plan.sorts) v->sorts.push_back(detail::build_sort(sc, graph_.device));
    v->attentions = std::move(attentions);
    return v;
  }

  // Times the variants into private outputs (so that outputs aliasing inputs are written once,
  // by the real run) with CUDA events; the fused plan (variant 0) is kept unless the other
  // beats it clearly (runtime::pick_fastest_by, as kernel tuning).
  void choose(const RunArgs& args) const {
    if (variants_.size() < 2) return;
    const runtime::CudaContext& ctx = runtime::cuda_context(graph_.device.index);
    const std::string key = "steps-epilogue|" + ctx.name + "|" + ctx.arch() + "|" + kiln::detail::hex64(graph_.key) +
                            "|" + std::to_string(graph_.nodes.size());
    if (auto stored = runtime::load_tuning(key)) {
      for (const auto& v : variants_)
        if (*stored == v->name) {
          chosen_.store(v.get(), std::memory_order_release);
          return;
        }
    }
    RunArgs priv;
    priv.inputs = args.inputs;
    std::vector<StoragePtr> outs;
    for (std::size_t o = 0; o < graph_.outputs.size(); ++o) {
      const ir::GraphNode& n = graph_.nodes[static_cast<std::size_t>(graph_.outputs[o])];
      const std::int64_t span = detail::span_elements(n.shape, graph_.output_strides[o]);
      if (span < 0) return;  // negative output strides: keep the fused plan untimed
      outs.push_back(backend::allocate(static_cast<std::size_t>(span) * itemsize(n.dtype), graph_.device));
      priv.outputs.push_back(outs.back()->data);
    }
    // Each variant's calls tune their algorithms in a first run.
    for (const auto& v : variants_) run_variant(*v, priv, true);
    runtime::CudaEvent start(ctx), stop(ctx);
    auto time = [&](std::size_t i, int reps) {
      run_variant(*variants_[i], priv, false);
      double best = 1e300;
      for (int r = 0; r < std::max(1, reps); ++r) {
        start.record();
        run_variant(*variants_[i], priv, false);
        stop.record();
        stop.synchronize();
        best = std::min(best, static_cast<double>(stop.elapsed_ms_since(start)) * 1e-3);
      }
      return best;
    };
    std::vector<double> seconds;
    const std::size_t best = runtime::pick_fastest_by(variants_.size(), time, {}, &seconds);
    chosen_.store(variants_[best].get(), std::memory_order_release);
    runtime::store_tuning(key, variants_[best]->name);
    if (log_enabled(LogChannel::perf)) {
      char text[128];
      std::snprintf(text, sizeof text, ": epilogues fused into the library calls %.4f ms, as kernels %.4f ms; %s",
                    seconds[0] * 1e3, seconds[1] * 1e3, variants_[best]->name);
      log(LogChannel::perf, "max-autotune steps of graph " + kiln::detail::hex64(graph_.key) + text);
    }
  }

  ir::Graph graph_;
  std::vector<std::unique_ptr<Variant>> variants_;
  mutable std::atomic<const Variant*> chosen_{nullptr};
  bool autotune_ = false;
  mutable std::atomic<bool> tuned_{false};
};

/// A graph run as steps, captured into a CUDA graph (reduce-overhead, max-autotune): the
/// segments' kernels and the cuBLASLt calls in one stream capture, over buffers fixed for
/// the instance (its temporaries included).
class StepCaptureWork final : public CudaCaptureWork {
 public:
  explicit StepCaptureWork(std::shared_ptr<const StepProgram> program) : program_(std::move(program)) {}

  std::shared_ptr<const void> prepare(const RunArgs& bound) const override {
    // One plain run first: kernels compiled and loaded, cuBLASLt plans made (handle,
    // workspace, heuristic query: none of it may happen while capturing), max-autotune's
    // choices settled. It reads the instance's input buffers before any input is copied in, so
    // the range faults its gathers and scatters find there are no user's: dropped (a fault of
    // earlier work is raised first).
    const runtime::CudaContext& ctx = runtime::cuda_context(program_->graph().device.index);
    ctx.synchronize();
    program_->run(bound);
    auto b = std::make_shared<Binding>();
    b->variant = &program_->chosen();
    b->temps = program_->allocate_temps(b->variant->plan);
    const bool tuned = program_->autotuned();
    for (const auto& seg : b->variant->plan.segments) {
      Binding::Kernels k;
      k.args = StepProgram::segment_args(seg, bound, b->temps);
      k.plan = tuned ? detail::tuned_cuda_plan(seg.graph, detail::alignment_of(k.args), k.args)
                     : detail::CudaPlanCache::instance().get(seg.graph, detail::alignment_of(k.args));
      if (!k.plan->temp_offsets.empty()) k.temps = runtime::allocate_cuda(k.plan->temp_total, seg.graph.device.index);
      b->kernel_count += k.plan->functions.size();
      b->segments.push_back(std::move(k));
    }
    b->call_count = b->variant->plan.calls.size();
    ctx.synchronize_discarding_faults();
    for (const auto& k : b->variant->scatters)
      b->kernel_count += (k.source.index_elements > 0) + (k.source.out_elements > 0) + (k.source.scatter_threads > 0) +
                         (k.source.sorted_runs && !k.source.linked ? 3 : 0);
    for (const auto& k : b->variant->scans) b->kernel_count += k.source.threads > 0;
    for (const auto& k : b->variant->sorts) b->kernel_count += k.source.rows > 0;
    for (const auto& k : b->variant->attentions) {
      if (k.cudnn) ++b->call_count;
      b->kernel_count += (k.rows_kernel != nullptr) + (k.stats_kernel != nullptr);  // the library's fix-ups
      for (const auto& e : k.source.entries) b->kernel_count += e.grid > 0;
    }
    return b;
  }

  void record(const RunArgs& bound, const void* prepared, runtime::cu::CUstream stream) const override {
    const Binding& b = *static_cast<const Binding*>(prepared);
    const runtime::CudaContext& ctx = runtime::cuda_context(program_->graph().device.index);
    for (const sched::Step& st : b.variant->plan.order) {
      if (st.kind == sched::Step::Call) {
        program_->run_call(b.variant->plan.calls[static_cast<std::size_t>(st.index)], bound, b.temps, false, stream);
        continue;
      }
      if (st.kind == sched::Step::Scatter) {
        program_->run_scatter_step(*b.variant, static_cast<std::size_t>(st.index), bound, b.temps, stream);
        continue;
      }
      if (st.kind == sched::Step::Scan) {
        program_->run_scan_step(*b.variant, static_cast<std::size_t>(st.index), bound, b.temps, stream);
        continue;
      }
      if (st.kind == sched::Step::Sort) {
        program_->run_sort_step(*b.variant, static_cast<std::size_t>(st.index), bound, b.temps, stream);
        continue;
      }
      if (st.kind == sched::Step::Attention) {
        program_->run_attention_step(*b.variant, static_cast<std::size_t>(st.index), bound, b.temps, stream);
        continue;
      }
      const Binding::Kernels& k = b.segments[static_cast<std::size_t>(st.index)];
      detail::enqueue_cuda_plan(*k.plan, ctx, k.args.inputs.data(), k.plan->leaves, k.args.outputs.data(),
                                k.args.outputs.size(), k.temps ? static_cast<char*>(k.temps->data) : nullptr, stream);
    }
  }

  void run(const RunArgs& args) const override { program_->run(args); }
  std::size_t kernels(const void* prepared) const override {
    return static_cast<const Binding*>(prepared)->kernel_count;
  }
  std::size_t library_calls(const void* prepared) const override {
    return static_cast<const Binding*>(prepared)->call_count;
  }

 private:
  struct Binding {
    struct Kernels {
      RunArgs args;
      std::shared_ptr<const detail::CudaPlan> plan;
      StoragePtr temps;
    };
    const StepProgram::Variant* variant = nullptr;
    std::vector<StoragePtr> temps;
    std::vector<Kernels> segments;
    std::size_t kernel_count = 0, call_count = 0;
  };
  std::shared_ptr<const StepProgram> program_;
};

namespace detail {

/// Step programs of the graphs lazy evaluation runs (not prepared by their caller), by structure.
class StepProgramCache {
 public:
  static StepProgramCache& instance() {
    static StepProgramCache* c = new StepProgramCache;  // leaked: programs may run during exit
    return *c;
  }
  std::shared_ptr<const StepProgram> get(const ir::Graph& g, Mode mode) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = programs_[g.key];
    for (auto& [m, p] : list)
      if (m == mode && ir::same_graph(p->graph(), g)) return p;
    auto p = std::make_shared<const StepProgram>(g, mode, CpuLaunchOptions{});
    list.emplace_back(mode, p);
    return p;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    programs_.clear();
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::vector<std::pair<Mode, std::shared_ptr<const StepProgram>>>> programs_;
};

}  // namespace detail

inline void run_steps(const ir::Graph& g, const RunArgs& args, Mode mode) {
  detail::StepProgramCache::instance().get(g, mode)->run(args);
}

/// A CUDA graph runner of `g` (which holds library calls): its step program captured.
inline std::shared_ptr<CudaGraphRunner> step_cuda_graph_runner(ir::Graph g, std::size_t max_instances, bool autotune) {
  CpuLaunchOptions launch;
  launch.autotune = autotune;
  auto work = std::make_shared<const StepCaptureWork>(make_step_program(g, Mode::Jit, launch));
  return std::make_shared<CudaGraphRunner>(std::move(g), max_instances, autotune, std::move(work));
}

inline std::string explain_steps(const ir::Graph& g, Mode mode) {
  sched::StepPlan plan = sched::plan_steps(g, g.device.is_cuda(), detail::training_epilogues());
  std::string s = "steps (library calls between generated kernels):\n" + plan.str();
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    s += "segment " + std::to_string(i) + ": " + backend::explain(plan.segments[i].graph, mode);
  return s;
}

inline std::shared_ptr<const StepProgram> make_step_program(const ir::Graph& g, Mode mode, CpuLaunchOptions launch) {
  return std::make_shared<const StepProgram>(g, mode, launch);
}

inline void run_step_program(const StepProgram& p, const RunArgs& args) { p.run(args); }

inline void clear_step_programs() { detail::StepProgramCache::instance().clear(); }

}  // namespace kiln::backend
