// The CUDA executor on a GPU against the reference executor on the host: every WORKLOADS.md
// workload, every op x dtype and layout (the graphs of tests/codegen/test_cuda_codegen.cpp),
// the strategies of long rows, few rows and many columns at sizes that take them on a real
// GPU, the plan cache, determinism and KILN_LOGS=output_code. Without a GPU only the error
// path runs: CUDA work throws DeviceError saying why CUDA is unavailable.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../codegen/cuda_test_util.hpp"
#include "../support/gpu_util.hpp"
#include "kiln/backend/cuda.hpp"
#include "kiln/backend/dispatch.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/runtime/cuda_memory.hpp"

namespace kiln_test_backend_cuda {

using namespace kiln_cuda_test;

namespace {

bool have_gpu() { return kiln::testing::have_gpu("the GPU tests"); }

struct GpuRun {
  std::string mismatch;
  std::uint64_t launches = 0;
  std::uint64_t compiles = 0;
  std::size_t kernels = 0;
  std::vector<std::vector<unsigned char>> outputs;  ///< raw bytes of every output
};

/// The captured host graph `c` moved to cuda:0: leaves copied (whole storages, so offsets and
/// strides stay valid), outputs poisoned, run_cuda, outputs copied back and compared with the
/// reference executor's. `misalign` shifts every leaf by one element (no vector loads).
GpuRun run_gpu(const ir::Captured& c, double tol_scale = 1.0, bool misalign = false) {
  GpuRun r;
  Outputs want = make_outputs(c.graph, 0xAB);
  backend::run_reference(c.graph, args_for(c, want));
  ir::Graph g = c.graph;
  g.device = Device::cuda(0);
  g.rehash();
  r.kernels = sched::schedule(g).kernels.size();
  std::vector<StoragePtr> keep;
  backend::RunArgs args;
  for (auto& leaf : c.leaves) {
    const Storage& host = *leaf->buffer->storage;
    const std::size_t shift = misalign ? itemsize(leaf->dtype) : 0;
    keep.push_back(runtime::allocate_cuda(host.bytes + shift, 0));
    char* base = static_cast<char*>(keep.back()->data) + shift;
    runtime::copy_host_to_device(base, host.data, host.bytes, 0);
    args.inputs.push_back(base + leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype)));
  }
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    sizes.push_back(output_bytes(g, k));
    keep.push_back(runtime::allocate_cuda(sizes.back(), 0));
    runtime::fill_device_bytes(keep.back()->data, 0xAB, sizes.back(), 0);
    args.outputs.push_back(keep.back()->data);
  }
  Stats before = stats();
  backend::run_cuda(g, args);
  runtime::synchronize_cuda(0);
  r.launches = stats().launches - before.launches;
  r.compiles = stats().compiles - before.compiles;
  Outputs got = make_outputs(c.graph, 0);
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    runtime::copy_device_to_host(got.pointers[k], args.outputs[k], sizes[k], 0);
    const auto* p = static_cast<const unsigned char*>(got.pointers[k]);
    r.outputs.emplace_back(p, p + sizes[k]);
  }
  r.mismatch = compare(c.graph, got.pointers, want.pointers, tol_scale);
  if (!r.mismatch.empty()) r.mismatch += "\n" + backend::explain_cuda(g);
  return r;
}

GpuRun run_gpu(const std::vector<NodePtr>& roots, const std::vector<Strides>& out_strides = {}, double tol_scale = 1.0,
               bool misalign = false) {
  return run_gpu(capture(roots, out_strides), tol_scale, misalign);
}

}  // namespace

TEST_CASE("cuda: without a usable driver, CUDA work throws DeviceError saying why") {
  if (cuda_available()) return;
  const std::string why = cuda_unavailable_reason();
  CHECK_FALSE(why.empty());
  ir::Captured c = capture({add(input({4}, f32, 1), input({4}, f32, 2))});
  ir::Graph g = c.graph;
  g.device = Device::cuda(0);
  g.rehash();
  float out[4];
  backend::RunArgs args{{c.leaves[0]->buffer->storage->data, c.leaves[1]->buffer->storage->data}, {out}};
  try {
    backend::run_cuda(g, args);
    FAIL("run_cuda did not throw");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find(why) != std::string::npos);
  }
  try {
    backend::allocate(64, Device::cuda(0));
    FAIL("allocate did not throw");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find(why) != std::string::npos);
  }
}

TEST_CASE("cuda: WORKLOADS.md workloads on the GPU == reference, one kernel each") {
  if (!have_gpu()) return;
  for (auto& w : workloads()) {
    SUBCASE(w.id) {
      for (auto [m, k] : {std::pair<std::int64_t, std::int64_t>{37, 256}, {3, 1000}, {256, 4096}, {4096, 1024}}) {
        GpuRun r = run_gpu(w.build(m, k));
        CHECK_MESSAGE(r.mismatch.empty(), w.id << " " << m << "x" << k << ": " << r.mismatch);
        CHECK(r.kernels == 1);
        CHECK(r.launches == 1);
      }
    }
  }
}

