// The CPU workloads of the benchmark table (docs/performance.md, CPU shapes), each timed with
// the reference executor ("eager": op by op, every intermediate materialised) and with the JIT
// (fused, compiled), beside a plain copy of memory measured in the same run. Built on kiln's
// benchmark kit (kiln/bench.hpp): every workload declares its bytes (the least traffic a
// perfect kernel needs), and the kit reports GB/s, `x_copy` (that bandwidth divided by the
// copy bandwidth measured at start-up; `ratio_to_copy` before the kit), `compile_ms` (the
// untimed first call) and launches_per_call. Benchmarks keep Google Benchmark's real-time
// registration, so their names (".../real_time") compare across versions.
//
//   bench_cpu --benchmark_out=cpu.json --benchmark_out_format=json   # or KILN_BENCH_JSON=cpu.json
//   KILN_NUM_THREADS=2 taskset -c 0,1 bench_cpu      # the 2-core setting of the workload table
//   scripts/plot-bench cpu.json cpu.png              # x_copy per workload, as a bar chart
//
// Beside them: Eigen Tensor peers (2-thread ThreadPoolDevice), the user's loop
// `Tensor z = 2.0f * x + y; z.eval();`, the dispatch cost of cached expressions on 16 elements
// (assign and kiln::compile), the cold compile of one fused kernel, and a disk-cache hit in a
// new process (bench_cpu_process, spawned from here). Unless KILN_CACHE_DIR is set, the run
// uses a fresh cache directory, so no figure depends on what an earlier run left on disk.
#define EIGEN_USE_THREADS
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <unsupported/Eigen/CXX11/Tensor>
#include <kiln/bench.hpp>
#include <kiln/kiln.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;

namespace {

constexpr std::int64_t kN = std::int64_t{1} << 24;  // P1-P3, R1
constexpr std::int64_t kM = 4096, kK = 4096;        // P4, R2, R3, N1, N3, N4, N5

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const Device kCpu = Device::cpu();

struct CopyBuffers {
  std::vector<char> src, dst;
  explicit CopyBuffers(std::size_t bytes) : src(bytes, 1), dst(bytes, 0) {}
};

/// The copy baseline itself (the kit measures the same loop once at start-up for x_copy).
void BM_copy(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(kN) * sizeof(float);
  CopyBuffers b(bytes);
  const int threads = static_cast<int>(state.range(0)) > 0 ? static_cast<int>(state.range(0)) : bench::cpu_threads();
  bench::parallel_memcpy(b.dst.data(), b.src.data(), bytes, threads);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    bench::parallel_memcpy(b.dst.data(), b.src.data(), bytes, threads);
    benchmark::ClobberMemory();
  }
  const double seconds = seconds_since(t0);
  state.counters["threads"] = threads;
  bench::report(state, kCpu, {.bytes = 2.0 * static_cast<double>(bytes)},
                seconds / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations())));
}

/// One workload: makes (and evaluates) its inputs, then builds its result from them.
struct Workload {
  const char* id;
  std::function<std::vector<Tensor>()> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> compute;
  double bytes;  // 0: launch-bound, no bandwidth reported
};

std::vector<Tensor> evaluated(std::vector<Tensor> ts) {
  for (auto& t : ts) t.eval();
  return ts;
}

