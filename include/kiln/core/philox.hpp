#pragma once
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
// SC'11) and kiln's element generators built on it. Counter-based: element i of a random
// tensor depends only on (seed, i), so every device and every thread count gives the same
// numbers.
//
// The functions are written once and exist twice: compiled here for the host, and as source
// text (kiln::philox::kPhiloxSource) that code generators paste into generated C++ and CUDA
// kernels. Hence the plain C-like subset (no std::, no <cstdint> types): it must compile under
// NVRTC, which has no standard library.
#include <math.h>  // ::sqrtf, ::logf, ::cosf, ::sqrt, ::log, ::cos for CUDA's host and device compilers

// The libm functions the shared text calls (Box-Muller's sqrt, log and cos): the compiler's
// builtins in host C++ (the same functions; generated CPU units then need no <math.h>, whose
// C++ wrapper is most of a small unit's parse time), CUDA's own under nvcc and NVRTC. Qualified
// or builtin, so kiln::log and kiln::cos of the front end cannot hide them. (nvcc and NVRTC
// declare CUDA's math functions themselves, so the pasted text includes nothing.)
#ifndef KILN_PHILOX_MATH
#if defined(__CUDACC__)
#define KILN_PHILOX_MATH(f) ::f
#else
#define KILN_PHILOX_MATH(f) __builtin_##f
#endif
#endif

#ifndef KILN_HOST_DEVICE
#if defined(__CUDACC_RTC__)
#define KILN_HOST_DEVICE __device__
#elif defined(__CUDACC__)
// nvcc compiles host code too (this header's host callers), so both qualifiers.
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
#endif

/// The text that defines KILN_HOST_DEVICE in generated source (same rule as above).
#define KILN_HOST_DEVICE_SOURCE                    \
  "#ifndef KILN_HOST_DEVICE\n"                     \
  "#if defined(__CUDACC_RTC__)\n"                  \
  "#define KILN_HOST_DEVICE __device__\n"          \
  "#elif defined(__CUDACC__)\n"                    \
  "#define KILN_HOST_DEVICE __host__ __device__\n" \
  "#else\n"                                        \
  "#define KILN_HOST_DEVICE\n"                     \
  "#endif\n"                                       \
  "#endif\n"

#ifndef KILN_DUAL_SOURCE
/// Emits the code in `...` and defines `inline constexpr const char* var` holding
/// `prologue`, the same code as text, and `epilogue`. Comments inside `...` are stripped by the
/// preprocessor and the text is one line; it must not contain `#` directives or string literals.
#define KILN_DUAL_SOURCE(var, prologue, epilogue, ...) \
  __VA_ARGS__                                          \
  inline constexpr const char* var = prologue "\n" #__VA_ARGS__ "\n" epilogue;
#endif

