#pragma once
// The CUDA unit of a fused attention step (sched::AttentionCall): FlashAttention-2's forward and
// backward on tensor cores for f16/bf16 with feature dims a multiple of 16 (up to 256), and a
// generic SIMT kernel set (float or double math) for everything else.
//
// Tensor-core path (4 warps a block, each warp 16 rows of the block's tile):
//  - forward: a block per (batch, head, 64 query rows); Q's tile stays in shared memory, K and V
//    tiles (64 keys, 32 when a feature dim passes 128) are double-buffered with cp.async so the
//    next tile loads while this one multiplies. S = Q Kᵀ by mma.sync m16n8k16 (f32 accumulators),
//    an online softmax in base 2 (scale · log2 e folded into one multiply), and P reused from
//    its C fragments as the A fragments of P V, so P never touches shared memory. Key tiles past
//    the causal diagonal are not loaded.
//  - backward: `delta` (a warp per row: rowsum(dout · out)), then dQ (a block per query tile,
//    looping over key tiles: S and dP = dO Vᵀ, dS = P (dP - delta), dQ += dS K), then dK/dV (a
//    block per kv head's key tile, looping over the group's heads and their query tiles; it
//    computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ directly, so Pᵀ and dSᵀ are already the A fragments of
//    dV += Pᵀ dO and dK += dSᵀ Q, and one block owns each dk/dv row: no atomics). When E + Ev
//    passes 256 the dK and dV accumulators would not both fit in registers, so they run as two
//    kernels.
//  Rows of a tile past L or S are zero-filled in shared memory (a 0 · garbage NaN never reaches
//  a product) and masked to -inf in the scores. Rows whose every key is masked get lse = -inf, an
//  output of 0 and zero gradients. Global rows move in 16-byte cp.async pieces when the strides
//  are multiples of 8 elements and the pointer is 16-byte aligned (checked at run time), else
//  element by element.
//
// Tiles and dynamic shared memory (rows padded by 8 halves so a fragment load's 8 rows fall on
// distinct banks; over 48 KiB takes the opt-in attribute, within sm_80's 163 KiB everywhere):
//   E = Ev   forward (Q 64, K/V tiles x2)   dQ (Q, dO 64; K, V)     dK/dV (K, V 64; Q, dO tile)
//   <= 64    64 keys: 45 KiB                64 keys: 36 KiB         64 queries: 37 KiB
//   <= 128   64 keys: 85 KiB                64 keys: 68 KiB         32 queries: 51 KiB
//   <= 256   32 keys: 99 KiB                32 keys: 99 KiB         32 queries: 99 KiB, two kernels
// which keep every kernel under ~250 registers a thread without spills (ptxas, sm_90).
//
// Dropout (both paths): each kernel that forms P multiplies it by ka_keep, one Philox draw per
// element keyed by the call's key (codegen/c/attention.hpp), after the row sums; the backward
// draws the same numbers, so nothing is saved between them.
//
// Generic path (128 threads a block): the same decomposition with tiles of converted values in
// shared memory (sized to the head dims and the dtype: 32 x 32 tiles, halved until they fit),
// a score per thread, a thread per row for the softmax statistics.
//
// The tensor-core instructions (mma.sync, cp.async) are small helpers under
// `#ifndef KILN_EMULATED_MMA`, so the host emulator of the tests supplies its own.
#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/codegen/c/attention.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/core/error.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

namespace cuda_attention_detail {

using i64 = std::int64_t;

inline constexpr const char* kTensorCoreHelpers = R"CUDA(
#ifndef KILN_EMULATED_MMA
// D += A B for one m16n8k16 tile (A row-major 16x16, B column-major 16x8, f32 accumulators).
static __device__ __forceinline__ void kiln_mma_m16n8k16_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                             unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void kiln_mma_m16n8k16_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                              unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// 16 bytes global -> shared without passing through registers; visible after a wait and a barrier.
static __device__ __forceinline__ void kiln_cp_async16(void* smem, const void* gmem) {
  unsigned s;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void kiln_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void kiln_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
static __device__ __forceinline__ void kiln_cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
#endif

#define KA_THREADS 128
static __device__ __forceinline__ unsigned ka_lds32(const unsigned short* p) { return *(const unsigned*)p; }
// Two elements `stride` apart as one fragment register (the lower index in the low half).
static __device__ __forceinline__ unsigned ka_lds2(const unsigned short* p, int stride) {
  return (unsigned)p[0] | ((unsigned)p[stride] << 16);
}
static __device__ __forceinline__ bool ka_aligned(const void* p) { return ((unsigned long long)p & 15ull) == 0ull; }

// Rows [0, n) of a [.., width] tile (global row stride rs) into shared memory (row stride ds),
// rows [n, rows) zeroed. 16 bytes a step: cp.async when `vec` (the caller commits and waits).
static __device__ __forceinline__ void ka_tile(unsigned short* dst, int ds, const unsigned short* src, long long rs,
                                               int rows, int n, int width, bool vec) {
  const int chunks = width >> 3;
  for (int x = threadIdx.x; x < rows * chunks; x += KA_THREADS) {
    const int r = x / chunks, c = (x - r * chunks) << 3;
    unsigned short* d = dst + r * ds + c;
    if (r >= n) {
      *(uint4*)d = make_uint4(0u, 0u, 0u, 0u);
    } else if (vec) {
      kiln_cp_async16(d, src + r * rs + c);
    } else {
      for (int u = 0; u < 8; ++u) d[u] = src[r * rs + c + u];
    }
  }
}

// acc[n] = A Bᵀ for this warp: A's 16 rows (row stride as) against B's rows [8n, 8n + 8) (row
// stride bs), both in shared memory, over W features.
template <int N, int W>
static __device__ __forceinline__ void ka_abt(float (&acc)[N][4], const unsigned short* A, int as,
                                              const unsigned short* B, int bs, int g, int t) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < W; kk += 16) {
    const unsigned short* ap = A + g * as + kk + 2 * t;
    const unsigned a0 = ka_lds32(ap), a1 = ka_lds32(ap + 8 * as), a2 = ka_lds32(ap + 8), a3 = ka_lds32(ap + 8 * as + 8);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const unsigned short* bp = B + (n * 8 + g) * bs + kk + 2 * t;
      KA_MMA(acc[n], a0, a1, a2, a3, ka_lds32(bp), ka_lds32(bp + 8));
    }
  }
}

// acc[n] += P B for this warp: P (16 x K) as the C fragments of an earlier product, which are
// the A fragments of this one once packed; B's rows [0, K) (row stride bs), columns [8n, 8n + 8).
template <int K, int N>
static __device__ __forceinline__ void ka_pb(float (&acc)[N][4], const float (&p)[K / 8][4], const unsigned short* B,
                                             int bs, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const unsigned a0 = ka_pack(p[2 * kk][0], p[2 * kk][1]), a1 = ka_pack(p[2 * kk][2], p[2 * kk][3]);
    const unsigned a2 = ka_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), a3 = ka_pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    const unsigned short* bp = B + (kk * 16 + 2 * t) * bs + g;
#pragma unroll
    for (int n = 0; n < N; ++n) KA_MMA(acc[n], a0, a1, a2, a3, ka_lds2(bp + n * 8, bs), ka_lds2(bp + 8 * bs + n * 8, bs));
  }
}

// The additive mask at (i, j) in base-2 units (0 without one).
static __device__ __forceinline__ float ka_mask2(const ka_mask_t* mask, long long mo, long long i, long long j) {
#if KA_HAS_MASK
  return (float)ka_ldm(mask[mo + i * KA_M2 + j * KA_M3]) * 1.4426950408889634f;
#else
  (void)mask; (void)mo; (void)i; (void)j;
  return 0.0f;
#endif
}
// A row's saved lse in base-2 units, +inf for a row whose keys are all masked (or past L), so
// that exp2(s - it) is 0 whatever s is.
static __device__ __forceinline__ float ka_lse2(float x) { return x == -KILN_INF_F ? KILN_INF_F : x * 1.4426950408889634f; }
)CUDA";