Tensor gelu_written_out(const Tensor& x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): eight pointwise ops.
  return 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * (x * x * x))));
}

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> w = {
      {"P1_2x_plus_y",
       [] {
         return evaluated({randn({kN}, 1), randn({kN}, 2)});
       },
       [](const auto& in) -> Tensor { return 2.0f * in[0] + in[1]; }, 3.0 * kN * 4},
      {"P2_gelu_tanh_8ops", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) { return gelu_written_out(in[0]); }, 2.0 * kN * 4},
      {"P3_16x_sin_chain", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 16; ++i) x = sin(x) * 1.01f + 0.5f;
         return x;
       },
       2.0 * kN * 4},
      {"P4_broadcast_affine",
       [] {
         return evaluated({randn({kM, kK}, 1), randn({kM, 1}, 2), rand({kK}, 3), randn({kK}, 4)});
       },
       [](const auto& in) -> Tensor { return (in[0] - in[1]) * in[2] + in[3]; }, 2.0 * kM* kK * 4},
      {"R1_sum_x_squared", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) { return sum(in[0] * in[0]); }, 1.0 * kN * 4},
      {"C1_cumsum_rows_16384x4096",
       [] {
         return evaluated({randn({16384, kK}, 1)});
       },
       [](const auto& in) { return cumsum(in[0], 1); }, 2.0 * 16384 * kK * 4},
      {"K1_topk64_rows",
       [] {
         return evaluated({randn({kM, kK}, 1)});
       },
       [](const auto& in) { return std::get<0>(topk(in[0], 64, -1)); }, 1.0 * kM * kK * 4},
      {"R2_row_sum",
       [] {
         return evaluated({randn({kM, kK}, 1)});
       },
       [](const auto& in) { return sum(in[0], {1}); }, 1.0 * kM * kK * 4},
      {"R3_column_sum",
       [] {
         return evaluated({randn({kM, kK}, 1)});
       },
       [](const auto& in) { return sum(in[0], {0}); }, 1.0 * kM * kK * 4},
      {"N1_softmax",
       [] {
         return evaluated({randn({kM, kK}, 1)});
       },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * kM * kK * 4},
      {"N2_softmax_short_rows",
       [] {
         return evaluated({randn({16384, 1024}, 1)});
       },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * 16384 * 1024 * 4},
      {"N3_layer_norm",
       [] {
         return evaluated({randn({kM, kK}, 1), rand({kK}, 2), randn({kK}, 3)});
       },
       [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, 2.0 * kM * kK * 4},
      {"N4_rms_norm_written_out",
       [] {
         return evaluated({randn({kM, kK}, 1), rand({kK}, 2)});
       },
       [](const auto& in) -> Tensor { return in[0] * rsqrt(mean(in[0] * in[0], {-1}, true) + 1e-6f) * in[1]; },
       2.0 * kM* kK * 4},
      {"N5_softmax_bf16",
       [] {
         return evaluated({randn({kM, kK}, 1, bf16)});
       },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * kM * kK * 2},
      {"N6_cross_entropy",
       [] {
         const std::int64_t rows = 2048, classes = 32768;
         Tensor targets = Tensor(rand({rows}, 2, f64) * static_cast<double>(classes)).to(i64);
         return evaluated({randn({rows, classes}, 1), targets});
       },
       [](const auto& in) { return cross_entropy(in[0], in[1]); }, 1.0 * 2048 * 32768 * 4},
      {"S1_10x_relu_chain_4096",
       [] {
         return evaluated({randn({4096}, 1), rand({4096}, 2)});
       },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 10; ++i) x = relu(x * in[1] + 0.1f);
         return x;
       },
       0.0},
  };
  return w;
}

