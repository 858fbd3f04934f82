// max-autotune on CUDA (backend/cuda.hpp: cuda_tuning_candidates, tune_cuda_plan) and launch
// graphs (runtime/cuda_graph.hpp: CudaLaunchGraph). Without a GPU: the candidate list, the
// choice of which candidates change which kernel's code, per-kernel knobs in one unit (checked
// against the reference in the CUDA emulator and compiled by NVRTC), and the stored record's
// format. On the GPU: compiled functions in both max-autotune modes equal the default mode,
// tune once, and reuse the stored choice after kiln::reset() and in a new process without
// timing anything; launch graphs take new arguments per launch, also when queued back to back.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/cuda.hpp>
#include <kiln/backend/dispatch.hpp>
#include <kiln/runtime/cublaslt.hpp>
#include <kiln/runtime/autotune.hpp>
#include <kiln/runtime/cuda_graph.hpp>
#include <kiln/runtime/process.hpp>

#include "../codegen/cuda_emulator.hpp"
#include "../codegen/cuda_test_util.hpp"
#include "../support/child_process.hpp"
#include "../support/compile_util.hpp"
#include "../support/gpu_util.hpp"
#include "../support/mode_workloads.hpp"

namespace kiln_test_backend_cuda_autotune {

using namespace kiln;
using backend::detail::CudaTuning;

namespace {

/// softmax(X) over rows, then its column sums: a row kernel and a column reduction of its result.
std::vector<ir::NodePtr> two_kernel_roots(std::int64_t m, std::int64_t k) {
  using namespace kiln_cuda_test;
  NodePtr x = input({m, k}, f32, 7);
  NodePtr sm = softmax_ir(x, 1);
  return {sm, ir::reshape(red(Op::ReduceSum, sm, {0}), Shape{k})};
}

std::size_t index_of(const std::vector<CudaTuning>& cands, int CudaTuning::*knob, int value) {
  for (std::size_t i = 0; i < cands.size(); ++i)
    if (cands[i].*knob == value) return i;
  FAIL("no candidate " << value);
  return 0;
}

bool contains(const std::vector<std::size_t>& v, std::size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

TEST_CASE("cuda autotune: candidates are the default then one knob moved each, all distinct") {
  const auto cands = backend::detail::cuda_tuning_candidates();
  REQUIRE(cands.size() > 8);
  CHECK(backend::detail::tuning_text(cands[0]) == "default");
  std::vector<std::string> texts;
  for (std::size_t i = 1; i < cands.size(); ++i) {
    int moved = 0;
    for (const auto& f : backend::detail::tuning_fields()) moved += cands[i].*(f.member) != 0;
    CHECK(moved == 1);
    texts.push_back(backend::detail::tuning_text(cands[i]));
  }
  std::sort(texts.begin(), texts.end());
  CHECK(std::adjacent_find(texts.begin(), texts.end()) == texts.end());
}

TEST_CASE("cuda autotune: records round-trip, and anything malformed is refused") {
  std::vector<CudaTuning> per_kernel(3);
  per_kernel[1].row_vectors_per_thread = 8;
  per_kernel[2].column_unroll = 2;
  per_kernel[2].split_blocks_per_sm = 8;
  const std::string record = backend::detail::cuda_tuning_record(per_kernel);
  CHECK(record == "cuda kernels 3\ndefault\nrow_vectors_per_thread=8\nsplit_blocks_per_sm=8 column_unroll=2\n");
  std::vector<CudaTuning> back;
  REQUIRE(backend::detail::parse_cuda_tuning_record(record, 3, back));
  REQUIRE(back.size() == 3);
  CHECK(backend::detail::tuning_text(back[0]) == "default");
  CHECK(back[1].row_vectors_per_thread == 8);
  CHECK(back[2].column_unroll == 2);
  CHECK(back[2].split_blocks_per_sm == 8);
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record(record, 2, back));  // another kernel count
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("cuda kernels 1\nno_such_knob=2\n", 1, back));
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("cuda kernels 1\ncolumn_unroll=x\n", 1, back));
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("cuda kernels 1\ncolumn_unroll=0\n", 1, back));
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("cuda kernels 1\ndefault\nextra\n", 1, back));
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("cuda kernels 1\ndefault", 1, back));  // truncated
  CHECK_FALSE(backend::detail::parse_cuda_tuning_record("", 1, back));
}

