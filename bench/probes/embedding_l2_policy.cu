// Probe: does an L2 evict_last policy on E1's gathered rows (32768 rows of 1024 f32 from
// [50304, 1024]) pay when nothing is left in L2 by the launch before? Times kiln's form of the
// gather with plain loads and with evict_last loads:
//   same    - the same table, ids and output every launch (what a benchmark loop does);
//   rotate  - four tables, id sets and outputs taken in turn (824 MB of tables: nothing a launch
//             reads was read by the launch before);
//   flush   - a 256 MiB memset before each launch, one launch between two events (Triton's
//             do_bench);
// with uniform random ids (about 26 % repeats in a launch) and with distinct ids, and then how
// fast an L2-bound kernel runs right after each policy's launches (do kept lines crowd it out?).
// Ratios are to cudaMemcpy of 1 GiB. Not part of the build:
//   nvcc -O3 -arch=sm_90 -std=c++17 embedding_l2_policy.cu (docs/performance-gpu.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                         \
      return 1;                                                              \
    }                                                                        \
  } while (0)

constexpr long long VOCAB = 50304, D = 1024, N = 32768, NV = N * D / 4;
constexpr int R = 4;

__device__ __forceinline__ uint4 ld_keep(const void* p) {
  uint4 r;
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(pol));
  return r;
}

// kiln's pointwise gather: 256 threads, 4 steps a thread, an id load then a 16-byte row load.
template <bool KEEP>
__global__ void __launch_bounds__(256) gather(const float* __restrict__ table, const long long* __restrict__ ids,
                                              float* __restrict__ out, int* bad) {
  long long t = blockIdx.x * 256LL + threadIdx.x;
  const long long G = gridDim.x * 256LL;
  for (; t < NV; t += 4 * G) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long tu = t + u * G;
      if (tu >= NV) break;
      const long long i0 = tu / 256, i1 = (tu % 256) * 4;
      long long id = ids[i0];
      if ((unsigned long long)id >= (unsigned long long)VOCAB) {
        atomicExch(bad, 1);
        id = 0;
      }
      const float* p = table + id * D + i1;
      *(uint4*)(out + i0 * D + i1) = KEEP ? ld_keep(p) : *(const uint4*)p;
    }
  }
}

// An L2-bound kernel: 16 passes over a 16 MiB buffer (fits in L2 unless something crowds it).
__global__ void reread(const float4* __restrict__ buf, long long n, float* sink) {
  float acc = 0;
  for (int pass = 0; pass < 16; ++pass)
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
      const float4 v = buf[(i + pass * 4099) % n];
      acc += v.x + v.y + v.z + v.w;
    }
  if (acc == 12345.f) *sink = acc;
}

