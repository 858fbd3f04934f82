// Probe: B1 (gradients of sum(gelu_tanh(layer_norm(X, w, b))) w.r.t. X, w, b; X [16384, 4096] f32)
// as one persistent row kernel that also accumulates dw and db per thread (its columns are fixed),
// writes per-block partials, and a small kernel that sums the partials in block order: the
// structure that reads X from memory once. Row sums accumulate in double, as kiln's kernels do;
// the per-thread column partials in float or double. Checked against a double evaluation on the
// host. Not part of the build:
//   nvcc -O3 -arch=sm_90 -std=c++17 b1_fused_columns.cu (docs/performance-gpu.md, "B1's row").
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <cmath>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
constexpr int M = 16384, K = 4096, T = 256, S = K / (T * 4);  // 4 slots of float4 per thread

template <class A>
__device__ __forceinline__ A block_sum(A v, A* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  A r = 0;
  for (int w = 0; w < T / 32; ++w) r += sh[w];
  __syncthreads();
  return r;
}

template <class ACC>
__global__ void __launch_bounds__(256) fused(const float* __restrict__ X, const float* __restrict__ w, const float* __restrict__ b,
                                             float* __restrict__ dX, ACC* __restrict__ pdw, ACC* __restrict__ pdb) {
  __shared__ double sh[8];
  __shared__ double sh2[8];
  const int tid = threadIdx.x;
  float wr[S][4], br[S][4];
  ACC aw[S][4], ab[S][4];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    float4 wv = *(const float4*)(w + (s * T + tid) * 4), bv = *(const float4*)(b + (s * T + tid) * 4);
    wr[s][0] = wv.x; wr[s][1] = wv.y; wr[s][2] = wv.z; wr[s][3] = wv.w;
    br[s][0] = bv.x; br[s][1] = bv.y; br[s][2] = bv.z; br[s][3] = bv.w;
#pragma unroll
    for (int l = 0; l < 4; ++l) aw[s][l] = ab[s][l] = 0;
  }
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    float x[S][4];
    double a = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float4 v = *(const float4*)(X + (long long)row * K + (s * T + tid) * 4);
      x[s][0] = v.x; x[s][1] = v.y; x[s][2] = v.z; x[s][3] = v.w;
      a += (double)((v.x + v.y) + (v.z + v.w));
    }
    const float mean = (float)block_sum(a, sh) / (float)K;
    double q = 0;
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int l = 0; l < 4; ++l) { float d = x[s][l] - mean; q += (double)(d * d); }
    const float var = (float)block_sum(q, sh) / (float)K;
    const float rstd = 1.0f / sqrtf(var + 1e-5f);
    float g[S][4];
    double s1 = 0, s2 = 0;
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const float xh = (x[s][l] - mean) * rstd;
        const float y = xh * wr[s][l] + br[s][l];
        const float y2 = y * y;
        const float t = tanhf(0.7978845608f * (y + 0.044715f * y2 * y));
        const float gy = 0.5f * (1.f + t) + 0.5f * y * (1.f - t * t) * 0.7978845608f * (1.f + 0.134145f * y2);
        g[s][l] = gy;
        x[s][l] = xh;
        const float gw = gy * wr[s][l];
        s1 += (double)gw;
        s2 += (double)(gw * xh);
        aw[s][l] += (ACC)(gy * xh);
        ab[s][l] += (ACC)gy;
      }
    // both sums in one block reduction round
    for (int o = 16; o > 0; o >>= 1) { s1 += __shfl_xor_sync(0xffffffffu, s1, o); s2 += __shfl_xor_sync(0xffffffffu, s2, o); }
    if ((tid & 31) == 0) { sh[tid >> 5] = s1; sh2[tid >> 5] = s2; }
    __syncthreads();
    double r1 = 0, r2 = 0;
    for (int k = 0; k < T / 32; ++k) { r1 += sh[k]; r2 += sh2[k]; }
    __syncthreads();
    const float m1 = (float)r1 / K, m2 = (float)r2 / K;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float o[4];
#pragma unroll
      for (int l = 0; l < 4; ++l) o[l] = rstd * (g[s][l] * wr[s][l] - m1 - x[s][l] * m2);
      *(float4*)(dX + (long long)row * K + (s * T + tid) * 4) = make_float4(o[0], o[1], o[2], o[3]);
    }
  }
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      pdw[(long long)blockIdx.x * K + (s * T + tid) * 4 + l] = aw[s][l];
      pdb[(long long)blockIdx.x * K + (s * T + tid) * 4 + l] = ab[s][l];
    }
}

template <class ACC>
__global__ void combine(const ACC* __restrict__ pdw, const ACC* __restrict__ pdb, int G, float* dw, float* db) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= K) return;
  double a = 0, bb = 0;
  for (int i = 0; i < G; ++i) { a += (double)pdw[(long long)i * K + c]; bb += (double)pdb[(long long)i * K + c]; }
  dw[c] = (float)a; db[c] = (float)bb;
}

