#pragma once
// The C++ unit of a fused attention step (sched::AttentionCall): blocked online softmax, so
// memory stays O(tile) per thread whatever the sequence length (no [L, S] scores).
//
// The forward walks, per (batch, head, block of kQueryTile query rows), the key blocks of
// kKeyTile rows: scores of the block, the running row maximum and sum rescaled as a larger
// maximum appears, the output accumulated in float (double for float64) and divided by the sum
// at the end; the row's log-sum-exp is kept for the backward. The backward recomputes the
// scores block by block from it: one entry computes delta = rowsum(dout * out), one dq per
// query block, one dk and dv per key block (looping over the query blocks of every head of
// its group, so no two threads write one gradient row). Causal blocks past the diagonal are
// skipped. Operands are converted to the accumulation type a tile at a time, so the inner
// loops are contiguous multiply-adds the compiler vectorises. With dropout every entry that
// forms P multiplies it by ka_keep (codegen/c/attention.hpp): the same Philox draw per element
// in the forward and the backward.
#include <string>

#include "kiln/codegen/c/attention.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

namespace attention_detail {

using i64 = std::int64_t;

// The body every C++ attention unit shares; the constants and conversions above it say the
// call's shapes, strides and dtypes.
inline constexpr const char* kCpuAttentionBody = R"CPP(
#define KA_QT 32LL
#define KA_KT 64LL
#define KA_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KA_NEG_INF (-__builtin_inf())

// Scores of query rows [i0, i0 + nq) against key rows [j0, j0 + nk) of (b, h): s[r * KT + c].
static void ka_scores(const ka_acc* qb, long long nq, const ka_acc* kb, long long nk, ka_acc* s, long long b,
                      long long h, long long i0, long long j0, const ka_mask_t* mask) {
  (void)mask; (void)b; (void)h;
  for (long long r = 0; r < nq; ++r)
    for (long long c = 0; c < nk; ++c) {
      if (KA_CAUSAL && j0 + c > i0 + r) { s[r * KA_KT + c] = KA_NEG_INF; continue; }
      ka_acc a = 0;
      #pragma omp simd reduction(+ : a)
      for (long long e = 0; e < KA_E; ++e) a += qb[r * KA_E + e] * kb[c * KA_E + e];
      a *= (ka_acc)KA_SCALE;
#if KA_HAS_MASK
      a += ka_ldm(mask[b * KA_M0 + h * KA_M1 + (i0 + r) * KA_M2 + (j0 + c) * KA_M3]);
#endif
      s[r * KA_KT + c] = a;
    }
}

// Rows [r0, r0 + n) of a [.., rows, width] tensor at (b, h) as accumulation values, dense.
static void ka_rows(const ka_t* x, long long base, long long rs, long long r0, long long n, long long width,
                    ka_acc* to) {
  for (long long r = 0; r < n; ++r)
    for (long long e = 0; e < width; ++e) to[r * width + e] = ka_ld(x[base + (r0 + r) * rs + e]);
}

#if KA_DROPOUT
// Dropout's factors of query row i against keys [j0, j0 + n): one Philox block per four keys.
static void ka_keep_row(unsigned long long seed, long long b, long long h, long long i, long long j0, long long n,
                        ka_acc* z) {
  const unsigned long long first = ka_drop_index(b, h, i, j0);
  kiln::philox::Result block = kiln::philox::philox_element(seed, first >> 2);
  for (long long c = 0; c < n; ++c) {
    const unsigned long long x = first + (unsigned long long)c;
    if (c > 0 && (x & 3ull) == 0) block = kiln::philox::philox_element(seed, x >> 2);
    z[c] = ka_keep_of(kiln::philox::philox_word(block, (unsigned)(x & 3ull)));
  }
}
#endif

// The first key row past query rows [i0, i0 + nq)'s reach.
static long long ka_key_end(long long i0, long long nq) { return KA_CAUSAL ? KA_MIN(KA_S, i0 + nq) : KA_S; }

extern "C" int KA_NAME_forward(void* const* args, int nth) {
  const ka_t* q = (const ka_t*)args[0];
  const ka_t* k = (const ka_t*)args[1];
  const ka_t* v = (const ka_t*)args[2];
  const ka_mask_t* mask = (const ka_mask_t*)args[3];
  ka_t* out = (ka_t*)args[4];
  ka_acc* lse = (ka_acc*)args[5];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)args[KA_SEED_ARG] : 0ull;
  (void)seed;
  const long long qblocks = (KA_L + KA_QT - 1) / KA_QT, tasks = KA_B * KA_H * qblocks;
  #pragma omp parallel num_threads(nth) if (KA_WORK >= 65536LL)
  {
    ka_acc* qb = (ka_acc*)malloc(sizeof(ka_acc) * (KA_QT * KA_E + KA_KT * KA_E + KA_KT * KA_EV + KA_QT * KA_KT + KA_QT * KA_EV + 2 * KA_QT));
    ka_acc* kb = qb + KA_QT * KA_E;
    ka_acc* vb = kb + KA_KT * KA_E;
    ka_acc* s = vb + KA_KT * KA_EV;
    ka_acc* o = s + KA_QT * KA_KT;
    ka_acc* m = o + KA_QT * KA_EV;
    ka_acc* l = m + KA_QT;
    #pragma omp for schedule(dynamic, 1)
    for (long long t = 0; t < tasks; ++t) {
      const long long b = t / (KA_H * qblocks), h = (t / qblocks) % KA_H, i0 = (t % qblocks) * KA_QT;
      const long long hk = h / KA_GROUP, nq = KA_MIN(KA_QT, KA_L - i0);
      ka_rows(q, b * KA_Q0 + h * KA_Q1, KA_Q2, i0, nq, KA_E, qb);
      for (long long r = 0; r < nq; ++r) { m[r] = KA_NEG_INF; l[r] = 0; }
      for (long long x = 0; x < nq * KA_EV; ++x) o[x] = 0;
      const long long jend = ka_key_end(i0, nq);
      for (long long j0 = 0; j0 < jend; j0 += KA_KT) {
        const long long nk = KA_MIN(KA_KT, jend - j0);
        ka_rows(k, b * KA_K0 + hk * KA_K1, KA_K2, j0, nk, KA_E, kb);
        if (KA_WANT_OUT) ka_rows(v, b * KA_V0 + hk * KA_V1, KA_V2, j0, nk, KA_EV, vb);
        ka_scores(qb, nq, kb, nk, s, b, h, i0, j0, mask);
        for (long long r = 0; r < nq; ++r) {
          ka_acc* sr = s + r * KA_KT;
          ka_acc mx = m[r];
          for (long long c = 0; c < nk; ++c) mx = ka_nanmax(mx, sr[c]);
          if (mx == KA_NEG_INF) {  // every key so far masked: nothing to add
            for (long long c = 0; c < nk; ++c) sr[c] = 0;
            continue;
          }
          const ka_acc alpha = KA_EXP(m[r] - mx);
          ka_acc sum = 0;
          for (long long c = 0; c < nk; ++c) { sr[c] = KA_EXP(sr[c] - mx); sum += sr[c]; }
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          if (KA_WANT_OUT) {
#if KA_DROPOUT
            // The sum above is of the whole P (the lse's); the product takes the kept part.
            ka_acc z[KA_KT];
            ka_keep_row(seed, b, h, i0 + r, j0, nk, z);
            for (long long c = 0; c < nk; ++c) sr[c] *= z[c];
#endif
            ka_acc* orow = o + r * KA_EV;
            for (long long e = 0; e < KA_EV; ++e) orow[e] *= alpha;
            for (long long c = 0; c < nk; ++c) {
              const ka_acc p = sr[c];
              const ka_acc* vrow = vb + c * KA_EV;
              #pragma omp simd
              for (long long e = 0; e < KA_EV; ++e) orow[e] += p * vrow[e];
            }
          }
        }
      }
      for (long long r = 0; r < nq; ++r) {
        if (KA_WANT_LSE) lse[(b * KA_H + h) * KA_L + i0 + r] = l[r] != 0 ? m[r] + KA_LOG(l[r]) : KA_NEG_INF;
        if (KA_WANT_OUT) {
          const ka_acc inv = l[r] != 0 ? 1 / l[r] : 0;
          ka_t* orow = out + b * KA_O0 + h * KA_O1 + (i0 + r) * KA_O2;
          for (long long e = 0; e < KA_EV; ++e) orow[e] = ka_st(o[r * KA_EV + e] * inv);
        }
      }
    }
    free(qb);
  }
  return 0;
}

