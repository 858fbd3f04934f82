#pragma once
#include "kiln/core/linkage.hpp"
// kiln's own transcendental functions for generated CPU kernels, as source text.
//
// The code generator pastes kCpuMathSource at the top of every generated CPU translation unit.
// Why kiln carries its own: a loop that calls libm's expf/tanhf/... does not vectorise without
// -ffast-math, and -ffast-math changes what users rely on (NaN/Inf handling, signed zeros,
// reassociation). These functions are written so that GCC >= 12 / Clang if-convert and vectorise
// them inside `#pragma omp simd` loops at plain -O3:
//   - no calls, no data-dependent branches: every special case is a select on values that are
//     all computed, written as bit masks (kiln_f32_sel: see there why not `?:`), which becomes
//     a blend;
//   - bit casts through __builtin_memcpy, rounding to an integer through the 1.5*2^23 shift
//     trick (no float->int conversion, so no UB on NaN or huge inputs), FMA through
//     __builtin_fma[f] (inlined with -mfma / -march=native);
//   - clamps select on `v > hi` so that NaN (all comparisons false) passes through.
// Accuracy (max ulp, measured against double / long double libm over dense sweeps) and
// throughput are recorded in docs/performance-math.md and asserted by
// tests/codegen/test_cpu_math.cpp. The text includes no headers, so it adds little to the
// compile time of a generated kernel, and it is valid C11 as well as C++17.

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// C/C++17 source text defining `static inline` kiln_<fn>_f32(float) / kiln_<fn>_f64(double)
/// for fn in exp, exp2, expm1, log, log2, log1p, tanh, erf, sin, cos, tan, sigmoid.
/// Paste it once at the top of a generated translation unit (it has no includes).
inline constexpr const char* kCpuMathSource = R"KILN_MATH(
/* ---- kiln cpu math prelude (kiln/codegen/cpp/math.hpp) ---- */
static inline unsigned int kiln_f32_bits(float x) { unsigned int u; __builtin_memcpy(&u, &x, 4); return u; }
static inline float kiln_f32_from_bits(unsigned int u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
static inline float kiln_f32_abs(float x) { return kiln_f32_from_bits(kiln_f32_bits(x) & 0x7fffffffu); }
/* c ? a : b as bit operations. A plain `?:` on floats is a phi to GCC: PRE then folds the
   arithmetic that follows into the arm holding a constant and leaves an FP operation in the
   other arm, which -ftrapping-math (the default) forbids if-conversion to speculate, and the
   loop stops vectorising. The mask form has no phi and still becomes one blend. */
static inline float kiln_f32_sel(int c, float a, float b) {
  unsigned int m = 0u - (unsigned int)c;
  return kiln_f32_from_bits((kiln_f32_bits(a) & m) | (kiln_f32_bits(b) & ~m));
}
/* 2^n for n in [-126, 127] */
static inline float kiln_f32_pow2i(int n) { return kiln_f32_from_bits((unsigned int)(n + 127) << 23); }

/* exp(r) - 1 - r = r^2 * P(r) on |r| <= ln2/2: minimax, relative to exp(r): 2^-28.3 */
static inline float kiln_f32_exp_poly(float r) {
  float p = 0x1.6a2434p-10f;
  p = __builtin_fmaf(p, r, 0x1.1239e2p-7f);
  p = __builtin_fmaf(p, r, 0x1.5558f2p-5f);
  p = __builtin_fmaf(p, r, 0x1.555492p-3f);
  p = __builtin_fmaf(p, r, 0x1.fffffcp-2f);
  return p;
}

/* exp for x in [-104, 89] (callers clamp; NaN propagates). n in [-150, 128]: the result is
   scaled by 2^(n/2) twice so that both factors are normal and only the second product rounds,
   which gives gradual underflow and overflow to inf. */
static inline float kiln_f32_exp_clamped(float xc) {
  const float shift = 0x1.8p23f;
  float t = __builtin_fmaf(xc, 0x1.715476p+0f, shift);
  float n = t - shift;
  float r = __builtin_fmaf(n, -0x1.62e430p-1f, xc); /* exact */
  r = __builtin_fmaf(n, 0x1.05c610p-29f, r);
  float y = 1.0f + __builtin_fmaf(r * r, kiln_f32_exp_poly(r), r);
  int ni = (int)(kiln_f32_bits(t) - kiln_f32_bits(shift));
  int n1 = ni >> 1;
  return y * kiln_f32_pow2i(n1) * kiln_f32_pow2i(ni - n1);
}

/* exp for x in [-87, 88], where the result is normal: one scale factor. */
static inline float kiln_f32_exp_normal(float x) {
  const float shift = 0x1.8p23f;
  float t = __builtin_fmaf(x, 0x1.715476p+0f, shift);
  float n = t - shift;
  float r = __builtin_fmaf(n, -0x1.62e430p-1f, x);
  r = __builtin_fmaf(n, 0x1.05c610p-29f, r);
  float y = 1.0f + __builtin_fmaf(r * r, kiln_f32_exp_poly(r), r);
  return y * kiln_f32_pow2i((int)(kiln_f32_bits(t) - kiln_f32_bits(shift)));
}

static inline float kiln_exp_f32(float x) {
  /* Outside [-104, 89] the result is 0 or inf; clamping keeps the scale factors in range. */
  float xc = kiln_f32_sel(x > 89.0f, 89.0f, x);
  return kiln_f32_exp_clamped(kiln_f32_sel(xc < -104.0f, -104.0f, xc));
}

/* exp for x <= 0 or NaN (softmax's x - max(x)): only the lower clamp is needed. */
static inline float kiln_exp_nonpos_f32(float x) {
  return kiln_f32_exp_clamped(kiln_f32_sel(x < -104.0f, -104.0f, x));
}

static inline float kiln_exp2_f32(float x) {
  float xc = kiln_f32_sel(x > 129.0f, 129.0f, x);
  xc = kiln_f32_sel(xc < -151.0f, -151.0f, xc);
  const float shift = 0x1.8p23f;
  float t = xc + shift;
  float r = xc - (t - shift); /* exact, |r| <= 1/2 */
  /* 2^r = 1 + r * Q(r): minimax, relative 2^-28.5 */
  float q = 0x1.470b48p-13f;
  q = __builtin_fmaf(q, r, 0x1.5f7276p-10f);
  q = __builtin_fmaf(q, r, 0x1.3b270ep-7f);
  q = __builtin_fmaf(q, r, 0x1.c6ae72p-5f);
  q = __builtin_fmaf(q, r, 0x1.ebfbe2p-3f);
  q = __builtin_fmaf(q, r, 0x1.62e432p-1f);
  float y = __builtin_fmaf(r, q, 1.0f);
  int ni = (int)(kiln_f32_bits(t) - kiln_f32_bits(shift));
  int n1 = ni >> 1;
  return y * kiln_f32_pow2i(n1) * kiln_f32_pow2i(ni - n1);
}

/* expm1 for x in [-30, 89] (callers clamp); NaN propagates. */
static inline float kiln_f32_expm1_core(float x) {
  const float shift = 0x1.8p23f;
  float t = __builtin_fmaf(x, 0x1.715476p+0f, shift);
  float n = t - shift;
  float r = __builtin_fmaf(n, -0x1.62e430p-1f, x);
  r = __builtin_fmaf(n, 0x1.05c610p-29f, r);
  /* expm1(r) = r + r^2 * P(r): minimax relative to expm1(r): 2^-26.2 */
  float p = 0x1.6bec06p-10f;
  p = __builtin_fmaf(p, r, 0x1.122776p-7f);
  p = __builtin_fmaf(p, r, 0x1.555674p-5f);
  p = __builtin_fmaf(p, r, 0x1.5554b0p-3f);
  p = __builtin_fmaf(p, r, 0x1.fffffep-2f);
  float em = __builtin_fmaf(r * r, p, r);
  /* expm1(x) = 2^n * em + (2^n - 1) = 2 * (s * em + (s - 1/2)) with s = 2^(n-1): s - 1/2 is
     exact for the n where it matters, the fma rounds once, and 2*(...) overflows to inf
     without forming 2^128. */
  int ni = (int)(kiln_f32_bits(t) - kiln_f32_bits(shift));
  float s = kiln_f32_pow2i(ni - 1);
  return __builtin_fmaf(s, em, s - 0.5f) * 2.0f;
}

static inline float kiln_expm1_f32(float x) {
  float xc = kiln_f32_sel(x > 89.0f, 89.0f, x);
  xc = kiln_f32_sel(xc < -30.0f, -30.0f, xc); /* expm1(-30) rounds to -1 */
  float y = kiln_f32_expm1_core(xc);
  /* below 2^-25 expm1(x) rounds to x: keeps -0 and the subnormals the core's halving loses */
  return kiln_f32_sel(kiln_f32_abs(x) < 0x1p-25f, x, y);
}

/* Splits positive normal x = 2^k * (1 + f), 1 + f in [sqrt(1/2), sqrt(2)), and returns f (exact)
   with *tail = log1p(f) - f and *kf = k + k0 (k0 adjusts for pre-scaled subnormals). Keeping f
   apart lets callers add the small terms first and round the big sum once. */
static inline float kiln_f32_log_core(float x, int k0, float* kf_out, float* tail_out) {
  int ix = (int)(kiln_f32_bits(x) - 0x3f3504f3u);
  int k = (ix >> 23) + k0;
  float m = kiln_f32_from_bits(((unsigned int)ix & 0x007fffffu) + 0x3f3504f3u);
  float f = m - 1.0f;
  /* log1p(f) = f - f^2/2 + f^3 * P(f): minimax relative to log1p(f): 2^-27.4 */
  float p = -0x1.38b566p-4f;
  p = __builtin_fmaf(p, f, 0x1.055d70p-3f);
  p = __builtin_fmaf(p, f, -0x1.0d8636p-3f);
  p = __builtin_fmaf(p, f, 0x1.22d9e8p-3f);
  p = __builtin_fmaf(p, f, -0x1.547228p-3f);
  p = __builtin_fmaf(p, f, 0x1.99a00ap-3f);
  p = __builtin_fmaf(p, f, -0x1.000228p-2f);
  p = __builtin_fmaf(p, f, 0x1.555554p-2f);
  float f2 = f * f;
  *kf_out = (float)k;
  *tail_out = __builtin_fmaf(f2 * f, p, -0.5f * f2);
  return f;
}

static inline float kiln_f32_log_special(float x, float y) {
  y = kiln_f32_sel(x == __builtin_inff(), x, y);
  return kiln_f32_sel(x > 0.0f, y, kiln_f32_sel(x == 0.0f, -__builtin_inff(), __builtin_nanf("")));
}

static inline float kiln_log_f32(float x) {
  int sub = x < 0x1p-126f;
  float xs = kiln_f32_sel(sub, x * 0x1p23f, x);
  float kf, tail;
  float f = kiln_f32_log_core(xs, -23 * sub, &kf, &tail);
  float y = __builtin_fmaf(kf, 0x1.62e430p-1f, f + __builtin_fmaf(kf, -0x1.05c610p-29f, tail));
  return kiln_f32_log_special(x, y);
}

static inline float kiln_log2_f32(float x) {
  int sub = x < 0x1p-126f;
  float xs = kiln_f32_sel(sub, x * 0x1p23f, x);
  float kf, tail;
  float f = kiln_f32_log_core(xs, -23 * sub, &kf, &tail);
  /* log2e = hi + lo, so that the constant's rounding does not add to the error */
  float lo = __builtin_fmaf(f, 0x1.4ae0c0p-26f, tail * 0x1.715476p+0f);
  float y = __builtin_fmaf(f, 0x1.715476p+0f, lo + kf);
  return kiln_f32_log_special(x, y);
}

static inline float kiln_log1p_f32(float x) {
  float u = 1.0f + x;
  /* c = (1 + x) - u exactly (u - 1 is exact for every u >= 1/2, and c = 0 below), so
     log1p(x) = log(u) + c/u to first order. */
  float c = x - (u - 1.0f);
  float kf, tail;
  float f = kiln_f32_log_core(u, 0, &kf, &tail);
  float y = __builtin_fmaf(kf, 0x1.62e430p-1f, f + (tail + __builtin_fmaf(kf, -0x1.05c610p-29f, c / u)));
  y = kiln_f32_log_special(u, y);
  y = kiln_f32_sel(x == __builtin_inff(), x, y);
  return kiln_f32_sel(x == 0.0f, x, y); /* keeps -0 */
}

static inline float kiln_tanh_f32(float x) {
  float a = kiln_f32_abs(x);
  a = kiln_f32_sel(a > 10.0f, 10.0f, a); /* tanh(10) rounds to 1 */
  /* Below 1.5, tanh(a) = expm1(2a) / (expm1(2a) + 2): the relative error of expm1 is not
     amplified (the factor is 2 / (em + 2) <= 1). From 1.5 on, 1 - 2 / (em + 2): the quotient is
     at most 0.095, so its error is a fraction of the result's ulp (max 0.66 ulp there, was
     1.50), and results next to 1 round right: em / (em + 2) rounded its denominator at the
     result's own ulp and gave 1 for tanh(8.897) = 0.99999994. One division either way. */
  float em = kiln_f32_expm1_core(2.0f * a);
  int big = a >= 1.5f;
  float y = kiln_f32_sel(big, 1.0f, 0.0f) + kiln_f32_sel(big, -2.0f, em) / (em + 2.0f);
  return kiln_f32_from_bits(kiln_f32_bits(y) | (kiln_f32_bits(x) & 0x80000000u));
}

static inline float kiln_sigmoid_f32(float x) {
  /* 1/(1+exp(-x)) for x >= 0 and exp(x)/(1+exp(x)) below, so that exp never overflows and the
     tail below -88 keeps its (subnormal) value instead of flushing to 0. */
  float na = -kiln_f32_abs(x);
  float e = kiln_f32_exp_clamped(kiln_f32_sel(na < -104.0f, -104.0f, na));
  return kiln_f32_sel(x >= 0.0f, 1.0f, e) / (1.0f + e);
}

static inline float kiln_erf_f32(float x) {
  float a = kiln_f32_abs(x);
  /* |x| < 1: erf(x) = x + x * Q(x^2), minimax relative 2^-29.6 */
  float z = a * a;
  float q = 0x1.496a32p-14f;
  q = __builtin_fmaf(q, z, -0x1.a3f700p-11f);
  q = __builtin_fmaf(q, z, 0x1.5405b2p-8f);
  q = __builtin_fmaf(q, z, -0x1.b7f90ep-6f);
  q = __builtin_fmaf(q, z, 0x1.ce2cf8p-4f);
  q = __builtin_fmaf(q, z, -0x1.81273ep-2f);
  q = __builtin_fmaf(q, z, 0x1.06eba8p-3f);
  float ys = __builtin_fmaf(a, q, a);
  /* 1 <= |x| < 3.92: erf = 1 - exp(P(|x| - 2.5)) with P ~ log(erfc), absolute 2^-26.9;
     above 3.92 erf rounds to 1. */
  float al = kiln_f32_sel(a > 3.92f, 3.92f, a);
  float t = al - 2.5f;
  float p = 0x1.b613bap-20f;
  p = __builtin_fmaf(p, t, -0x1.bd8bc6p-17f);
  p = __builtin_fmaf(p, t, 0x1.445b34p-14f);
  p = __builtin_fmaf(p, t, -0x1.b8a922p-12f);
  p = __builtin_fmaf(p, t, 0x1.1bcce4p-9f);
  p = __builtin_fmaf(p, t, -0x1.63cf0ep-7f);
  p = __builtin_fmaf(p, t, -0x1.e34608p-1f);
  p = __builtin_fmaf(p, t, -0x1.569252p+2f);
  p = __builtin_fmaf(p, t, -0x1.f3a2dcp+2f);
  float yl = 1.0f - kiln_f32_exp_normal(p); /* p in [-17.5, -1.8] */
  float y = kiln_f32_sel(a < 1.0f, ys, yl);
  return kiln_f32_from_bits(kiln_f32_bits(y) | (kiln_f32_bits(x) & 0x80000000u));
}

/* Cody-Waite reduction x = j*pi/2 + r with a 3-part pi/2 and FMA (the first step is exact):
   r keeps full relative accuracy for |x| <= 2^20 (the closest float to a multiple of pi/2
   there is 2^-27.8 away; the part of pi/2 dropped after 3 terms costs j * 2^-74), and |r|
   stays below 0.83, the polynomials' range. Beyond 2^20 j = rint(x * fl(2/pi)) can be off by
   one and r loses its low bits: those results are replaced by kiln_f32_trig_big below.
   Returns r and j mod 4 in *q. */
static inline float kiln_f32_trig_reduce(float x, unsigned int* q) {
  const float shift = 0x1.8p23f;
  float t = __builtin_fmaf(x, 0x1.45f306p-1f, shift);
  float j = t - shift;
  float r = __builtin_fmaf(j, -0x1.921fb6p+0f, x);
  r = __builtin_fmaf(j, 0x1.777a5cp-25f, r);
  r = __builtin_fmaf(j, 0x1.ee59dap-50f, r);
  *q = kiln_f32_bits(t);
  return r;
}

/* sin(r) = r + r^3 * S(r^2), cos(r) = 1 - r^2/2 + r^4 * C(r^2) on |r| <= 0.83 (minimax,
   relative 2^-27.3 and 2^-32.2). */
static inline float kiln_f32_sin_poly(float r, float z) {
  float s = -0x1.9877d0p-13f;
  s = __builtin_fmaf(s, z, 0x1.1104cap-7f);
  s = __builtin_fmaf(s, z, -0x1.55553ep-3f);
  return __builtin_fmaf(r * z, s, r);
}
static inline float kiln_f32_cos_poly(float z) {
  float c = 0x1.9930d4p-16f;
  c = __builtin_fmaf(c, z, -0x1.6c098cp-10f);
  c = __builtin_fmaf(c, z, 0x1.555546p-5f);
  return __builtin_fmaf(z * z, c, __builtin_fmaf(-0.5f, z, 1.0f));
}

/* The fast paths: accurate for |x| <= 2^20, NaN for NaN, anything (finite or NaN) beyond. */
static inline float kiln_f32_sin_fast(float x) {
  unsigned int q;
  float r = kiln_f32_trig_reduce(x, &q);
  float z = r * r;
  float y = kiln_f32_sel((int)(q & 1u), kiln_f32_cos_poly(z), kiln_f32_sin_poly(r, z));
  y = kiln_f32_from_bits(kiln_f32_bits(y) ^ ((q & 2u) << 30));
  return kiln_f32_sel(x == 0.0f, x, y); /* keeps -0 (the reduction's fma turns it into +0) */
}

static inline float kiln_f32_cos_fast(float x) {
  unsigned int q;
  float r = kiln_f32_trig_reduce(x, &q);
  q += 1u;
  float z = r * r;
  float y = kiln_f32_sel((int)(q & 1u), kiln_f32_cos_poly(z), kiln_f32_sin_poly(r, z));
  return kiln_f32_from_bits(kiln_f32_bits(y) ^ ((q & 2u) << 30));
}

static inline float kiln_f32_tan_fast(float x) {
  unsigned int q;
  float r = kiln_f32_trig_reduce(x, &q);
  float z = r * r;
  /* tan(r) = r + r^3 * T(r^2) on |r| <= 0.83, minimax relative 2^-28.1; odd quadrants give
     -1/tan(r). (sin/cos divided costs the error of both.) */
  float p = 0x1.4bd1fep-8f;
  p = __builtin_fmaf(p, z, -0x1.60d71cp-10f);
  p = __builtin_fmaf(p, z, 0x1.894a76p-7f);
  p = __builtin_fmaf(p, z, 0x1.551990p-6f);
  p = __builtin_fmaf(p, z, 0x1.bb9d2cp-5f);
  p = __builtin_fmaf(p, z, 0x1.11092ep-3f);
  p = __builtin_fmaf(p, z, 0x1.555572p-2f);
  float t = __builtin_fmaf(r * z, p, r);
  t = kiln_f32_sel((int)(q & 1u), -1.0f / t, t);
  return kiln_f32_sel(x == 0.0f, x, t); /* keeps -0 */
}

/* |x| > 2^20 (and +-inf): libm's sinf/cosf/tanf, which reduce with Payne-Hanek over the whole
   float range. A branch-free reduction of that range needs a 2/pi window chosen by the exponent
   (gathers and 64-bit products on every lane: several times the cost of the fast path), and
   GCC 12 does not vectorise a loop with a conditional call in it. So the fix-up is one
   function with vector variants (OpenMP `declare simd`, x86-64 vector function ABI): a
   vectorised loop calls the variant of its width with the fast results, and the variant hands
   them back untouched unless some lane is beyond 2^20 (a compare, a movmsk and a branch that
   is predicted not taken); only then are those lanes recomputed one by one, out of line.
   fn: 0 sin, 1 cos, 2 tan. The variants are written for every ISA the unit is compiled for
   (b: SSE2, c: AVX, d: AVX2, e: AVX-512F), so that whichever GCC picks is defined; being
   extern (the compiler cannot see the calls it will make to them), they are compiled into
   every unit that has this text, about 25 ms of compile time. Clang 14's
   loop vectoriser does not call `declare simd` variants, so there the fix-up is a plain
   branch: correct, but a loop of sin/cos/tan stays scalar. */
#if defined(__cplusplus)
extern "C" {
#endif
__attribute__((visibility("hidden"), noinline, cold)) void kiln_f32_trig_big_lanes(const float* x, float* y, int n, int fn) {
  for (int i = 0; i < n; ++i)
    if (kiln_f32_abs(x[i]) > 0x1p20f) y[i] = fn == 0 ? __builtin_sinf(x[i]) : fn == 1 ? __builtin_cosf(x[i]) : __builtin_tanf(x[i]);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* Declared here and defined under other C names through asm labels, so that the compiler
   takes the variants written below instead of cloning a body of its own. */
#pragma omp declare simd uniform(fn) notinbranch
__attribute__((visibility("hidden"), const, nothrow)) float kiln_f32_trig_big(float x, float y, int fn);
__attribute__((visibility("hidden"))) float kiln_f32_trig_big_1(float x, float y, int fn) __asm__("kiln_f32_trig_big");
__attribute__((visibility("hidden"))) float kiln_f32_trig_big_1(float x, float y, int fn) {
  if (__builtin_expect(kiln_f32_abs(x) > 0x1p20f, 0)) kiln_f32_trig_big_lanes(&x, &y, 1, fn);
  return y;
}
/* The variant keeps x and y in registers on the common path (the copies to memory are in the
   cold helper, whose by-value parameters would otherwise force a spill and a reload of y on
   every call) and tests |x| > 2^20 as x * x > 2^40 (exact, false for NaN): a multiply, a
   compare, a movmsk and a branch. */
#define KILN_TRIG_BIG_VARIANT(isa, n, vf, vi, any)                                                           \
  static __attribute__((noinline, cold)) vf kiln_f32_trig_big_fix_##isa(vf x, vf y, int fn) {                \
    float xs[n], ys[n];                                                                                      \
    __builtin_memcpy(xs, &x, sizeof x);                                                                      \
    __builtin_memcpy(ys, &y, sizeof y);                                                                      \
    kiln_f32_trig_big_lanes(xs, ys, n, fn);                                                                  \
    __builtin_memcpy(&y, ys, sizeof y);                                                                      \
    return y;                                                                                                \
  }                                                                                                          \
  __attribute__((visibility("hidden"))) vf kiln_f32_trig_big_##isa(vf x, vf y, int fn)                      \
      __asm__("_ZGV" #isa "N" #n "vvu_kiln_f32_trig_big");                                                   \
  __attribute__((visibility("hidden"))) vf kiln_f32_trig_big_##isa(vf x, vf y, int fn) {                    \
    vi big = x * x > 0x1p40f;                                                                                \
    return __builtin_expect(any, 0) ? kiln_f32_trig_big_fix_##isa(x, y, fn) : y;                              \
  }
typedef float kiln_v4sf __attribute__((vector_size(16)));
typedef int kiln_v4si __attribute__((vector_size(16)));
KILN_TRIG_BIG_VARIANT(b, 4, kiln_v4sf, kiln_v4si, __builtin_ia32_movmskps((kiln_v4sf)big))
#if defined(__AVX__)
typedef float kiln_v8sf __attribute__((vector_size(32)));
typedef int kiln_v8si __attribute__((vector_size(32)));
#if !defined(__AVX2__) /* with AVX2, GCC always prefers d to c (same width, lower badness) */
KILN_TRIG_BIG_VARIANT(c, 8, kiln_v8sf, kiln_v8si, __builtin_ia32_movmskps256((kiln_v8sf)big))
#endif
#endif
#if defined(__AVX2__)
KILN_TRIG_BIG_VARIANT(d, 8, kiln_v8sf, kiln_v8si, __builtin_ia32_movmskps256((kiln_v8sf)big))
#endif
#if defined(__AVX512F__)
typedef float kiln_v16sf __attribute__((vector_size(64)));
typedef int kiln_v16si __attribute__((vector_size(64)));
static inline int kiln_v16si_any(kiln_v16si m) {
  kiln_v8si h[2];
  __builtin_memcpy(h, &m, 64);
  return __builtin_ia32_movmskps256((kiln_v8sf)(h[0] | h[1]));
}
KILN_TRIG_BIG_VARIANT(e, 16, kiln_v16sf, kiln_v16si, kiln_v16si_any(big))
#endif
#undef KILN_TRIG_BIG_VARIANT
#else
static inline float kiln_f32_trig_big(float x, float y, int fn) {
  if (__builtin_expect(kiln_f32_abs(x) > 0x1p20f, 0)) kiln_f32_trig_big_lanes(&x, &y, 1, fn);
  return y;
}
#endif
#if defined(__cplusplus)
}
#endif

static inline float kiln_sin_f32(float x) { return kiln_f32_trig_big(x, kiln_f32_sin_fast(x), 0); }
static inline float kiln_cos_f32(float x) { return kiln_f32_trig_big(x, kiln_f32_cos_fast(x), 1); }
static inline float kiln_tan_f32(float x) { return kiln_f32_trig_big(x, kiln_f32_tan_fast(x), 2); }
/* ---- float64 ----
   Double kernels call glibc's libm (__builtin_<fn> emits the call without a declaration; link
   with -lm). Such loops do not vectorise. Defining KILN_CPU_MATH_LIBMVEC before this text (and
   linking -lmvec, glibc >= 2.35) declares the functions with the OpenMP simd attribute, as
   glibc's own <math.h> does under -ffast-math, so that GCC calls libmvec's 4-wide AVX2
   variants (_ZGVdN4v_exp, ...) in `omp simd` loops: documented <= 4 ulp, special inputs handled
   by the scalar libm path. */
static inline unsigned long long kiln_f64_bits(double x) { unsigned long long u; __builtin_memcpy(&u, &x, 8); return u; }
static inline double kiln_f64_from_bits(unsigned long long u) { double x; __builtin_memcpy(&x, &u, 8); return x; }
static inline double kiln_f64_abs(double x) { return kiln_f64_from_bits(kiln_f64_bits(x) & 0x7fffffffffffffffull); }
static inline double kiln_f64_sel(int c, double a, double b) {
  unsigned long long m = 0ull - (unsigned long long)c;
  return kiln_f64_from_bits((kiln_f64_bits(a) & m) | (kiln_f64_bits(b) & ~m));
}
/* ---- atan, asin, acos ----
   Evaluated in double and rounded once to float: every rounding of the reduction steps stays
   far below the float's half ulp, and double sqrt and division vectorise. atan: |x| > 1 goes
   through pi/2 - atan(1/|x|), then t > tan(pi/12) through pi/6 + atan((t - 1/sqrt 3) /
   (1 + t/sqrt 3)), leaving |u| <= tan(pi/12) = 0.268, where atan's series to u^15 is within
   1e-11 relative. asin(x) = atan(x / sqrt(1 - x^2)) (x^2 of a float is exact in double);
   acos(x) = 2 atan(sqrt((1 - x) / (1 + x))), without cancellation near x = 1. Special values
   fall out of the arithmetic: atan(+-inf) = +-pi/2, asin(+-1) = +-pi/2, acos(-1) = pi, NaN
   outside [-1, 1], signed zeros kept (the sign is copied back). asin and acos vectorise with
   -fno-math-errno, as kernels are built (a sqrt that may set errno does not). */
static inline double kiln_f64_atan_nonneg(double a) {
  int inv = a > 1.0;
  double t = kiln_f64_sel(inv, 1.0 / a, a);
  int red = t > 0.26794919243112270;
  double u = kiln_f64_sel(red, (t - 0.57735026918962576) / (1.0 + t * 0.57735026918962576), t);
  double u2 = u * u;
  double q = -1.0 / 15.0;
  q = 1.0 / 13.0 + u2 * q;
  q = -1.0 / 11.0 + u2 * q;
  q = 1.0 / 9.0 + u2 * q;
  q = -1.0 / 7.0 + u2 * q;
  q = 1.0 / 5.0 + u2 * q;
  q = -1.0 / 3.0 + u2 * q;
  double r = u + u * (u2 * q);
  r = kiln_f64_sel(red, 0.52359877559829887 + r, r);
  return kiln_f64_sel(inv, 1.5707963267948966 - r, r);
}
static inline float kiln_atan_f32(float x) {
  double d = (double)x;
  return (float)__builtin_copysign(kiln_f64_atan_nonneg(__builtin_fabs(d)), d);
}
static inline float kiln_asin_f32(float x) {
  double d = (double)x;
  return (float)__builtin_copysign(kiln_f64_atan_nonneg(__builtin_fabs(d) / __builtin_sqrt(1.0 - d * d)), d);
}
static inline float kiln_acos_f32(float x) {
  double d = (double)x;
  return (float)(2.0 * kiln_f64_atan_nonneg(__builtin_sqrt((1.0 - d) / (1.0 + d))));
}
/* atan2 and hypot, in double too. atan2: q = min(|x|, |y|) / max(|x|, |y|) in [0, 1] (0 when
   both are 0, 1 when both are infinite), r = atan(q), then pi/2 - r when |y| > |x|, pi - r when
   x's sign bit is set, and y's sign: atan2(+-0, -0) = +-pi, atan2(+-inf, -inf) = +-3pi/4, NaN
   in, NaN out. hypot: sqrt(x^2 + y^2) cannot overflow or lose digits in double for floats;
   an infinite operand gives +inf even beside a NaN (IEEE, C). */
static inline float kiln_atan2_f32(float y, float x) {
  double dy = (double)y, dx = (double)x, ay = __builtin_fabs(dy), ax = __builtin_fabs(dx);
  int swap = ay > ax;
  double num = kiln_f64_sel(swap, ax, ay), den = kiln_f64_sel(swap, ay, ax);
  double q = kiln_f64_sel((den == 0.0) & (num == 0.0), 0.0, num / den);
  q = kiln_f64_sel((ax == __builtin_inf()) & (ay == __builtin_inf()), 1.0, q);
  double r = kiln_f64_atan_nonneg(q);
  r = kiln_f64_sel(swap, 1.5707963267948966 - r, r);
  r = kiln_f64_sel((int)(kiln_f64_bits(dx) >> 63), 3.1415926535897931 - r, r);
  return (float)__builtin_copysign(r, dy);
}
static inline float kiln_hypot_f32(float x, float y) {
  double dx = (double)x, dy = (double)y;
  double r = __builtin_sqrt(dx * dx + dy * dy);
  return (float)kiln_f64_sel((__builtin_fabs(dx) == __builtin_inf()) | (__builtin_fabs(dy) == __builtin_inf()),
                             __builtin_inf(), r);
}
/* fmod, exactly (as libm), in double and vectorisable: r = |x| is reduced by t = |y| 2^s while
   r >= |y|, s chosen so that the quotient q = trunc(r / t) stays below 2^49. r - q t is exactly
   representable (less than 2t, a multiple of the smaller of r's and t's last bits: 25 bits), so
   one fused multiply-add gives it exactly. r / t is taken as r (1 / |y|) 2^-s (one division
   for the element, not one a step) and truncated by adding and taking away 2^52 (trunc does
   not vectorise); its roundings put q at most one off either way, which one correction each way
   (r - q t below 0 or at least t) undoes. Each step takes 48 bits off the exponent difference,
   so six cover every pair of floats (at most 277 apart); a finished lane keeps its r.
   y = 0, an infinite x or a NaN give NaN; an infinite y gives x; the result has x's sign. */
static inline long long kiln_f64_exponent(double x) { return (long long)((kiln_f64_bits(x) >> 52) & 0x7ff); }
static inline float kiln_fmod_f32(float x, float y) {
  double ax = kiln_f64_abs((double)x), ay = kiln_f64_abs((double)y), r = ax, inv = 1.0 / ay;
  long long ey = kiln_f64_exponent(ay);
#pragma GCC unroll 6
  for (int step = 0; step < 6; ++step) {
    long long s = kiln_f64_exponent(r) - ey - 48;
    s = s < 0 ? 0 : s;
    double t = ay * kiln_f64_from_bits((unsigned long long)(1023 + s) << 52);
    double v = r * inv * kiln_f64_from_bits((unsigned long long)(1023 - s) << 52);
    double q = (v + 0x1p52) - 0x1p52;  // v in [0, 2^49]: to the nearest integer, then down
    q = kiln_f64_sel(q > v, q - 1.0, q);
    double n = __builtin_fma(-q, t, r);
    n = kiln_f64_sel(n < 0.0, n + t, n);
    n = kiln_f64_sel(n >= t, n - t, n);
    r = kiln_f64_sel(r >= ay, n, r);
  }
  double res = __builtin_copysign(r, (double)x);
  int bad = (ay == 0.0) | (ax == __builtin_inf()) | (x != x) | (y != y);
  return (float)kiln_f64_sel(bad, __builtin_nan(""), res);
}
static inline double kiln_fmod_f64(double x, double y) { return __builtin_fmod(x, y); }
#if defined(KILN_CPU_MATH_LIBMVEC)
#if defined(__cplusplus)
#define KILN_LIBMVEC_DECL(fn) extern "C" double fn(double) noexcept(true) __attribute__((simd("notinbranch")));
#else
#define KILN_LIBMVEC_DECL(fn) extern double fn(double) __attribute__((simd("notinbranch")));
#endif
KILN_LIBMVEC_DECL(exp) KILN_LIBMVEC_DECL(exp2) KILN_LIBMVEC_DECL(expm1) KILN_LIBMVEC_DECL(log)
KILN_LIBMVEC_DECL(log2) KILN_LIBMVEC_DECL(log1p) KILN_LIBMVEC_DECL(tanh) KILN_LIBMVEC_DECL(erf)
KILN_LIBMVEC_DECL(sin) KILN_LIBMVEC_DECL(cos) KILN_LIBMVEC_DECL(tan)
KILN_LIBMVEC_DECL(atan) KILN_LIBMVEC_DECL(asin) KILN_LIBMVEC_DECL(acos)
#if defined(__cplusplus)
extern "C" double atan2(double, double) noexcept(true) __attribute__((simd("notinbranch")));
extern "C" double hypot(double, double) noexcept(true) __attribute__((simd("notinbranch")));
#else
extern double atan2(double, double) __attribute__((simd("notinbranch")));
extern double hypot(double, double) __attribute__((simd("notinbranch")));
#endif
#undef KILN_LIBMVEC_DECL
#define KILN_LIBM(fn) fn
#else
#define KILN_LIBM(fn) __builtin_##fn
#endif
static inline double kiln_exp_f64(double x) { return KILN_LIBM(exp)(x); }
static inline double kiln_exp2_f64(double x) { return KILN_LIBM(exp2)(x); }
static inline double kiln_expm1_f64(double x) { return KILN_LIBM(expm1)(x); }
static inline double kiln_log_f64(double x) { return KILN_LIBM(log)(x); }
static inline double kiln_log2_f64(double x) { return KILN_LIBM(log2)(x); }
static inline double kiln_log1p_f64(double x) { return KILN_LIBM(log1p)(x); }
static inline double kiln_tanh_f64(double x) { return KILN_LIBM(tanh)(x); }
static inline double kiln_erf_f64(double x) { return KILN_LIBM(erf)(x); }
static inline double kiln_sin_f64(double x) { return KILN_LIBM(sin)(x); }
static inline double kiln_cos_f64(double x) { return KILN_LIBM(cos)(x); }
static inline double kiln_tan_f64(double x) { return KILN_LIBM(tan)(x); }
static inline double kiln_atan_f64(double x) { return KILN_LIBM(atan)(x); }
static inline double kiln_asin_f64(double x) { return KILN_LIBM(asin)(x); }
static inline double kiln_acos_f64(double x) { return KILN_LIBM(acos)(x); }
static inline double kiln_atan2_f64(double y, double x) { return KILN_LIBM(atan2)(y, x); }
static inline double kiln_hypot_f64(double x, double y) { return KILN_LIBM(hypot)(x, y); }
static inline double kiln_sigmoid_f64(double x) {
  /* same split as the float version: exp never overflows, the negative tail keeps its value */
  double e = KILN_LIBM(exp)(-kiln_f64_abs(x));
  return kiln_f64_sel(x >= 0.0, 1.0, e) / (1.0 + e);
}
#undef KILN_LIBM
/* ---- end of kiln cpu math prelude ---- */
)KILN_MATH";

}  // namespace kiln::codegen

KILN_COLD_CODE_END
