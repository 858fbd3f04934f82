#pragma once
// A CUDA emulator for the generated kernels, so their logic (indexing, vector lanes, warp
// shuffles, block reductions, the last-block combination of partials) is tested against the
// reference executor on machines without a GPU. The generated unit is compiled by the host C++
// compiler behind a prelude that defines CUDA's built-ins: every CUDA thread of a block is a
// fiber (ucontext) with its own stack; __syncthreads and the warp shuffles are real barriers
// over the block's or the warp's fibers, which run until they block, highest thread first (so
// a missing barrier shows as a wrong result). Blocks run one after another, in order.
// Numerics differ from a GPU only where the host's libm differs from CUDA's math library.
#include <algorithm>  // before kiln/ir/graph.hpp, which uses std::find
#include <cstring>
#include <memory>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ucontext.h>

#include "kiln/backend/executor.hpp"
#include "kiln/codegen/cuda.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln_cuda_emu {

// The emulator's runtime lives here, in the test binary, and the generated units call it through
// one table of functions (kiln_emu_api) handed to each unit when it is loaded. A unit therefore
// includes no system header and compiles none of the fiber machinery: its prelude is
// declarations, and its compile time is the kernel's own (about a fifth of what a unit that
// carried the runtime and <vector>, <math.h> and <ucontext.h> took).
namespace rt {

struct Dim3 {
  unsigned x, y, z;
};

/// The table a unit calls (the prelude declares the same layout as `kiln_emu_api`). The
/// block's indices are data the runtime updates before each block.
struct Api {
  Dim3 block_idx, block_dim, grid_dim;
  unsigned (*tid)();
  void (*block_barrier)();
  void (*warp_barrier)();
  unsigned long long (*shfl)(unsigned long long bits, unsigned src_lane);
  unsigned (*match_any)(unsigned long long v);
  unsigned char* (*dynamic_smem)();
  void (*mma)(int bf16, float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1);
  void (*run_grid)(unsigned grid, unsigned block, unsigned smem, void (*body)(void*), void* arg);
  void (*no_kernel)(const char* name);
};

struct Fiber {
  ucontext_t ctx;
  unsigned tid = 0;
  int state = 0;           // 0 runnable, 1 block barrier, 2 warp barrier, 3 done
  unsigned mma_calls = 0;  // which of the warp's two fragment areas its next mma uses
  std::vector<char> stack;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t main;
  int cur = -1;
  unsigned live = 0, at_block = 0;
  std::vector<unsigned> at_warp, warp_live;
  std::vector<unsigned long long> slots;  // 32 per warp
  std::vector<unsigned> fragments;        // mma operands: 2 areas a warp, 6 words a lane
  std::vector<unsigned char> smem;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};

Api& api();
inline Block*& current_block() {
  static Block* b = nullptr;
  return b;
}
inline Block& blk() { return *current_block(); }
inline Fiber& me() { return blk().fibers[static_cast<std::size_t>(blk().cur)]; }
inline void yield() { swapcontext(&me().ctx, &blk().main); }

inline void release(Block& b, int state, unsigned warp) {
  for (auto& f : b.fibers)
    if (f.state == state && (state == 1 || f.tid / 32 == warp)) f.state = 0;
}

inline void block_barrier() {
  Block& b = blk();
  me().state = 1;
  if (++b.at_block == b.live) {
    release(b, 1, 0);
    b.at_block = 0;
  }
  yield();
}

inline void warp_barrier() {
  Block& b = blk();
  const unsigned w = me().tid / 32;
  me().state = 2;
  if (++b.at_warp[w] == b.warp_live[w]) {
    release(b, 2, w);
    b.at_warp[w] = 0;
  }
  yield();
}

inline unsigned long long shfl(unsigned long long bits, unsigned src_lane) {
  Block& b = blk();
  const unsigned tid = me().tid, w = tid / 32;
  b.slots[tid] = bits;
  warp_barrier();
  const unsigned long long got = b.slots[w * 32 + (src_lane & 31)];
  warp_barrier();
  return got;
}

/// The lanes of the warp holding the same value as this one (every lane of the warp takes part).
inline unsigned match_any(unsigned long long v) {
  Block& b = blk();
  const unsigned tid = me().tid, w = tid / 32;
  b.slots[tid] = v;
  warp_barrier();
  unsigned mask = 0;
  for (unsigned l = 0; l < 32 && w * 32 + l < b.fibers.size(); ++l)
    if (b.fibers[w * 32 + l].state != 3 && b.slots[w * 32 + l] == v) mask |= 1u << l;
  warp_barrier();
  return mask;
}

inline float f16_value(unsigned short h) {
  const unsigned sign = static_cast<unsigned>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  auto bits = [](unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  if (e == 0x1fu) return bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits(sign | ((e + 112u) << 23) | (m << 13));
}

inline float bf16_value(unsigned short b) {
  const unsigned u = static_cast<unsigned>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: every lane publishes its fragments, then
/// computes its own four outputs from the whole warp's, with the PTX ISA's lane layout (g = lane
/// / 4, t = lane % 4; A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B: b0
/// (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C: c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..)). The
/// products are exact in double; the sum is rounded once into the f32 accumulator. Two areas a
/// warp, alternating, so one barrier a call suffices: a lane that reaches the call after next
/// has passed the next call's barrier, which every lane reaches only after reading this one.
inline void mma_m16n8k16(int bf16, float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                         unsigned b1) {
  Block& b = blk();
  Fiber& f = me();
  const unsigned lane = f.tid & 31, w = f.tid / 32;
  unsigned* const area = b.fragments.data() + (static_cast<std::size_t>(w) * 2 + (f.mma_calls++ & 1u)) * 32 * 6;
  unsigned* const mine = area + lane * 6;
  mine[0] = a0;
  mine[1] = a1;
  mine[2] = a2;
  mine[3] = a3;
  mine[4] = b0;
  mine[5] = b1;
  warp_barrier();
  auto half = [&](unsigned from_lane, unsigned reg, unsigned k) -> double {
    const unsigned word = area[from_lane * 6 + reg];
    const auto bits = static_cast<unsigned short>((k & 1u) ? word >> 16 : word & 0xffffu);
    return bf16 ? static_cast<double>(bf16_value(bits)) : static_cast<double>(f16_value(bits));
  };
  const unsigned g = lane >> 2, t = lane & 3;
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = g + (e >= 2 ? 8u : 0u), col = 2 * t + (e & 1u);
    double s = 0;
    for (unsigned k = 0; k < 16; ++k) {
      const double x = half((row & 7u) * 4 + ((k & 7u) >> 1), (row >= 8 ? 1u : 0u) + (k >= 8 ? 2u : 0u), k);
      const double y = half(col * 4 + ((k & 7u) >> 1), 4u + (k >= 8 ? 1u : 0u), k);
      s += x * y;
    }
    d[e] = static_cast<float>(static_cast<double>(d[e]) + s);
  }
}

inline void trampoline() {
  Block& b = blk();
  b.body(b.arg);
  me().state = 3;
  const unsigned w = me().tid / 32;
  b.live--;
  b.warp_live[w]--;
  // A thread that leaves may complete a barrier the others wait at.
  if (b.live > 0 && b.at_block == b.live) {
    release(b, 1, 0);
    b.at_block = 0;
  }
  if (b.warp_live[w] > 0 && b.at_warp[w] == b.warp_live[w]) {
    release(b, 2, w);
    b.at_warp[w] = 0;
  }
  setcontext(&b.main);
}

inline void run_grid(unsigned grid, unsigned block, unsigned smem_bytes, void (*body)(void*), void* arg) {
  static Block b;
  b.fibers.resize(block);
  for (auto& f : b.fibers)
    if (f.stack.size() < 64 * 1024) f.stack.resize(64 * 1024);
  api().grid_dim = {grid, 1, 1};
  api().block_dim = {block, 1, 1};
  b.body = body;
  b.arg = arg;
  current_block() = &b;
  for (unsigned bx = 0; bx < grid; ++bx) {
    api().block_idx = {bx, 0, 0};
    b.smem.assign(smem_bytes + 16, 0xCD);
    b.live = block;
    b.at_block = 0;
    const unsigned warps = (block + 31) / 32;
    b.at_warp.assign(warps, 0);
    b.warp_live.assign(warps, 0);
    b.slots.assign(warps * 32, 0);
    b.fragments.assign(warps * 2 * 32 * 6, 0);
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = b.fibers[t];
      f.tid = t;
      f.state = 0;
      f.mma_calls = 0;
      b.warp_live[t / 32]++;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, trampoline, 0);
    }
    for (;;) {
      bool any = false, progress = false;
      for (int t = static_cast<int>(block) - 1; t >= 0; --t) {
        Fiber& f = b.fibers[static_cast<std::size_t>(t)];
        if (f.state == 3) continue;
        any = true;
        if (f.state != 0) continue;
        b.cur = t;
        swapcontext(&b.main, &f.ctx);
        progress = true;
      }
      if (!any) break;
      if (!progress) {
        std::fprintf(stderr, "kiln CUDA emulator: deadlock in block %u (threads wait at barriers that cannot complete)\n",
                     bx);
        std::abort();
      }
    }
  }
  current_block() = nullptr;
}