// Dropout's factors of a lane's four scores (shared by the tensor-core kernels). With S a
// multiple of 4 a Philox block covers four neighbouring keys of one query row, which four
// lanes' fragments hold between them: each lane evaluates one block and the lanes trade words,
// a quarter of the Philox work of drawing per score. (Other S: a draw per score.)
inline constexpr const char* kTensorCoreDropout = R"CUDA(
// Scores of rows r0, r1 at columns jc, jc + 1 (this lane's C fragment: z[0..1] row r0, z[2..3]
// row r1): lanes t and t ^ 1 cover columns [jc & ~3, +4) of both rows; the even one evaluates
// row r0's block, the odd one row r1's.
static __device__ __forceinline__ void ka_keep_rows(float (&z)[4], unsigned long long seed, long long b, long long h,
                                                    long long r0, long long r1, long long jc, int t) {
#if KA_S % 4 == 0
  const bool odd = (t & 1) != 0;
  const kiln::philox::Result w =
      kiln::philox::philox_element(seed, ka_drop_index(b, h, odd ? r1 : r0, jc - (odd ? 2 : 0)) >> 2);
  // The even lane needs row r1's words 0, 1 (from the odd one), the odd lane row r0's 2, 3.
  const unsigned x = __shfl_xor_sync(0xffffffffu, odd ? w.r0 : w.r2, 1);
  const unsigned y = __shfl_xor_sync(0xffffffffu, odd ? w.r1 : w.r3, 1);
  z[0] = ka_keep_of(odd ? x : w.r0);
  z[1] = ka_keep_of(odd ? y : w.r1);
  z[2] = ka_keep_of(odd ? w.r2 : x);
  z[3] = ka_keep_of(odd ? w.r3 : y);
#else
  (void)t;
  z[0] = ka_keep(seed, b, h, r0, jc);
  z[1] = ka_keep(seed, b, h, r0, jc + 1);
  z[2] = ka_keep(seed, b, h, r1, jc);
  z[3] = ka_keep(seed, b, h, r1, jc + 1);
#endif
}
static __device__ __forceinline__ unsigned ka_pick4(unsigned a, unsigned b, unsigned c, unsigned d, int i) {
  return i == 0 ? a : i == 1 ? b : i == 2 ? c : d;
}
// Transposed scores (dK/dV): keys k0 and k0 + 8 (z[0..1] key k0, z[2..3] key k0 + 8) against
// queries c, c + 1. The four lanes of one t whose g differ in bits 0-1 (r = g & 3) hold keys
// kb + r, kb = k0 - r: lane r evaluates block r (query c + (r & 1), keys kb + (r >> 1) * 8 on),
// and every lane takes word r of each block, trading with lane ^ (d << 2) in round d.
static __device__ __forceinline__ void ka_keep_cols(float (&z)[4], unsigned long long seed, long long b, long long h,
                                                    long long c, long long k0, int g) {
#if KA_S % 4 == 0
  const int r = g & 3;
  const kiln::philox::Result w =
      kiln::philox::philox_element(seed, ka_drop_index(b, h, c + (r & 1), k0 - r + (r >> 1) * 8) >> 2);
  // got[d]: word r of block r ^ d (the partner of round d holds block r ^ d and sends word r).
  const unsigned g0 = ka_pick4(w.r0, w.r1, w.r2, w.r3, r);
  const unsigned g1 = __shfl_xor_sync(0xffffffffu, ka_pick4(w.r0, w.r1, w.r2, w.r3, r ^ 1), 4);
  const unsigned g2 = __shfl_xor_sync(0xffffffffu, ka_pick4(w.r0, w.r1, w.r2, w.r3, r ^ 2), 8);
  const unsigned g3 = __shfl_xor_sync(0xffffffffu, ka_pick4(w.r0, w.r1, w.r2, w.r3, r ^ 3), 12);
  // Score e is of block e: query c + (e & 1), key k0 + (e >> 1) * 8.
#pragma unroll
  for (int e = 0; e < 4; ++e) z[e] = ka_keep_of(ka_pick4(g0, g1, g2, g3, r ^ e));
#else
  (void)g;
  z[0] = ka_keep(seed, b, h, c, k0);
  z[1] = ka_keep(seed, b, h, c + 1, k0);
  z[2] = ka_keep(seed, b, h, c, k0 + 8);
  z[3] = ka_keep(seed, b, h, c + 1, k0 + 8);
#endif
}
)CUDA";