TEST_CASE("cuda autotune: only candidates that change a kernel's code are kept, per kernel") {
  using namespace kiln_cuda_test;
  const auto cands = backend::detail::cuda_tuning_candidates();
  const codegen::CudaTarget base = codegen::CudaTarget::sm90();
  const std::size_t unroll1 = index_of(cands, &CudaTuning::pointwise_unroll, 1);
  const std::size_t rows8 = index_of(cands, &CudaTuning::row_vectors_per_thread, 8);
  const std::size_t col2 = index_of(cands, &CudaTuning::column_unroll, 2);
  auto kept = [&](const std::vector<NodePtr>& roots) {
    ir::Captured c = capture(roots);
    return backend::detail::cuda_tuning_variants(c.graph, sched::schedule(c.graph), base, {}, cands);
  };
  SUBCASE("pointwise (P1 at 2^20): unroll matters, row and column knobs do not") {
    auto w = workloads()[0];
    REQUIRE(std::string(w.id) == "P1");
    auto v = kept(w.build(1024, 1024));
    REQUIRE(v.variants.size() == 1);
    CHECK(v.candidates.front() == 0);
    CHECK(contains(v.candidates, unroll1));
    CHECK_FALSE(contains(v.candidates, rows8));
    CHECK_FALSE(contains(v.candidates, col2));
    CHECK(v.candidates.size() < cands.size());
    CHECK(v.variants[0].size() == v.candidates.size());
  }
  SUBCASE("a row kernel then a column reduction: each kernel has its own variants") {
    auto v = kept(two_kernel_roots(512, 8192));
    REQUIRE(v.variants.size() == 2);
    CHECK(contains(v.candidates, rows8));
    CHECK(contains(v.candidates, col2));
    // Candidate positions in v.candidates of the row and column knobs.
    const std::size_t at_rows8 =
        static_cast<std::size_t>(std::find(v.candidates.begin(), v.candidates.end(), rows8) - v.candidates.begin());
    const std::size_t at_col2 =
        static_cast<std::size_t>(std::find(v.candidates.begin(), v.candidates.end(), col2) - v.candidates.begin());
    std::size_t row_kernel = 0;
    ir::Captured c = capture(two_kernel_roots(512, 8192));
    sched::Schedule s = sched::schedule(c.graph);
    codegen::CudaSource src = codegen::generate_cuda(c.graph, s, "t", base);
    if (src.kernels[1].strategy.rfind("row reduction", 0) == 0) row_kernel = 1;
    REQUIRE(src.kernels[row_kernel].strategy.rfind("row reduction", 0) == 0);
    REQUIRE(src.kernels[1 - row_kernel].strategy.rfind("column reduction", 0) == 0);
    CHECK(contains(v.variants[row_kernel], at_rows8));
    CHECK_FALSE(contains(v.variants[row_kernel], at_col2));
    CHECK(contains(v.variants[1 - row_kernel], at_col2));
    CHECK_FALSE(contains(v.variants[1 - row_kernel], at_rows8));
  }
}