// P of one score (0 where the row's keys are all masked) and dS = P (dP - delta).
static inline ka_acc ka_prob(ka_acc s, ka_acc row_lse) {
  return row_lse == KA_NEG_INF || s == KA_NEG_INF ? 0 : KA_EXP(s - row_lse);
}

extern "C" int KA_NAME_delta(void* const* args, int nth) {
  const ka_t* out = (const ka_t*)args[4];
  const ka_t* dout = (const ka_t*)args[5];
  ka_acc* delta = (ka_acc*)args[10];
  #pragma omp parallel for num_threads(nth) schedule(static) if (KA_B * KA_H * KA_L * KA_EV >= 65536LL)
  for (long long t = 0; t < KA_B * KA_H * KA_L; ++t) {
    const long long b = t / (KA_H * KA_L), h = (t / KA_L) % KA_H, i = t % KA_L;
    const ka_t* orow = out + b * KA_O0 + h * KA_O1 + i * KA_O2;
    const ka_t* grow = dout + b * KA_G0 + h * KA_G1 + i * KA_G2;
    ka_acc a = 0;
    for (long long e = 0; e < KA_EV; ++e) a += ka_ld(orow[e]) * ka_ld(grow[e]);
    delta[t] = a;
  }
  return 0;
}

extern "C" int KA_NAME_dq(void* const* args, int nth) {
  const ka_t* q = (const ka_t*)args[0];
  const ka_t* k = (const ka_t*)args[1];
  const ka_t* v = (const ka_t*)args[2];
  const ka_mask_t* mask = (const ka_mask_t*)args[3];
  const ka_t* dout = (const ka_t*)args[5];
  const ka_acc* lse = (const ka_acc*)args[6];
  ka_t* dq = (ka_t*)args[7];
  const ka_acc* delta = (const ka_acc*)args[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)args[KA_SEED_ARG] : 0ull;
  (void)seed;
  const long long qblocks = (KA_L + KA_QT - 1) / KA_QT, tasks = KA_B * KA_H * qblocks;
  #pragma omp parallel num_threads(nth) if (KA_WORK >= 65536LL)
  {
    ka_acc* qb = (ka_acc*)malloc(sizeof(ka_acc) * (KA_QT * KA_E + KA_KT * KA_E + KA_KT * KA_EV + KA_QT * KA_KT + KA_QT * KA_EV + KA_QT * KA_E));
    ka_acc* kb = qb + KA_QT * KA_E;
    ka_acc* vb = kb + KA_KT * KA_E;
    ka_acc* s = vb + KA_KT * KA_EV;
    ka_acc* gb = s + KA_QT * KA_KT;
    ka_acc* acc = gb + KA_QT * KA_EV;
    #pragma omp for schedule(dynamic, 1)
    for (long long t = 0; t < tasks; ++t) {
      const long long b = t / (KA_H * qblocks), h = (t / qblocks) % KA_H, i0 = (t % qblocks) * KA_QT;
      const long long hk = h / KA_GROUP, nq = KA_MIN(KA_QT, KA_L - i0), row0 = (b * KA_H + h) * KA_L + i0;
      ka_rows(q, b * KA_Q0 + h * KA_Q1, KA_Q2, i0, nq, KA_E, qb);
      ka_rows(dout, b * KA_G0 + h * KA_G1, KA_G2, i0, nq, KA_EV, gb);
      for (long long x = 0; x < nq * KA_E; ++x) acc[x] = 0;
      const long long jend = ka_key_end(i0, nq);
      for (long long j0 = 0; j0 < jend; j0 += KA_KT) {
        const long long nk = KA_MIN(KA_KT, jend - j0);
        ka_rows(k, b * KA_K0 + hk * KA_K1, KA_K2, j0, nk, KA_E, kb);
        ka_rows(v, b * KA_V0 + hk * KA_V1, KA_V2, j0, nk, KA_EV, vb);
        ka_scores(qb, nq, kb, nk, s, b, h, i0, j0, mask);
        for (long long r = 0; r < nq; ++r) {
          const ka_acc rl = lse[row0 + r], rd = delta[row0 + r];
          ka_acc* arow = acc + r * KA_E;
#if KA_DROPOUT
          ka_acc z[KA_KT];
          ka_keep_row(seed, b, h, i0 + r, j0, nk, z);
#endif
          for (long long c = 0; c < nk; ++c) {
            const ka_acc p = ka_prob(s[r * KA_KT + c], rl);
            if (p == 0) continue;
            ka_acc dp = 0;
            #pragma omp simd reduction(+ : dp)
            for (long long e = 0; e < KA_EV; ++e) dp += gb[r * KA_EV + e] * vb[c * KA_EV + e];
#if KA_DROPOUT
            dp *= z[c];  // the gradient of the kept weight only
#endif
            const ka_acc ds = p * (dp - rd);
            const ka_acc* krow = kb + c * KA_E;
            #pragma omp simd
            for (long long e = 0; e < KA_E; ++e) arow[e] += ds * krow[e];
          }
        }
      }
      for (long long r = 0; r < nq; ++r) {
        ka_t* drow = dq + b * KA_DQ0 + h * KA_DQ1 + (i0 + r) * KA_DQ2;
        for (long long e = 0; e < KA_E; ++e) drow[e] = ka_st(acc[r * KA_E + e] * (ka_acc)KA_SCALE);
      }
    }
    free(qb);
  }
  return 0;
}