inline Api& api() {
  static Api a{{0, 0, 0},
               {0, 0, 0},
               {0, 0, 0},
               [] { return me().tid; },
               block_barrier,
               warp_barrier,
               shfl,
               match_any,
               [] { return blk().smem.data(); },
               mma_m16n8k16,
               run_grid,
               [](const char* name) {
                 std::fprintf(stderr, "kiln CUDA emulator: no kernel %s in the unit\n", name);
                 std::abort();
               }};
  return a;
}

}  // namespace rt

/// What every emulated unit starts with: CUDA's built-ins as declarations and small inline
/// functions over the runtime's table (no system header: the C math functions the kernels call
/// are declared here, and the compiler treats them as its builtins).
inline constexpr const char* kPrelude = R"EMU(
// The C math library's float and double families, as <math.h> declares them.
#define KILN_EMU_LIBM(T, s)                                                                          \
  T sin##s(T); T cos##s(T); T tan##s(T); T asin##s(T); T acos##s(T); T atan##s(T); T atan2##s(T, T);    \
  T sinh##s(T); T cosh##s(T); T tanh##s(T); T asinh##s(T); T acosh##s(T); T atanh##s(T); T exp##s(T);   \
  T exp2##s(T); T expm1##s(T); T log##s(T); T log2##s(T); T log10##s(T); T log1p##s(T); T pow##s(T, T); \
  T sqrt##s(T); T cbrt##s(T); T hypot##s(T, T); T erf##s(T); T erfc##s(T); T lgamma##s(T);              \
  T tgamma##s(T); T fabs##s(T); T floor##s(T); T ceil##s(T); T trunc##s(T); T round##s(T); T rint##s(T); \
  T nearbyint##s(T); T fmod##s(T, T); T remainder##s(T, T); T fma##s(T, T, T); T fmin##s(T, T);          \
  T fmax##s(T, T); T copysign##s(T, T); T nextafter##s(T, T); T ldexp##s(T, int); T frexp##s(T, int*);   \
  T modf##s(T, T*); long lrint##s(T); long long llrint##s(T); long lround##s(T); long long llround##s(T);