TEST_CASE("cuda autotune: a knob changes the code of the kinds of kernel that read it, and of no other") {
  // max-autotune skips a candidate for kernels whose kind does not read what it moves
  // (KILN_CUDA_TUNING_KNOBS): a reader left out of that table would hide a variant.
  using namespace kiln_cuda_test;
  const auto cands = backend::detail::cuda_tuning_candidates();
  const codegen::CudaTarget base = codegen::CudaTarget::sm90();
  std::vector<std::vector<NodePtr>> graphs;
  for (auto& w : workloads())
    for (auto [m, k] : {std::pair<std::int64_t, std::int64_t>{37, 256}, {3, 40000}}) graphs.push_back(w.build(m, k));
  graphs.push_back(two_kernel_roots(512, 8192));
  graphs.push_back({red(Op::ReduceSum, input({40000, 24}, f32, 47), {0})});  // a split column reduction
  unsigned seen_kinds = 0;
  std::size_t changed = 0;
  for (auto& roots : graphs) {
    ir::Captured c = capture(roots);
    sched::Schedule s = sched::schedule(c.graph);
    const codegen::CudaSource def = codegen::generate_cuda(c.graph, s, "t", base);
    for (std::size_t ci = 1; ci < cands.size(); ++ci) {
      unsigned readers = 0;
      for (const auto& f : backend::detail::tuning_fields())
        if (cands[ci].*(f.member) != 0) readers |= f.readers;
      REQUIRE(readers != 0);
      codegen::CudaTarget t = base;
      backend::detail::apply_tuning(t, cands[ci]);
      const codegen::CudaSource moved = codegen::generate_cuda(c.graph, s, "t", t);
      for (std::size_t k = 0; k < s.kernels.size(); ++k) {
        const auto kind = static_cast<unsigned>(codegen::cuda_kernel_kind(s, static_cast<int>(k), base));
        seen_kinds |= kind;
        const bool same = moved.kernels[k].code_hash == def.kernels[k].code_hash &&
                          moved.kernels[k].block == def.kernels[k].block &&
                          moved.kernels[k].grid == def.kernels[k].grid;
        if (!same) ++changed;
        CHECK_MESSAGE((same || (readers & kind)), backend::detail::tuning_text(cands[ci])
                                                      << " changed a "
                                                      << codegen::kind_name(static_cast<codegen::CudaKernelKind>(kind))
                                                      << " kernel, a kind it is not listed as read by");
      }
    }
  }
  CHECK(seen_kinds == codegen::kReadAll);  // every kind was in the corpus
  CHECK(changed > 0);
}

TEST_CASE("cuda autotune: one unit with other knobs per kernel: each kernel is the one its knobs give") {
  using namespace kiln_cuda_test;
  ir::Captured c = capture(two_kernel_roots(512, 8192));
  sched::Schedule s = sched::schedule(c.graph);
  REQUIRE(s.kernels.size() == 2);
  codegen::CudaTarget a = codegen::CudaTarget::sm90(), b = a;
  b.row_vectors_per_thread = 8;
  b.column_unroll = 2;
  codegen::CudaSource all_a = codegen::generate_cuda(c.graph, s, "t", a);
  codegen::CudaSource all_b = codegen::generate_cuda(c.graph, s, "t", b);
  codegen::CudaSource mixed = codegen::generate_cuda(c.graph, s, "t", std::vector<codegen::CudaTarget>{a, b});
  REQUIRE(mixed.kernels.size() == 2);
  CHECK(mixed.kernels[0].code_hash == all_a.kernels[0].code_hash);
  CHECK(mixed.kernels[1].code_hash == all_b.kernels[1].code_hash);
  CHECK(all_a.kernels[0].code_hash != all_b.kernels[0].code_hash);
  CHECK(all_a.kernels[1].code_hash != all_b.kernels[1].code_hash);
  CHECK_THROWS_AS(codegen::generate_cuda(c.graph, s, "t", std::vector<codegen::CudaTarget>{a}), Error);
  if (runtime::nvrtc_available()) {
    std::string cubin = runtime::compile_cuda_to_cubin(mixed.source, "mixed.cu", "sm_90");
    CHECK(cubin.compare(0, 4,
                        "\x7f"
                        "ELF") == 0);
  }
}

TEST_CASE("cuda emulator: a unit with other knobs per kernel computes what the reference does") {
  if (!runtime::CpuModuleCache::instance().compiler()) return;
  using namespace kiln_cuda_test;
  ir::Captured c = capture(two_kernel_roots(37, 256));
  sched::Schedule s = sched::schedule(c.graph);
  REQUIRE(s.kernels.size() == 2);
  codegen::CudaTarget a = kiln_cuda_emu::small_target(), b = a;
  b.row_vectors_per_thread = 8;
  b.column_unroll = 2;
  b.column_vectors_per_thread = 2;
  Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
  backend::run_reference(c.graph, args_for(c, want));
  codegen::CudaSource mixed = codegen::generate_cuda(c.graph, s, "kiln_mixed", std::vector<codegen::CudaTarget>{b, a});
  // Launched as run_cuda would (host buffers are 16-byte aligned: the default alignment class).
  kiln_cuda_emu::Module mod = kiln_cuda_emu::load(mixed);
  backend::RunArgs args = args_for(c, got);
  std::vector<void*> argv;
  for (auto p : args.inputs) argv.push_back(const_cast<void*>(p));
  for (auto p : args.outputs) argv.push_back(p);
  std::vector<StoragePtr> keep;
  for (auto& t : s.temps) {
    keep.push_back(runtime::allocate_host(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype)));
    argv.push_back(keep.back()->data);
  }
  keep.push_back(runtime::allocate_host(std::max<std::size_t>(16, mixed.scratch_bytes)));
  argv.push_back(keep.back()->data);
  for (auto& k : mixed.kernels) mod.launch(k.name.c_str(), k.grid, k.block, k.shared_bytes, argv.data());
  std::string m = compare(c.graph, got.pointers, want.pointers);
  CHECK_MESSAGE(m.empty(), m);
}