namespace kiln::philox {

static_assert(sizeof(unsigned int) == 4 && sizeof(unsigned long long) == 8,
              "Philox needs 32- and 64-bit unsigned types");

KILN_DUAL_SOURCE(
    kPhiloxSource,
    KILN_HOST_DEVICE_SOURCE
    "#ifndef KILN_PHILOX_SOURCE\n#define KILN_PHILOX_SOURCE\n"
    "#ifndef KILN_PHILOX_MATH\n#if defined(__CUDACC__)\n#define KILN_PHILOX_MATH(f) ::f\n#else\n"
    "#define KILN_PHILOX_MATH(f) __builtin_##f\n#endif\n#endif\n"
    "namespace kiln { namespace philox {",
    "} }\n#endif\n",

    /* Four 32-bit outputs of one Philox block. */
    struct Result { unsigned int r0, r1, r2, r3; };

    /* Philox4x32-10: counter (c0..c3), key (k0, k1). */
    KILN_HOST_DEVICE inline Result philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                                                 unsigned int k0, unsigned int k1) {
      for (int round = 0; round < 10; ++round) {
        if (round > 0) {
          k0 += 0x9E3779B9u;
          k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
        unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
        unsigned int hi0 = (unsigned int)(p0 >> 32), lo0 = (unsigned int)p0;
        unsigned int hi1 = (unsigned int)(p1 >> 32), lo1 = (unsigned int)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
      }
      Result r;
      r.r0 = c0;
      r.r1 = c1;
      r.r2 = c2;
      r.r3 = c3;
      return r;
    }

    /* The block of element `index` of a random tensor seeded with `seed`. */
    KILN_HOST_DEVICE inline Result philox_element(unsigned long long seed, unsigned long long index) {
      return philox4x32_10((unsigned int)index, (unsigned int)(index >> 32), 0u, 0u, (unsigned int)seed,
                           (unsigned int)(seed >> 32));
    }

    /* A float32 uniform [0, 1) from one 32-bit word (its top 24 bits). */
    KILN_HOST_DEVICE inline float uniform_f32_of(unsigned int word) {
      return (float)(word >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
    }
    /* Word w (0..3) of a block. */
    KILN_HOST_DEVICE inline unsigned int philox_word(Result r, unsigned int w) {
      return w == 0u ? r.r0 : w == 1u ? r.r1 : w == 2u ? r.r2 : r.r3;
    }

    /* Uniform [0, 1) values; each is exactly representable in its dtype, so rounding never
       reaches 1. The f16/bf16 ones are returned as float (convert exactly). float32 takes four
       values from a block: element `index` is word index % 4 of the block at counter index / 4,
       so a kernel that draws four neighbours evaluates Philox once (fused attention's dropout). */
    KILN_HOST_DEVICE inline float uniform_f32(unsigned long long seed, unsigned long long index) {
      return uniform_f32_of(philox_word(philox_element(seed, index >> 2), (unsigned int)(index & 3ull)));
    } KILN_HOST_DEVICE inline float uniform_f16(unsigned long long seed, unsigned long long index) {
      return (float)(philox_element(seed, index).r0 >> 21) * 0.00048828125f; /* 2^-11 */
    } KILN_HOST_DEVICE inline float uniform_bf16(unsigned long long seed, unsigned long long index) {
      return (float)(philox_element(seed, index).r0 >> 24) * 0.00390625f; /* 2^-8 */
    } KILN_HOST_DEVICE inline double uniform_f64(unsigned long long seed, unsigned long long index) {
      Result r = philox_element(seed, index);
      unsigned long long bits = ((unsigned long long)r.r0 << 21) ^ (unsigned long long)(r.r1 >> 11);
      return (double)bits * 1.1102230246251565404236316680908203125e-16; /* 2^-53 */
    }

    /* Standard normal by Box-Muller: u1 in (0, 1], u2 in [0, 1]. The float version serves
       f32, f16 and bf16 (round its result). */
    KILN_HOST_DEVICE inline float normal_f32(unsigned long long seed, unsigned long long index) {
      Result r = philox_element(seed, index);
      float u1 = ((float)r.r0 + 1.0f) * 2.3283064365386962890625e-10f; /* 2^-32 */
      float u2 = (float)r.r1 * 2.3283064365386962890625e-10f;
      return KILN_PHILOX_MATH(sqrtf)(-2.0f * KILN_PHILOX_MATH(logf)(u1)) * KILN_PHILOX_MATH(cosf)(6.283185307179586f * u2);
    } KILN_HOST_DEVICE inline double normal_f64(unsigned long long seed, unsigned long long index) {
      Result r = philox_element(seed, index);
      double u1 = ((double)r.r0 + 1.0) * 2.3283064365386962890625e-10;
      double u2 = (double)r.r1 * 2.3283064365386962890625e-10;
      return KILN_PHILOX_MATH(sqrt)(-2.0 * KILN_PHILOX_MATH(log)(u1)) *
             KILN_PHILOX_MATH(cos)(6.283185307179586476925286766559 * u2);
    })

}  // namespace kiln::philox

// The host definitions above satisfy the guard of the pasted text too, so a translation unit
// may both include this header and paste kPhiloxSource.
#define KILN_PHILOX_SOURCE