extern "C" {
KILN_EMU_LIBM(float, f)
KILN_EMU_LIBM(double, )
}
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)
#define signbit(x) __builtin_signbit(x)
#define memcpy __builtin_memcpy
#define memset __builtin_memset
#define strcmp __builtin_strcmp
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __align__(n) alignas(n)
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(x)
#define __shared__ static
#define KILN_EXTERN_SMEM(name) unsigned char* name = ::kiln_emu_rt->dynamic_smem()
struct uint4 { unsigned int x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { float4 r = {a, b, c, d}; return r; }
struct kiln_dim3 { unsigned int x, y, z; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { uint4 r = {a, b, c, d}; return r; }
static inline uint2 make_uint2(unsigned a, unsigned b) { uint2 r = {a, b}; return r; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline void __threadfence() {}
static inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p = old + v; return old; }
static inline unsigned atomicExch(unsigned* p, unsigned v) { unsigned old = *p; *p = v; return old; }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
  unsigned long long old = *p;
  if (old == cmp) *p = v;
  return old;
}
// The runtime's table (tests/codegen/cuda_emulator.hpp, rt::Api: the same layout), bound at load.
struct kiln_emu_api {
  kiln_dim3 block_idx, block_dim, grid_dim;
  unsigned (*tid)(void);
  void (*block_barrier)(void);
  void (*warp_barrier)(void);
  unsigned long long (*shfl)(unsigned long long bits, unsigned src_lane);
  unsigned (*match_any)(unsigned long long v);
  unsigned char* (*dynamic_smem)(void);
  void (*mma)(int bf16, float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1);
  void (*run_grid)(unsigned grid, unsigned block, unsigned smem, void (*body)(void*), void* arg);
  void (*no_kernel)(const char* name);
};
static const kiln_emu_api* kiln_emu_rt = 0;
extern "C" void kiln_emu_bind(const kiln_emu_api* api) { kiln_emu_rt = api; }
namespace kiln_emu {
static inline kiln_dim3 thread_idx() { kiln_dim3 d = {kiln_emu_rt->tid(), 0, 0}; return d; }
static inline void run_grid(unsigned grid, unsigned block, unsigned smem, void (*body)(void*), void* arg) {
  kiln_emu_rt->run_grid(grid, block, smem, body, arg);
}
static inline void no_kernel(const char* name) { kiln_emu_rt->no_kernel(name); }
template <class T> static inline T shfl(T v, unsigned src_lane) {
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = kiln_emu_rt->shfl(bits, src_lane);
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}
static inline unsigned lane() { return kiln_emu_rt->tid() & 31; }
}  // namespace kiln_emu
#define threadIdx (::kiln_emu::thread_idx())
#define blockIdx (::kiln_emu_rt->block_idx)
#define blockDim (::kiln_emu_rt->block_dim)
#define gridDim (::kiln_emu_rt->grid_dim)
#define __syncthreads() ::kiln_emu_rt->block_barrier()
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m) { return ::kiln_emu::shfl(v, ::kiln_emu::lane() ^ (unsigned)m); }
template <class T> static inline T __shfl_sync(unsigned, T v, int src) { return ::kiln_emu::shfl(v, (unsigned)src); }
// Lanes below `d` read their own value, as the hardware's.
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d) {
  const unsigned lane = ::kiln_emu::lane();
  return ::kiln_emu::shfl(v, lane >= d ? lane - d : lane);
}
static inline unsigned __match_any_sync(unsigned, unsigned v) { return kiln_emu_rt->match_any(v); }
static inline unsigned __match_any_sync(unsigned, unsigned long long v) { return kiln_emu_rt->match_any(v); }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline void __syncwarp(unsigned = 0xffffffffu) { kiln_emu_rt->warp_barrier(); }
static inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
static inline int __clz(unsigned v) { return v ? __builtin_clz(v) : 32; }

