#pragma once
// The C++ dialect of the C-family core (codegen/c/): literals and types as GCC reads them, what a
// unit's prelude must hold (Needs) and the small helpers it may hold (integer division and
// shifts, 16-bit conversions, streaming stores).
#include <string>

#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/codegen/c/reduction.hpp"
#include "kiln/codegen/cpp/math.hpp"
#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::detail {

using ir::Op;
using sched::i64;
using sched::Index;
using sched::IndexExpr;

/// The kLibmName ops cpp/math.hpp vectorises (kiln_<name>_f32/_f64, within the bounds of
/// docs/performance-math.md); sqrt, the other one, is the compiler's builtin (an instruction).
inline constexpr Op kVectorMath[] = {Op::Exp, Op::Exp2, Op::Log,  Op::Log2, Op::Log1p, Op::Expm1, Op::Sin, Op::Cos,
                                     Op::Tan, Op::Tanh, Op::Erf,  Op::Atan, Op::Asin,  Op::Acos,  Op::Atan2, Op::Hypot};

/// The C library functions the generated host units besides the fused kernels (attention,
/// scans, sorts) call, declared instead of including <math.h>, <stdlib.h> and <string.h>:
/// those headers cost a unit about a third of its compile time, a first call's and every
/// test's. GCC and Clang know these names as builtins, so the code is the same; the float
/// overloads are the ones C++'s <math.h> declares.
inline constexpr const char* kHostCLibrary =
    "extern \"C\" {\n"
    "double exp(double); float expf(float); double log(double); float logf(float);\n"
    "double log1p(double); float log1pf(float); double fabs(double); float fabsf(float);\n"
    "void* malloc(__SIZE_TYPE__); void free(void*); void* memcpy(void*, const void*, __SIZE_TYPE__);\n"
    "}\n"
    // C++'s <math.h> overloads these for float, as CUDA does: exp(float) stays in float.
    "static inline float exp(float x) { return expf(x); }\n"
    "static inline float log(float x) { return logf(x); }\n"
    "static inline float log1p(float x) { return log1pf(x); }\n"
    "static inline float fabs(float x) { return fabsf(x); }\n";

/// How this writer's errors name it.
inline constexpr const char* kWriter = "kiln codegen";

// Types and literals: the C every dialect shares (codegen/c/literals.hpp).
using c_family::ctype;
using c_family::hex_double;
using c_family::int_literal;
using c_family::stype;
inline std::string float_literal(double v, bool is_double) {
  return c_family::float_literal(v, is_double, c_family::kCppDialect);
}
inline std::string constant_literal(const ir::GraphNode& n) {
  return c_family::constant_literal(n, c_family::kCppDialect);
}

/// What a translation unit needs in its prelude.
struct Needs : c_family::PreludeNeeds {
  bool math = false, stream = false;
};

// Writes a finished row to memory with non-temporal stores where the target has them: a large
// output is not read again soon, so writing it around the cache saves the read-for-ownership
// of every line (a third of the traffic of a read-once, write-once kernel) and keeps the
// cache for the rows being reduced. The tail and unaligned head go through memcpy.
inline constexpr const char* kStreamHelpers = R"(
#if defined(__AVX__)
/* The non-temporal store, the loads and the fence as the compiler's builtins (what
   <immintrin.h>'s _mm256_stream_si256, _mm256_load(u)_si256 and _mm_sfence expand to): that
   header is some 60 000 lines with -march=native, and parsing it was most of a streamed
   kernel's compile time. May-alias, as <immintrin.h>'s own vector types: the chunk is written
   as floats and read back as vectors. */
typedef long long kiln_v4di __attribute__((vector_size(32), __may_alias__));
typedef long long kiln_v4di_u __attribute__((vector_size(32), __may_alias__, aligned(1)));
static inline void kiln_nt_store32(void* dst, kiln_v4di v) {
#if defined(__clang__)
  __builtin_nontemporal_store(v, (kiln_v4di*)dst);
#else
  __builtin_ia32_movntdq256((kiln_v4di*)dst, v);
#endif
}
#endif
static inline void kiln_stream_row(void* dst, const void* src, long long bytes) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
#if defined(__AVX__)
  long long head = (long long)((32u - ((unsigned long long)d & 31u)) & 31u);
  if (head > bytes) head = bytes;
  __builtin_memcpy(d, s, (unsigned long)head);
  long long i = head;
  for (; i + 32 <= bytes; i += 32) kiln_nt_store32(d + i, *(const kiln_v4di_u*)(s + i));
  __builtin_memcpy(d + i, s + i, (unsigned long)(bytes - i));
  __builtin_ia32_sfence();
#else
  __builtin_memcpy(d, s, (unsigned long)bytes);
