#pragma once
// Every environment setting kiln reads, declared in one place with its meaning.
#include <cstdlib>
#include <string>

namespace kiln::env {

struct Setting {
  const char* name;
  const char* help;
};

/// The full list, for documentation and `kiln --help`-style printing.
inline constexpr Setting kSettings[] = {
    {"KILN_LOGS",
     "comma list of log channels: graph_breaks,recompiles,guards,schedule,output_code,cache,perf,graph (or all); graph "
     "prints every graph evaluated"},
    {"KILN_LOGS_OUT", "file that logs go to (default: stderr)"},
    {"KILN_CACHE_DIR", "on-disk kernel cache (default: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)"},
    {"KILN_CACHE", "0 disables the on-disk kernel cache"},
    {"KILN_CACHE_MAX_BYTES",
     "bound on the on-disk cache's total size, e.g. 2G, 512M (default 2G; 0: no bound); least recently used entries "
     "are evicted"},
    {"KILN_CXX", "host C++ compiler for CPU kernels (default: c++)"},
    {"KILN_DEVICE", "default device of tests and examples: cpu or cuda"},
    {"KILN_BACKEND", "eager: run graphs op by op with the reference executor; jit (default when a compiler exists)"},
    {"KILN_NUM_THREADS",
     "most threads of a CPU kernel's OpenMP team (default: the CPUs this process may run on, sched_getaffinity); "
     "kernels with little work get fewer, see KILN_THREAD_POLICY"},
    {"KILN_THREAD_POLICY",
     "auto (default): a kernel gets one thread per ~20 us of work, up to KILN_NUM_THREADS; kernels under ~0.6 ms "
     "shrink to the CPUs other programs leave free (/proc/loadavg, sampled every 25 ms); libgomp spins 300 pauses "
     "before sleeping (GOMP_SPINCOUNT=300, set before libgomp loads unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set). "
     "static: the same without the load check. fixed: every parallel kernel gets KILN_NUM_THREADS and libgomp keeps "
     "its defaults (the old behaviour)"},
    {"KILN_BENCH_JSON",
     "path: a benchmark built with KILN_BENCH_MAIN also writes Google Benchmark's JSON there (for scripts/plot-bench)"},
    {"KILN_LIBCUDA_PATH", "path of libcuda.so.1 (default: the dynamic loader's search)"},
    {"KILN_CUDA_LAUNCH_GRAPHS", "0 launches CUDA kernels with cuLaunchKernel instead of per-plan launch graphs"},
    {"KILN_BLAS",
     "the CBLAS of CPU matrix products: openblas, blis, builtin (kiln's own loop), or a library's path (default: "
     "libopenblas.so.0, then BLIS, then libcblas.so.3 / libblas.so.3; none found: the built-in loop, with a warning)"},
    {"KILN_NVRTC_PATH", "path of libnvrtc.so (default: the dynamic loader's search, then /usr/local/cuda)"},
    {"KILN_CUDNN_PATH",
     "path of libcudnn.so for fused attention on the GPU (default: the dynamic loader's search for libcudnn.so.9, "
     "then libcudnn.so; absent: kiln's generated attention kernels)"},
    {"KILN_ATTENTION",
     "auto (default): GPU attention in half types runs cuDNN's fused kernels where cuDNN loads and takes the "
     "problem, else kiln's generated kernels; generated: always kiln's generated kernels"},
    {"KILN_CUBLASLT_TRAINING_EPILOGUES",
     "1 (default): products also take a training step's epilogues: bias and activation through a reshape that "
     "splits their rows (linear over [B, T, C]), a tanh-GELU whose input is read again as cuBLASLt's "
     "GELU_AUX(_BIAS), the GELU's gradient as DGELU on the next product; 0: those run as generated kernels"},
    {"KILN_CUBLASLT_PATH",
     "path of libcublasLt.so for GPU matrix products (default: the dynamic loader's search for libcublasLt.so.13, "
     "then libcublasLt.so)"},
    {"KILN_NCCL_PATH",
     "path of libnccl.so for collectives between GPUs (default: the dynamic loader's search for libnccl.so.2, then "
     "libnccl.so)"},
    {"KILN_RENDEZVOUS_FILE",
     "a file every rank sees: distributed::init_from_env's rendezvous goes through it instead of TCP to "
     "MASTER_ADDR:MASTER_PORT (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are read as torch "
     "reads them; scripts/kiln-run sets them)"},
    {"KILN_RUN_ID", "the launch a rank belongs to (scripts/kiln-run sets a fresh one); ranks of other runs are refused"},
};

/// Raw value or nullptr.
inline const char* raw(const char* name) { return std::getenv(name); }

/// Value or `fallback` when unset or empty.
inline std::string get(const char* name, const std::string& fallback = {}) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

/// True when the variable is set to something other than "", "0", "false", "off", "no".
inline bool flag(const char* name, bool fallback = false) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  std::string s(v);
  return !(s == "0" || s == "false" || s == "off" || s == "no" || s == "OFF" || s == "FALSE");
}

}  // namespace kiln::env
