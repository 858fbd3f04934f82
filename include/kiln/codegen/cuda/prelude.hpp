#pragma once
#include "kiln/core/linkage.hpp"
// Device-side helpers pasted at the top of every generated CUDA unit, as source text. NVRTC gets
// no CUDA headers (cuda_fp16.h, cuda_runtime.h), so the 16-bit float conversions and the integer
// semantics of the reference executor (kiln/backend/reference.hpp) are written here, each piece
// only when a kernel of the unit needs it. The same text also compiles as host C++ under a thin
// emulation layer (tests/codegen/cuda_emulator.hpp), which is why the PTX paths are guarded by
// __CUDA_ARCH__ and have portable equivalents.

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

// Types and limits every unit uses. The argument block is one struct of pointers passed by
// value: leaves, outputs, temporaries, then the scratch buffer of cross-block partials.
inline constexpr const char* kCudaBase = R"(
typedef unsigned long long kiln_u64;
#define KILN_INF_F __int_as_float(0x7f800000)
#define KILN_NAN_F __int_as_float(0x7fc00000)
#define KILN_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define KILN_NAN_D __longlong_as_double(0x7ff8000000000000LL)
static __device__ __forceinline__ long long kiln_iclamp(long long x, long long hi) { return x < 0 ? 0 : x > hi ? hi : x; }
// A 16-byte load whose lines L2 evicts last (row kernels' rows kept on chip: see
// CudaTarget::row_cache_load_keep).
static __device__ __forceinline__ uint4 kiln_ld_keep(const void* p) {
#if defined(__CUDA_ARCH__)
  uint4 r; kiln_u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  return r;
#else
  return *(const uint4*)p;
#endif
}
)";

// IEEE binary16 <-> float: one PTX conversion each on the GPU (round to nearest even,
// subnormals, Inf and NaN as IEEE says); the portable version is kiln/core/half.hpp's.
inline constexpr const char* kCudaHalf = R"(
static __device__ __forceinline__ float kiln_h2f(unsigned short h) {
#if defined(__CUDA_ARCH__)
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) { float v = (float)m * 5.9604644775390625e-08f; return sign ? -v : v; }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}
static __device__ __forceinline__ unsigned short kiln_f2h(float f) {
#if defined(__CUDA_ARCH__)
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
  unsigned int x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (mag > 0x7f800000u ? (0x200u | ((mag >> 13) & 0x3ffu)) : 0u));
  if (mag >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (mag < 0x38800000u) return (unsigned short)(sign | (__float_as_uint(__uint_as_float(mag) + 0.5f) - 0x3f000000u));
  return (unsigned short)(sign | ((mag + 0xc8000fffu + ((mag >> 13) & 1u)) >> 13));
#endif
}
static __device__ __forceinline__ float kiln_rh(float f) { return kiln_h2f(kiln_f2h(f)); }
)";

// bfloat16 <-> float: the widening is a shift; the narrowing is one PTX conversion from sm_80 on.
inline constexpr const char* kCudaBf16 = R"(
static __device__ __forceinline__ float kiln_b2f(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
static __device__ __forceinline__ unsigned short kiln_f2b(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
  unsigned int x = __float_as_uint(f);
  return (unsigned short)((x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16));
#endif
}
static __device__ __forceinline__ float kiln_rb(float f) { return kiln_b2f(kiln_f2b(f)); }
)";

// Integer arithmetic wraps (through unsigned); division by 0 gives 0 and by -1 negates; a float
// out of an integer's range converts to its minimum (what x86's cvttsd2si gives): the
// reference executor's rules.
inline constexpr const char* kCudaInts = R"(
static __device__ __forceinline__ int kiln_idiv_i32(int a, int b) {
  int q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (int)(0u - (unsigned)a) : q;
}
static __device__ __forceinline__ long long kiln_idiv_i64(long long a, long long b) {
  long long q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (long long)(0ull - (unsigned long long)a) : q;
}
static __device__ __forceinline__ long long kiln_ipow_i64(long long base, long long e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned long long r = 1, b = (unsigned long long)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (long long)r;
}
static __device__ __forceinline__ int kiln_ipow_i32(int base, int e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned r = 1, b = (unsigned)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (int)r;
}
// fmod of integers (the dividend's sign; by 0 and by -1: 0) and PyTorch's shifts (a count
// outside [0, bits) shifts everything out), as the reference executor.
static __device__ __forceinline__ int kiln_ifmod_i32(int a, int b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
static __device__ __forceinline__ long long kiln_ifmod_i64(long long a, long long b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
static __device__ __forceinline__ int kiln_shl_i32(int a, int b) { return (b < 0) | (b >= 32) ? 0 : (int)((unsigned)a << (b & 31)); }
static __device__ __forceinline__ long long kiln_shl_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? 0 : (long long)((unsigned long long)a << (b & 63)); }
static __device__ __forceinline__ int kiln_shr_i32(int a, int b) { return (b < 0) | (b >= 32) ? (a < 0 ? -1 : 0) : a >> (b & 31); }
static __device__ __forceinline__ long long kiln_shr_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? (a < 0 ? -1LL : 0LL) : a >> (b & 63); }
static __device__ __forceinline__ int kiln_f2i32(double x) { return (x > -2147483649.0 && x < 2147483648.0) ? (int)x : (-2147483647 - 1); }
static __device__ __forceinline__ long long kiln_f2i64(double x) {
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (long long)x : (-9223372036854775807LL - 1);
}
)";

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