inline constexpr const char* kTensorCoreForward = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_NAME_forward(ka_args a) {
  const unsigned short* __restrict__ q = (const unsigned short*)a.p[0];
  const unsigned short* __restrict__ k = (const unsigned short*)a.p[1];
  const unsigned short* __restrict__ v = (const unsigned short*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  unsigned short* __restrict__ out = (unsigned short*)a.p[4];
  ka_stat* __restrict__ lse = (ka_stat*)a.p[5];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  KILN_EXTERN_SMEM(ka_sm);
  unsigned short* const sQ = (unsigned short*)ka_sm;
  unsigned short* const sK = sQ + KA_BQ * KA_QS;  // two buffers each
  unsigned short* const sV = sK + 2 * KA_BK * KA_KS;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const long long qblocks = (KA_L + KA_BQ - 1) / KA_BQ, bh = (long long)blockIdx.x / qblocks;
  const long long h = bh % KA_H, b = bh / KA_H, hk = h / KA_GROUP, i0 = ((long long)blockIdx.x % qblocks) * KA_BQ;
  const int nq = (int)KA_MIN((long long)KA_BQ, KA_L - i0);
  const unsigned short* const kb = k + b * KA_K0 + hk * KA_K1;
  const unsigned short* const vb = v + b * KA_V0 + hk * KA_V1;
  const long long mo = b * KA_M0 + h * KA_M1;
  (void)mask; (void)out; (void)lse; (void)vb;
  const bool kvec = KA_KVEC && ka_aligned(k), vvec = KA_VVEC && ka_aligned(v);
  ka_tile(sQ, KA_QS, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_BQ, nq, KA_E, KA_QVEC && ka_aligned(q));
  const long long jend = KA_CAUSAL ? KA_MIN(KA_S, i0 + nq) : KA_S;
  const int tiles = (int)((jend + KA_BK - 1) / KA_BK);
  if (tiles > 0) {
    const int nk = (int)KA_MIN((long long)KA_BK, jend);
    ka_tile(sK, KA_KS, kb, KA_K2, KA_BK, nk, KA_E, kvec);
    if (KA_WANT_OUT) ka_tile(sV, KA_VS, vb, KA_V2, KA_BK, nk, KA_EV, vvec);
  }
  kiln_cp_async_commit();
  const long long qi0 = i0 + warp * 16 + g, qi1 = qi0 + 8;  // this lane's two rows
  float o[KA_EV / 8][4];
#pragma unroll
  for (int n = 0; n < KA_EV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Row maxima (base 2) and this lane's part of the row sums, relative to the maxima.
  float m0 = -KILN_INF_F, m1 = -KILN_INF_F, l0 = 0.0f, l1 = 0.0f;
  for (int jt = 0; jt < tiles; ++jt) {
    const long long j0 = (long long)jt * KA_BK;
    const int buf = jt & 1;
    if (jt + 1 < tiles) {  // the next tile loads while this one computes
      const long long j1 = j0 + KA_BK;
      const int nk = (int)KA_MIN((long long)KA_BK, jend - j1);
      ka_tile(sK + (buf ^ 1) * KA_BK * KA_KS, KA_KS, kb + j1 * KA_K2, KA_K2, KA_BK, nk, KA_E, kvec);
      if (KA_WANT_OUT) ka_tile(sV + (buf ^ 1) * KA_BK * KA_VS, KA_VS, vb + j1 * KA_V2, KA_V2, KA_BK, nk, KA_EV, vvec);
      kiln_cp_async_commit();
      kiln_cp_async_wait_one();
    } else {
      kiln_cp_async_wait_all();
    }
    __syncthreads();
    float s[KA_BK / 8][4];
    ka_abt<KA_BK / 8, KA_E>(s, sQ + warp * 16 * KA_QS, KA_QS, sK + buf * KA_BK * KA_KS, KA_KS, g, t);
    float mx0 = -KILN_INF_F, mx1 = -KILN_INF_F;
#pragma unroll
    for (int n = 0; n < KA_BK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long i = e < 2 ? qi0 : qi1, j = j0 + n * 8 + 2 * t + (e & 1);
        float x = -KILN_INF_F;
        if (i < KA_L && j < jend && !(KA_CAUSAL && j > i)) x = s[n][e] * KA_SCALE2 + ka_mask2(mask, mo, i, j);
        s[n][e] = x;
        if (e < 2) mx0 = ka_nanmax(mx0, x); else mx1 = ka_nanmax(mx1, x);
      }
    // A row's values live in the 4 lanes of a quad.
    mx0 = ka_nanmax(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = ka_nanmax(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = ka_nanmax(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = ka_nanmax(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = ka_nanmax(m0, mx0), mn1 = ka_nanmax(m1, mx1);
    // Every key so far masked: subtract 0, so exp2(-inf - base) is 0 rather than NaN.
    const float base0 = mn0 == -KILN_INF_F ? 0.0f : mn0, base1 = mn1 == -KILN_INF_F ? 0.0f : mn1;
    const float al0 = exp2f(m0 - base0), al1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int n = 0; n < KA_BK / 8; ++n) {
      s[n][0] = exp2f(s[n][0] - base0);
      s[n][1] = exp2f(s[n][1] - base0);
      s[n][2] = exp2f(s[n][2] - base1);
      s[n][3] = exp2f(s[n][3] - base1);
      rs0 += s[n][0] + s[n][1];
      rs1 += s[n][2] + s[n][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    if (KA_WANT_OUT) {
#if KA_DROPOUT
      // The sums above are of the whole P (the lse's); the product takes the kept part.
#pragma unroll
      for (int n = 0; n < KA_BK / 8; ++n) {
        float z[4];
        ka_keep_rows(z, seed, b, h, qi0, qi1, j0 + n * 8 + 2 * t, t);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= z[e];
      }
#endif
#pragma unroll
      for (int n = 0; n < KA_EV / 8; ++n) {
        o[n][0] *= al0;
        o[n][1] *= al0;
        o[n][2] *= al1;
        o[n][3] *= al1;
      }
      ka_pb<KA_BK, KA_EV / 8>(o, s, sV + buf * KA_BK * KA_VS, KA_VS, g, t);
    }
    __syncthreads();  // before the next iteration's loads overwrite this buffer
  }
  kiln_cp_async_wait_all();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (KA_WANT_LSE && t == 0) {
    float* const lr = lse + (b * KA_H + h) * KA_L;
    if (qi0 < KA_L) lr[qi0] = l0 != 0.0f ? (m0 + log2f(l0)) * 0.6931471805599453f : -KILN_INF_F;
    if (qi1 < KA_L) lr[qi1] = l1 != 0.0f ? (m1 + log2f(l1)) * 0.6931471805599453f : -KILN_INF_F;
  }
  if (KA_WANT_OUT) {
    // A row without weight (every score -inf) is 0, not its 0-weighed sum: 0 * inf is NaN.
    const bool w0 = l0 != 0.0f, w1 = l1 != 0.0f;
    const float v0 = w0 ? 1.0f / l0 : 0.0f, v1 = w1 ? 1.0f / l1 : 0.0f;
    unsigned short* const ob = out + b * KA_O0 + h * KA_O1;
#pragma unroll
    for (int n = 0; n < KA_EV / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (qi0 < KA_L) ka_store2(ob + qi0 * KA_O2 + c, w0 ? o[n][0] * v0 : 0.0f, w0 ? o[n][1] * v0 : 0.0f);
      if (qi1 < KA_L) ka_store2(ob + qi1 * KA_O2 + c, w1 ? o[n][2] * v1 : 0.0f, w1 ? o[n][3] * v1 : 0.0f);
    }
  }
}
)CUDA";

inline constexpr const char* kTensorCoreDq = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_NAME_dq(ka_args a) {
  const unsigned short* __restrict__ q = (const unsigned short*)a.p[0];
  const unsigned short* __restrict__ k = (const unsigned short*)a.p[1];
  const unsigned short* __restrict__ v = (const unsigned short*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  const unsigned short* __restrict__ dout = (const unsigned short*)a.p[5];
  const ka_stat* __restrict__ lse = (const ka_stat*)a.p[6];
  unsigned short* __restrict__ dq = (unsigned short*)a.p[7];
  const ka_stat* __restrict__ delta = (const ka_stat*)a.p[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  (void)mask;
  KILN_EXTERN_SMEM(ka_sm);
  unsigned short* const sQ = (unsigned short*)ka_sm;
  unsigned short* const sG = sQ + KA_BQ * KA_QS;
  unsigned short* const sK = sG + KA_BQ * KA_GS;
  unsigned short* const sV = sK + KA_BK * KA_KS;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const long long qblocks = (KA_L + KA_BQ - 1) / KA_BQ, bh = (long long)blockIdx.x / qblocks;
  const long long h = bh % KA_H, b = bh / KA_H, hk = h / KA_GROUP, i0 = ((long long)blockIdx.x % qblocks) * KA_BQ;
  const int nq = (int)KA_MIN((long long)KA_BQ, KA_L - i0);
  const unsigned short* const kb = k + b * KA_K0 + hk * KA_K1;
  const unsigned short* const vb = v + b * KA_V0 + hk * KA_V1;
  const long long mo = b * KA_M0 + h * KA_M1;
  const bool kvec = KA_KVEC && ka_aligned(k), vvec = KA_VVEC && ka_aligned(v);
  ka_tile(sQ, KA_QS, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_BQ, nq, KA_E, KA_QVEC && ka_aligned(q));
  ka_tile(sG, KA_GS, dout + b * KA_G0 + h * KA_G1 + i0 * KA_G2, KA_G2, KA_BQ, nq, KA_EV, KA_GVEC && ka_aligned(dout));
  kiln_cp_async_commit();
  const long long qi0 = i0 + warp * 16 + g, qi1 = qi0 + 8;
  const float* const lr = lse + (b * KA_H + h) * KA_L;
  const float* const dr = delta + (b * KA_H + h) * KA_L;
  const float L0 = qi0 < KA_L ? ka_lse2(lr[qi0]) : KILN_INF_F, L1 = qi1 < KA_L ? ka_lse2(lr[qi1]) : KILN_INF_F;
  const float D0 = qi0 < KA_L ? dr[qi0] : 0.0f, D1 = qi1 < KA_L ? dr[qi1] : 0.0f;
  float acc[KA_E / 8][4];
#pragma unroll
  for (int n = 0; n < KA_E / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const long long jend = KA_CAUSAL ? KA_MIN(KA_S, i0 + nq) : KA_S;
  for (long long j0 = 0; j0 < jend; j0 += KA_BK) {
    const int nk = (int)KA_MIN((long long)KA_BK, jend - j0);
    __syncthreads();  // the previous tile's readers are done
    ka_tile(sK, KA_KS, kb + j0 * KA_K2, KA_K2, KA_BK, nk, KA_E, kvec);
    ka_tile(sV, KA_VS, vb + j0 * KA_V2, KA_V2, KA_BK, nk, KA_EV, vvec);
    kiln_cp_async_commit();
    kiln_cp_async_wait_all();
    __syncthreads();
    float s[KA_BK / 8][4], dp[KA_BK / 8][4];
    ka_abt<KA_BK / 8, KA_E>(s, sQ + warp * 16 * KA_QS, KA_QS, sK, KA_KS, g, t);
    ka_abt<KA_BK / 8, KA_EV>(dp, sG + warp * 16 * KA_GS, KA_GS, sV, KA_VS, g, t);
#pragma unroll
    for (int n = 0; n < KA_BK / 8; ++n) {
#if KA_DROPOUT
      float z[4];
      ka_keep_rows(z, seed, b, h, qi0, qi1, j0 + n * 8 + 2 * t, t);
#endif
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long i = e < 2 ? qi0 : qi1, j = j0 + n * 8 + 2 * t + (e & 1);
        float x = -KILN_INF_F;
        if (i < KA_L && j < jend && !(KA_CAUSAL && j > i)) x = s[n][e] * KA_SCALE2 + ka_mask2(mask, mo, i, j);
        const float p = exp2f(x - (e < 2 ? L0 : L1));
#if KA_DROPOUT
        dp[n][e] *= z[e];  // the gradient of the kept weight only
#endif
        s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1));  // dS
      }
    }
    ka_pb<KA_BK, KA_E / 8>(acc, s, sK, KA_KS, g, t);
  }
  kiln_cp_async_wait_all();
  unsigned short* const db = dq + b * KA_DQ0 + h * KA_DQ1;
#pragma unroll
  for (int n = 0; n < KA_E / 8; ++n) {
    const int c = n * 8 + 2 * t;
    if (qi0 < KA_L) ka_store2(db + qi0 * KA_DQ2 + c, acc[n][0] * KA_SCALEF, acc[n][1] * KA_SCALEF);
    if (qi1 < KA_L) ka_store2(db + qi1 * KA_DQ2 + c, acc[n][2] * KA_SCALEF, acc[n][3] * KA_SCALEF);
  }
}
)CUDA";

// KA_KNAME, KA_KDO_DK and KA_KDO_DV are replaced per instance (one kernel, or dK and dV apart).
inline constexpr const char* kTensorCoreDkdv = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_KNAME(ka_args a) {
  const unsigned short* __restrict__ q = (const unsigned short*)a.p[0];
  const unsigned short* __restrict__ k = (const unsigned short*)a.p[1];
  const unsigned short* __restrict__ v = (const unsigned short*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  const unsigned short* __restrict__ dout = (const unsigned short*)a.p[5];
  const ka_stat* __restrict__ lse = (const ka_stat*)a.p[6];
  unsigned short* __restrict__ dk = (unsigned short*)a.p[8];
  unsigned short* __restrict__ dv = (unsigned short*)a.p[9];
  const ka_stat* __restrict__ delta = (const ka_stat*)a.p[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  (void)mask; (void)dk; (void)dv;
  KILN_EXTERN_SMEM(ka_sm);
  unsigned short* const sK = (unsigned short*)ka_sm;
  unsigned short* const sV = sK + KA_BKB * KA_KS;
  unsigned short* const sQ = sV + KA_BKB * KA_VS;
  unsigned short* const sG = sQ + KA_BQB * KA_QS;
  float* const sL = (float*)(sG + KA_BQB * KA_GS);
  float* const sD = sL + KA_BQB;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const long long kblocks = (KA_S + KA_BKB - 1) / KA_BKB, bh = (long long)blockIdx.x / kblocks;
  const long long hk = bh % KA_HKV, b = bh / KA_HKV, j0 = ((long long)blockIdx.x % kblocks) * KA_BKB;
  const int nk = (int)KA_MIN((long long)KA_BKB, KA_S - j0);
  ka_tile(sK, KA_KS, k + b * KA_K0 + hk * KA_K1 + j0 * KA_K2, KA_K2, KA_BKB, nk, KA_E, KA_KVEC && ka_aligned(k));
  ka_tile(sV, KA_VS, v + b * KA_V0 + hk * KA_V1 + j0 * KA_V2, KA_V2, KA_BKB, nk, KA_EV, KA_VVEC && ka_aligned(v));
  kiln_cp_async_commit();
  const bool qvec = KA_QVEC && ka_aligned(q), gvec = KA_GVEC && ka_aligned(dout);
  const long long kj0 = j0 + warp * 16 + g, kj1 = kj0 + 8;  // this lane's two keys
  float dka[KA_E / 8][4], dva[KA_EV / 8][4];
#pragma unroll
  for (int n = 0; n < KA_E / 8; ++n) dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.0f;
#pragma unroll
  for (int n = 0; n < KA_EV / 8; ++n) dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.0f;
  // Causal: query rows before j0 see none of these keys.
  const long long ifirst = KA_CAUSAL ? j0 / KA_BQB * KA_BQB : 0;
  for (long long h = hk * KA_GROUP; h < (hk + 1) * KA_GROUP; ++h) {
    const long long mo = b * KA_M0 + h * KA_M1, row0 = (b * KA_H + h) * KA_L;
    for (long long i0 = ifirst; i0 < KA_L; i0 += KA_BQB) {
      const int nq = (int)KA_MIN((long long)KA_BQB, KA_L - i0);
      __syncthreads();  // the previous query tile's readers are done
      ka_tile(sQ, KA_QS, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_BQB, nq, KA_E, qvec);
      ka_tile(sG, KA_GS, dout + b * KA_G0 + h * KA_G1 + i0 * KA_G2, KA_G2, KA_BQB, nq, KA_EV, gvec);
      for (int r = tid; r < KA_BQB; r += KA_THREADS) {
        sL[r] = r < nq ? ka_lse2(lse[row0 + i0 + r]) : KILN_INF_F;
        sD[r] = r < nq ? delta[row0 + i0 + r] : 0.0f;
      }
      kiln_cp_async_commit();
      kiln_cp_async_wait_all();
      __syncthreads();
      // Sᵀ and dPᵀ: this warp's 16 keys against the tile's queries.
      float st[KA_BQB / 8][4], dpt[KA_BQB / 8][4];
      ka_abt<KA_BQB / 8, KA_E>(st, sK + warp * 16 * KA_KS, KA_KS, sQ, KA_QS, g, t);
      if (KA_KDO_DK) ka_abt<KA_BQB / 8, KA_EV>(dpt, sV + warp * 16 * KA_VS, KA_VS, sG, KA_GS, g, t);
#pragma unroll
      for (int n = 0; n < KA_BQB / 8; ++n) {
#if KA_DROPOUT
        float z[4];
        ka_keep_cols(z, seed, b, h, i0 + n * 8 + 2 * t, kj0, g);
#endif
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * t + (e & 1);
          const long long i = i0 + c, j = e < 2 ? kj0 : kj1;
          float x = -KILN_INF_F;
          if (i < KA_L && j < KA_S && !(KA_CAUSAL && j > i)) x = st[n][e] * KA_SCALE2 + ka_mask2(mask, mo, i, j);
          const float p = exp2f(x - sL[c]);
#if KA_DROPOUT
          const float keep = z[e];
#else
          const float keep = 1.0f;
#endif
          st[n][e] = p * keep;
          if (KA_KDO_DK) dpt[n][e] = p * (dpt[n][e] * keep - sD[c]);  // dSᵀ
        }
      }
      if (KA_KDO_DV) ka_pb<KA_BQB, KA_EV / 8>(dva, st, sG, KA_GS, g, t);
      if (KA_KDO_DK) ka_pb<KA_BQB, KA_E / 8>(dka, dpt, sQ, KA_QS, g, t);
    }
  }
  kiln_cp_async_wait_all();
  if (KA_KDO_DK) {
    unsigned short* const db = dk + b * KA_DK0 + hk * KA_DK1;
#pragma unroll
    for (int n = 0; n < KA_E / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (kj0 < KA_S) ka_store2(db + kj0 * KA_DK2 + c, dka[n][0] * KA_SCALEF, dka[n][1] * KA_SCALEF);
      if (kj1 < KA_S) ka_store2(db + kj1 * KA_DK2 + c, dka[n][2] * KA_SCALEF, dka[n][3] * KA_SCALEF);
    }
  }
  if (KA_KDO_DV) {
    unsigned short* const db = dv + b * KA_DV0 + hk * KA_DV1;
#pragma unroll
    for (int n = 0; n < KA_EV / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (kj0 < KA_S) ka_store2(db + kj0 * KA_DV2 + c, dva[n][0], dva[n][1]);
      if (kj1 < KA_S) ka_store2(db + kj1 * KA_DV2 + c, dva[n][2], dva[n][3]);
    }
  }
}
)CUDA";

// delta = rowsum(dout * out): a warp per row (both paths).
inline constexpr const char* kDelta = R"CUDA(
extern "C" __global__ void __launch_bounds__(256) KA_NAME_delta(ka_args a) {
  const ka_t* __restrict__ out = (const ka_t*)a.p[4];
  const ka_t* __restrict__ dout = (const ka_t*)a.p[5];
  ka_stat* __restrict__ delta = (ka_stat*)a.p[10];
  const long long row = (long long)blockIdx.x * 8 + (long long)(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= KA_B * KA_H * KA_L) return;  // a whole warp: no shuffle waits on it
  const long long b = row / (KA_H * KA_L), h = (row / KA_L) % KA_H, i = row % KA_L;
  const ka_t* const orow = out + b * KA_O0 + h * KA_O1 + i * KA_O2;
  const ka_t* const grow = dout + b * KA_G0 + h * KA_G1 + i * KA_G2;
  ka_acc s = 0;
  for (int e = lane; e < KA_EV; e += 32) s += ka_ld(orow[e]) * ka_ld(grow[e]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) delta[row] = (ka_stat)s;
}
)CUDA";

inline constexpr const char* kGenericHelpers = R"CUDA(
// Rows [0, n) of a [.., width] tile (global row stride rs) as accumulation values in shared
// memory (row stride ds), rows [n, rows) zeroed.
static __device__ __forceinline__ void ka_rows(ka_acc* dst, int ds, const ka_t* src, long long rs, int rows, int n,
                                               int width) {
  for (int x = threadIdx.x; x < rows * width; x += 128) {
    const int r = x / width, e = x - r * width;
    dst[r * ds + e] = r < n ? ka_ld(src[r * rs + e]) : (ka_acc)0;
  }
}
// Score of query i (row qr) and key j (row kr); -inf where masked out or past the ends.
static __device__ __forceinline__ ka_acc ka_score(const ka_acc* qr, const ka_acc* kr, bool valid, long long i,
                                                  long long j, const ka_mask_t* mask, long long mo) {
  (void)mask; (void)mo;
  if (!valid || (KA_CAUSAL && j > i)) return KA_NEG_INF;
  ka_acc s = 0;
  for (int e = 0; e < KA_E; ++e) s += qr[e] * kr[e];
  s *= (ka_acc)KA_SCALE;
#if KA_HAS_MASK
  s += ka_ldm(mask[mo + i * KA_M2 + j * KA_M3]);
#endif
  return s;
}
// P from a score and its row's saved lse (0 for a row whose keys are all masked).
static __device__ __forceinline__ ka_acc ka_prob(ka_acc s, ka_acc row_lse) {
  return row_lse == KA_NEG_INF || s == KA_NEG_INF ? (ka_acc)0 : KA_EXP(s - row_lse);
}
)CUDA";

inline constexpr const char* kGenericForward = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_NAME_forward(ka_args a) {
  const ka_t* __restrict__ q = (const ka_t*)a.p[0];
  const ka_t* __restrict__ k = (const ka_t*)a.p[1];
  const ka_t* __restrict__ v = (const ka_t*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  ka_t* __restrict__ out = (ka_t*)a.p[4];
  ka_stat* __restrict__ lse = (ka_stat*)a.p[5];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  (void)v; (void)out; (void)lse;
  KILN_EXTERN_SMEM(ka_sm);
  ka_acc* const sQ = (ka_acc*)ka_sm;
  ka_acc* const sK = sQ + KA_GQ * KA_EP;
  ka_acc* const sV = sK + KA_GK * KA_EP;
  ka_acc* const sS = sV + KA_GK * KA_EVP;
  ka_acc* const sO = sS + KA_GQ * KA_GK;
  ka_acc* const sM = sO + KA_GQ * KA_EV;
  ka_acc* const sL = sM + KA_GQ;
  ka_acc* const sA = sL + KA_GQ;
  const int tid = threadIdx.x;
  const long long qblocks = (KA_L + KA_GQ - 1) / KA_GQ, bh = (long long)blockIdx.x / qblocks;
  const long long h = bh % KA_H, b = bh / KA_H, hk = h / KA_GROUP, i0 = ((long long)blockIdx.x % qblocks) * KA_GQ;
  const int nq = (int)KA_MIN((long long)KA_GQ, KA_L - i0);
  const long long mo = b * KA_M0 + h * KA_M1;
  ka_rows(sQ, KA_EP, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_GQ, nq, KA_E);
  for (int x = tid; x < KA_GQ * KA_EV; x += 128) sO[x] = 0;
  for (int r = tid; r < KA_GQ; r += 128) { sM[r] = KA_NEG_INF; sL[r] = 0; }
  const long long jend = KA_CAUSAL ? KA_MIN(KA_S, i0 + nq) : KA_S;
  for (long long j0 = 0; j0 < jend; j0 += KA_GK) {
    const int nk = (int)KA_MIN((long long)KA_GK, jend - j0);
    __syncthreads();
    ka_rows(sK, KA_EP, k + b * KA_K0 + hk * KA_K1 + j0 * KA_K2, KA_K2, KA_GK, nk, KA_E);
    if (KA_WANT_OUT) ka_rows(sV, KA_EVP, v + b * KA_V0 + hk * KA_V1 + j0 * KA_V2, KA_V2, KA_GK, nk, KA_EV);
    __syncthreads();
    for (int x = tid; x < KA_GQ * KA_GK; x += 128) {
      const int r = x / KA_GK, c = x - r * KA_GK;
      sS[x] = ka_score(sQ + r * KA_EP, sK + c * KA_EP, r < nq && c < nk, i0 + r, j0 + c, mask, mo);
    }
    __syncthreads();
    for (int r = tid; r < KA_GQ; r += 128) {
      ka_acc* const sr = sS + r * KA_GK;
      ka_acc mx = sM[r];
      for (int c = 0; c < KA_GK; ++c) mx = ka_nanmax(mx, sr[c]);
      if (mx == KA_NEG_INF) {  // every key so far masked: nothing to add
        for (int c = 0; c < KA_GK; ++c) sr[c] = 0;
        sA[r] = 1;
        continue;
      }
      const ka_acc alpha = KA_EXP(sM[r] - mx);
      ka_acc sum = 0;
      for (int c = 0; c < KA_GK; ++c) { sr[c] = KA_EXP(sr[c] - mx); sum += sr[c]; }
      sL[r] = sL[r] * alpha + sum;
      sM[r] = mx;
      sA[r] = alpha;
#if KA_DROPOUT
      // The sum above is of the whole P (the lse's); the product takes the kept part.
      if (KA_WANT_OUT)
        for (int c = 0; c < KA_GK; ++c) sr[c] *= ka_keep(seed, b, h, i0 + r, j0 + c);
#endif
    }
    __syncthreads();
    if (KA_WANT_OUT)
      for (int x = tid; x < KA_GQ * KA_EV; x += 128) {
        const int r = x / KA_EV, e = x - r * KA_EV;
        const ka_acc* const pr = sS + r * KA_GK;
        ka_acc o = sO[x] * sA[r];
        for (int c = 0; c < KA_GK; ++c) o += pr[c] * sV[c * KA_EVP + e];
        sO[x] = o;
      }
  }
  __syncthreads();
  if (KA_WANT_LSE)
    for (int r = tid; r < nq; r += 128)
      lse[(b * KA_H + h) * KA_L + i0 + r] = sL[r] != 0 ? (ka_stat)(sM[r] + KA_LOG(sL[r])) : (ka_stat)-KILN_INF_F;
  if (KA_WANT_OUT)
    for (int x = tid; x < nq * KA_EV; x += 128) {
      const int r = x / KA_EV, e = x - r * KA_EV;
      const ka_acc l = sL[r];
      out[b * KA_O0 + h * KA_O1 + (i0 + r) * KA_O2 + e] = ka_st(l != 0 ? sO[x] / l : (ka_acc)0);
    }
}
)CUDA";

inline constexpr const char* kGenericDq = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_NAME_dq(ka_args a) {
  const ka_t* __restrict__ q = (const ka_t*)a.p[0];
  const ka_t* __restrict__ k = (const ka_t*)a.p[1];
  const ka_t* __restrict__ v = (const ka_t*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  const ka_t* __restrict__ dout = (const ka_t*)a.p[5];
  const ka_stat* __restrict__ lse = (const ka_stat*)a.p[6];
  ka_t* __restrict__ dq = (ka_t*)a.p[7];
  const ka_stat* __restrict__ delta = (const ka_stat*)a.p[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  KILN_EXTERN_SMEM(ka_sm);
  ka_acc* const sQ = (ka_acc*)ka_sm;
  ka_acc* const sG = sQ + KA_GQ * KA_EP;
  ka_acc* const sK = sG + KA_GQ * KA_EVP;
  ka_acc* const sV = sK + KA_GK * KA_EP;
  ka_acc* const sS = sV + KA_GK * KA_EVP;
  ka_acc* const sA = sS + KA_GQ * KA_GK;
  ka_acc* const sL = sA + KA_GQ * KA_E;
  ka_acc* const sD = sL + KA_GQ;
  const int tid = threadIdx.x;
  const long long qblocks = (KA_L + KA_GQ - 1) / KA_GQ, bh = (long long)blockIdx.x / qblocks;
  const long long h = bh % KA_H, b = bh / KA_H, hk = h / KA_GROUP, i0 = ((long long)blockIdx.x % qblocks) * KA_GQ;
  const int nq = (int)KA_MIN((long long)KA_GQ, KA_L - i0);
  const long long mo = b * KA_M0 + h * KA_M1, row0 = (b * KA_H + h) * KA_L + i0;
  ka_rows(sQ, KA_EP, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_GQ, nq, KA_E);
  ka_rows(sG, KA_EVP, dout + b * KA_G0 + h * KA_G1 + i0 * KA_G2, KA_G2, KA_GQ, nq, KA_EV);
  for (int x = tid; x < KA_GQ * KA_E; x += 128) sA[x] = 0;
  for (int r = tid; r < KA_GQ; r += 128) {
    sL[r] = r < nq ? (ka_acc)lse[row0 + r] : KA_NEG_INF;
    sD[r] = r < nq ? (ka_acc)delta[row0 + r] : 0;
  }
  const long long jend = KA_CAUSAL ? KA_MIN(KA_S, i0 + nq) : KA_S;
  for (long long j0 = 0; j0 < jend; j0 += KA_GK) {
    const int nk = (int)KA_MIN((long long)KA_GK, jend - j0);
    __syncthreads();
    ka_rows(sK, KA_EP, k + b * KA_K0 + hk * KA_K1 + j0 * KA_K2, KA_K2, KA_GK, nk, KA_E);
    ka_rows(sV, KA_EVP, v + b * KA_V0 + hk * KA_V1 + j0 * KA_V2, KA_V2, KA_GK, nk, KA_EV);
    __syncthreads();
    for (int x = tid; x < KA_GQ * KA_GK; x += 128) {
      const int r = x / KA_GK, c = x - r * KA_GK;
      const ka_acc p = ka_prob(ka_score(sQ + r * KA_EP, sK + c * KA_EP, r < nq && c < nk, i0 + r, j0 + c, mask, mo), sL[r]);
      ka_acc ds = 0;
      if (p != 0) {
        ka_acc dp = 0;
        for (int e = 0; e < KA_EV; ++e) dp += sG[r * KA_EVP + e] * sV[c * KA_EVP + e];
#if KA_DROPOUT
        dp *= ka_keep(seed, b, h, i0 + r, j0 + c);  // the gradient of the kept weight only
#endif
        ds = p * (dp - sD[r]);
      }
      sS[x] = ds;
    }
    __syncthreads();
    for (int x = tid; x < KA_GQ * KA_E; x += 128) {
      const int r = x / KA_E, e = x - r * KA_E;
      ka_acc s = sA[x];
      for (int c = 0; c < KA_GK; ++c) s += sS[r * KA_GK + c] * sK[c * KA_EP + e];
      sA[x] = s;
    }
  }
  __syncthreads();
  for (int x = tid; x < nq * KA_E; x += 128) {
    const int r = x / KA_E, e = x - r * KA_E;
    dq[b * KA_DQ0 + h * KA_DQ1 + (i0 + r) * KA_DQ2 + e] = ka_st(sA[x] * (ka_acc)KA_SCALE);
  }
}
)CUDA";

inline constexpr const char* kGenericDkdv = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) KA_NAME_dkdv(ka_args a) {
  const ka_t* __restrict__ q = (const ka_t*)a.p[0];
  const ka_t* __restrict__ k = (const ka_t*)a.p[1];
  const ka_t* __restrict__ v = (const ka_t*)a.p[2];
  const ka_mask_t* __restrict__ mask = (const ka_mask_t*)a.p[3];
  const ka_t* __restrict__ dout = (const ka_t*)a.p[5];
  const ka_stat* __restrict__ lse = (const ka_stat*)a.p[6];
  ka_t* __restrict__ dk = (ka_t*)a.p[8];
  ka_t* __restrict__ dv = (ka_t*)a.p[9];
  const ka_stat* __restrict__ delta = (const ka_stat*)a.p[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)a.p[KA_SEED_ARG] : 0ull;
  (void)seed;
  (void)dk; (void)dv;
  KILN_EXTERN_SMEM(ka_sm);
  ka_acc* const sK = (ka_acc*)ka_sm;
  ka_acc* const sV = sK + KA_GK * KA_EP;
  ka_acc* const sQ = sV + KA_GK * KA_EVP;
  ka_acc* const sG = sQ + KA_GQ * KA_EP;
  ka_acc* const sP = sG + KA_GQ * KA_EVP;
  ka_acc* const sDS = sP + KA_GQ * KA_GK;
  ka_acc* const sDK = sDS + KA_GQ * KA_GK;
  ka_acc* const sDV = sDK + KA_GK * KA_E;
  ka_acc* const sL = sDV + KA_GK * KA_EV;
  ka_acc* const sD = sL + KA_GQ;
  const int tid = threadIdx.x;
  const long long kblocks = (KA_S + KA_GK - 1) / KA_GK, bh = (long long)blockIdx.x / kblocks;
  const long long hk = bh % KA_HKV, b = bh / KA_HKV, j0 = ((long long)blockIdx.x % kblocks) * KA_GK;
  const int nk = (int)KA_MIN((long long)KA_GK, KA_S - j0);
  ka_rows(sK, KA_EP, k + b * KA_K0 + hk * KA_K1 + j0 * KA_K2, KA_K2, KA_GK, nk, KA_E);
  ka_rows(sV, KA_EVP, v + b * KA_V0 + hk * KA_V1 + j0 * KA_V2, KA_V2, KA_GK, nk, KA_EV);
  for (int x = tid; x < KA_GK * KA_E; x += 128) sDK[x] = 0;
  for (int x = tid; x < KA_GK * KA_EV; x += 128) sDV[x] = 0;
  // Causal: query rows before j0 see none of these keys.
  const long long ifirst = KA_CAUSAL ? j0 / KA_GQ * KA_GQ : 0;
  for (long long h = hk * KA_GROUP; h < (hk + 1) * KA_GROUP; ++h) {
    const long long mo = b * KA_M0 + h * KA_M1;
    for (long long i0 = ifirst; i0 < KA_L; i0 += KA_GQ) {
      const int nq = (int)KA_MIN((long long)KA_GQ, KA_L - i0);
      const long long row0 = (b * KA_H + h) * KA_L + i0;
      __syncthreads();
      ka_rows(sQ, KA_EP, q + b * KA_Q0 + h * KA_Q1 + i0 * KA_Q2, KA_Q2, KA_GQ, nq, KA_E);
      ka_rows(sG, KA_EVP, dout + b * KA_G0 + h * KA_G1 + i0 * KA_G2, KA_G2, KA_GQ, nq, KA_EV);
      for (int r = tid; r < KA_GQ; r += 128) {
        sL[r] = r < nq ? (ka_acc)lse[row0 + r] : KA_NEG_INF;
        sD[r] = r < nq ? (ka_acc)delta[row0 + r] : 0;
      }
      __syncthreads();
      for (int x = tid; x < KA_GQ * KA_GK; x += 128) {
        const int r = x / KA_GK, c = x - r * KA_GK;
        const ka_acc p = ka_prob(ka_score(sQ + r * KA_EP, sK + c * KA_EP, r < nq && c < nk, i0 + r, j0 + c, mask, mo), sL[r]);
#if KA_DROPOUT
        const ka_acc keep = p != 0 ? ka_keep(seed, b, h, i0 + r, j0 + c) : (ka_acc)0;
#else
        const ka_acc keep = 1;
#endif
        ka_acc ds = 0;
        if (KA_WANT_DK && p != 0) {
          ka_acc dp = 0;
          for (int e = 0; e < KA_EV; ++e) dp += sG[r * KA_EVP + e] * sV[c * KA_EVP + e];
          ds = p * (dp * keep - sD[r]);
        }
        sP[x] = p * keep;
        sDS[x] = ds;
      }
      __syncthreads();
      if (KA_WANT_DV)
        for (int x = tid; x < KA_GK * KA_EV; x += 128) {
          const int c = x / KA_EV, e = x - c * KA_EV;
          ka_acc s = sDV[x];
          for (int r = 0; r < KA_GQ; ++r) s += sP[r * KA_GK + c] * sG[r * KA_EVP + e];
          sDV[x] = s;
        }
      if (KA_WANT_DK)
        for (int x = tid; x < KA_GK * KA_E; x += 128) {
          const int c = x / KA_E, e = x - c * KA_E;
          ka_acc s = sDK[x];
          for (int r = 0; r < KA_GQ; ++r) s += sDS[r * KA_GK + c] * sQ[r * KA_EP + e];
          sDK[x] = s;
        }
    }
  }
  __syncthreads();
  if (KA_WANT_DK)
    for (int x = tid; x < nk * KA_E; x += 128) {
      const int c = x / KA_E, e = x - c * KA_E;
      dk[b * KA_DK0 + hk * KA_DK1 + (j0 + c) * KA_DK2 + e] = ka_st(sDK[x] * (ka_acc)KA_SCALE);
    }
  if (KA_WANT_DV)
    for (int x = tid; x < nk * KA_EV; x += 128) {
      const int c = x / KA_EV, e = x - c * KA_EV;
      dv[b * KA_DV0 + hk * KA_DV1 + (j0 + c) * KA_DV2 + e] = ka_st(sDV[x]);
    }
}
)CUDA";

inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
  return s;
}

/// `#define prefix0..prefix3` as the element strides of `s` (0 for an absent slot).
/// Whether every row of `s` starts 16-byte aligned given an aligned base (half types: strides
/// that are multiples of 8 elements, and a view's offset into that base a multiple of 16 bytes).
inline bool vec_strides(const sched::Slot& s) {
  if (s.kind == sched::Slot::None || s.strides.size() != 4 || s.byte_offset % 16 != 0) return false;
  return s.strides[0] % 8 == 0 && s.strides[1] % 8 == 0 && s.strides[2] % 8 == 0 && s.strides[3] == 1;
}

inline i64 ceil_div(i64 a, i64 b) { return b <= 0 ? 0 : (a + b - 1) / b; }

/// Tensor-core tiles: query rows a block (forward and dQ), key rows a forward/dQ tile, key
/// rows a dK/dV block, query rows a dK/dV tile.
struct TcTiles {
  i64 bq = 64, bk = 64, bkb = 64, bqb = 64;
  bool split = false;  ///< dK and dV in two kernels (their accumulators would not fit together)
};

inline TcTiles tc_tiles(const sched::AttentionCall& c) {
  TcTiles t;
  const i64 e = c.head_dim, ev = c.value_dim;
  // Per lane, a forward holds Ev/2 output and Bk/2 score floats, dQ E/2 + Bk (scores and dP):
  // 32-key tiles keep a 256-wide head under ~160 registers.
  t.bk = e <= 128 && ev <= 128 ? 64 : 32;
  // dK/dV holds E/2 + Ev/2 accumulators and Bqb (Sᵀ and dPᵀ) floats.
  t.bqb = e + ev <= 128 ? 64 : 32;
  t.split = e + ev > 256;
  return t;
}

/// Generic tiles: query rows and key rows a block (shrunk until the shared memory fits).
struct GenericTiles {
  i64 gq = 32, gk = 32, shared = 0;
};

inline i64 generic_shared(const sched::AttentionCall& c, i64 gq, i64 gk) {
  const i64 acc = c.dtype == DType::Float64 ? 8 : 4, e = c.head_dim, ev = c.value_dim, ep = e + 1, evp = ev + 1;
  if (c.kind == sched::AttentionCall::Forward)
    return acc * (gq * ep + gk * ep + gk * evp + gq * gk + gq * ev + 3 * gq);
  const i64 dq = gq * ep + gq * evp + gk * ep + gk * evp + gq * gk + gq * e + 2 * gq;
  const i64 dkdv = gk * ep + gk * evp + gq * ep + gq * evp + 2 * gq * gk + gk * e + gk * ev + 2 * gq;
  return acc * std::max(dq, dkdv);
}

inline GenericTiles generic_tiles(const sched::AttentionCall& c) {
  GenericTiles t;
  // Under 48 KiB needs no opt-in and leaves room for several blocks an SM; wide heads shrink the
  // tiles (keys first: the softmax's per-row loop is over them) rather than spill.
  while (generic_shared(c, t.gq, t.gk) > 48 * 1024 && (t.gq > 1 || t.gk > 1)) {
    if (t.gk >= t.gq && t.gk > 1)
      t.gk /= 2;
    else
      t.gq /= 2;
  }
  t.shared = generic_shared(c, t.gq, t.gk);
  if (t.shared > 160 * 1024)
    throw Error("kiln CUDA attention: feature dims " + std::to_string(c.head_dim) + " and " +
                std::to_string(c.value_dim) + " of " + std::string(dtype_name(c.dtype)) +
                " need more shared memory than a block has, even one row a tile");
  return t;
}

}  // namespace cuda_attention_detail