void BM_workload(benchmark::State& state, const Workload& w, Backend backend) {
  const Backend saved = get_backend();
  set_backend(backend);
  try {
    const std::vector<Tensor> in = w.inputs();
    // A new result each call, as a user's loop makes; the kit's untimed first call compiles
    // (or loads from the disk cache).
    bench::run(state, kCpu, {.bytes = w.bytes}, [&] { return w.compute(in); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  set_backend(saved);
}

/// B1: forward and backward of gelu(layer_norm(X, w, b)) (tanh gelu, as torch_suite's B1) with
/// respect to X, w and b, X [4096, 4096] f32: each call builds the forward, differentiates
/// sum(out) and evaluates the three gradients together. Bytes: X read once and dX written once
/// (the least traffic; torch_suite reports B1's GB/s on twice that).
void BM_B1(benchmark::State& state) {
  Tensor X = randn({kM, kK}, 1).eval().requires_grad_(), w = rand({kK}, 2).eval().requires_grad_(),
         b = randn({kK}, 3).eval().requires_grad_();
  try {
    bench::run(state, kCpu, {.bytes = 2.0 * kM * kK * 4}, [&] {
      return autograd::grad({sum(gelu(layer_norm(X, w, b), true))}, {X, w, b});
    });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// T3: one training step of an MLP (1024 -> 1024 -> 1024 -> 1024 -> 10, tanh-GELU, batch 256,
/// f32, AdamW, cross_entropy), eager or with model.compile(). compile_ms is the first step (cold:
/// the run's cache starts empty). The peers are PyTorch's eager and torch.compile steps on the
/// same CPU pinned alike (run this as `KILN_NUM_THREADS=2 taskset -c 0,1 bench_cpu`).
void BM_T3(benchmark::State& state, bool compiled) {
  manual_seed(0);
  auto model = nn::Sequential(nn::Linear(1024, 1024), nn::GELU("tanh"), nn::Linear(1024, 1024), nn::GELU("tanh"),
                              nn::Linear(1024, 1024), nn::GELU("tanh"), nn::Linear(1024, 10));
  if (compiled) model.compile();
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  Tensor x = randn({256, 1024}, 7).eval();
  Tensor y = argmax(randn({256, 10}, 8), 1).eval();
  // Products: three forward, and for each layer the two backward ones (the first layer's input
  // gradient is not needed).
  const double flops = 2.0 * 256 * (3 * 1024.0 * 1024 + 1024 * 10) * 3;
  bench::run(state, kCpu, {.flops = flops}, [&] {
    Tensor loss = cross_entropy(model(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss;
  });
}

/// A3: causal attention on the CPU, f32 [1, 8, 2048, 64] (kiln's fused step: an online softmax
/// over key blocks, no [2048, 2048] scores), the forward alone and with the backward of q, k and
/// v; flops as FlashAttention counts them (4 B H T T D halved by the mask; the backward 2.5
/// forwards). Held to the CBLAS product rate of the same run (G_cpu_1024/cblas).
void BM_A3(benchmark::State& state, bool backward) {
  const std::int64_t T = 2048;
  Tensor q = randn({1, 8, T, 64}, 1).eval(), k = randn({1, 8, T, 64}, 2).eval(), v = randn({1, 8, T, 64}, 3).eval();
  const double flops = 4.0 * 8 * T * T * 64 / 2 * (backward ? 3.5 : 1.0);
  if (backward) {
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_();
    bench::run(state, kCpu, {.flops = flops}, [&] {
      return autograd::grad({sum(scaled_dot_product_attention(q, k, v, {}, 0.0, true))}, {q, k, v});
    });
  } else {
    bench::run(state, kCpu, {.flops = flops}, [&] { return scaled_dot_product_attention(q, k, v, {}, 0.0, true); });
  }
}

// ---- Eigen Tensor peers -------------------------------------------------------------------

using EVec = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using EMat = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using EIdx = Eigen::Index;

int eigen_threads() { return bench::cpu_threads(); }

/// Fills an Eigen tensor from a kiln tensor (same values as kiln's inputs of that workload).
template <class ET>
void fill_from(ET& dst, const Tensor& src) {
  const std::vector<float> v = src.to_vector<float>();
  std::memcpy(dst.data(), v.data(),
              sizeof(float) * std::min<std::size_t>(v.size(), static_cast<std::size_t>(dst.size())));
}

struct EigenWorkload {
  const char* id;
  double bytes;
  // Sets up inputs/outputs and returns the body of one iteration (writes into a preallocated
  // output, as an Eigen user would: Eigen has no lazily allocated results).
  std::function<std::function<void(Eigen::ThreadPoolDevice&)>()> make;
};

const std::vector<EigenWorkload>& eigen_workloads() {
  static const std::vector<EigenWorkload> w = {
      {"P1_2x_plus_y", 3.0 * kN * 4,
       [] {
         auto x = std::make_shared<EVec>(kN), y = std::make_shared<EVec>(kN), z = std::make_shared<EVec>(kN);
         fill_from(*x, randn({kN}, 1));
         fill_from(*y, randn({kN}, 2));
         return std::function<void(Eigen::ThreadPoolDevice&)>(
             [x, y, z](Eigen::ThreadPoolDevice& d) { z->device(d) = 2.0f * *x + *y; });
       }},
      {"P2_gelu_tanh_8ops", 2.0 * kN * 4,
       [] {
         auto x = std::make_shared<EVec>(kN), z = std::make_shared<EVec>(kN);
         fill_from(*x, randn({kN}, 1));
         return std::function<void(Eigen::ThreadPoolDevice&)>([x, z](Eigen::ThreadPoolDevice& d) {
           const EVec& v = *x;
           z->device(d) = 0.5f * v * (1.0f + (0.7978845608f * (v + 0.044715f * (v * v * v))).tanh());
         });
       }},
      {"P3_16x_sin_chain", 2.0 * kN * 4,
       [] {
         // As an Eigen user writes a chain built in a loop: one evaluation per step (an Eigen
         // expression's type cannot grow at run time), in place, Eigen's vectorised sin.
         auto x = std::make_shared<EVec>(kN), z = std::make_shared<EVec>(kN);
         fill_from(*x, randn({kN}, 1));
         return std::function<void(Eigen::ThreadPoolDevice&)>([x, z](Eigen::ThreadPoolDevice& d) {
           const Eigen::internal::scalar_sin_op<float> sin_op;  // Eigen::Tensor has no .sin(): its vectorised psin
           z->device(d) = x->unaryExpr(sin_op) * 1.01f + 0.5f;
           for (int i = 1; i < 16; ++i) z->device(d) = z->unaryExpr(sin_op) * 1.01f + 0.5f;
         });
       }},
      {"P4_broadcast_affine", 2.0 * kM * kK * 4,
       [] {
         auto X = std::make_shared<EMat>(kM, kK), Z = std::make_shared<EMat>(kM, kK);
         auto mu = std::make_shared<EMat>(kM, 1), s = std::make_shared<EMat>(1, kK), b = std::make_shared<EMat>(1, kK);
         fill_from(*X, randn({kM, kK}, 1));
         fill_from(*mu, randn({kM, 1}, 2));
         fill_from(*s, rand({kK}, 3));
         fill_from(*b, randn({kK}, 4));
         return std::function<void(Eigen::ThreadPoolDevice&)>([=](Eigen::ThreadPoolDevice& d) {
           const std::array<EIdx, 2> along_k{1, kK}, along_m{kM, 1};
           Z->device(d) = (*X - mu->broadcast(along_k)) * s->broadcast(along_m) + b->broadcast(along_m);
         });
       }},
      {"R2_row_sum", 1.0 * kM * kK * 4,
       [] {
         auto X = std::make_shared<EMat>(kM, kK);
         auto r = std::make_shared<EVec>(kM);
         fill_from(*X, randn({kM, kK}, 1));
         return std::function<void(Eigen::ThreadPoolDevice&)>([=](Eigen::ThreadPoolDevice& d) {
           const std::array<EIdx, 1> dim1{1};
           r->device(d) = X->sum(dim1);
         });
       }},
      {"N1_softmax", 2.0 * kM * kK * 4,
       [] {
         // Softmax as Eigen users (and Eigen's own tests) write it: max, exp of the shifted
         // input, row sums, divide; four separate evaluations.
         auto X = std::make_shared<EMat>(kM, kK), E = std::make_shared<EMat>(kM, kK);
         auto m = std::make_shared<EMat>(kM, 1), s = std::make_shared<EMat>(kM, 1);
         fill_from(*X, randn({kM, kK}, 1));
         return std::function<void(Eigen::ThreadPoolDevice&)>([=](Eigen::ThreadPoolDevice& d) {
           const std::array<EIdx, 1> dim1{1};
           const std::array<EIdx, 2> col{kM, 1}, along_k{1, kK};
           m->device(d) = X->maximum(dim1).reshape(col);
           E->device(d) = (*X - m->broadcast(along_k)).exp();
           s->device(d) = E->sum(dim1).reshape(col);
           E->device(d) = *E / s->broadcast(along_k);
         });
       }},
      {"N3_layer_norm", 2.0 * kM * kK * 4,
       [] {
         auto X = std::make_shared<EMat>(kM, kK), Z = std::make_shared<EMat>(kM, kK);
         auto mean = std::make_shared<EMat>(kM, 1), rstd = std::make_shared<EMat>(kM, 1);
         auto w = std::make_shared<EMat>(1, kK), b = std::make_shared<EMat>(1, kK);
         fill_from(*X, randn({kM, kK}, 1));
         fill_from(*w, rand({kK}, 2));
         fill_from(*b, randn({kK}, 3));
         return std::function<void(Eigen::ThreadPoolDevice&)>([=](Eigen::ThreadPoolDevice& d) {
           const std::array<EIdx, 1> dim1{1};
           const std::array<EIdx, 2> col{kM, 1}, along_k{1, kK}, along_m{kM, 1};
           mean->device(d) = X->mean(dim1).reshape(col);
           // Centred values first (into the output), then the variance from them: two-pass,
           // as kiln's layer_norm is.
           Z->device(d) = *X - mean->broadcast(along_k);
           rstd->device(d) = (Z->square().mean(dim1).reshape(col) + 1e-5f).rsqrt();
           Z->device(d) = *Z * rstd->broadcast(along_k) * w->broadcast(along_m) + b->broadcast(along_m);
         });
       }},
  };
  return w;
}

void BM_eigen(benchmark::State& state, const EigenWorkload& w) {
  Eigen::ThreadPool pool(eigen_threads());
  Eigen::ThreadPoolDevice device(&pool, eigen_threads());
  auto body = w.make();
  body(device);  // warm-up: touches the output pages
  const auto t0 = Clock::now();
  for (auto _ : state) {
    body(device);
    benchmark::ClobberMemory();
  }
  const double seconds = seconds_since(t0);
  state.counters["threads"] = eigen_threads();
  bench::report(state, kCpu, {.bytes = w.bytes},
                seconds / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations())));
}

// ---- matrix products (G-CPU): kiln beside the CBLAS it calls and Eigen's product ------------

/// One product shape: y = a [m, k] @ b [k, n]; with `linear`, relu(x @ W^T + bias) with W
/// [n, k] (torch.nn.functional.linear's layout).
struct ProductCase {
  const char* id;
  std::int64_t m, k, n;
  bool linear;
};
const ProductCase kProducts[] = {{"G_cpu_1024", 1024, 1024, 1024, false},
                                 {"G_cpu_linear_relu", 4096, 1024, 1024, true}};

/// kiln as a user writes it: a new result each call.
void BM_product_kiln(benchmark::State& state, const ProductCase& c) {
  Tensor a = randn({c.m, c.k}, 1, f32, kCpu).eval();
  Tensor b = c.linear ? randn({c.n, c.k}, 2, f32, kCpu).eval() : randn({c.k, c.n}, 2, f32, kCpu).eval();
  Tensor bias = randn({c.n}, 3, f32, kCpu).eval();
  bench::run(state, kCpu, {.flops = 2.0 * static_cast<double>(c.m * c.k * c.n)}, [&] {
    return c.linear ? Tensor(relu(linear(a, b, bias))) : matmul(a, b);
  });
}

/// The CBLAS product alone (the same call kiln makes, no epilogue), into a buffer kept.
void BM_product_cblas(benchmark::State& state, const ProductCase& c) {
  std::vector<float> a(static_cast<std::size_t>(c.m * c.k), 0.5f), b(static_cast<std::size_t>(c.k * c.n), 0.25f),
      d(static_cast<std::size_t>(c.m * c.n));
  runtime::GemmShape s;
  s.m = c.m, s.n = c.n, s.k = c.k;
  s.a_rs = c.k, s.a_cs = 1;
  if (c.linear)
    s.b_rs = 1, s.b_cs = c.k;  // W^T: W [n, k] row-major read column-major
  else
    s.b_rs = c.n, s.b_cs = 1;
  s.d_rs = c.n;
  state.SetLabel(runtime::cblas_path());
  bench::run(state, kCpu, {.flops = 2.0 * static_cast<double>(c.m * c.k * c.n)},
             [&] { runtime::cpu_gemm(s, a.data(), b.data(), d.data()); });
}

/// Eigen Tensor's contraction on a ThreadPoolDevice of the same threads.
void BM_product_eigen(benchmark::State& state, const ProductCase& c) {
  using T2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
  T2 A(c.m, c.k), B(c.k, c.n), C(c.m, c.n);
  A.setRandom();
  B.setRandom();
  Eigen::ThreadPool pool(eigen_threads());
  Eigen::ThreadPoolDevice device(&pool, eigen_threads());
  const std::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 0)};
  C.device(device) = A.contract(B, dims);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    C.device(device) = A.contract(B, dims);
    benchmark::ClobberMemory();
  }
  const double seconds = seconds_since(t0);
  bench::report(state, kCpu, {.flops = 2.0 * static_cast<double>(c.m * c.k * c.n)},
                seconds / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations())));
}

