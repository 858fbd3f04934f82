#pragma once
// Source of a sort step (sched::SortCall) in the C++ and CUDA dialects: the positions of each
// row's k first elements in sorted order (sort, argsort, topk, kthvalue-style selections).
//
// Both dialects order by a rank key: an unsigned integer that grows with the value (floats by
// their bits, the sign flipped; NaN the largest, -0 made +0; integers with the sign bit
// flipped), inverted for an ascending sort, so that "first" is always "larger key, then lower
// position". That order is total, so results are the same on every device and a full sort is
// stable.
//
// The CPU keeps, per row, a heap of the k best elements seen (its root the worst of them) and
// pops it into place: O(n log k), one pass over the row. The GPU gives each row a block. A
// top-k (k < n) first finds the k-th element by a radix select over the row's keys in shared
// memory, eight bits a pass from the top, with the position as the last digits so the choice is
// exact on ties (a pass stops the search early once its bin holds just the elements still
// needed); the k selected elements are then sorted by a bitonic network. A full sort runs the
// bitonic network over the whole row. Rows whose working set passes the shared-memory budget
// keep it in a global scratch buffer instead (same code, L2-resident, slower).
#include <string>

#include "kiln/codegen/c/axis_rows.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// A sort step's unit: the CPU's function `entry` (entry(void* const* args, int nth), args
/// {src, out}), or the GPU's kernel `entry` (one argument {src, out, scratch} by value) run
/// as `grid` blocks of `block` threads with `shared_bytes` of dynamic shared memory.
struct SortSource {
  std::string source;
  std::string entry;
  std::int64_t rows = 0;  ///< 0: nothing to run (an empty input or k = 0)
  std::int64_t grid = 0, block = 0, shared_bytes = 0;
};

namespace sort_detail {

using i64 = std::int64_t;

/// C text: typedef kiln_key and kiln_rank(v), the rank key of a value of ctype(in) (larger
/// first); `f2u`/`d2u` name the dialect's float/double bit casts.
inline std::string rank_key(const sched::SortCall& c, const char* f2u, const char* d2u) {
  const bool wide = c.wide_key();
  std::string s = std::string("typedef ") + (wide ? "unsigned long long" : "unsigned int") + " kiln_key;\n";
  s += "static KILN_SORT_FN kiln_key kiln_rank(" + std::string(c_family::ctype(c.in)) + " v) {\n";
  switch (c.in) {
    case DType::Float64:
      s += "  unsigned long long u = " + std::string(d2u) + "(v);\n";
      s += "  if (v != v) u = 0xffffffffffffffffull;\n  else if (v == 0.0) u = 0x8000000000000000ull;\n";
      s += "  else u = (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);\n";
      break;
    case DType::Float32:
    case DType::Float16:
    case DType::BFloat16:
      s += "  unsigned int u = " + std::string(f2u) + "(v);\n";
      s += "  if (v != v) u = 0xffffffffu;\n  else if (v == 0.0f) u = 0x80000000u;\n";
      s += "  else u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);\n";
      break;
    case DType::Int64:
      s += "  const unsigned long long u = (unsigned long long)v ^ 0x8000000000000000ull;\n";
      break;
    case DType::Int32:
      s += "  const unsigned int u = (unsigned int)v ^ 0x80000000u;\n";
      break;
    case DType::Bool:
      s += "  const unsigned int u = v ? 1u : 0u;\n";
      break;
  }
  s += c.descending ? "  return u;\n}\n" : "  return ~u;\n}\n";
  return s;
}

}  // namespace sort_detail