// Tensor-core helpers of generated units (their PTX versions are under #ifndef KILN_EMULATED_MMA).
#define KILN_EMULATED_MMA 1
static inline void kiln_mma_m16n8k16_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  kiln_emu_rt->mma(0, d, a0, a1, a2, a3, b0, b1);
}
static inline void kiln_mma_m16n8k16_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned b0, unsigned b1) {
  kiln_emu_rt->mma(1, d, a0, a1, a2, a3, b0, b1);
}
// cp.async as a plain copy: the copy is complete at once, so commits and waits have nothing to do.
static inline void kiln_cp_async16(void* smem, const void* gmem) { memcpy(smem, gmem, 16); }
static inline void kiln_cp_async_commit() {}
static inline void kiln_cp_async_wait_all() {}
static inline void kiln_cp_async_wait_one() {}
)EMU";

// The prelude's kiln_emu_api mirrors rt::Api: three 12-byte index triples, then nine pointers.
static_assert(offsetof(rt::Api, tid) == 40 && sizeof(rt::Api) == 40 + 9 * sizeof(void*), "rt::Api: the prelude's layout");

/// Loads an emulator unit (the prelude, a generated source and its launcher) through the CPU
/// module cache (memory, disk, compiler) and binds it to the runtime.
inline std::shared_ptr<kiln::runtime::SharedLibrary> load_library(const std::string& unit) {
  auto lib = kiln::runtime::CpuModuleCache::instance().get(unit);
  reinterpret_cast<void (*)(const rt::Api*)>(lib->symbol("kiln_emu_bind"))(&rt::api());
  return lib;
}