extern "C" int KA_NAME_dkdv(void* const* args, int nth) {
  const ka_t* q = (const ka_t*)args[0];
  const ka_t* k = (const ka_t*)args[1];
  const ka_t* v = (const ka_t*)args[2];
  const ka_mask_t* mask = (const ka_mask_t*)args[3];
  const ka_t* dout = (const ka_t*)args[5];
  const ka_acc* lse = (const ka_acc*)args[6];
  ka_t* dk = (ka_t*)args[8];
  ka_t* dv = (ka_t*)args[9];
  const ka_acc* delta = (const ka_acc*)args[10];
  const unsigned long long seed = KA_DROPOUT ? *(const unsigned long long*)args[KA_SEED_ARG] : 0ull;
  (void)seed;
  const long long kblocks = (KA_S + KA_KT - 1) / KA_KT, tasks = KA_B * KA_HKV * kblocks;
  #pragma omp parallel num_threads(nth) if (KA_WORK >= 65536LL)
  {
    ka_acc* qb = (ka_acc*)malloc(sizeof(ka_acc) * (KA_QT * KA_E + KA_KT * KA_E + KA_KT * KA_EV + KA_QT * KA_KT + KA_QT * KA_EV + KA_KT * KA_E + KA_KT * KA_EV));
    ka_acc* kb = qb + KA_QT * KA_E;
    ka_acc* vb = kb + KA_KT * KA_E;
    ka_acc* s = vb + KA_KT * KA_EV;
    ka_acc* gb = s + KA_QT * KA_KT;
    ka_acc* dka = gb + KA_QT * KA_EV;
    ka_acc* dva = dka + KA_KT * KA_E;
    #pragma omp for schedule(dynamic, 1)
    for (long long t = 0; t < tasks; ++t) {
      const long long b = t / (KA_HKV * kblocks), hk = (t / kblocks) % KA_HKV, j0 = (t % kblocks) * KA_KT;
      const long long nk = KA_MIN(KA_KT, KA_S - j0);
      ka_rows(k, b * KA_K0 + hk * KA_K1, KA_K2, j0, nk, KA_E, kb);
      ka_rows(v, b * KA_V0 + hk * KA_V1, KA_V2, j0, nk, KA_EV, vb);
      for (long long x = 0; x < nk * KA_E; ++x) dka[x] = 0;
      for (long long x = 0; x < nk * KA_EV; ++x) dva[x] = 0;
      // Causal: query rows before j0 see none of these keys.
      const long long ifirst = KA_CAUSAL ? j0 / KA_QT * KA_QT : 0;
      for (long long h = hk * KA_GROUP; h < (hk + 1) * KA_GROUP; ++h)
        for (long long i0 = ifirst; i0 < KA_L; i0 += KA_QT) {
          const long long nq = KA_MIN(KA_QT, KA_L - i0), row0 = (b * KA_H + h) * KA_L + i0;
          ka_rows(q, b * KA_Q0 + h * KA_Q1, KA_Q2, i0, nq, KA_E, qb);
          ka_rows(dout, b * KA_G0 + h * KA_G1, KA_G2, i0, nq, KA_EV, gb);
          ka_scores(qb, nq, kb, nk, s, b, h, i0, j0, mask);
          for (long long r = 0; r < nq; ++r) {
            const ka_acc rl = lse[row0 + r], rd = delta[row0 + r];
            const ka_acc* grow = gb + r * KA_EV;
            const ka_acc* qrow = qb + r * KA_E;
#if KA_DROPOUT
            ka_acc z[KA_KT];
            ka_keep_row(seed, b, h, i0 + r, j0, nk, z);
#endif
            for (long long c = 0; c < nk; ++c) {
              const ka_acc p = ka_prob(s[r * KA_KT + c], rl);
              if (p == 0) continue;
              ka_acc* dvrow = dva + c * KA_EV;
#if KA_DROPOUT
              const ka_acc keep = z[c];
#else
              const ka_acc keep = 1;
#endif
              const ka_acc pk = p * keep;
              ka_acc dp = 0;
              #pragma omp simd reduction(+ : dp)
              for (long long e = 0; e < KA_EV; ++e) { dvrow[e] += pk * grow[e]; dp += grow[e] * vb[c * KA_EV + e]; }
              const ka_acc ds = p * (dp * keep - rd);
              ka_acc* dkrow = dka + c * KA_E;
              #pragma omp simd
              for (long long e = 0; e < KA_E; ++e) dkrow[e] += ds * qrow[e];
            }
          }
        }
      for (long long c = 0; c < nk; ++c) {
        if (KA_WANT_DK) {
          ka_t* row = dk + b * KA_DK0 + hk * KA_DK1 + (j0 + c) * KA_DK2;
          for (long long e = 0; e < KA_E; ++e) row[e] = ka_st(dka[c * KA_E + e] * (ka_acc)KA_SCALE);
        }
        if (KA_WANT_DV) {
          ka_t* row = dv + b * KA_DV0 + hk * KA_DV1 + (j0 + c) * KA_DV2;
          for (long long e = 0; e < KA_EV; ++e) row[e] = ka_st(dva[c * KA_EV + e]);
        }
      }
    }
    free(qb);
  }
  return 0;
}
)CPP";

}  // namespace attention_detail

