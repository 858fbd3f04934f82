#pragma once
// The WORKLOADS.md workloads at test sizes as functions of up to four tensors, shared by the
// tests of kiln::compile's modes (CPU: tests/compile/test_modes.cpp; CUDA graphs:
// tests/backend/test_cuda_graph.cpp).
#include <cstdint>
#include <functional>
#include <vector>

#include <kiln/kiln.hpp>

namespace kiln::testing {

struct ModeWorkload {
  const char* id;
  std::function<std::vector<Tensor>()> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> compute;
};

/// Sizes: n elements for 1-D work, m x k matrices, short_rows x 128 for N2, 16 x classes for N6.
struct ModeWorkloadSizes {
  std::int64_t n, m, k, short_rows, classes;
};

inline std::vector<Tensor> evaluated(std::vector<Tensor> ts) {
  for (auto& t : ts) t.eval();
  return ts;
}

/// P1-P4, R1-R3, N1-N6 and S1 with inputs on `dev`.
inline std::vector<ModeWorkload> mode_workloads(Device dev, ModeWorkloadSizes s) {
  const std::int64_t N = s.n, M = s.m, K = s.k;
  return {
      {"P1",
       [=] {
         return evaluated({randn({N}, 1, f32, dev), randn({N}, 2, f32, dev)});
       },
       [](const auto& in) -> Tensor { return 2.0f * in[0] + in[1]; }},
      {"P2", [=] { return evaluated({randn({N}, 1, f32, dev)}); },
       [](const auto& in) -> Tensor {
         const Tensor& x = in[0];
         return 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * (x * x * x))));
       }},
      {"P3", [=] { return evaluated({randn({N}, 1, f32, dev)}); },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 16; ++i) x = sin(x) * 1.01f + 0.5f;
         return x;
       }},
      {"P4",
       [=] {
         return evaluated(
             {randn({M, K}, 1, f32, dev), randn({M, 1}, 2, f32, dev), rand({K}, 3, f32, dev), randn({K}, 4, f32, dev)});
       },
       [](const auto& in) -> Tensor { return (in[0] - in[1]) * in[2] + in[3]; }},
      {"R1", [=] { return evaluated({randn({N}, 1, f32, dev)}); }, [](const auto& in) { return sum(in[0] * in[0]); }},
      {"R2",
       [=] {
         return evaluated({randn({M, K}, 1, f32, dev)});
       },
       [](const auto& in) { return sum(in[0], {1}); }},
      {"R3",
       [=] {
         return evaluated({randn({M, K}, 1, f32, dev)});
       },
       [](const auto& in) { return sum(in[0], {0}); }},
      {"N1",
       [=] {
         return evaluated({randn({M, K}, 1, f32, dev)});
       },
       [](const auto& in) { return softmax(in[0], -1); }},
      {"N2",
       [=] {
         return evaluated({randn({s.short_rows, 128}, 1, f32, dev)});
       },
       [](const auto& in) { return softmax(in[0], -1); }},
      {"N3",
       [=] {
         return evaluated({randn({M, K}, 1, f32, dev), rand({K}, 2, f32, dev), randn({K}, 3, f32, dev)});
       },
       [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }},
      {"N4",
       [=] {
         return evaluated({randn({M, K}, 1, f32, dev), rand({K}, 2, f32, dev)});
       },
       [](const auto& in) -> Tensor { return in[0] * rsqrt(mean(in[0] * in[0], {-1}, true) + 1e-6f) * in[1]; }},
      {"N5",
       [=] {
         return evaluated({randn({M, K}, 1, bf16, dev)});
       },
       [](const auto& in) { return softmax(in[0], -1); }},
      {"N6",
       [=] {
         const std::int64_t rows = 16;
         Tensor targets = Tensor(rand({rows}, 2, f64, dev) * static_cast<double>(s.classes)).to(i64);
         return evaluated({randn({rows, s.classes}, 1, f32, dev), targets});
       },
       [](const auto& in) { return cross_entropy(in[0], in[1]); }},
      {"S1",
       [=] {
         return evaluated({randn({4096}, 1, f32, dev), rand({4096}, 2, f32, dev)});
       },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 10; ++i) x = relu(x * in[1] + 0.1f);
         return x;
       }},
  };
}

/// The workload as a compiled function of four tensors (unused ones are not captured).
inline auto compiled_workload(const ModeWorkload& w, const char* mode) {
  CompileOptions opt;
  opt.mode = mode;
  auto fn = w.compute;
  return kiln::compile(
      [fn](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
        std::vector<Tensor> in{a, b, c, d};
        return fn(in);
      },
      opt);
}

}  // namespace kiln::testing