// ---- the user's loop, dispatch overhead, compile times --------------------------------------

/// `Tensor z = 2.0f * x + y; z.eval();` exactly as a user writes it: a new result each time.
void BM_user_loop(benchmark::State& state) {
  set_backend(Backend::Jit);
  Tensor x = randn({kN}, 1), y = randn({kN}, 2);
  x.eval();
  y.eval();
  bench::run(state, kCpu, {.bytes = 3.0 * kN * 4}, [&] {
    Tensor z = 2.0f * x + y;
    z.eval();
  });
}

/// Host cost of a cached typed expression on 16 elements: `z.assign(2.0f * x + y)`.
/// (`compiles`, the timed loop's compiles, was this benchmark's counter before the kit; the kit
/// reports loop_compiles only when it is not 0.)
void BM_dispatch_assign_16(benchmark::State& state) {
  set_backend(Backend::Jit);
  Tensor x = randn({16}, 1), y = randn({16}, 2), z = zeros({16});
  x.eval();
  y.eval();
  z.eval();
  bench::run(state, kCpu, {}, [&] {
    z.assign(2.0f * x + y);
    benchmark::ClobberMemory();
  });
}

/// The same through kiln::compile: a compiled function called on 16-element tensors.
void BM_dispatch_compile_16(benchmark::State& state) {
  set_backend(Backend::Jit);
  Tensor x = randn({16}, 1), y = randn({16}, 2);
  x.eval();
  y.eval();
  auto f = kiln::compile([](const Tensor& a, const Tensor& b) { return 2.0f * a + b; });
  bench::run(state, kCpu, {}, [&] { return f(x, y); });
  state.counters["traces"] = static_cast<double>(f.stats().traces);
}

