// Probe: rms_norm rows [16384, 4096] f32 as hand-written one-row-per-block kernels (cache policies,
// rows per block, one or two passes) against cudaMemcpy of the same bytes, also over rotating
// inputs. Not part of the build: nvcc -O3 -arch=sm_90 -std=c++17 rms_norm_l2_policy.cu (docs/performance-gpu.md).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
constexpr int M = 16384, K = 4096;
template <int MODE> __device__ __forceinline__ uint4 ld(const float* p) {
  if (MODE & 40) {
    uint4 r; unsigned long long pol;
    if (MODE & 8) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
    return r;
  }
  if (MODE & 1) return __ldcs((const uint4*)p);
  if (MODE & 4) return __ldg((const uint4*)p);
  return *(const uint4*)p;
}
template <int MODE> __device__ __forceinline__ void st(float* p, uint4 v) {
  if (MODE & 16) {
    unsigned long long pol; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
  } else if (MODE & 2) __stcs((uint4*)p, v); else *(uint4*)p = v;
}
// T threads per row, V float4 per thread (T*V*4 == K), R rows per block, ACC double or float.
template <int T, int V, int R, class ACC, int MODE, int MINB>
__global__ void __launch_bounds__(T * R, MINB) rms(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y) {
  __shared__ ACC part[R][T / 32];
  const int sub = threadIdx.x / T, tid = threadIdx.x % T;
  const int row = blockIdx.x * R + sub;
  const float* xr = x + (long long)row * K;
  uint4 c[V];
  ACC a = 0;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    c[s] = ld<MODE>(xr + (s * T + tid) * 4);
    float v0 = __uint_as_float(c[s].x), v1 = __uint_as_float(c[s].y), v2 = __uint_as_float(c[s].z), v3 = __uint_as_float(c[s].w);
    a += (ACC)((v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  if ((tid & 31) == 0) part[sub][tid >> 5] = a;
  __syncthreads();
  a = part[sub][0];
#pragma unroll
  for (int i = 1; i < T / 32; ++i) a += part[sub][i];
  const float r = rsqrtf((float)a / K + 1e-6f);
  float* yr = y + (long long)row * K;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int pos = (s * T + tid) * 4;
    const uint4 ww = *(const uint4*)(w + pos);
    uint4 o;
    o.x = __float_as_uint(__uint_as_float(c[s].x) * r * __uint_as_float(ww.x));
    o.y = __float_as_uint(__uint_as_float(c[s].y) * r * __uint_as_float(ww.y));
    o.z = __float_as_uint(__uint_as_float(c[s].z) * r * __uint_as_float(ww.z));
    o.w = __float_as_uint(__uint_as_float(c[s].w) * r * __uint_as_float(ww.w));
    st<MODE>(yr + pos, o);
  }
}
template <int T, int V, int R, int MODE1, int MODE2>
__global__ void __launch_bounds__(T * R) rms2(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y) {
  __shared__ float part[R][T / 32];
  const int sub = threadIdx.x / T, tid = threadIdx.x % T;
  const int row = blockIdx.x * R + sub;
  const float* xr = x + (long long)row * K;
  float a = 0;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    uint4 c = ld<MODE1>(xr + (s * T + tid) * 4);
    float v0 = __uint_as_float(c.x), v1 = __uint_as_float(c.y), v2 = __uint_as_float(c.z), v3 = __uint_as_float(c.w);
    a += (v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  if ((tid & 31) == 0) part[sub][tid >> 5] = a;
  __syncthreads();
  a = part[sub][0];
#pragma unroll
  for (int i = 1; i < T / 32; ++i) a += part[sub][i];
  const float r = rsqrtf(a / K + 1e-6f);
  float* yr = y + (long long)row * K;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int pos = (s * T + tid) * 4;
    const uint4 c = ld<MODE2>(xr + pos);
    const uint4 ww = *(const uint4*)(w + pos);
    uint4 o;
    o.x = __float_as_uint(__uint_as_float(c.x) * r * __uint_as_float(ww.x));
    o.y = __float_as_uint(__uint_as_float(c.y) * r * __uint_as_float(ww.y));
    o.z = __float_as_uint(__uint_as_float(c.z) * r * __uint_as_float(ww.z));
    o.w = __float_as_uint(__uint_as_float(c.w) * r * __uint_as_float(ww.w));
    st<0>(yr + pos, o);
  }
}
__global__ void fill(float* p, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ 0x9e3779b9u; h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
    p[i] = (float)(h & 0xffffff) * 1e-7f - 0.8f;
  }
}
template <class F> float timeit(F f, int reps = 20) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ms;
  for (int k = 0; k < 9; ++k) {
    f(); cudaEventRecord(a); for (int r = 0; r < reps; ++r) f(); cudaEventRecord(b); cudaEventSynchronize(b);
    float m; cudaEventElapsedTime(&m, a, b); ms.push_back(m / reps);
  }
  std::sort(ms.begin(), ms.end()); return ms[ms.size() / 2];
}
template <int T, int V, int R, class ACC, int MODE, int MINB>
void occ(const char* name) {
  int n = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, rms<T, V, R, ACC, MODE, MINB>, T * R, 0);
  cudaFuncAttributes at; cudaFuncGetAttributes(&at, rms<T, V, R, ACC, MODE, MINB>);
  printf("  %-30s blocks/SM %d regs %d\n", name, n, at.numRegs);
}
int main() {
  float *x, *y, *w, *big0, *big1;
  CK(cudaMalloc(&x, 4LL * M * K)); CK(cudaMalloc(&y, 4LL * M * K)); CK(cudaMalloc(&w, 4 * K));
  CK(cudaMalloc(&big0, 1LL << 30)); CK(cudaMalloc(&big1, 1LL << 30));
  fill<<<4096, 256>>>(x, (long long)M * K); fill<<<16, 256>>>(w, K); fill<<<4096, 256>>>(big0, 1LL << 28);
  const double bytes = 2.0 * M * K * 4;
#define RUN(name, T, V, R, ACC, MODE, MINB) show(name, timeit([&] { rms<T, V, R, ACC, MODE, MINB><<<M / R, T * R>>>(x, w, y); }))
  occ<256, 4, 1, double, 0, 1>("K0 256x4 double");
  occ<256, 4, 1, float, 0, 1>("K1 256x4 float");
  occ<128, 8, 1, double, 0, 1>("K4 128x8 double");
  occ<512, 2, 1, double, 0, 1>("K3 512x2 double");
  // Rotating inputs: 8 buffers of 256 MiB, a different one each launch (nothing a launch
  // leaves in L2 is read by the next).
  std::vector<float*> xs(8), ys(2);
  for (auto& p : xs) { CK(cudaMalloc(&p, 4LL * M * K)); fill<<<4096, 256>>>(p, (long long)M * K); }
  for (auto& p : ys) CK(cudaMalloc(&p, 4LL * M * K));
  int turn = 0;
#define ROT(name, launch) show(name, timeit([&] { float* xr_ = xs[turn % 8]; float* yr_ = ys[turn % 2]; ++turn; launch; }, 16))
  for (int round = 0; round < 2; ++round) {
    float big = timeit([&] { cudaMemcpyAsync(big1, big0, 1LL << 30, cudaMemcpyDeviceToDevice); }, 5);
    double copy_bw = 2.0 * (1LL << 30) / (big * 1e-3);
    auto show = [&](const char* name, float ms) { printf("%-40s %8.4f ms  ratio %.4f\n", name, ms, bytes / (ms * 1e-3) / copy_bw); };
    printf("copy 1 GiB: %.4f ms, %.1f GB/s\n", big, copy_bw / 1e9);
    show("same   memcpy 256 MiB", timeit([&] { cudaMemcpyAsync(y, x, 4LL * M * K, cudaMemcpyDeviceToDevice); }));
    ROT("rotate memcpy 256 MiB", cudaMemcpyAsync(yr_, xr_, 4LL * M * K, cudaMemcpyDeviceToDevice));
    RUN("same   K0 (kiln)", 256, 4, 1, double, 0, 1);
    ROT("rotate K0 (kiln)", (rms<256, 4, 1, double, 0, 1><<<M, 256>>>(xr_, w, yr_)));
    RUN("same   K18 ld evict_last", 256, 4, 1, double, 32, 1);
    RUN("same   K1 sum in float", 256, 4, 1, float, 0, 1);
    RUN("same   K15 ld evict_first", 256, 4, 1, double, 8, 1);
    RUN("same   K2 ldcs+stcs", 256, 4, 1, double, 3, 1);
    RUN("same   K7 2 rows", 256, 4, 2, double, 0, 1);
    RUN("same   K11 2 rows ldcs+stcs", 256, 4, 2, double, 3, 1);
    RUN("same   K3 512 threads", 512, 2, 1, double, 0, 1);
    show("same   T2 two-pass 256x4 l/f", timeit([&] { rms2<256, 4, 1, 32, 8><<<M, 256>>>(x, w, y); }));
    ROT("rotate K18 ld evict_last", (rms<256, 4, 1, double, 32, 1><<<M, 256>>>(xr_, w, yr_)));
    ROT("rotate K11 2 rows ldcs+stcs", (rms<256, 4, 2, double, 3, 1><<<M / 2, 512>>>(xr_, w, yr_)));
    ROT("rotate K7 2 rows", (rms<256, 4, 2, double, 0, 1><<<M / 2, 512>>>(xr_, w, yr_)));
    ROT("rotate K2 ldcs+stcs", (rms<256, 4, 1, double, 3, 1><<<M, 256>>>(xr_, w, yr_)));
    show("same   T3 two-pass 512x2 l/f", timeit([&] { rms2<512, 2, 1, 32, 8><<<M, 512>>>(x, w, y); }));
    ROT("rotate T3 two-pass 512x2 l/f", (rms2<512, 2, 1, 32, 8><<<M, 512>>>(xr_, w, yr_)));
    ROT("rotate T1 two-pass 256x4", (rms2<256, 4, 1, 0, 0><<<M, 256>>>(xr_, w, yr_)));
    // after K18 on x, does a plain K0 over another buffer slow down (evict_last lines left in L2)?
    ROT("rotate K0 after K18 on x", (rms<256, 4, 1, double, 32, 1><<<M, 256>>>(x, w, y), rms<256, 4, 1, double, 0, 1><<<M, 256>>>(xr_, w, yr_)));
    ROT("rotate K0 after K0 on x", (rms<256, 4, 1, double, 0, 1><<<M, 256>>>(x, w, y), rms<256, 4, 1, double, 0, 1><<<M, 256>>>(xr_, w, yr_)));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