/// The C++ unit of attention step `c`, entries prefixed `name`: the forward, or the backward's
/// delta, dq and dk/dv entries (those whose results are wanted).
inline AttentionSource generate_cpu_attention(const sched::AttentionCall& c, const std::string& name) {
  using namespace attention_detail;
  c_family::PreludeNeeds needs;
  std::string s = std::string("// kiln generated attention\n") + detail::kHostCLibrary;
  s += attention_constants(c);
  s += "#define KA_WORK " + std::to_string(c.batch * c.heads * c.q_len * c.kv_len * (c.head_dim + c.value_dim)) + "LL\n";
  const std::string conversions = attention_conversions(c, "static inline", needs);
  if (needs.half) s += detail::kHalfHelpers;
  if (needs.bf16) s += detail::kBf16Helpers;
  s += conversions;
  s += attention_dropout(c, "static inline");
  std::string body = kCpuAttentionBody;
  for (std::size_t at; (at = body.find("KA_NAME")) != std::string::npos;) body.replace(at, 7, name);
  s += body;
  AttentionSource out;
  out.source = std::move(s);
  if (c.kind == sched::AttentionCall::Forward) {
    out.arguments = 7;
    if (c.wants(c.out) || c.wants(c.lse)) out.entries.push_back({name + "_forward"});
  } else {
    out.arguments = 12;
    if (c.wants(c.dq) || c.wants(c.dk) || c.wants(c.dv)) out.entries.push_back({name + "_delta"});
    if (c.wants(c.dq)) out.entries.push_back({name + "_dq"});
    if (c.wants(c.dk) || c.wants(c.dv)) out.entries.push_back({name + "_dkdv"});
  }
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