/// kiln::compile's modes on the CPU (docs/performance.md, "Modes"): a compiled graph called
/// again and again, end to end (guard check, output allocation, launches), in `mode`. S1 is
/// the workload table's launch-bound chain (10 pointwise steps on 4096 elements: one fused kernel);
/// "two_sums" (column and row sums of a 512x512 matrix, returned as a pair) is two kernels,
/// each large enough for a team, where reduce-overhead's single parallel region (one launch,
/// one barrier instead of a second region) can pay; "call_16" is `2*a + b` on 16 elements.
void BM_compiled_mode(benchmark::State& state, const std::string& graph, const std::string& mode) {
  set_backend(Backend::Jit);
  CompileOptions opt;
  opt.mode = mode;
  std::vector<Tensor> in;
  std::function<std::pair<Tensor, Tensor>(const Tensor&, const Tensor&)> fn;
  if (graph == "S1") {
    in = evaluated({randn({4096}, 1), rand({4096}, 2)});
    fn = [](const Tensor& x0, const Tensor& y) {
      Tensor x = x0;
      for (int i = 0; i < 10; ++i) x = relu(x * y + 0.1f);
      return std::pair<Tensor, Tensor>{x, Tensor()};
    };
  } else if (graph == "two_sums") {
    in = evaluated({randn({512, 512}, 1), randn({1}, 2)});
    fn = [](const Tensor& x, const Tensor&) { return std::pair<Tensor, Tensor>{sum(x, {0}), sum(x, {1})}; };
  } else {
    in = evaluated({randn({16}, 1), randn({16}, 2)});
    fn = [](const Tensor& a, const Tensor& b) { return std::pair<Tensor, Tensor>{2.0f * a + b, Tensor()}; };
  }
  auto f = kiln::compile(fn, opt);
  // Trace, compile (and tune) in the kit's first call and two more untimed calls.
  bench::run(state, kCpu, {},
             [&] {
               auto r = f(in[0], in[1]);
               r.first.eval();
               if (r.second.defined()) r.second.eval();
             },
             {.warmup = 2});
  state.counters["traces"] = static_cast<double>(f.stats().traces);
}