#endif
}
/* One chunk of a streamed row (`bytes`: 64): around the cache when `dst` is 32-byte aligned,
   else plain stores; kiln_stream_fence orders the row's chunks before the kernel returns. */
static inline void kiln_stream_chunk(void* dst, const void* src, long long bytes) {
#if defined(__AVX__)
  if ((((unsigned long long)dst) & 31u) == 0) {
    for (long long i = 0; i < bytes; i += 32)
      kiln_nt_store32((unsigned char*)dst + i, *(const kiln_v4di*)((const unsigned char*)src + i));
    return;
  }
#endif
  __builtin_memcpy(dst, src, (unsigned long)bytes);
}
static inline void kiln_stream_fence(void) {
#if defined(__AVX__)
  __builtin_ia32_sfence();
#endif
}
)";

// Helpers every generated unit may use. Integer arithmetic wraps (through unsigned, since
// signed overflow is UB); integer division by 0 gives 0 and by -1 negates, as the reference.
inline constexpr const char* kIntHelpers = R"(
static inline int kiln_idiv_i32(int a, int b) {
  int q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (int)(0u - (unsigned)a) : q;
}
static inline long long kiln_idiv_i64(long long a, long long b) {
  long long q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (long long)(0ull - (unsigned long long)a) : q;
}
static inline long long kiln_ipow_i64(long long base, long long e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned long long r = 1, b = (unsigned long long)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (long long)r;
}
static inline int kiln_ipow_i32(int base, int e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned r = 1, b = (unsigned)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (int)r;
}
// fmod of integers: the dividend's sign, as %; by 0 and by -1 give 0 (as the reference).
static inline int kiln_ifmod_i32(int a, int b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
static inline long long kiln_ifmod_i64(long long a, long long b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
// Shifts by a count outside [0, bits) shift everything out, as PyTorch's.
static inline int kiln_shl_i32(int a, int b) { return (b < 0) | (b >= 32) ? 0 : (int)((unsigned)a << (b & 31)); }
static inline long long kiln_shl_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? 0 : (long long)((unsigned long long)a << (b & 63)); }
static inline int kiln_shr_i32(int a, int b) { return (b < 0) | (b >= 32) ? (a < 0 ? -1 : 0) : a >> (b & 31); }
static inline long long kiln_shr_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? (a < 0 ? -1 : 0) : a >> (b & 63); }
static inline int kiln_f2i32(double x) { return (x > -2147483649.0 && x < 2147483648.0) ? (int)x : (-2147483647 - 1); }
static inline long long kiln_f2i64(double x) {
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (long long)x : (-9223372036854775807LL - 1);
}
)";

// IEEE binary16 and bfloat16 <-> float, bit for bit as kiln/core/half.hpp, written with
// selects only so that loops converting them vectorise.
inline constexpr const char* kHalfHelpers = R"(
static inline unsigned short kiln_f2h(float f) {
  unsigned int x; __builtin_memcpy(&x, &f, 4);
  unsigned int sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  unsigned int naninf = 0x7c00u | (mag > 0x7f800000u ? (0x200u | ((mag >> 13) & 0x3ffu)) : 0u);
  float sf; __builtin_memcpy(&sf, &mag, 4); sf = sf + 0.5f;
  unsigned int sub; __builtin_memcpy(&sub, &sf, 4); sub -= 0x3f000000u;
  unsigned int norm = (mag + 0xc8000fffu + ((mag >> 13) & 1u)) >> 13;
  unsigned int r = mag >= 0x7f800000u ? naninf : mag >= 0x477ff000u ? 0x7c00u : mag < 0x38800000u ? sub : norm;
  return (unsigned short)(sign | r);
}
static inline float kiln_h2f(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float sv = (float)m * 5.9604644775390625e-08f;
  unsigned int sb; __builtin_memcpy(&sb, &sv, 4);
  unsigned int bits = e == 0x1fu ? (sign | 0x7f800000u | (m << 13)) : e == 0 ? (sign | sb) : (sign | ((e + 112u) << 23) | (m << 13));
  float r; __builtin_memcpy(&r, &bits, 4);
  return r;
}
static inline float kiln_rh(float f) { return kiln_h2f(kiln_f2h(f)); }
)";

inline constexpr const char* kBf16Helpers = R"(
static inline unsigned short kiln_f2b(float f) {
  unsigned int x; __builtin_memcpy(&x, &f, 4);
  unsigned int r = (x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  return (unsigned short)r;
}
static inline float kiln_b2f(unsigned short b) { unsigned int x = (unsigned int)b << 16; float r; __builtin_memcpy(&r, &x, 4); return r; }
static inline float kiln_rb(float f) { return kiln_b2f(kiln_f2b(f)); }
)";

}  // namespace kiln::codegen::detail

KILN_COLD_CODE_END