/// The CUDA unit of attention step `c`, kernels prefixed `name`: `name_forward`, or the
/// backward's `name_delta`, `name_dq` and `name_dkdv` (`name_dk` and `name_dv` for wide
/// tensor-core heads), each only when its results are wanted. Entries over 48 KiB of dynamic
/// shared memory need the opt-in attribute (runtime::set_max_dynamic_shared).
inline AttentionSource generate_cuda_attention(const sched::AttentionCall& c, const std::string& name) {
  using namespace cuda_attention_detail;
  c_family::PreludeNeeds needs;
  const bool fwd = c.kind == sched::AttentionCall::Forward, dbl = c.dtype == DType::Float64;
  // (Empty feature dims would make empty fragment arrays: the generic kernels handle them.)
  const bool tc = c.tensor_cores() && c.head_dim > 0 && c.value_dim > 0;
  std::string s = "// kiln generated attention\n";
  s += std::string("struct ka_args { void* p[") + (fwd ? "7" : "12") + "]; };\n";
  s += cuda_detail::kCudaBase;
  s += "#ifndef KILN_EXTERN_SMEM\n#define KILN_EXTERN_SMEM(name) extern __shared__ __align__(16) unsigned char "
       "name[]\n#endif\n";
  auto def = [&](const std::string& k, const std::string& v) { s += "#define " + k + " " + v + "\n"; };
  def("KA_MIN(a, b)", "((a) < (b) ? (a) : (b))");
  s += attention_detail::attention_constants(c);
  def("KA_SCALEF", c_family::float_literal(c.scale, false, c_family::kCudaDialect));
  def("KA_SCALE2", c_family::float_literal(c.scale * 1.4426950408889634, false, c_family::kCudaDialect));
  def("KA_NEG_INF", dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)");
  std::string helpers = attention_detail::attention_conversions(c, "static __device__ __forceinline__", needs);
  AttentionSource out;
  out.arguments = fwd ? 7 : 12;
  const i64 bh = c.batch * c.heads, bhkv = c.batch * c.kv_heads;
  std::string kernels;
  if (tc) {
    const TcTiles t = tc_tiles(c);
    const bool bf = c.dtype == DType::BFloat16;
    const i64 e = c.head_dim, ev = c.value_dim, qs = e + 8, ks = e + 8, vs = ev + 8, gs = ev + 8;
    // Rows padded by 8 elements (16 bytes) put a fragment load's 8 rows on distinct banks.
    def("KA_BQ", std::to_string(t.bq));
    def("KA_BK", std::to_string(t.bk));
    def("KA_BKB", std::to_string(t.bkb));
    def("KA_BQB", std::to_string(t.bqb));
    def("KA_QS", std::to_string(qs));
    def("KA_KS", std::to_string(ks));
    def("KA_VS", std::to_string(vs));
    def("KA_GS", std::to_string(gs));
    def("KA_QVEC", vec_strides(c.q) ? "1" : "0");
    def("KA_KVEC", vec_strides(c.k) ? "1" : "0");
    def("KA_VVEC", vec_strides(c.v) ? "1" : "0");
    def("KA_GVEC", vec_strides(c.dout) ? "1" : "0");
    def("KA_MMA", bf ? "kiln_mma_m16n8k16_bf16" : "kiln_mma_m16n8k16_f16");
    // A pair of f32 values as one register of two 16-bit values (the first in the low half).
    if (bf) {
      needs.bf16 = true;
      helpers +=
          "static __device__ __forceinline__ unsigned ka_pack(float lo, float hi) {\n#if defined(__CUDA_ARCH__)\n"
          "  unsigned r; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r;\n"
          "#else\n  return (unsigned)kiln_f2b(lo) | ((unsigned)kiln_f2b(hi) << 16);\n#endif\n}\n";
    } else {
      needs.half = true;
      helpers +=
          "static __device__ __forceinline__ unsigned ka_pack(float lo, float hi) {\n#if defined(__CUDA_ARCH__)\n"
          "  unsigned r; asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r;\n"
          "#else\n  return (unsigned)kiln_f2h(lo) | ((unsigned)kiln_f2h(hi) << 16);\n#endif\n}\n";
    }
    // Two adjacent outputs: one 32-bit store where the address allows it.
    helpers +=
        "static __device__ __forceinline__ void ka_store2(unsigned short* p, float x, float y) {\n"
        "  if (((unsigned long long)p & 3ull) == 0ull) *(unsigned*)p = ka_pack(x, y);\n"
        "  else { p[0] = ka_st(x); p[1] = ka_st(y); }\n}\n";
    if (fwd) {
      if (c.wants(c.out) || c.wants(c.lse)) {
        kernels += kTensorCoreForward;
        out.entries.push_back({name + "_forward", bh * ceil_div(c.q_len, t.bq), 128,
                               2 * (t.bq * qs + 2 * t.bk * ks + 2 * t.bk * vs)});
      }
    } else {
      const bool dq = c.wants(c.dq), dk = c.wants(c.dk), dv = c.wants(c.dv);
      if (dq || dk || dv) {
        kernels += kDelta;
        out.entries.push_back({name + "_delta", ceil_div(bh * c.q_len, 8), 256, 0});
      }
      if (dq) {
        kernels += kTensorCoreDq;
        out.entries.push_back(
            {name + "_dq", bh * ceil_div(c.q_len, t.bq), 128, 2 * (t.bq * qs + t.bq * gs + t.bk * ks + t.bk * vs)});
      }
      const i64 dkdv_shared = 2 * (t.bkb * ks + t.bkb * vs + t.bqb * qs + t.bqb * gs) + 8 * t.bqb;
      const i64 dkdv_grid = bhkv * ceil_div(c.kv_len, t.bkb);
      auto instance = [&](const std::string& kname, bool do_dk, bool do_dv) {
        std::string k = replace_all(kTensorCoreDkdv, "KA_KNAME", kname);
        k = replace_all(k, "KA_KDO_DK", do_dk ? "1" : "0");
        kernels += replace_all(k, "KA_KDO_DV", do_dv ? "1" : "0");
        out.entries.push_back({kname, dkdv_grid, 128, dkdv_shared});
      };
      if (dk && dv && t.split) {
        instance(name + "_dk", true, false);
        instance(name + "_dv", false, true);
      } else if (dk || dv) {
        instance(name + "_dkdv", dk, dv);
      }
    }
  } else {
    const GenericTiles t = generic_tiles(c);
    def("KA_GQ", std::to_string(t.gq));
    def("KA_GK", std::to_string(t.gk));
    // Rows one element longer: a warp's 32 threads read 32 rows at one column, on 32 banks.
    def("KA_EP", std::to_string(c.head_dim + 1));
    def("KA_EVP", std::to_string(c.value_dim + 1));
    kernels += kGenericHelpers;
    if (fwd) {
      if (c.wants(c.out) || c.wants(c.lse)) {
        kernels += kGenericForward;
        out.entries.push_back({name + "_forward", bh * ceil_div(c.q_len, t.gq), 128, t.shared});
      }
    } else {
      const bool dq = c.wants(c.dq), dk = c.wants(c.dk), dv = c.wants(c.dv);
      if (dq || dk || dv) {
        kernels += kDelta;
        out.entries.push_back({name + "_delta", ceil_div(bh * c.q_len, 8), 256, 0});
      }
      if (dq) {
        kernels += kGenericDq;
        out.entries.push_back({name + "_dq", bh * ceil_div(c.q_len, t.gq), 128, t.shared});
      }
      if (dk || dv) {
        kernels += kGenericDkdv;
        out.entries.push_back({name + "_dkdv", bhkv * ceil_div(c.kv_len, t.gk), 128, t.shared});
      }
    }
  }
  if (needs.half) s += cuda_detail::kCudaHalf;
  if (needs.bf16) s += cuda_detail::kCudaBf16;
  s += helpers;
  s += attention_detail::attention_dropout(c, "static __device__ __forceinline__");
  if (tc) s += kTensorCoreHelpers;
  if (tc && c.has_dropout()) s += kTensorCoreDropout;
  s += replace_all(kernels, "KA_NAME", name);
  out.source = std::move(s);
  return out;
}