/// A generated unit built for the emulator.
struct Module {
  std::shared_ptr<kiln::runtime::SharedLibrary> library;
  using Launch = void (*)(const char*, unsigned, unsigned, unsigned, void**);
  Launch launch = nullptr;
  /// Symbolic units (CudaSource::symbolic): the launch also passes the size `n`.
  using LaunchN = void (*)(const char*, unsigned, unsigned, unsigned, void**, long long);
  LaunchN launch_n = nullptr;
};

/// Compiles `src` under the emulator (through the CPU module cache: memory, disk, compiler).
inline Module load(const kiln::codegen::CudaSource& src) {
  std::string unit = kPrelude;
  unit += src.source;
  unit += "\nstruct kiln_emu_call { void (*fn)(kiln_args); kiln_args a; };\n";
  unit += "static void kiln_emu_body(void* p) { kiln_emu_call* c = (kiln_emu_call*)p; c->fn(c->a); }\n";
  unit +=
      "extern \"C\" void kiln_emu_launch(const char* name, unsigned grid, unsigned block, unsigned smem, void** args) "
      "{\n";
  unit += "  kiln_emu_call c; c.fn = nullptr; memcpy(c.a.p, args, sizeof c.a.p);\n";
  for (auto& k : src.kernels) unit += "  if (!strcmp(name, \"" + k.name + "\")) c.fn = " + k.name + ";\n";
  unit += "  if (!c.fn) ::kiln_emu::no_kernel(name);\n";
  unit += "  ::kiln_emu::run_grid(grid, block, smem, kiln_emu_body, &c);\n}\n";
  if (src.symbolic) {
    unit +=
        "extern \"C\" void kiln_emu_launch_n(const char* name, unsigned grid, unsigned block, unsigned smem, void** "
        "args, long long n) {\n";
    unit += "  kiln_emu_call c; c.fn = nullptr; memcpy(c.a.p, args, sizeof c.a.p); c.a.n = n;\n";
    for (auto& k : src.kernels) unit += "  if (!strcmp(name, \"" + k.name + "\")) c.fn = " + k.name + ";\n";
    unit += "  if (!c.fn) ::kiln_emu::no_kernel(name);\n";
    unit += "  ::kiln_emu::run_grid(grid, block, smem, kiln_emu_body, &c);\n}\n";
  }
  Module m;
  m.library = load_library(unit);
  m.launch = reinterpret_cast<Module::Launch>(m.library->symbol("kiln_emu_launch"));
  if (src.symbolic) m.launch_n = reinterpret_cast<Module::LaunchN>(m.library->symbol("kiln_emu_launch_n"));
  return m;
}