TEST_CASE("cuda emulator: every autotune candidate that changes a workload's code computes what the reference does") {
  // max-autotune may pick any candidate, so each must be right, not only fast.
  if (!runtime::CpuModuleCache::instance().compiler()) return;
  using namespace kiln_cuda_test;
  const auto cands = backend::detail::cuda_tuning_candidates();
  const codegen::CudaTarget base = kiln_cuda_emu::small_target();
  std::size_t units = 0;
  for (auto& w : workloads()) {
    // Short rows (a warp per row: rows per block matter) and, for row kernels, long rows (many
    // threads per row: threads per row, uncached rows and the shared-memory cache matter).
    std::vector<std::pair<std::int64_t, std::int64_t>> sizes = {{37, 256}};
    if (w.id[0] == 'N') sizes.push_back({3, 4100});
    for (auto [m, k] : sizes) {
      ir::Captured c = capture(w.build(m, k));
      sched::Schedule s = sched::schedule(c.graph);
      auto v = backend::detail::cuda_tuning_variants(c.graph, s, base, {}, cands);
      for (std::size_t ci : v.candidates) {
        codegen::CudaTarget t = base;
        backend::detail::apply_tuning(t, cands[ci]);
        const std::string which = std::string(w.id) + " " + std::to_string(m) + "x" + std::to_string(k) + " " +
                                  backend::detail::tuning_text(cands[ci]);
        CAPTURE(which);
        Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
        backend::run_reference(c.graph, args_for(c, want));
        kiln_cuda_emu::run(c.graph, args_for(c, got), t);
        std::string diff = compare(c.graph, got.pointers, want.pointers);
        CHECK_MESSAGE(diff.empty(), which << ": " << diff);
        ++units;
      }
    }
  }
  MESSAGE(units << " emulated units");
  CHECK(units > 2 * workloads().size());  // the candidates did change code: more than one unit per workload on average
}

// ---- on the GPU ---------------------------------------------------------------------------

namespace {

bool have_gpu() { return kiln::testing::have_gpu("the GPU autotune and launch graph cases"); }

const Device kGpu = Device::cuda(0);

std::vector<testing::ModeWorkload> gpu_workloads() {
  return testing::mode_workloads(kGpu, {1 << 16, 64, 1024, 512, 2048});
}

const char* const kTunedIds[] = {"P1", "P3", "R1", "R3", "N1", "N6", "S1"};

using testing::PrivateDiskCache;

constexpr const char* kChild = "KILN_TEST_CUDA_AUTOTUNE_CHILD";

using testing::max_rel_diff;

/// Whether some kernel of `w`'s CUDA schedule has code variants to time (else tuning settles
/// on the defaults without timing anything).
bool has_choices(const testing::ModeWorkload& w, const std::vector<Tensor>& in) {
  Tensor r = w.compute(in);
  ir::Captured c = ir::capture({r.node()}, kGpu);
  const auto& ctx = runtime::cuda_context(0);
  auto v = backend::detail::cuda_tuning_variants(c.graph, sched::schedule(c.graph), backend::detail::cuda_target(ctx),
                                                 {}, backend::detail::cuda_tuning_candidates());
  for (auto& k : v.variants)
    if (k.size() > 1) return true;
  return false;
}

std::vector<Tensor> padded(std::vector<Tensor> in) {
  while (in.size() < 4) in.push_back(zeros({1}, f32, kGpu));
  return in;
}

}  // namespace