__global__ void fill(float* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ seed;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    p[i] = (float)(h & 0xffffff) * 1e-7f - 0.8f;
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  const int grid = (int)((NV + 4 * 256 - 1) / (4 * 256));
  std::vector<float*> table(R), out(R);
  std::vector<long long*> uni(R), dis(R);
  float *big0, *big1, *flush, *l2buf, *sink;
  int* bad;
  for (int r = 0; r < R; ++r) {
    CK(cudaMalloc(&table[r], VOCAB * D * 4));
    CK(cudaMalloc(&out[r], N * D * 4));
    CK(cudaMalloc(&uni[r], N * 8));
    CK(cudaMalloc(&dis[r], N * 8));
    fill<<<4096, 256>>>(table[r], VOCAB * D, 0x9e3779b9u + r);
    std::mt19937_64 rng(23 + r);
    std::vector<long long> h(N), perm(VOCAB);
    for (auto& x : h) x = (long long)(rng() % VOCAB);
    CK(cudaMemcpy(uni[r], h.data(), N * 8, cudaMemcpyHostToDevice));
    std::iota(perm.begin(), perm.end(), 0LL);
    std::shuffle(perm.begin(), perm.end(), rng);
    CK(cudaMemcpy(dis[r], perm.data(), N * 8, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&big0, 1LL << 30));
  CK(cudaMalloc(&big1, 1LL << 30));
  CK(cudaMalloc(&flush, 256LL << 20));
  const long long l2n = (16LL << 20) / 16;
  CK(cudaMalloc(&l2buf, l2n * 16));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&bad, 4));
  cudaMemset(bad, 0, 4);
  cudaMemset(l2buf, 0, l2n * 16);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  // Mean ms of one call over batches of `reps` (each batch led by an untimed call), median of 9.
  auto batched = [&](auto&& f, int reps) {
    std::vector<float> ms;
    for (int k = 0; k < 9; ++k) {
      f(-1);
      cudaEventRecord(a);
      for (int r = 0; r < reps; ++r) f(r);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float m;
      cudaEventElapsedTime(&m, a, b);
      ms.push_back(m / reps);
    }
    return median(ms);
  };
  // One call between two events after a 256 MiB memset, median of 60 (do_bench's way).
  auto flushed = [&](auto&& f) {
    std::vector<float> ms;
    for (int k = 0; k < 60; ++k) {
      cudaMemsetAsync(flush, k & 0xff, 256LL << 20);
      cudaEventRecord(a);
      f(k);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float m;
      cudaEventElapsedTime(&m, a, b);
      ms.push_back(m);
    }
    return median(ms);
  };
  const double bytes = 2.0 * N * D * 4;
  for (int round = 0; round < 2; ++round) {
    const float big = batched([&](int) { cudaMemcpyAsync(big1, big0, 1LL << 30, cudaMemcpyDeviceToDevice); }, 5);
    const double copy_bw = 2.0 * (1LL << 30) / (big * 1e-3);
    const float small =
        batched([&](int r) { cudaMemcpyAsync(out[(r + 4) % R], table[(r + 4) % R], N * D * 4, cudaMemcpyDeviceToDevice); }, 20);
    printf("round %d: copy 1 GiB %.4f ms (%.1f GB/s); copy 128 MiB (rotating) ratio %.4f\n", round, big,
           copy_bw / 1e9, bytes / (small * 1e-3) / copy_bw);
    auto show = [&](const char* what, float plain, float keep) {
      printf("  %-26s plain %.4f ms ratio %.4f | evict_last %.4f ms ratio %.4f\n", what, plain,
             bytes / (plain * 1e-3) / copy_bw, keep, bytes / (keep * 1e-3) / copy_bw);
    };
    for (int distinct = 0; distinct < 2; ++distinct) {
      auto& ids = distinct ? dis : uni;
      const char* tag = distinct ? "distinct" : "uniform";
      auto same = [&](auto kern) { return batched([&](int) { kern<<<grid, 256>>>(table[0], ids[0], out[0], bad); }, 20); };
      auto rot = [&](auto kern) {
        return batched([&](int r) { const int i = (r + 4) % R; kern<<<grid, 256>>>(table[i], ids[i], out[i], bad); }, 20);
      };
      auto fl = [&](auto kern) { return flushed([&](int) { kern<<<grid, 256>>>(table[0], ids[0], out[0], bad); }); };
      char label[64];
      snprintf(label, sizeof label, "%s, same", tag);
      show(label, same(gather<false>), same(gather<true>));
      snprintf(label, sizeof label, "%s, rotate", tag);
      show(label, rot(gather<false>), rot(gather<true>));
      snprintf(label, sizeof label, "%s, flush", tag);
      show(label, fl(gather<false>), fl(gather<true>));
    }
    // The L2-bound kernel alone, then right after 20 launches of each policy.
    auto reread_ms = [&](int before) {
      std::vector<float> ms;
      for (int k = 0; k < 9; ++k) {
        for (int r = 0; r < 20; ++r) {
          if (before == 1) gather<false><<<grid, 256>>>(table[r % R], uni[r % R], out[r % R], bad);
          if (before == 2) gather<true><<<grid, 256>>>(table[r % R], uni[r % R], out[r % R], bad);
        }
        cudaEventRecord(a);
        reread<<<1056, 256>>>((const float4*)l2buf, l2n, sink);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float m;
        cudaEventElapsedTime(&m, a, b);
        ms.push_back(m);
      }
      return median(ms);
    };
    printf("  L2-bound kernel (16 passes over 16 MiB): alone %.4f ms, after plain %.4f ms, after evict_last %.4f ms\n",
           reread_ms(0), reread_ms(1), reread_ms(2));
  }
  CK(cudaDeviceSynchronize());
  int h_bad = 0;
  cudaMemcpy(&h_bad, bad, 4, cudaMemcpyDeviceToHost);
  printf("bad ids: %d\n", h_bad);
  return 0;
}
