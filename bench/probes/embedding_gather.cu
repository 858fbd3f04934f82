// Probe: the E1 embedding gather (32768 rows of 1024 f32 from [50304, 1024]) as hand-written kernels
// (kiln's form, index checks deferred or combined, 1-4 steps a thread) against cudaMemcpy. Not part of
// the build: nvcc -O3 -arch=sm_90 -std=c++17 embedding_gather.cu (docs/performance-gpu.md).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <random>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ long long* g_report;
__device__ __noinline__ void report(long long site, long long v, long long bound) {
  long long* r = g_report;
  if (r && (long long)atomicCAS((unsigned long long*)r, 0ull, 1ull) == 0) { r[1] = site; r[2] = v; r[3] = bound; }
}
static __device__ inline long long gidx(long long v, long long bound) {
  if ((unsigned long long)v >= (unsigned long long)bound) { report(7, v, bound); return v < 0 ? 0 : bound - 1; }
  return v;
}
constexpr int NV = 32768 * 256;
constexpr long long VOCAB = 50304;
// kiln's structure: per step, id load, checked (call in a branch), row load, store.
template <int U>
__global__ void __launch_bounds__(256) v0(const float* __restrict__ in0, const long long* __restrict__ in1, float* __restrict__ out0) {
  int t = blockIdx.x * 256 + threadIdx.x; const int G = gridDim.x * 256;
  for (; t + (U - 1) * G < NV; t += U * G) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int tu = t + u * G; int i0 = tu / 256, i1 = (tu % 256) * 4;
      long long id = gidx(in1[i0], VOCAB);
      *(uint4*)(out0 + (1024 * i0 + i1)) = *(const uint4*)(in0 + (i1 + 1024LL * id));
    }
  }
  for (; t < NV; t += G) { int i0 = t / 256, i1 = (t % 256) * 4; long long id = gidx(in1[i0], VOCAB);
    *(uint4*)(out0 + (1024 * i0 + i1)) = *(const uint4*)(in0 + (i1 + 1024LL * id)); }
}
// kiln's structure with a deferred report: the step clamps with a select and remembers the
// first bad index in registers; one call after the loops.
template <int U>
__global__ void __launch_bounds__(256) vdefer(const float* __restrict__ in0, const long long* __restrict__ in1, float* __restrict__ out0) {
  int t = blockIdx.x * 256 + threadIdx.x; const int G = gridDim.x * 256;
  long long bad_v = 0; bool bad = false;
  auto clampi = [&](long long v) {
    const bool b = (unsigned long long)v >= (unsigned long long)VOCAB;
    bad_v = (b && !bad) ? v : bad_v; bad = bad || b;
    return b ? (v < 0 ? 0 : VOCAB - 1) : v;
  };
  for (; t + (U - 1) * G < NV; t += U * G) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int tu = t + u * G; int i0 = tu / 256, i1 = (tu % 256) * 4;
      long long id = clampi(in1[i0]);
      *(uint4*)(out0 + (1024 * i0 + i1)) = *(const uint4*)(in0 + (i1 + 1024LL * id));
    }
  }
  for (; t < NV; t += G) { int i0 = t / 256, i1 = (t % 256) * 4; long long id = clampi(in1[i0]);
    *(uint4*)(out0 + (1024 * i0 + i1)) = *(const uint4*)(in0 + (i1 + 1024LL * id)); }
  if (bad) report(7, bad_v, VOCAB);
}
// loads first; CHECK 0: one combined branch, 1: a branch per index
template <int U, int CHECK>
__global__ void __launch_bounds__(256) v1(const float* __restrict__ in0, const long long* __restrict__ in1, float* __restrict__ out0) {
  int t = blockIdx.x * 256 + threadIdx.x; const int G = gridDim.x * 256;
  for (; t + (U - 1) * G < NV; t += U * G) {
    long long id[U]; uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) id[u] = in1[(t + u * G) / 256];
    if (CHECK == 0) {
      bool bad = false;
#pragma unroll
      for (int u = 0; u < U; ++u) bad |= (unsigned long long)id[u] >= (unsigned long long)VOCAB;
      if (bad) {
#pragma unroll
        for (int u = 0; u < U; ++u) id[u] = gidx(id[u], VOCAB);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) id[u] = gidx(id[u], VOCAB);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) w[u] = *(const uint4*)(in0 + ((t + u * G) % 256) * 4 + 1024LL * id[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) { int tu = t + u * G; *(uint4*)(out0 + (1024 * (tu / 256) + (tu % 256) * 4)) = w[u]; }
  }
  for (; t < NV; t += G) { int i0 = t / 256, i1 = (t % 256) * 4; long long id = gidx(in1[i0], VOCAB);
    *(uint4*)(out0 + (1024 * i0 + i1)) = *(const uint4*)(in0 + (i1 + 1024LL * id)); }
}
__global__ void fill(float* p, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ 0x9e3779b9u; h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
    p[i] = (float)(h & 0xffffff) * 1e-7f - 0.8f;
  }
}
template <class F>
float timeit(F f, int reps = 20) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ms;
  for (int k = 0; k < 9; ++k) {
    f(); cudaEventRecord(a); for (int r = 0; r < reps; ++r) f(); cudaEventRecord(b); cudaEventSynchronize(b);
    float m; cudaEventElapsedTime(&m, a, b); ms.push_back(m / reps);
  }
  std::sort(ms.begin(), ms.end()); return ms[ms.size() / 2];
}
int main() {
  float *table, *out, *big0, *big1; long long *ids, *report_buf;
  CK(cudaMalloc(&table, VOCAB * 1024 * 4)); CK(cudaMalloc(&out, 32768LL * 1024 * 4));
  CK(cudaMalloc(&big0, 1LL << 30)); CK(cudaMalloc(&big1, 1LL << 30)); CK(cudaMalloc(&ids, 32768 * 8));
  CK(cudaMalloc(&report_buf, 64));
  cudaMemset(report_buf, 0, 64); cudaMemcpyToSymbol(g_report, &report_buf, sizeof(void*));
  fill<<<4096, 256>>>(table, VOCAB * 1024);
  std::mt19937_64 rng(23); std::vector<long long> h(32768);
  for (auto& x : h) x = rng() % (VOCAB - 1);
  cudaMemcpy(ids, h.data(), 32768 * 8, cudaMemcpyHostToDevice);
  const double bytes = 2.0 * 32768 * 1024 * 4;
  for (int round = 0; round < 3; ++round) {
    float big = timeit([&] { cudaMemcpyAsync(big1, big0, 1LL << 30, cudaMemcpyDeviceToDevice); }, 5);
    double copy_bw = 2.0 * (1LL << 30) / (big * 1e-3);
    auto show = [&](const char* name, float ms) { printf("%-34s %8.4f ms  ratio %.4f\n", name, ms, bytes / (ms * 1e-3) / copy_bw); };
    printf("copy 1 GiB: %.4f ms, %.1f GB/s\n", big, copy_bw / 1e9);
    show("v0<1> kiln form", timeit([&] { v0<1><<<32768, 256>>>(table, ids, out); }));
    show("v0<2> kiln form", timeit([&] { v0<2><<<16384, 256>>>(table, ids, out); }));
    show("v0<4> kiln form (today)", timeit([&] { v0<4><<<8192, 256>>>(table, ids, out); }));
    show("vdefer<1>", timeit([&] { vdefer<1><<<32768, 256>>>(table, ids, out); }));
    show("vdefer<2>", timeit([&] { vdefer<2><<<16384, 256>>>(table, ids, out); }));
    show("vdefer<4>", timeit([&] { vdefer<4><<<8192, 256>>>(table, ids, out); }));
    show("v1<2> combined check", timeit([&] { v1<2, 0><<<16384, 256>>>(table, ids, out); }));
    show("v1<2> check per index", timeit([&] { v1<2, 1><<<16384, 256>>>(table, ids, out); }));
    show("v1<4> check per index", timeit([&] { v1<4, 1><<<8192, 256>>>(table, ids, out); }));
  }
  CK(cudaDeviceSynchronize());
  long long r[4]; cudaMemcpy(r, report_buf, 32, cudaMemcpyDeviceToHost); printf("report %lld\n", r[0]);
  return 0;
}