TEST_CASE("cuda autotune: both max-autotune modes equal the default, tune once, and reload the choice untimed") {
  if (!have_gpu()) return;
  PrivateDiskCache cache("kiln_cuda_tune");
  const auto ws = gpu_workloads();
  for (const char* mode : {"max-autotune-no-cudagraphs", "max-autotune"}) {
    for (const char* id : kTunedIds) {
      const std::string which = std::string(mode) + " " + id;
      CAPTURE(which);
      const testing::ModeWorkload* w = nullptr;
      for (auto& x : ws)
        if (std::string(x.id) == id) w = &x;
      REQUIRE(w);
      auto in = padded(w->inputs());
      auto def = testing::compiled_workload(*w, "default");
      auto tuned = testing::compiled_workload(*w, mode);
      Tensor expect = def(in[0], in[1], in[2], in[3]);
      expect.eval();
      runtime::AutotuneStats s0 = runtime::autotune_stats();
      Tensor got = tuned(in[0], in[1], in[2], in[3]);
      got.eval();
      runtime::AutotuneStats s1 = runtime::autotune_stats();
      if (std::string(mode) == "max-autotune-no-cudagraphs") {
        // The first mode met this graph first: its kernels were timed (the second finds them),
        // unless no kernel has anything to choose (R1's full reduction: no knob changes its code).
        const bool choices = has_choices(*w, in);
        CHECK(choices == (std::string(id) != "R1"));
        CHECK((s1.tunings > s0.tunings) == choices);
        CHECK((s1.timed_runs > s0.timed_runs) == choices);
      } else {
        CHECK(s1.timed_runs == s0.timed_runs);
      }
      CHECK(max_rel_diff(got, expect) < 1e-5);
      for (int i = 0; i < 3; ++i) {
        Tensor again = tuned(in[0], in[1], in[2], in[3]);
        CHECK(max_rel_diff(again, expect) < 1e-5);
      }
      CHECK(runtime::autotune_stats().timed_runs == s1.timed_runs);
    }
  }
  // Fresh in-process caches: every choice comes from the disk cache, untimed.
  kiln::reset();
  runtime::AutotuneStats s0 = runtime::autotune_stats();
  for (const char* id : kTunedIds)
    for (auto& w : ws)
      if (std::string(w.id) == id) {
        auto in = padded(w.inputs());
        testing::compiled_workload(w, "max-autotune")(in[0], in[1], in[2], in[3]).eval();
      }
  runtime::AutotuneStats s1 = runtime::autotune_stats();
  CHECK(s1.timed_runs == s0.timed_runs);
  CHECK(s1.tunings == s0.tunings);
  CHECK(s1.disk_hits - s0.disk_hits == std::size(kTunedIds));

  // A new process: the same, with the disk hit in its log and no "tuned in" line.
  testing::expect_untimed_autotune_child("cuda autotune: child*", cache.dir, kChild, "KILN_CUDA_AUTOTUNE_CHILD_OK");
}

TEST_CASE("cuda autotune: child (run by the test above)") {
  if (!std::getenv(kChild) || !have_gpu()) return;
  const auto ws = gpu_workloads();
  for (const char* id : kTunedIds)
    for (auto& w : ws)
      if (std::string(w.id) == id) {
        auto in = padded(w.inputs());
        auto def = testing::compiled_workload(w, "default");
        auto tuned = testing::compiled_workload(w, "max-autotune-no-cudagraphs");
        CHECK(max_rel_diff(tuned(in[0], in[1], in[2], in[3]), def(in[0], in[1], in[2], in[3])) < 1e-5);
      }
  runtime::AutotuneStats s = runtime::autotune_stats();
  CHECK(s.timed_runs == 0);
  CHECK(s.tunings == 0);
  CHECK(s.disk_hits == std::size(kTunedIds));
  if (s.timed_runs == 0 && s.tunings == 0 && s.disk_hits == std::size(kTunedIds))
    std::printf("KILN_CUDA_AUTOTUNE_CHILD_OK\n");
}