/// Runs the symbolic unit `src` (loaded as `m`; generated from schedule `s` of a graph at its
/// placeholder, s.symbolic) over host buffers laid out for the graph at size `n`, as
/// backend::run_cuda_symbolic does on a GPU: temporaries sized for `n`, each kernel's grid
/// computed for `n` (CudaKernelInfo::grid_for), the size passed in the argument struct. Counts
/// launches.
inline void run_symbolic(const Module& m, const kiln::codegen::CudaSource& src, const kiln::sched::Schedule& s,
                         const kiln::backend::RunArgs& args, std::int64_t n) {
  using namespace kiln;
  std::vector<void*> argv;
  for (auto p : args.inputs) argv.push_back(const_cast<void*>(p));
  for (auto p : args.outputs) argv.push_back(p);
  std::vector<StoragePtr> keep;
  for (auto& t : s.temps) {
    std::size_t bytes = itemsize(t.dtype);
    for (auto d : t.shape) bytes *= static_cast<std::size_t>(d == s.symbolic ? n : d);
    keep.push_back(runtime::allocate_host(std::max<std::size_t>(1, bytes)));
    std::memset(keep.back()->data, 0xCD, keep.back()->bytes);
    argv.push_back(keep.back()->data);
  }
  keep.push_back(runtime::allocate_host(std::max<std::size_t>(16, src.scratch_bytes)));
  std::memset(keep.back()->data, 0xCD, keep.back()->bytes);
  argv.push_back(keep.back()->data);
  for (auto& k : src.kernels) {
    m.launch_n(k.name.c_str(), k.grid_for(n), k.block, k.shared_bytes, argv.data(), n);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
}

/// A small GPU: few multiprocessors keep grids (and emulation time) small while every
/// multi-block path still runs.
inline kiln::codegen::CudaTarget small_target() {
  kiln::codegen::CudaTarget t = kiln::codegen::CudaTarget::sm90();
  t.sm_count = 3;
  // The non-default paths too: long rows kept in shared memory, reciprocal division.
  t.row_cache_shared = true;
  t.reciprocal_div = true;
  return t;
}

/// What one emulated run did.
struct RunInfo {
  kiln::codegen::CudaSource source;
  std::string schedule;
};

/// Runs `g` over host buffers as run_cuda would on a GPU: schedule, generate (alignment taken
/// from the actual pointers), build, launch every kernel in order. Counts launches.
inline RunInfo run(const kiln::ir::Graph& g, const kiln::backend::RunArgs& args,
                   const kiln::codegen::CudaTarget& target = small_target()) {
  using namespace kiln;
  RunInfo info;
  sched::Schedule s = sched::schedule(g);
  info.schedule = s.str(g);
  codegen::CudaAlignment al;
  for (auto p : args.inputs) al.inputs.push_back(reinterpret_cast<std::uintptr_t>(p) % 16 == 0);
  for (auto p : args.outputs) al.outputs.push_back(reinterpret_cast<std::uintptr_t>(p) % 16 == 0);
  info.source = codegen::generate_cuda(g, s, "kemu", target, al);
  Module m = load(info.source);
  std::vector<void*> argv;
  for (auto p : args.inputs) argv.push_back(const_cast<void*>(p));
  for (auto p : args.outputs) argv.push_back(p);
  std::vector<StoragePtr> keep;
  for (auto& t : s.temps) {
    keep.push_back(runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(1, t.shape.numel())) *
                                          itemsize(t.dtype)));
    std::memset(keep.back()->data, 0xCD, keep.back()->bytes);
    argv.push_back(keep.back()->data);
  }
  keep.push_back(runtime::allocate_host(std::max<std::size_t>(16, info.source.scratch_bytes)));
  std::memset(keep.back()->data, 0xCD, keep.back()->bytes);
  argv.push_back(keep.back()->data);
  for (auto& k : info.source.kernels) {
    m.launch(k.name.c_str(), k.grid, k.block, k.shared_bytes, argv.data());
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
  return info;
}

}  // namespace kiln_cuda_emu