/// The C++ unit of sort `c`, entry named `name`: rows shared among the team, each walked once
/// with a heap of its k best elements.
inline SortSource generate_cpu_sort(const sched::SortCall& c, const std::string& name) {
  using namespace sort_detail;
  c_family::PreludeNeeds needs;
  SortSource out;
  out.entry = name;
  const i64 len = c.length(), rows = c.rows();
  out.rows = rows;
  const std::string st = c_family::stype(c.in), n = std::to_string(len) + "LL", k = std::to_string(c.k) + "LL";
  const std::string xs = std::to_string(c.src.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  const std::string os = std::to_string(c.result.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  std::string body = "extern \"C\" int " + name + "(void* const* args, int nth) {\n  (void)nth;\n";
  body += "  const " + st + "* __restrict src = (const " + st + "*)args[0];\n";
  body += "  long long* __restrict out = (long long*)args[1];\n";
  body += "  #pragma omp parallel num_threads(nth) if(" + std::to_string(rows * len) + "LL >= 32768LL)\n  {\n";
  body += "    kiln_key* hk = (kiln_key*)malloc(sizeof(kiln_key) * " + k + ");\n";
  body += "    long long* hp = (long long*)malloc(sizeof(long long) * " + k + ");\n";
  body += "    #pragma omp for schedule(static)\n";
  body += "    for (long long row = 0; row < " + std::to_string(rows) + "LL; ++row) {\n";
  body += c_family::axis_row_offsets(c.shape, c.axis, c.src.strides, c.result.strides, "row", "      ");
  // The heap keeps the k best seen, the worst at the root: a parent is never before a child.
  // The first k fill it; after them every element held comes earlier in the row, so a later
  // one enters only with a strictly larger key (one compare against the worst key an element).
  const std::string load = "kiln_rank(" + c_family::from_storage("src[xo + i * " + xs + "]", c.in, needs) + ")";
  body += "      long long m = 0;\n";
  body += "      for (long long i = 0; i < " + k + "; ++i) {\n";
  body += "        const kiln_key kk = " + load + ";\n";
  body += "        long long j = m++;\n";
  body += "        while (j > 0) { const long long p = (j - 1) >> 1; if (!kiln_before(hk[p], hp[p], kk, i)) break;"
          " hk[j] = hk[p]; hp[j] = hp[p]; j = p; }\n";
  body += "        hk[j] = kk; hp[j] = i;\n      }\n";
  body += "      kiln_key worst = hk[0];\n";
  body += "      for (long long i = " + k + "; i < " + n + "; ++i) {\n";
  body += "        const kiln_key kk = " + load + ";\n";
  body += "        if (kk > worst) { kiln_sift(hk, hp, m, kk, i); worst = hk[0]; }\n      }\n";
  // Popping the worst each time fills the row from its end.
  body += "      for (long long j = m - 1; j >= 0; --j) {\n";
  body += "        out[oo + j * " + os + "] = hp[0];\n";
  body += "        if (j > 0) kiln_sift(hk, hp, j, hk[j], hp[j]);\n";
  body += "      }\n    }\n    free(hk);\n    free(hp);\n  }\n  return 0;\n}\n";
  std::string& src = out.source;
  src = std::string("// kiln generated sort\n") + detail::kHostCLibrary + "#define KILN_SORT_FN inline\n";
  src += "static inline unsigned int kiln_f2u(float v) { unsigned int u; memcpy(&u, &v, 4); return u; }\n";
  src += "static inline unsigned long long kiln_d2u(double v) { unsigned long long u; memcpy(&u, &v, 8); return u; }\n";
  src += rank_key(c, "kiln_f2u", "kiln_d2u");
  src += "static inline int kiln_before(kiln_key ka, long long pa, kiln_key kb, long long pb) {\n"
         "  return ka > kb || (ka == kb && pa < pb);\n}\n";
  // Puts (kk, i) at the root of the heap of m elements and sifts it down to its place.
  src += "static inline void kiln_sift(kiln_key* hk, long long* hp, long long m, kiln_key kk, long long i) {\n"
         "  long long j = 0;\n"
         "  for (;;) {\n"
         "    long long w = 2 * j + 1;\n"
         "    if (w >= m) break;\n"
         "    if (w + 1 < m && kiln_before(hk[w], hp[w], hk[w + 1], hp[w + 1])) ++w;  // the worse child\n"
         "    if (!kiln_before(kk, i, hk[w], hp[w])) break;\n"
         "    hk[j] = hk[w]; hp[j] = hp[w]; j = w;\n"
         "  }\n"
         "  hk[j] = kk; hp[j] = i;\n}\n";
  if (needs.half) src += detail::kHalfHelpers;
  if (needs.bf16) src += detail::kBf16Helpers;
  src += body;
  return out;
}

/// The CUDA unit of sort `c`, kernel named `name`: a block per row (blocks stride over rows
/// when the working sets live in global scratch, c.scratch_rows of them).
inline SortSource generate_cuda_sort(const sched::SortCall& c, const std::string& name) {
  using namespace sort_detail;
  c_family::PreludeNeeds needs;
  SortSource out;
  out.entry = name;
  const i64 len = c.length(), rows = c.rows();
  out.rows = rows;
  const bool select = c.selects();
  const i64 p = c.network();
  const i64 ks = c.wide_key() ? 8 : 4;
  const i64 row_bytes = c.gpu_row_bytes();
  const bool in_shared = c.scratch < 0;
  // A row's keys stay in shared memory through the select's passes, so rows in flight per
  // multiprocessor are what hides each pass's latency: 256 threads a block (eight blocks of a
  // 4096-long row fit an SM; 512 measured 0.38 ms for K1 against 0.25 wanted, four blocks).
  const i64 threads = len > 8192 || p > 8192 ? 1024 : 256;
  out.block = threads;
  out.grid = in_shared ? rows : std::min<i64>(rows, c.scratch_rows);
  out.shared_bytes = in_shared ? row_bytes : 0;
  auto align = [](i64 b) { return (b + 15) / 16 * 16; };
  const i64 keys_at = 0, ck_at = select ? align(len * ks) : 0, ci_at = ck_at + align(p * ks);
  const int key_bits = static_cast<int>(ks * 8);
  int pos_bits = 0;
  while ((i64{1} << pos_bits) < len) ++pos_bits;
  const int key_passes = key_bits / 8, pos_passes = (pos_bits + 7) / 8;
  const std::string st = c_family::stype(c.in);
  const std::string xs = std::to_string(c.src.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  const std::string os = std::to_string(c.result.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  const std::string N = std::to_string(len), K = std::to_string(c.k), P = std::to_string(p),
                    T = std::to_string(threads);
  auto load = [&](const std::string& i) {
    return "kiln_rank(" + c_family::from_storage("src[xo + (long long)(" + i + ") * " + xs + "]", c.in, needs) + ")";
  };
  std::string b = "extern \"C\" __global__ void __launch_bounds__(" + T + ") " + name + "(kiln_sort_args a) {\n";
  b += "  const " + st + "* __restrict__ src = (const " + st + "*)a.p[0];\n";
  b += "  long long* __restrict__ out = (long long*)a.p[1];\n";
  b += "  const unsigned tid = threadIdx.x;\n";
  if (in_shared)
    b += "  KILN_EXTERN_SMEM(kiln_sm);\n  unsigned char* const mem = kiln_sm;\n";
  else
    b += "  unsigned char* const mem = (unsigned char*)a.p[2] + (long long)blockIdx.x * " + std::to_string(row_bytes) +
         "LL;\n";
  b += "  kiln_key* const keys = (kiln_key*)(mem + " + std::to_string(keys_at) + ");\n";
  b += "  kiln_key* const ck = (kiln_key*)(mem + " + std::to_string(ck_at) + ");\n";
  b += "  unsigned* const ci = (unsigned*)(mem + " + std::to_string(ci_at) + ");\n";
  b += "  (void)keys;\n";
  if (select)
    b += "  __shared__ unsigned hist[256];\n  __shared__ unsigned s_digit, s_need, s_bin, s_taken;\n";
  b += "  for (long long row = blockIdx.x; row < " + std::to_string(rows) + "LL; row += gridDim.x) {\n";
  b += c_family::axis_row_offsets(c.shape, c.axis, c.src.strides, c.result.strides, "row", "    ");
  if (select) {
    // The first pass's histogram (every element, the key's top digit) is counted as the keys
    // are loaded: one sweep of the row's shared keys fewer.
    b += "    for (unsigned d = tid; d < 256u; d += " + T + "u) hist[d] = 0u;\n    __syncthreads();\n";
    b += "    for (unsigned i = tid; i < " + N + "u; i += " + T + "u) {\n      const kiln_key kk = " + load("i") +
         ";\n      keys[i] = kk;\n      atomicAdd(&hist[(unsigned)(kk >> " + std::to_string(key_bits - 8) +
         ") & 255u], 1u);\n    }\n    __syncthreads();\n";
    // The k-th element's key and position, a digit at a time from the top: `prefix`/`mask` over
    // the key, then `pprefix`/`pmask` over (n - 1 - position) (lower positions first).
    b += "    kiln_key prefix = 0, mask = 0;\n    unsigned pprefix = 0, pmask = 0, need = " + K + "u;\n";
    b += "    for (int pass = 0; pass < " + std::to_string(key_passes + pos_passes) + "; ++pass) {\n";
    b += "      const bool on_key = pass < " + std::to_string(key_passes) + ";\n";
    b += "      const int shift = on_key ? " + std::to_string(key_bits - 8) + " - 8 * pass : " +
         std::to_string(pos_passes * 8 - 8) + " - 8 * (pass - " + std::to_string(key_passes) + ");\n";
    b += "      if (pass > 0) {\n";
    b += "      for (unsigned d = tid; d < 256u; d += " + T + "u) hist[d] = 0u;\n      __syncthreads();\n";
    // (Aggregating a warp's equal digits with __match_any_sync measured slower on an H200.)
    b += "      for (unsigned i = tid; i < " + N + "u; i += " + T + "u) {\n";
    b += "        const kiln_key kk = keys[i];\n        const unsigned pos = " + N + "u - 1u - i;\n";
    b += "        if ((kk & mask) != prefix || (pos & pmask) != pprefix) continue;\n";
    b += "        const unsigned d = on_key ? (unsigned)(kk >> shift) & 255u : (pos >> shift) & 255u;\n";
    b += "        atomicAdd(&hist[d], 1u);\n      }\n      __syncthreads();\n      }\n";
    // One warp finds the bin holding the need-th largest: lane l sums bins 255-8l down to 248-8l.
    b += "      if (tid < 32u) {\n";
    b += "        unsigned cnt[8], sum = 0;\n";
    b += "        for (int j = 0; j < 8; ++j) { cnt[j] = hist[255u - 8u * tid - (unsigned)j]; sum += cnt[j]; }\n";
    b += "        unsigned incl = sum;\n";
    b += "        for (int o = 1; o < 32; o <<= 1) {\n";
    b += "          const unsigned y = __shfl_sync(0xffffffffu, incl, (int)tid >= o ? (int)tid - o : (int)tid);\n";
    b += "          if ((int)tid >= o) incl += y;\n        }\n";
    b += "        const unsigned excl = incl - sum;\n";
    b += "        if (excl < need && need <= incl) {\n";
    b += "          unsigned acc = excl;\n";
    b += "          for (int j = 0; j < 8; ++j) {\n";
    b += "            if (acc + cnt[j] >= need) { s_digit = 255u - 8u * tid - (unsigned)j; s_need = need - acc; s_bin = "
         "cnt[j]; break; }\n";
    b += "            acc += cnt[j];\n          }\n        }\n      }\n      __syncthreads();\n";
    b += "      const unsigned digit = s_digit, bin = s_bin;\n      need = s_need;\n";
    b += "      if (on_key) { prefix |= (kiln_key)digit << shift; mask |= (kiln_key)255u << shift; }\n";
    b += "      else { pprefix |= digit << shift; pmask |= 255u << shift; }\n";
    b += "      __syncthreads();\n";
    b += "      if (bin == need) break;  // the bin holds just the elements still needed: all of it is taken\n";
    b += "    }\n";
    // Exactly k elements are at or above (prefix, pprefix) under the masks: collect them.
    b += "    if (tid == 0) s_taken = 0u;\n    __syncthreads();\n";
    b += "    for (unsigned i = tid; i < " + N + "u; i += " + T + "u) {\n";
    b += "      const kiln_key kk = keys[i] & mask;\n      const unsigned pos = (" + N + "u - 1u - i) & pmask;\n";
    b += "      if (kk > prefix || (kk == prefix && pos >= pprefix)) {\n";
    b += "        const unsigned s = atomicAdd(&s_taken, 1u);\n        ck[s] = keys[i];\n        ci[s] = i;\n      }\n    }\n";
    b += "    for (unsigned i = " + K + "u + tid; i < " + P + "u; i += " + T + "u) { ck[i] = 0; ci[i] = 0xffffffffu; }\n";
  } else {
    b += "    for (unsigned i = tid; i < " + P + "u; i += " + T + "u) {\n";
    b += "      if (i < " + N + "u) { ck[i] = " + load("i") + "; ci[i] = i; } else { ck[i] = 0; ci[i] = 0xffffffffu; }\n";
    b += "    }\n";
  }
  b += "    __syncthreads();\n";
  // Bitonic network: every pair (i, i + stride) put in order, the direction alternating in
  // blocks of `size` so that the last merge orders the whole array first-to-last. A network of
  // up to 1024 (a top-k's candidates) is run by the first warp alone, with warp barriers between
  // its stages instead of the block's.
  const bool one_warp = p <= 1024;
  const std::string workers = one_warp ? "32u" : T, barrier = one_warp ? "__syncwarp();" : "__syncthreads();";
  if (one_warp) b += "    if (tid < 32u) {\n";
  b += "    for (unsigned size = 2u; size <= " + P + "u; size <<= 1) {\n";
  b += "      for (unsigned stride = size >> 1; stride > 0u; stride >>= 1) {\n";
  b += "        for (unsigned t = tid; t < " + P + "u / 2u; t += " + workers + ") {\n";
  b += "          const unsigned i = 2u * t - (t & (stride - 1u)), j = i + stride;\n";
  b += "          const kiln_key ki = ck[i], kj = ck[j];\n          const unsigned pi = ci[i], pj = ci[j];\n";
  b += "          const bool j_first = kj > ki || (kj == ki && pj < pi);\n";
  b += "          if (j_first == ((i & size) == 0u)) { ck[i] = kj; ck[j] = ki; ci[i] = pj; ci[j] = pi; }\n";
  b += "        }\n        " + barrier + "\n      }\n    }\n";
  if (one_warp) b += "    }\n    __syncthreads();\n";
  b += "    for (unsigned j = tid; j < " + K + "u; j += " + T + "u) out[oo + (long long)j * " + os + "] = (long long)ci[j];\n";
  b += "    __syncthreads();  // the row's memory is reused by the next row\n";
  b += "  }\n}\n";
  std::string& src = out.source;
  src = "// kiln generated sort\nstruct kiln_sort_args { void* p[3]; };\n";
  src += cuda_detail::kCudaBase;
  src += "#ifndef KILN_EXTERN_SMEM\n#define KILN_EXTERN_SMEM(name) extern __shared__ __align__(16) unsigned char "
         "name[]\n#endif\n";
  src += "#define KILN_SORT_FN __device__ __forceinline__\n";
  src += rank_key(c, "__float_as_uint", "(unsigned long long)__double_as_longlong");
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  src += b;
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