namespace cuda_attention_detail {

/// A library attention's fix-up unit: one kernel `entry`, a thread per [B, H, L] row of `c` (its
/// index r; KR_ROWS the row count), over two pointers; `defines` come before the kernel and
/// `body` after the row's bound check.
inline AttentionSource library_row_unit(const sched::AttentionCall& c, const std::string& what,
                                        const std::string& entry, const std::string& defines,
                                        const std::string& body) {
  const i64 rows = c.batch * c.heads * c.q_len;
  AttentionSource out;
  out.arguments = 2;
  out.source = "// kiln: " + what + "\nstruct ka_args { void* p[2]; };\n#define KR_ROWS " + std::to_string(rows) +
               "LL\n" + defines + "extern \"C\" __global__ void " + entry +
               "(ka_args a) {\n"
               "  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
               "  if (r >= KR_ROWS) return;\n" +
               body + "}\n";
  out.entries.push_back({entry, ceil_div(rows, 256), 256, 0});
  return out;
}

}  // namespace cuda_attention_detail

/// The unit that keeps a library attention's forward (cuDNN's fused kernels: f16/bf16, no mask)
/// at torch's values on rows whose every score is -inf (infinite query or key features). The
/// library leaves their lse at -inf and weighs their values by 0, so a non-finite value gives
/// 0 · inf = NaN where torch's safe softmax (and the generated kernels) give 0. One entry,
/// `name`_zero_rows, a thread per [B, H, L] row, arguments {lse (float, contiguous), out}: it
/// zeroes the output rows whose lse is -inf and touches nothing else.
inline AttentionSource cuda_library_attention_rows(const sched::AttentionCall& c, const std::string& name) {
  using namespace cuda_attention_detail;
  std::string defines;
  auto def = [&](const std::string& k, i64 v) { defines += "#define " + k + " " + std::to_string(v) + "LL\n"; };
  def("KR_H", c.heads);
  def("KR_L", c.q_len);
  def("KR_EV", c.value_dim);
  for (int d = 0; d < 3; ++d) def("KR_S" + std::to_string(d), c.out.strides[static_cast<std::size_t>(d)]);
  // x < -FLT_MAX: x is -inf (NaN compares false).
  return library_row_unit(
      c, "the rows of a library attention whose scores are all -inf", name + "_zero_rows", defines,
      "  if (!(((const float*)a.p[0])[r] < -3.40282347e38f)) return;\n"
      "  const long long l = r % KR_L, bh = r / KR_L;\n"
      "  unsigned short* o = (unsigned short*)a.p[1] + (bh / KR_H) * KR_S0 + (bh % KR_H) * KR_S1 + l * KR_S2;\n"
      "  for (long long d = 0; d < KR_EV; ++d) o[d] = 0;  // +0 in both half types\n");
}

/// The unit that gives a library attention's backward (cuDNN's fused kernels) the forward's lse
/// with +inf for -inf: a row whose every score is -inf has P = exp(s - lse) = exp(-inf + inf) =
/// NaN in the library's backward, which spreads to its query's gradient and to every value's
/// gradient of the head; with +inf, P = 0 there, as torch's (and the generated kernels')
/// gradients of such a row are 0. One entry, `name`_stats, a thread per [B, H, L] row,
/// arguments {lse (float, contiguous), the copy the library reads (float, contiguous)}.
inline AttentionSource cuda_library_attention_backward_stats(const sched::AttentionCall& c, const std::string& name) {
  return cuda_attention_detail::library_row_unit(
      c, "a library attention backward's lse, -inf rows as +inf", name + "_stats", "",
      "  const float x = ((const float*)a.p[0])[r];\n"
      "  ((float*)a.p[1])[r] = x < -3.40282347e38f ? __int_as_float(0x7f800000) : x;\n");
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