template <class ACC>
int run(const char* name, int G, float* X, float* w, float* b, float* dX, float* dw, float* db, float copy_ms) {
  ACC *pdw, *pdb;
  CK(cudaMalloc(&pdw, sizeof(ACC) * G * K)); CK(cudaMalloc(&pdb, sizeof(ACC) * G * K));
  cudaEvent_t e0, e1, e2; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
  for (int i = 0; i < 3; ++i) { fused<ACC><<<G, T>>>(X, w, b, dX, pdw, pdb); combine<ACC><<<K / 256, 256>>>(pdw, pdb, G, dw, db); }
  CK(cudaDeviceSynchronize());
  float best = 1e9, bk = 1e9;
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(e0);
    fused<ACC><<<G, T>>>(X, w, b, dX, pdw, pdb);
    cudaEventRecord(e1);
    combine<ACC><<<K / 256, 256>>>(pdw, pdb, G, dw, db);
    cudaEventRecord(e2);
    cudaEventSynchronize(e2);
    float a, c; cudaEventElapsedTime(&a, e0, e2); cudaEventElapsedTime(&c, e0, e1);
    best = std::min(best, a); bk = std::min(bk, c);
  }
  CK(cudaGetLastError());
  printf("%-28s grid %5d: %.4f ms (row kernel %.4f), %.3f of copy on X read + dX written\n", name, G, best, bk, copy_ms * (2.0 * M * K * 4) / (1 << 30) / best);
  cudaFree(pdw); cudaFree(pdb);
  return 0;
}

int main() {
  float *X, *w, *b, *dX, *dw, *db, *big, *big2;
  CK(cudaMalloc(&X, 4ll * M * K)); CK(cudaMalloc(&dX, 4ll * M * K)); CK(cudaMalloc(&w, 4 * K)); CK(cudaMalloc(&b, 4 * K));
  CK(cudaMalloc(&dw, 4 * K)); CK(cudaMalloc(&db, 4 * K));
  std::vector<float> h(size_t(M) * K);
  unsigned s = 1;
  for (auto& v : h) { s = s * 1664525u + 1013904223u; v = ((s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 4; }
  CK(cudaMemcpy(X, h.data(), 4ll * M * K, cudaMemcpyHostToDevice));
  std::vector<float> hw(K), hb(K);
  for (int i = 0; i < K; ++i) { hw[i] = 1 + 0.001f * (i % 7); hb[i] = 0.01f * (i % 5); }
  CK(cudaMemcpy(w, hw.data(), 4 * K, cudaMemcpyHostToDevice)); CK(cudaMemcpy(b, hb.data(), 4 * K, cudaMemcpyHostToDevice));
  // copy of 1 GiB (the kit's copy): ms per GiB moved (read + write counted)
  const size_t N = size_t(1) << 28;
  CK(cudaMalloc(&big, 4 * N)); CK(cudaMalloc(&big2, 4 * N));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float cbest = 1e9;
  for (int r = 0; r < 5; ++r) { cudaEventRecord(e0); cudaMemcpy(big2, big, 4 * N, cudaMemcpyDeviceToDevice); cudaEventRecord(e1); cudaEventSynchronize(e1); float a; cudaEventElapsedTime(&a, e0, e1); cbest = std::min(cbest, a); }
  const float copy_ms_per_gib = cbest / 2.0f;  // 1 GiB read + 1 GiB written
  printf("copy: %.0f GB/s\n", 2.0 * 4 * N / (cbest * 1e-3) / 1e9);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int k : {1, 2, 3, 4}) run<float>("fused, float partials", sms * k, X, w, b, dX, dw, db, copy_ms_per_gib);
  for (int k : {2, 4}) run<double>("fused, double partials", sms * k, X, w, b, dX, dw, db, copy_ms_per_gib);
  // check against a double CPU evaluation on a few rows/cols
  std::vector<float> hdX(size_t(M) * K), hdw(K), hdb(K);
  CK(cudaMemcpy(hdX.data(), dX, 4ll * M * K, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hdw.data(), dw, 4 * K, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hdb.data(), db, 4 * K, cudaMemcpyDeviceToHost));
  std::vector<double> rdw(K, 0), rdb(K, 0);
  double maxerr = 0;
  for (int r = 0; r < M; ++r) {
    const float* x = &h[size_t(r) * K];
    double m = 0; for (int i = 0; i < K; ++i) m += x[i]; m /= K;
    double v = 0; for (int i = 0; i < K; ++i) v += (x[i] - m) * (x[i] - m); v /= K;
    double rs = 1 / std::sqrt(v + 1e-5), s1 = 0, s2 = 0;
    std::vector<double> xh(K), g(K);
    for (int i = 0; i < K; ++i) {
      xh[i] = (x[i] - m) * rs; double y = xh[i] * hw[i] + hb[i];
      double t = std::tanh(0.7978845608028654 * (y + 0.044715 * y * y * y));
      g[i] = 0.5 * (1 + t) + 0.5 * y * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * y * y);
      s1 += g[i] * hw[i]; s2 += g[i] * hw[i] * xh[i]; rdw[i] += g[i] * xh[i]; rdb[i] += g[i];
    }
    if (r % 997 == 0)
      for (int i = 0; i < K; ++i) maxerr = std::max(maxerr, std::fabs(rs * (g[i] * hw[i] - s1 / K - xh[i] * s2 / K) - hdX[size_t(r) * K + i]));
  }
  double ew = 0, eb = 0;
  for (int i = 0; i < K; ++i) { ew = std::max(ew, std::fabs(rdw[i] - hdw[i]) / (1 + std::fabs(rdw[i]))); eb = std::max(eb, std::fabs(rdb[i] - hdb[i]) / (1 + std::fabs(rdb[i]))); }
  printf("check: dX max abs err %.3g, dw rel %.3g, db rel %.3g\n", maxerr, ew, eb);
  return 0;
}