TEST_CASE("cuda launch graphs: new arguments per launch, also queued back to back without waiting") {
  if (!have_gpu()) return;
  if (!runtime::cuda_launch_graphs_available()) {
    MESSAGE("launch graphs unavailable: " << runtime::detail::cuda_driver_state().launch_graphs_missing);
    return;
  }
  // Two kernels (a row kernel and a column sum of its result), a temporary between them, and
  // six runs on six inputs into six results, queued one after another with no wait between.
  auto step = kiln::compile([](const Tensor& a) {
    Tensor sm = softmax(a, -1);
    return std::make_tuple(sm, sum(sm, {0}));
  });
  Tensor x = randn({64, 512}, 3, f32);
  std::vector<Tensor> host_in, ins, outs_sm, outs_col;
  for (int i = 0; i < 6; ++i) {
    host_in.push_back(Tensor(x * static_cast<float>(i + 1)).eval());
    ins.push_back(host_in.back().to(kGpu));
  }
  const auto graph_replays = runtime::cuda_graph_counters().replays.load();
  for (int i = 0; i < 6; ++i) {
    auto [a, b] = step(ins[static_cast<std::size_t>(i)]);
    outs_sm.push_back(a);
    outs_col.push_back(b);
  }
  // Launch graphs are not CUDA graph replays (the reduce-overhead counter stays).
  CHECK(runtime::cuda_graph_counters().replays.load() == graph_replays);
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    Tensor want_sm = softmax(host_in[static_cast<std::size_t>(i)], -1);
    Tensor want_col = sum(want_sm, {0});
    CHECK(max_rel_diff(outs_sm[static_cast<std::size_t>(i)].to(Device::cpu()), want_sm) < 1e-5);
    CHECK(max_rel_diff(outs_col[static_cast<std::size_t>(i)].to(Device::cpu()), want_col) < 1e-5);
  }
}

TEST_CASE("cuda autotune: a product's fused epilogue is timed against the plain call and a kernel, once") {
  if (!have_gpu() || !runtime::cublaslt_available()) return;
  PrivateDiskCache cache("kiln_steps_tune");
  Tensor x = randn({256, 128}, 51, bf16, kGpu), w = randn({128, 512}, 52, bf16, kGpu), b = randn({512}, 53, bf16, kGpu);
  for (Tensor* t : {&x, &w, &b}) t->eval();
  Tensor want = relu(matmul(x, w) + b);
  Tensor expr = relu(matmul(x, w) + b);  // unevaluated: its node is the graph's root
  ir::Captured c = ir::capture({expr.node()}, kGpu);
  backend::CpuLaunchOptions launch;
  launch.autotune = true;
  auto run_into = [&](const std::shared_ptr<const backend::StepProgram>& p) {
    Tensor out = zeros({256, 512}, bf16, kGpu);
    out.eval();
    backend::RunArgs a;
    for (auto& leaf : c.leaves) a.inputs.push_back(kiln_cuda_test::leaf_pointer(leaf));
    a.outputs.push_back(out.data_ptr<BFloat16>());
    p->run(a);
    return out;
  };
  auto first = backend::make_step_program(c.graph, backend::Mode::Jit, launch);
  REQUIRE(first->plan().calls.size() == 1);
  CHECK(first->plan().calls[0].activation == sched::Activation::Relu);  // fused until timed
  Tensor got = run_into(first);
  const std::string chosen = first->chosen().name;
  CHECK((chosen == "fused" || chosen == "unfused"));
  CHECK(first->plan().calls[0].activation == (chosen == "fused" ? sched::Activation::Relu : sched::Activation::None));
  CHECK(max_rel_diff(got, want) <= 2e-2);
  // Another program of the graph (another process alike) loads the choice from the disk cache.
  runtime::clear_autotune_memory();
  const auto disk_hits = runtime::detail::autotune_counters().disk_hits.load();
  auto second = backend::make_step_program(c.graph, backend::Mode::Jit, launch);
  Tensor again = run_into(second);
  CHECK(runtime::detail::autotune_counters().disk_hits.load() > disk_hits);
  CHECK(second->chosen().name == chosen);
  CHECK(max_rel_diff(again, got) == 0.0);
}

}  // namespace kiln_test_backend_cuda_autotune