TEST_CASE("cuda: every op x dtype and every layout on the GPU == reference") {
  if (!have_gpu()) return;
  for (auto& c : op_cases()) {
    SUBCASE(c.name.c_str()) {
      GpuRun r = run_gpu(c.build(), c.out_strides, c.tol_scale);
      CHECK_MESSAGE(r.mismatch.empty(), c.name << ": " << r.mismatch);
      CHECK(r.launches == r.kernels);
    }
  }
  for (auto& c : layout_cases()) {
    SUBCASE(c.name.c_str()) {
      GpuRun r = run_gpu(c.build(), c.out_strides, c.tol_scale);
      CHECK_MESSAGE(r.mismatch.empty(), c.name << ": " << r.mismatch);
    }
  }
}

TEST_CASE("cuda: the GPU's strategies at sizes that take them (split rows, split columns, long rows)") {
  if (!have_gpu()) return;
  SUBCASE("R1-like full sum, split over blocks, and argmax") {
    NodePtr x = input({(1 << 22) + 12}, f32, 1);
    GpuRun r = run_gpu({red(Op::ReduceSum, mul(x, x), {0}), red(Op::ArgMax, x, {0})});
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
  SUBCASE("R3-like column sum split over blocks") {
    GpuRun r = run_gpu({red(Op::ReduceSum, input({8192, 1024}, f32, 2), {0})});
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
  SUBCASE("N6-like cross_entropy with 32768 classes (row in shared memory, online max and sum)") {
    std::vector<std::int64_t> t(64);
    for (std::int64_t i = 0; i < 64; ++i) t[static_cast<std::size_t>(i)] = i % 7 == 0 ? -100 : (i * 977) % 32768;
    GpuRun r = run_gpu({decomp::cross_entropy(input({64, 32768}, f32, 3), input_values<std::int64_t>({64}, t), -100)});
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
  SUBCASE("softmax and layer_norm of very long rows (read per pass)") {
    NodePtr X = input({8, 100000}, f32, 4), w = input({100000}, f32, 5), b = input({100000}, f32, 6);
    GpuRun r = run_gpu({decomp::softmax(X, 1), decomp::layer_norm(X, w, b, 1e-5)});
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
  SUBCASE("bf16 softmax and f16 rms_norm") {
    NodePtr X = input({512, 4096}, bf16, 7), Y = input({300, 2048}, f16, 8), w = input({2048}, f16, 9);
    GpuRun r = run_gpu({decomp::softmax(X, 1), decomp::rms_norm(Y, w, 1e-6)});
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
  SUBCASE("misaligned leaves take the element-wise path") {
    NodePtr X = input({333, 1024}, f32, 10);
    GpuRun r = run_gpu({decomp::softmax(X, 1), red(Op::ReduceSum, X, {0}), add(X, X)}, {}, 1.0, true);
    CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  }
}

TEST_CASE("cuda: plans are cached by structure and alignment; results are deterministic") {
  if (!have_gpu()) return;
  ir::Captured c = capture({decomp::softmax(input({1000, 2048}, f32, 11), 1)});
  GpuRun first = run_gpu(c);
  CHECK_MESSAGE(first.mismatch.empty(), first.mismatch);
  GpuRun again = run_gpu(c);
  CHECK(again.compiles == 0);
  CHECK(again.launches == 1);
  CHECK(again.outputs == first.outputs);
  GpuRun shifted = run_gpu(c, 1.0, true);  // another alignment class: another plan, same values
  CHECK_MESSAGE(shifted.mismatch.empty(), shifted.mismatch);
  CHECK(shifted.launches == 1);

  NodePtr x = input({(1 << 22) + 3}, f32, 12);
  ir::Captured full = capture({red(Op::ReduceSum, x, {0}), red(Op::ReduceSum, input({4096, 777}, f32, 13), {0})});
  GpuRun a = run_gpu(full), b = run_gpu(full);
  CHECK_MESSAGE(a.mismatch.empty(), a.mismatch);
  CHECK(a.outputs == b.outputs);  // bit for bit: partials combine in a fixed order
}

TEST_CASE("cuda: KILN_LOGS=output_code prints the CUDA source of a new kernel") {
  if (!have_gpu()) return;
  std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_cuda_output_code_" + std::to_string(::getpid()) + ".log"))
          .string();
  std::FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f);
  set_log_output(f);
  set_logs("output_code");
  // A constant no other test uses, so the source is new to this process.
  NodePtr x = input({1000}, f32, 14);
  GpuRun r =
      run_gpu({mul(x, cst(1.0 + 1.0 / static_cast<double>(reinterpret_cast<std::uintptr_t>(&path) % 9973 + 7), x))});
  set_logs("");
  set_log_output(nullptr);
  std::fclose(f);
  CHECK_MESSAGE(r.mismatch.empty(), r.mismatch);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str().find("extern \"C\" __global__") != std::string::npos);
  std::remove(path.c_str());
}

}  // namespace kiln_test_backend_cuda