/// A workload of the table through kiln::compile in `mode` (max-autotune must be at least as
/// fast as default on each; its tuning happens in the warm-up call).
void BM_workload_compiled(benchmark::State& state, const Workload& w, const std::string& mode) {
  set_backend(Backend::Jit);
  std::vector<Tensor> in = w.inputs();
  while (in.size() < 4) in.push_back(zeros({1}).eval());
  CompileOptions opt;
  opt.mode = mode;
  auto compute = w.compute;
  auto f = kiln::compile(
      [compute](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
        return compute({a, b, c, d});
      },
      opt);
  bench::run(state, kCpu, {.bytes = w.bytes}, [&] { return f(in[0], in[1], in[2], in[3]); });
}

/// max-autotune against default on one workload, calls interleaved (default, tuned, default,
/// tuned, ...) in one loop so that the machine's load and the process's memory state weigh on
/// both alike: separate benchmarks run one after the other in one process measured the second
/// 5-10 % slower whichever mode it was, on this shared 2-core machine. Reports each mode's
/// median ms per call and tuned / default ("at least as fast": <= 1 up to noise).
void BM_workload_autotune_vs_default(benchmark::State& state, const Workload& w) {
  set_backend(Backend::Jit);
  std::vector<Tensor> in = w.inputs();
  while (in.size() < 4) in.push_back(zeros({1}).eval());
  auto compute = w.compute;
  auto make = [&](const char* mode) {
    CompileOptions opt;
    opt.mode = mode;
    return kiln::compile(
        [compute](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
          return compute({a, b, c, d});
        },
        opt);
  };
  auto def = make("default");
  auto tuned = make("max-autotune");
  def(in[0], in[1], in[2], in[3]).eval();
  tuned(in[0], in[1], in[2], in[3]).eval();  // tunes (or loads the stored choice)
  std::vector<double> d_ms, t_ms;
  for (auto _ : state) {
    for (int pair = 0; pair < 2; ++pair) {
      auto t0 = Clock::now();
      def(in[0], in[1], in[2], in[3]).eval();
      d_ms.push_back(seconds_since(t0) * 1e3);
      t0 = Clock::now();
      tuned(in[0], in[1], in[2], in[3]).eval();
      t_ms.push_back(seconds_since(t0) * 1e3);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double d = median(d_ms), t = median(t_ms);
  state.counters["default_ms"] = d;
  state.counters["max_autotune_ms"] = t;
  state.counters["tuned_over_default"] = d > 0 ? t / d : 0;
}

/// Cold compile of one fused kernel: every iteration builds a structure no cache holds (a new
/// literal, and the in-memory caches cleared) and evaluates it once. The literal is pow's
/// exponent: a plain number in an expression is a kernel argument, not part of the source, so
/// `c * x` with a new `c` would find the first iteration's kernel on disk.
void BM_cold_compile(benchmark::State& state) {
  set_backend(Backend::Jit);
  Tensor x = randn({4096}, 1), y = randn({4096}, 2);
  x.eval();
  y.eval();
  static int counter = 0;
  const Stats before = stats();
  for (auto _ : state) {
    state.PauseTiming();
    kiln::reset();  // the public way to drop every in-memory kernel and compiled entry
    const float e = 1.0f + 1e-3f * static_cast<float>(++counter) + 1e-7f * static_cast<float>(getpid() % 1000);
    state.ResumeTiming();
    Tensor z = (pow(x, e) + y) * sin(x);
    z.eval();
  }
  const Stats after = stats();
  state.counters["compiles_per_iter"] = static_cast<double>(after.compiles - before.compiles) /
                                        static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["disk_hits"] = static_cast<double>(after.disk_hits - before.disk_hits);
}

std::string g_self_dir;  // the directory of this executable (bench_cpu_process lies beside it)

/// Runs `command`, returns its stdout.
std::string run_command(const std::string& command) {
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

double field(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  return at == std::string::npos ? -1.0 : std::atof(line.c_str() + at + key.size() + 1);
}

/// A disk-cache hit in a new process: bench_cpu_process with a warm KILN_CACHE_DIR. Wall time
/// is the whole process (start-up included); first_eval_ms the first eval() inside it.
void BM_disk_hit_new_process(benchmark::State& state) {
  const std::string helper = g_self_dir + "/bench_cpu_process";
  if (access(helper.c_str(), X_OK) != 0) {
    state.SkipWithError(("missing " + helper).c_str());
    return;
  }
  char tmpl[] = "/tmp/kiln_bench_disk_XXXXXX";
  if (!mkdtemp(tmpl)) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string cmd = "KILN_CACHE_DIR=" + std::string(tmpl) + " " + helper;
  const std::string cold = run_command(cmd);  // compiles and stores the kernel
  state.counters["cold_first_eval_ms"] = field(cold, "first_eval_ms");
  std::vector<double> evals;
  double disk_hits = 0, compiles = 0;
  for (auto _ : state) {
    const std::string warm = run_command(cmd);
    evals.push_back(field(warm, "first_eval_ms"));
    disk_hits += field(warm, "disk_hits");
    compiles += field(warm, "compiles");
  }
  std::sort(evals.begin(), evals.end());
  if (!evals.empty()) state.counters["first_eval_ms_median"] = evals[evals.size() / 2];
  state.counters["disk_hits_per_run"] = disk_hits / static_cast<double>(std::max<std::size_t>(1, evals.size()));
  state.counters["compiles_per_run"] = compiles / static_cast<double>(std::max<std::size_t>(1, evals.size()));
  std::filesystem::remove_all(tmpl);
}

}  // namespace

int main(int argc, char** argv) {
  g_self_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  // A fresh disk cache for this run (removed at exit) unless the caller chose one.
  std::string fresh_cache;
  if (!std::getenv("KILN_CACHE_DIR")) {
    char tmpl[] = "/tmp/kiln_bench_cache_XXXXXX";
    if (mkdtemp(tmpl)) {
      fresh_cache = tmpl;
      setenv("KILN_CACHE_DIR", tmpl, 1);
    }
  }
  // The kit's flags (KILN_BENCH_JSON) and context (kiln version, threads, cache directory).
  if (!bench::initialize(argc, argv)) {
    if (!fresh_cache.empty()) std::filesystem::remove_all(fresh_cache);
    return 1;
  }
  benchmark::AddCustomContext("eigen_threads", std::to_string(eigen_threads()));
  // The copy baseline, measured at start-up as before the kit (the kit keeps it for x_copy).
  benchmark::AddCustomContext("copy_GB_per_s", std::to_string(bench::copy_bandwidth(kCpu) / 1e9));
  benchmark::AddCustomContext("copy_threads", std::to_string(bench::cpu_threads()));

  benchmark::RegisterBenchmark("copy/threads:all", BM_copy)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("copy/threads:1", BM_copy)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (const Workload& w : workloads()) {
    for (auto [name, backend] : {std::pair{"eager", Backend::Eager}, std::pair{"jit", Backend::Jit}}) {
      benchmark::RegisterBenchmark((std::string(w.id) + "/" + name).c_str(), BM_workload, w, backend)
          ->UseRealTime()
          ->Unit(w.bytes > 0 ? benchmark::kMillisecond : benchmark::kMicrosecond);
    }
  }
  benchmark::RegisterBenchmark("B1_layer_norm_gelu_fwd_bwd/jit", BM_B1)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (bool compiled : {false, true})
    benchmark::RegisterBenchmark(compiled ? "T3_mlp_train_step/compiled" : "T3_mlp_train_step/eager", BM_T3, compiled)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (bool backward : {false, true})
    benchmark::RegisterBenchmark(backward ? "A3_attention_fwd_bwd/kiln" : "A3_attention_fwd/kiln", BM_A3, backward)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (const EigenWorkload& w : eigen_workloads())
    benchmark::RegisterBenchmark((std::string(w.id) + "/eigen").c_str(), BM_eigen, w)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (const ProductCase& c : kProducts) {
    benchmark::RegisterBenchmark((std::string(c.id) + "/kiln").c_str(), BM_product_kiln, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string(c.id) + "/cblas").c_str(), BM_product_cblas, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string(c.id) + "/eigen").c_str(), BM_product_eigen, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("user_loop_2x_plus_y", BM_user_loop)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dispatch_assign_16", BM_dispatch_assign_16)
      ->UseRealTime()
      ->Unit(benchmark::kNanosecond);
  benchmark::RegisterBenchmark("dispatch_compile_16", BM_dispatch_compile_16)
      ->UseRealTime()
      ->Unit(benchmark::kNanosecond);
  for (const Workload& w : workloads())
    benchmark::RegisterBenchmark((std::string(w.id) + "/autotune_vs_default").c_str(), BM_workload_autotune_vs_default,
                                 w)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (const Workload& w : workloads())
    for (const char* mode : {"default", "max-autotune"})
      benchmark::RegisterBenchmark((std::string(w.id) + "/compiled_" + mode).c_str(), BM_workload_compiled, w,
                                   std::string(mode))
          ->UseRealTime()
          ->Unit(w.bytes > 0 ? benchmark::kMillisecond : benchmark::kMicrosecond);
  for (const char* graph : {"S1", "two_sums", "call_16"})
    for (const char* mode : {"default", "reduce-overhead", "max-autotune"})
      benchmark::RegisterBenchmark((std::string("compiled_") + graph + "/" + mode).c_str(), BM_compiled_mode,
                                   std::string(graph), std::string(mode))
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("cold_compile_fused", BM_cold_compile)
      ->UseRealTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("disk_hit_new_process", BM_disk_hit_new_process)
      ->UseRealTime()
      ->Iterations(9)
      ->Unit(benchmark::kMillisecond);
  bench::run_benchmarks();
  if (!fresh_cache.empty()) std::filesystem::remove_all(fresh_cache);
  return 0;
}
