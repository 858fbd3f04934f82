// CUDA code generation without a GPU: every WORKLOADS.md workload and every op x dtype is
// generated and compiled by NVRTC to a cubin for sm_90 and sm_80; the launch strategies at the
// GPU shapes of WORKLOADS.md are checked; and the generated kernels run in a host emulator of
// CUDA (tests/codegen/cuda_emulator.hpp) against the reference executor. Units with a symbolic
// leading size (kiln::compile's dynamic shapes) are generated once and run at several sizes.
#include <doctest/doctest.h>

#include "cuda_emulator.hpp"
#include "cuda_test_util.hpp"
#include "kiln/autodiff/backward.hpp"
#include "kiln/backend/cuda_symbolic.hpp"
#include "kiln/codegen/scan.hpp"
#include "kiln/codegen/scatter.hpp"
#include "kiln/codegen/sort.hpp"
#include "kiln/runtime/nvrtc.hpp"

namespace kiln_test_codegen_cuda_codegen {

using namespace kiln_cuda_test;

namespace {

bool have_nvrtc() {
  if (runtime::nvrtc_available()) return true;
  MESSAGE("NVRTC not found, CUDA compile tests skipped: " << runtime::nvrtc_unavailable_reason());
  return false;
}

bool have_host_compiler() {
  if (runtime::CpuModuleCache::instance().compiler()) return true;
  MESSAGE("no host C++ compiler, emulated CUDA tests skipped");
  return false;
}

/// Generates the unit of `roots` and compiles it for sm_90 and sm_80.
void compile_both(const std::string& name, const std::vector<NodePtr>& roots,
                  const std::vector<Strides>& out_strides = {}) {
  ir::Captured c = capture(roots, out_strides);
  sched::Schedule s = sched::schedule(c.graph);
  for (auto target : {codegen::CudaTarget::sm90(), codegen::CudaTarget::sm80()}) {
    codegen::CudaSource src = codegen::generate_cuda(c.graph, s, "kiln_test", target);
    CHECK(src.kernels.size() == s.kernels.size());
    std::string cubin;
    try {
      cubin = runtime::compile_cuda_to_cubin(src.source, name + ".cu", target.arch());
    } catch (const CompileError& e) {
      FAIL_CHECK(name << " for " << target.arch() << ": " << e.what());
      continue;
    }
    CHECK_MESSAGE(cubin.size() > 4, name);
    CHECK_MESSAGE(cubin.compare(0, 4,
                                "\x7f"
                                "ELF") == 0,
                  name);  // a cubin, not PTX
  }
}

/// Runs `roots` in the emulator for `target` and with the reference executor; "" when they
/// agree. `strategies` (optional) receives each kernel's strategy line.
std::string emulate_on(const std::vector<NodePtr>& roots, const codegen::CudaTarget& target,
                       std::vector<std::string>* strategies = nullptr, const std::vector<Strides>& out_strides = {},
                       double tol_scale = 1.0, std::uint64_t* kernels = nullptr) {
  ir::Captured c = capture(roots, out_strides);
  Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
  backend::run_reference(c.graph, args_for(c, want));
  auto before = stats().launches;
  kiln_cuda_emu::RunInfo info = kiln_cuda_emu::run(c.graph, args_for(c, got), target);
  if (kernels) *kernels = stats().launches - before;
  if (strategies)
    for (auto& k : info.source.kernels) strategies->push_back(k.strategy);
  std::string m = compare(c.graph, got.pointers, want.pointers, tol_scale);
  if (!m.empty()) m += "\n" + c.graph.str() + info.schedule;
  return m;
}

/// The same on the emulator's small target (3 multiprocessors).
std::string emulate(const std::vector<NodePtr>& roots, const std::vector<Strides>& out_strides = {},
                    bool index64 = false, double tol_scale = 1.0, std::uint64_t* kernels = nullptr) {
  codegen::CudaTarget t = kiln_cuda_emu::small_target();
  t.index64 = index64;
  return emulate_on(roots, t, nullptr, out_strides, tol_scale, kernels);
}

/// A leaf of any size without memory behind it: code generation never reads leaves.
NodePtr shape_only(const Shape& shape, DType dt) {
  auto st = std::make_shared<Storage>();
  return ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dt, Device::cpu());
}

/// The strategy line of each kernel of the workload at `M` x `K` on an H200.
std::vector<std::string> strategies(const std::vector<NodePtr>& roots) {
  ir::Captured c = capture(roots);
  sched::Schedule s = sched::schedule(c.graph);
  codegen::CudaSource src = codegen::generate_cuda(c.graph, s, "kiln_test", codegen::CudaTarget::sm90());
  std::vector<std::string> out;
  for (auto& k : src.kernels) out.push_back(k.strategy);
  return out;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cuda codegen: every WORKLOADS.md workload compiles with NVRTC for sm_90 and sm_80") {
  if (!have_nvrtc()) return;
  for (auto& w : workloads()) {
    SUBCASE(w.id) { compile_both(w.id, w.build(64, 256)); }
  }
}

TEST_CASE("cuda codegen: every op x dtype and every layout compiles with NVRTC for sm_90 and sm_80") {
  if (!have_nvrtc()) return;
  for (auto& c : op_cases()) {
    SUBCASE(c.name.c_str()) { compile_both(c.name, c.build(), c.out_strides); }
  }
  for (auto& c : layout_cases()) {
    SUBCASE(c.name.c_str()) { compile_both(c.name, c.build(), c.out_strides); }
  }
}

TEST_CASE("cuda codegen: primitives on dtypes they are not defined for are DTypeErrors, as in the reference") {
  // Every unary and binary primitive of the op table that refuses int32 (float-only) or
  // float32 (integer-only), in the CUDA writer and in the reference alike.
  for (DType dt : {i32, f32, DType::Bool}) {
    NodePtr x = input({4, 4}, dt, 1);
    for (const std::vector<Op>* ops : {&kUnaryOps, &kBinaryOps})
      for (Op op : *ops) {
        if (defined_on(op, dt)) continue;
        CAPTURE(ir::op_name(op));
        CAPTURE(dtype_name(dt));
        ir::Captured c = capture({ir::op_kind(op) == ir::OpKind::Unary ? un(op, x) : ir::binary(op, x, x)});
        sched::Schedule s = sched::schedule(c.graph);
        CHECK_THROWS_AS(codegen::generate_cuda(c.graph, s, "k"), DTypeError);
        Outputs o = make_outputs(c.graph, 0);
        CHECK_THROWS_AS(backend::run_reference(c.graph, args_for(c, o)), DTypeError);
      }
  }
  NodePtr x = input({4, 4}, i32, 1);
  ir::Captured c = capture({ir::random({4}, 1, 0, i32, Device::cpu())});
  CHECK_THROWS_AS(codegen::generate_cuda(c.graph, sched::schedule(c.graph), "k"), DTypeError);
}

TEST_CASE("cuda codegen: floating +, - and * are the _rn intrinsics, which NVRTC never contracts into an FMA") {
  // softmax(w * x) with logits about 1e30: contracted, w*x - max(w*x) is the product's rounding
  // error (about 1e23, not 0), its exp overflows and the row became inf / inf = NaN on an H200.
  for (DType dt : {f32, f64, f16}) {
    CAPTURE(dtype_name(dt));
    NodePtr x = shape_only({21, 2}, dt), w = shape_only({21, 1}, dt);
    ir::Captured c = capture({softmax_ir(mul(expand(w, x->shape), x), 1)});
    sched::Schedule s = sched::schedule(c.graph);
    const std::string src = codegen::generate_cuda(c.graph, s, "kiln_test", codegen::CudaTarget::sm90()).source;
    const std::string f = dt == f64 ? "__d" : "__f";
    CHECK(has(src, f + "mul_rn("));
    CHECK(has(src, f + "sub_rn("));
  }
}

TEST_CASE("cuda codegen: a row kept on chip is read with an L2 evict_last policy, and only then") {
  // N4's shape: the rows of 4096 floats sit in registers; a pointwise kernel's loads stay plain.
  NodePtr x = shape_only({16384, 4096}, f32), w = shape_only({4096}, f32);
  ir::Captured rows = capture({softmax_ir(mul(x, expand(w, x->shape)), 1)});
  sched::Schedule s = sched::schedule(rows.graph);
  codegen::CudaTarget target = codegen::CudaTarget::sm90();
  const std::string kept = codegen::generate_cuda(rows.graph, s, "kiln_test", target).source;
  CHECK(has(kept, "= kiln_ld_keep("));
  target.row_cache_load_keep = false;
  const std::string plain = codegen::generate_cuda(rows.graph, s, "kiln_test", target).source;
  CHECK_FALSE(has(plain, "= kiln_ld_keep("));
  ir::Captured pointwise = capture({mul(x, expand(w, x->shape))});
  const std::string pw = codegen::generate_cuda(pointwise.graph, sched::schedule(pointwise.graph), "kiln_test",
                                                codegen::CudaTarget::sm90()).source;
  CHECK_FALSE(has(pw, "= kiln_ld_keep("));
}

TEST_CASE("cuda codegen: gathered rows take the evict_last policy with gather_load_keep, their ids never") {
  // E1's shape: embedding rows of 1024 floats; the ids (i64) and the output stay plain.
  NodePtr w = shape_only({50304, 1024}, f32), ids = shape_only({32768}, i64);
  const std::int64_t n = 32768, d = 1024;
  NodePtr rows = ir::gather(w, ir::broadcast(ir::reshape(ids, Shape{n, 1}), Shape{n, d}), 0, ir::GatherSite::Embedding);
  ir::Captured c = capture({rows});
  sched::Schedule s = sched::schedule(c.graph);
  codegen::CudaTarget target = codegen::CudaTarget::sm90();
  const std::string plain = codegen::generate_cuda(c.graph, s, "kiln_test", target).source;
  CHECK_FALSE(has(plain, "= kiln_ld_keep("));
  target.gather_load_keep = true;
  const std::string kept = codegen::generate_cuda(c.graph, s, "kiln_test", target).source;
  CHECK_MESSAGE(has(kept, "= kiln_ld_keep(in0 +"), kept);
  CHECK_FALSE(has(kept, "kiln_ld_keep(in1"));
}

TEST_CASE("cuda codegen: launch strategies at the GPU shapes of WORKLOADS.md (H200)") {
  const std::int64_t M = 16384, K = 4096, N = std::int64_t(1) << 26;
  // Pointwise: 16-byte vectors (4 f32 lanes), one kernel.
  {
    NodePtr x = shape_only({N}, f32), y = shape_only({N}, f32);
    auto s = strategies({add(mul(cst(2.0, x), x), y)});
    REQUIRE(s.size() == 1);
    CHECK(has(s[0], "pointwise, 4 lane(s)"));
  }
  {
    NodePtr X = shape_only({M, K}, f32), mu = shape_only({M, 1}, f32), sc = shape_only({K}, f32),
            b = shape_only({K}, f32);
    auto s = strategies({add(mul(sub(X, ir::broadcast(mu, X->shape)), expand(sc, X->shape)), expand(b, X->shape))});
    REQUIRE(s.size() == 1);
    CHECK(has(s[0], "pointwise, 4 lane(s)"));
  }
  // R1: one long row split over many blocks.
  {
    NodePtr x = shape_only({N}, f32);
    auto s = strategies({ir::reshape(red(Op::ReduceSum, mul(x, x), {0}), Shape{})});
    REQUIRE(s.size() == 1);
    CHECK(has(s[0], "split row reduction"));
  }
  // R2: rows; R3: columns split over blocks.
  {
    NodePtr X = shape_only({M, K}, f32);
    auto s2 = strategies({ir::reshape(red(Op::ReduceSum, X, {1}), Shape{M})});
    REQUIRE(s2.size() == 1);
    CHECK(has(s2[0], "row reduction, 256 thread(s) per row, 4 lane(s)"));
    auto s3 = strategies({ir::reshape(red(Op::ReduceSum, X, {0}), Shape{K})});
    REQUIRE(s3.size() == 1);
    CHECK(has(s3[0], "column reduction"));
    CHECK_FALSE(has(s3[0], " 1 split(s)"));
  }
  // N1, N3, N4: the row is read once into registers; N2: two warps per 1024-wide row (a warp
  // would unroll 32 floats per thread, slower to compile and to run); N5: 8 bf16 lanes.
  {
    NodePtr X = shape_only({M, K}, f32), w = shape_only({K}, f32), b = shape_only({K}, f32);
    for (auto& roots :
         {std::vector<NodePtr>{decomp::softmax(X, 1)}, std::vector<NodePtr>{decomp::layer_norm(X, w, b, 1e-5)},
          std::vector<NodePtr>{decomp::rms_norm(X, w, 1e-6)}}) {
      auto s = strategies(roots);
      REQUIRE(s.size() == 1);
      CHECK(has(s[0], "cached in registers"));
    }
    auto s2 = strategies({decomp::softmax(shape_only({65536, 1024}, f32), 1)});
    REQUIRE(s2.size() == 1);
    CHECK(has(s2[0], "64 thread(s) per row, 4 lane(s), 4 slot(s)"));
    CHECK(has(s2[0], "cached in registers"));
    auto s512 = strategies({decomp::softmax(shape_only({65536, 512}, f32), 1)});
    REQUIRE(s512.size() == 1);
    CHECK(has(s512[0], "32 thread(s) per row, 4 lane(s), 4 slot(s)"));
    auto s5 = strategies({decomp::softmax(shape_only({M, K}, bf16), 1)});
    REQUIRE(s5.size() == 1);
    CHECK(has(s5[0], "8 lane(s)"));
    CHECK(has(s5[0], "cached in registers"));
  }
  // N6: 128 KiB rows are read twice (the second time mostly from L2), max and sum of exp in
  // one pass; the mean over rows is a final of the same kernel.
  {
    NodePtr logits = shape_only({8192, 32768}, f32), t = shape_only({8192}, i64);
    auto s = strategies({decomp::cross_entropy(logits, t, -100)});
    REQUIRE(s.size() == 1);
    CHECK(has(s[0], "read per pass"));
    CHECK(has(s[0], "online max and sum of exp"));
    CHECK(has(s[0], "1 row gather(s) issued at the row's start"));  // the target's logit: one load per row
  }
  // B1: the backward row of gelu(layer_norm(X, w, b)) keeps X in registers over its passes
  // (mean, variance, the two row sums, dX); the weight and bias every row shares are not kept.
  {
    NodePtr X = shape_only({M, K}, f32), w = shape_only({K}, f32), b = shape_only({K}, f32);
    for (const NodePtr& leaf : {X, w, b}) {
      leaf->requires_grad = true;
      leaf->grad_leaf = std::make_shared<ir::GradLeaf>();
    }
    NodePtr loss = red(Op::ReduceSum, decomp::gelu(decomp::layer_norm(X, w, b, 1e-5), true), {0, 1});
    auto reached = autodiff::backward_pass({loss}, {ir::constant(1.0, f32, loss->shape, Device::cpu())}, {X, w, b},
                                           false, "B1");
    std::vector<NodePtr> grads;
    for (const NodePtr& leaf : {X, w, b})
      for (const autodiff::Reached& r : reached)
        if (r.node == leaf) grads.push_back(r.grad);
    REQUIRE(grads.size() == 3);
    auto s = strategies(grads);
    REQUIRE(s.size() == 2);
    CHECK_MESSAGE(has(s[0], "row reduction, 256 thread(s) per row, 4 lane(s), 4 slot(s), row cached in registers"), s[0]);
    CHECK(has(s[1], "column reduction"));
  }
}

TEST_CASE(
    "cuda emulator: rows at the warp-per-row limit, with a warp or two per row, compute what the reference does") {
  if (!have_host_compiler()) return;
  // 1000 columns (a partial last vector slot) and 1024; warp_row_vectors 8 gives them a warp,
  // 4 (the default) two warps and a block reduction.
  for (int wrv : {8, 4}) {
    codegen::CudaTarget t = kiln_cuda_emu::small_target();
    t.warp_row_vectors = wrv;
    for (std::int64_t C : {1000, 1024}) {
      NodePtr x = input({19, C}, f32, 47, {}, -1, 0, 3.0), w = input({C}, f32, 48), b = input({C}, f32, 49);
      std::vector<std::string> strat;
      std::string r = emulate_on({decomp::softmax(x, 1), decomp::layer_norm(x, w, b, 1e-5)}, t, &strat);
      CAPTURE(wrv);
      CAPTURE(C);
      CHECK_MESSAGE(r.empty(), r);
      REQUIRE(strat.size() == 1);  // both read the same rows: one kernel
      CHECK_MESSAGE(has(strat[0], wrv == 8 ? "32 thread(s) per row" : "64 thread(s) per row"), strat[0]);
    }
  }
}

TEST_CASE("cuda emulator: one-hot sums (sum of where(iota == t, x, 0)) and cross_entropy's gathered pick, as the reference") {
  if (!have_host_compiler()) return;
  const codegen::CudaTarget small = kiln_cuda_emu::small_target();
  auto run = [&](const std::string& name, const std::vector<NodePtr>& roots) {
    std::string r = emulate_on(roots, small);
    CHECK_MESSAGE(r.empty(), name << ": " << r);
  };
  auto pick_sum = [](const NodePtr& x, const NodePtr& classes, const NodePtr& t) {
    NodePtr onehot = ir::binary(Op::Eq, classes, t);
    return red(Op::ReduceSum, ir::where(onehot, x, cst(0.0, x)), {1});
  };
  // Targets in range, at both ends, ignored (-100), negative and past the last class (the
  // one-hot sums give 0 for those; cross_entropy reads only the targets in range or ignored).
  const std::int64_t M = 37, C = 256;
  std::vector<std::int64_t> tv(static_cast<std::size_t>(M)), tce(static_cast<std::size_t>(M));
  for (std::int64_t i = 0; i < M; ++i) {
    const std::int64_t special[] = {0, C - 1, -100, -1, C, C + 7};
    tv[static_cast<std::size_t>(i)] = i < 6 ? special[i] : (i * 53) % C;
    tce[static_cast<std::size_t>(i)] = i < 3 ? special[i] : (i * 53) % C;
  }
  NodePtr t64 = input_values<std::int64_t>({M}, tv);
  SUBCASE("cross_entropy (online max and sum of exp, the target's logit gathered, mean over rows)") {
    NodePtr x = input({M, C}, f32, 41, {}, -1, 0, 3.0);
    run("cross_entropy", {decomp::cross_entropy(x, input_values<std::int64_t>({M}, tce), -100)});
    run("cross_entropy bf16", {decomp::cross_entropy(ir::cast(x, bf16), input_values<std::int64_t>({M}, tce), -100)});
  }
  SUBCASE("the picked sum itself, int64 and int32 classes, f32 and bf16 values") {
    NodePtr x = input({M, C}, f32, 42);
    NodePtr t2 = expand(ir::reshape(t64, Shape{M, 1}), Shape{M, C});
    run("int64", {pick_sum(x, ir::iota(Shape{M, C}, 1, DType::Int64, Device::cpu()), t2)});
    std::vector<std::int32_t> t32(tv.begin(), tv.end());
    NodePtr t2i = expand(ir::reshape(input_values<std::int32_t>({M}, t32), Shape{M, 1}), Shape{M, C});
    NodePtr xb = input({M, C}, bf16, 43);
    run("int32 bf16", {pick_sum(xb, ir::iota(Shape{M, C}, 1, DType::Int32, Device::cpu()), t2i)});
    // Beside an ordinary row sum in the same kernel, and with the classes on the left.
    run("beside a row sum",
        {pick_sum(x, t2, ir::iota(Shape{M, C}, 1, DType::Int64, Device::cpu())), red(Op::ReduceSum, x, {1})});
  }
  SUBCASE("long rows split over blocks") {
    const std::int64_t R = 20000;
    NodePtr x = input({2, R}, f32, 44);
    NodePtr t2 = expand(ir::reshape(input_values<std::int64_t>({2}, {R - 3, 17}), Shape{2, 1}), Shape{2, R});
    std::vector<std::string> strat;
    std::string r =
        emulate_on({pick_sum(x, ir::iota(Shape{2, R}, 1, DType::Int64, Device::cpu()), t2), red(Op::ReduceMax, x, {1})},
                   small, &strat);
    CHECK_MESSAGE(r.empty(), r);
    REQUIRE(strat.size() == 1);
    CHECK(has(strat[0], "split row reduction"));
  }
  SUBCASE("a target that varies along the row, a value that needs the row's max, classes along rows") {
    NodePtr x = input({M, C}, f32, 45);
    NodePtr iota = ir::iota(Shape{M, C}, 1, DType::Int64, Device::cpu());
    NodePtr tfull = input({M, C}, i64, 46);  // small integers, some equal to their class
    run("target varies along the row", {pick_sum(x, iota, tfull)});
    NodePtr t2 = expand(ir::reshape(t64, Shape{M, 1}), Shape{M, C});
    NodePtr centred = sub(x, ir::broadcast(red(Op::ReduceMax, x, {1}), x->shape));
    run("value needs the row's max", {pick_sum(centred, iota, t2)});
    // Classes along the kept dim (one class per row): not the reduced one.
    NodePtr rows = ir::iota(Shape{M, C}, 0, DType::Int64, Device::cpu());
    run("iota along the kept dim", {pick_sum(x, rows, t2)});
  }
}

TEST_CASE("cuda emulator: column reductions split over many blocks combine every split (sum, max, argmax)") {
  if (!have_host_compiler()) return;
  // 132 multiprocessors: 156 splits of 40000 rows over 32 rows of threads (a batch of four
  // partials per row of threads, the last batch partly past the end).
  codegen::CudaTarget t = kiln_cuda_emu::small_target();
  t.sm_count = 132;
  NodePtr X = input({40000, 24}, f32, 47), I = input({40000, 24}, i32, 48);
  std::vector<std::string> strat;
  std::string r = emulate_on(
      {red(Op::ReduceSum, X, {0}), red(Op::ReduceMax, X, {0}), red(Op::ArgMax, X, {0}), red(Op::ReduceSum, I, {0})}, t,
      &strat);
  CHECK_MESSAGE(r.empty(), r);
  REQUIRE(!strat.empty());
  for (auto& s : strat) CHECK_MESSAGE(has(s, "156 split(s)"), s);
}

TEST_CASE("cuda emulator: a column sum stored beside the values it sums splits its rows over blocks") {
  if (!have_host_compiler()) return;
  // A bias gradient: the column sum of a pointwise value that is itself an output (the input
  // gradient of the product before it). The full values are written by the block that reads
  // their rows, so the rows split over blocks as for a sum alone.
  codegen::CudaTarget t = kiln_cuda_emu::small_target();
  t.sm_count = 132;
  NodePtr X = input({4000, 24}, f32, 49);
  NodePtr e = un(Op::Exp, X);
  std::vector<std::string> strat;
  std::string r = emulate_on({red(Op::ReduceSum, e, {0}), e}, t, &strat);
  CHECK_MESSAGE(r.empty(), r);
  REQUIRE(!strat.empty());
  CHECK_MESSAGE(strat[0].find("column reduction") == 0, strat[0]);
  CHECK_MESSAGE(strat[0].find(" 1 split(s)") == std::string::npos, strat[0]);
}

TEST_CASE("cuda emulator: a permuted leaf's log, stored and summed over two of its dims in one graph") {
  if (!have_host_compiler()) return;
  // The shape of the GPU fuzzer's seed 23 graph 2300: sum(log(permute(x, {2, 0, 1})), {0, 1})
  // beside the log itself.
  for (Shape shape : {Shape{3, 3, 3}, Shape{5, 7, 33}}) {
    CAPTURE(shape.str());
    // permute({2, 0, 1}) of a contiguous [shape[1], shape[2], shape[0]] buffer
    const Strides permuted{1, shape[2] * shape[0], shape[0]};
    NodePtr x = input(shape, f32, 91, permuted, shape.numel());
    NodePtr l = un(Op::Log, un(Op::Abs, x));
    std::string r = emulate({red(Op::ReduceSum, l, {0, 1}), l});
    CHECK_MESSAGE(r.empty(), r);
    // With the graph's other outputs: a NaN constant and a one-element leaf.
    NodePtr nan = ir::constant(std::nan(""), f32, Shape{1, 1}, Device::cpu());
    NodePtr one = input_values<float>(Shape{1, 1, 1, 1}, {1.0f});
    r = emulate({nan, one, red(Op::ReduceSum, l, {0, 1}), l});
    CHECK_MESSAGE(r.empty(), r);
  }
}

TEST_CASE("cuda codegen: a warp-per-row kernel storing a permuted value beside its sum compiles with NVRTC") {
  // Seed 23 graph 2300 on the GPU: NVRTC 13.0 itself died (SIGSEGV in nvrtcCompileProgram, nvcc's
  // cicc alike) on the row kernel of log(permute(x, {2, 0, 1})) summed over {0, 1} and stored as
  // maximum(log, y) beside it: its optimizer crashed on the loop over rows around the warp
  // shuffles. With a grid that covers every row the kernel has no such loop.
  if (!have_nvrtc()) return;
  const Shape shape{3, 3, 3};
  NodePtr x = input(shape, DType::Float64, 93, Strides{1, 9, 3}, 27);  // permute({2, 0, 1}) of a contiguous buffer
  NodePtr l = un(Op::Log, x);
  NodePtr y = input({3, 1, 1}, DType::Float64, 94);
  NodePtr m = ir::binary(Op::Maximum, l, expand(y, shape));
  compile_both("s23_g2300", {red(Op::ReduceSum, l, {0, 1}), m});
  CHECK(emulate({red(Op::ReduceSum, l, {0, 1}), m}).empty());
}

TEST_CASE("cuda codegen: a column kernel of many phases fits its shares in static shared memory") {
  // Seed 24 graph 1462 on the GPU: layer_norm(softmax(x, -1)) of a bool tensor whose last dim is
  // the outer one in memory, one column kernel of four phases (three double sums and a max); at
  // 8 columns per thread their 256 x 8 shares needed 56 KiB of static shared memory (ptxas: too
  // much shared data, 0xe000 bytes, 0xc000 max). The plan takes fewer columns per thread.
  for (std::int64_t last : {0, 3}) {
    CAPTURE(last);
    const Shape shape{1, 1000, last};
    NodePtr x = input(shape, DType::Bool, 95, Strides{1000 * std::max<std::int64_t>(last, 1), 1, 1000},
                      1000 * std::max<std::int64_t>(last, 1));
    NodePtr w = input({last}, f32, 96), b = input({last}, f32, 97);
    // Concatenated after a [1, 1, last] tensor, as in the fuzzer's graph: the normalised value
    // goes to a temporary, which makes the kernel a column one.
    NodePtr y = ir::concat({input({1, 1, last}, f32, 98),
                            decomp::layer_norm(decomp::softmax(ir::cast(x, f32), 2), w, b, 1e-5)},
                           1);
    if (have_nvrtc()) compile_both("s24_g1462_" + std::to_string(last), {y});
    std::vector<std::string> strat;
    CHECK(emulate_on({y}, codegen::CudaTarget::sm90(), &strat).empty());
    REQUIRE(!strat.empty());
    CHECK_MESSAGE(strat[0].find("column reduction") == 0, strat[0]);
  }
}

TEST_CASE("cuda emulator: a reduction of a one-row reduction's result, used beside it once per kernel, is in scope") {
  if (!have_host_compiler()) return;
  // Work done once per kernel (after the loop over rows) may not read a row's reduction: with a
  // single row the scheduler once accepted it, and the generated code named a variable of the
  // row loop outside it (NVRTC: identifier "r7" is undefined; g++: 'v5' was not declared).
  SUBCASE("rms_norm of a keepdim max") {
    NodePtr x = input({4}, f32, 3);
    NodePtr m = red(Op::ReduceMax, x, {0});  // [1]
    CHECK_MESSAGE(emulate({decomp::rms_norm(m, nullptr, 1.1920928955078125e-07)}).empty(), "rms_norm(max(x, 0, true))");
  }
  SUBCASE("s + sum(s) with s a full keepdim sum") {
    NodePtr x = input({3, 4}, f32, 5);
    NodePtr s = red(Op::ReduceSum, x, {0, 1});  // [1, 1]
    CHECK_MESSAGE(emulate({add(s, red(Op::ReduceSum, s, {0, 1}))}).empty(), "s + sum(s)");
  }
  SUBCASE("where(mask, x.to(i32), softmax(argmax(x.to(i32), keepdim), -1))") {
    NodePtr x = input({3, 5}, f32, 7, {}, -1, 0, 4.0), mask = input({3, 5}, DType::Bool, 8);
    NodePtr xi = ir::cast(x, DType::Int32);
    NodePtr am = ir::reshape(red(Op::ArgMax, ir::reshape(xi, Shape{15}), {0}), Shape{1, 1});
    NodePtr sm = decomp::softmax(ir::cast(am, f32), 1);
    CHECK_MESSAGE(emulate({ir::where(mask, ir::cast(xi, f32), expand(sm, Shape{3, 5}))}).empty(),
                  "where of a one-row softmax");
  }
}

TEST_CASE("cuda emulator: WORKLOADS.md workloads run as the reference executor computes them") {
  if (!have_host_compiler()) return;
  for (auto& w : workloads()) {
    SUBCASE(w.id) {
      for (auto [m, k] : {std::pair<std::int64_t, std::int64_t>{37, 256}, {3, 1000}}) {
        std::uint64_t kernels = 0;
        std::string r = emulate(w.build(m, k), {}, false, 1.0, &kernels);
        CHECK_MESSAGE(r.empty(), w.id << " " << m << "x" << k << ": " << r);
        CHECK(kernels == 1);
      }
    }
  }
}

TEST_CASE("cuda emulator: every op x dtype and every layout runs as the reference executor computes it") {
  if (!have_host_compiler()) return;
  for (auto& c : op_cases()) {
    SUBCASE(c.name.c_str()) {
      std::string r = emulate(c.build(), c.out_strides, c.index64, c.tol_scale);
      CHECK_MESSAGE(r.empty(), c.name << ": " << r);
    }
  }
  for (auto& c : layout_cases()) {
    SUBCASE(c.name.c_str()) {
      std::string r = emulate(c.build(), c.out_strides, c.index64, c.tol_scale);
      CHECK_MESSAGE(r.empty(), c.name << ": " << r);
    }
  }
}

// ---- symbolic sizes (kiln::compile's dynamic shapes) -----------------------------------------

namespace {

/// Makes a leaf of `shape` and dtype (seeded).
using LeafFn = std::function<NodePtr(const Shape&, DType, unsigned)>;

/// A graph whose leading size n is symbolic, buildable at any n.
struct SymCase {
  std::string name;
  std::function<std::vector<NodePtr>(std::int64_t, const LeafFn&)> build;
  std::size_t kernels = 1;                                  ///< kernels of its schedule
  std::vector<std::int64_t> sizes = {0, 1, 3, 7, 33, 300};  ///< emulated sizes
};

std::vector<SymCase> sym_cases() {
  std::vector<SymCase> v;
  v.push_back({"symbolic pointwise (a vector tail for odd sizes)", [](std::int64_t n, const LeafFn& leaf) {
                 NodePtr x = leaf({n, 37}, f32, 1);
                 return std::vector<NodePtr>{add(mul(x, cst(2.0, x)), un(Op::Sin, x))};
               }});
  v.push_back({"symbolic broadcast of a bias [K] over [n, K]", [](std::int64_t n, const LeafFn& leaf) {
                 NodePtr X = leaf({n, 64}, f32, 2), b = leaf({64}, f32, 3);
                 return std::vector<NodePtr>{add(X, expand(b, X->shape))};
               }});
  v.push_back({"symbolic softmax over the last axis (8 rows per block)", [](std::int64_t n, const LeafFn& leaf) {
                 return std::vector<NodePtr>{decomp::softmax(leaf({n, 64}, f32, 4), 1)};
               }});
  v.push_back({"symbolic layer_norm", [](std::int64_t n, const LeafFn& leaf) {
                 return std::vector<NodePtr>{
                     decomp::layer_norm(leaf({n, 300}, f32, 5), leaf({300}, f32, 6), leaf({300}, f32, 7), 1e-5)};
               }});
  v.push_back({"symbolic rms_norm of long rows (a block per row)",
               [](std::int64_t n, const LeafFn& leaf) {
                 return std::vector<NodePtr>{decomp::rms_norm(leaf({n, 2000}, f32, 8), leaf({2000}, f32, 9), 1e-6)};
               },
               1,
               {0, 1, 3, 33}});
  v.push_back({"symbolic row sums through a temporary into a 3-d pointwise",
               [](std::int64_t n, const LeafFn& leaf) {
                 NodePtr X = leaf({n, 64}, f32, 10), Y = leaf({n, 4, 64}, f32, 11);
                 NodePtr r = ir::reshape(red(Op::ReduceSum, X, {1}), {n, 1, 1});
                 return std::vector<NodePtr>{add(ir::broadcast(r, Y->shape), Y)};
               },
               2});
  return v;
}

const LeafFn kShapeOnly = [](const Shape& shape, DType dt, unsigned) { return shape_only(shape, dt); };
const LeafFn kData = [](const Shape& shape, DType dt, unsigned seed) { return input(shape, dt, seed); };

/// The case's graph at the placeholder, its symbolic unit for `target` and its schedule.
codegen::CudaSource sym_source(const SymCase& c, const codegen::CudaTarget& target, sched::Schedule& s) {
  ir::Captured cap = capture(c.build(backend::kSymbolicPlaceholder, kShapeOnly));
  std::string why;
  auto src = backend::detail::cuda_symbolic_source(cap.graph, "kiln_sym", target, {}, s, why);
  REQUIRE_MESSAGE(src.has_value(), c.name << ": " << why);
  return *src;
}

}  // namespace

TEST_CASE("cuda codegen: a symbolic size over a space with an empty dim launches one block, never a grid of 0") {
  // Seed 24 graph 1299 on the GPU (kiln::compile, dynamic): where(mask, x, 1e4) over [n, 0] made
  // a kernel with grid 0 and no rule (nothing per unit of the size), and cuLaunchKernel refused
  // grid (0, 1, 1).
  std::vector<SymCase> cases;
  cases.push_back({"pointwise over [n, 0]", [](std::int64_t n, const LeafFn& leaf) {
                     NodePtr m = leaf({n, 0}, DType::Bool, 1), x = leaf({n, 0}, DType::BFloat16, 2);
                     return std::vector<NodePtr>{ir::cast(ir::where(m, x, cst(1e4, x)), DType::Int32)};
                   }});
  cases.push_back({"row sums of [n, 0, 7]", [](std::int64_t n, const LeafFn& leaf) {
                     return std::vector<NodePtr>{red(Op::ReduceSum, leaf({n, 0, 7}, f32, 3), {2})};
                   }});
  for (auto& c : cases) {
    CAPTURE(c.name);
    sched::Schedule s;
    codegen::CudaSource src = sym_source(c, codegen::CudaTarget::sm90(), s);
    for (auto& k : src.kernels)
      for (std::int64_t n : {0, 1, 33}) CHECK_MESSAGE(k.grid_for(n) >= 1, k.strategy);
    if (have_nvrtc()) CHECK(runtime::compile_cuda_to_cubin(src.source, "empty_sym.cu", "sm_90").size() > 4);
  }
}

TEST_CASE("cuda codegen: symbolic sizes: one unit for every size, identical at two placeholders, compiled by NVRTC") {
  const std::int64_t p = backend::kSymbolicPlaceholder;
  for (auto& c : sym_cases()) {
    SUBCASE(c.name.c_str()) {
      for (auto target : {codegen::CudaTarget::sm90(), codegen::CudaTarget::sm80()}) {
        sched::Schedule s;
        codegen::CudaSource src = sym_source(c, target, s);
        CHECK(src.symbolic);
        CHECK(has(src.source, "struct kiln_args { void* p[" + std::to_string(src.num_args) + "]; long long n; };"));
        CHECK(has(src.source, "= a.n;"));
        // No size of the placeholder's making in the code: at p + 30 it is the same unit.
        CHECK_FALSE(has(src.source, std::to_string(p)));
        ir::Graph h = backend::detail::with_placeholder(capture(c.build(p, kShapeOnly)).graph, p, p + 30);
        codegen::CudaSource other = codegen::generate_cuda(h, sched::schedule(h, p + 30), "kiln_sym", target);
        CHECK(other.source == src.source);
        REQUIRE(src.kernels.size() == c.kernels);
        for (auto& k : src.kernels) {
          // Every kernel's grid follows the size (they all lead with it).
          CHECK(k.grid == 0);
          CHECK(k.grid_rule.units_per_size > 0);
          CHECK(k.grid_for(0) == 1);
          CHECK(k.grid_for(std::int64_t(1) << 40) == k.grid_rule.max_grid);  // clamped as the static choice is
          CHECK(has(k.strategy, "<= " + std::to_string(k.grid_rule.max_grid)));
        }
        if (!have_nvrtc()) continue;
        std::string cubin;
        try {
          cubin = runtime::compile_cuda_to_cubin(src.source, "sym.cu", target.arch());
        } catch (const CompileError& e) {
          FAIL_CHECK(c.name << " for " << target.arch() << ": " << e.what());
          continue;
        }
        CHECK(cubin.compare(0, 4,
                            "\x7f"
                            "ELF") == 0);
      }
    }
  }
}

TEST_CASE("cuda codegen: symbolic sizes: the grid rule of pointwise kernels and row kernels") {
  sched::Schedule s;
  auto cases = sym_cases();
  // Pointwise [n, 37] f32: n * 37 / 4 vectors, 2 per thread of 256 threads, at most 256 blocks per SM.
  codegen::CudaSource pw = sym_source(cases[0], codegen::CudaTarget::sm90(), s);
  const codegen::CudaGridRule& r = pw.kernels[0].grid_rule;
  CHECK(r.units_per_size == 37);
  CHECK(r.size_divisor == 4);
  CHECK(r.units_per_block == 512);
  CHECK(r.max_grid == 132 * 256);
  CHECK(pw.kernels[0].grid_for(1) == 1);
  CHECK(pw.kernels[0].grid_for(56) == 2);  // 518 vectors
  CHECK(has(pw.kernels[0].strategy, "grid (ceil(n * 37 / 4 / 512) <= 33792)x256"));
  // Softmax over 64 columns: a warp per row, 8 rows per block.
  codegen::CudaSource sm = sym_source(cases[2], codegen::CudaTarget::sm90(), s);
  CHECK(sm.kernels[0].block == 256);
  CHECK(sm.kernels[0].grid_for(8) == 1);
  CHECK(sm.kernels[0].grid_for(33) == 5);
  CHECK(has(sm.kernels[0].strategy, "grid (ceil(n / 8) <= 1073741824)x256"));
  // The 3-d pointwise of the temporary case: [n, 4, 64] elements.
  codegen::CudaSource tmp = sym_source(cases[5], codegen::CudaTarget::sm90(), s);
  REQUIRE(s.temps.size() == 1);
  CHECK(s.temps[0].shape[0] == backend::kSymbolicPlaceholder);
  CHECK(tmp.kernels[1].grid_rule.units_per_size == 256);
}

TEST_CASE("cuda codegen: symbolic sizes: reductions over the symbolic size are refused, saying why") {
  const std::int64_t p = backend::kSymbolicPlaceholder;
  struct Refused {
    std::string name;
    std::vector<NodePtr> roots;
    std::string why;
  };
  NodePtr X = shape_only({p, 64}, f32), Y = shape_only({p, 3, 64}, f32);
  for (auto& r :
       {Refused{"a column sum over the size", {red(Op::ReduceSum, X, {0})}, "reduces over the symbolic size"},
        Refused{"a sum over everything", {red(Op::ReduceSum, X, {0, 1})}, "reduces over the symbolic size"},
        Refused{"a middle axis beside the size (column strategy)", {red(Op::ReduceSum, Y, {1})}, "column strategy"}}) {
    CAPTURE(r.name);
    ir::Captured c = capture(r.roots);
    sched::Schedule s;
    std::string why;
    CHECK_FALSE(
        backend::detail::cuda_symbolic_source(c.graph, "k", codegen::CudaTarget::sm90(), {}, s, why).has_value());
    CHECK_MESSAGE(has(why, r.why), why);
    sched::Schedule s2 = sched::schedule(c.graph, p);
    try {
      codegen::generate_cuda(c.graph, s2, "k");
      FAIL_CHECK("generate_cuda accepted a kernel that cannot read the size at launch");
    } catch (const Error& e) {
      CHECK_MESSAGE(has(e.what(), "no symbolic-size code for"), e.what());
      CHECK_MESSAGE(has(e.what(), r.why), e.what());
    }
  }
}

TEST_CASE("cuda emulator: one symbolic unit gives the reference executor's results at every size") {
  if (!have_host_compiler()) return;
  for (auto& c : sym_cases()) {
    SUBCASE(c.name.c_str()) {
      sched::Schedule s;
      codegen::CudaSource src = sym_source(c, kiln_cuda_emu::small_target(), s);
      kiln_cuda_emu::Module m = kiln_cuda_emu::load(src);
      REQUIRE(static_cast<bool>(m.launch_n));
      for (std::int64_t n : c.sizes) {
        ir::Captured g = capture(c.build(n, kData));
        Outputs got = make_outputs(g.graph, 0xAB), want = make_outputs(g.graph, 0xAB);
        backend::run_reference(g.graph, args_for(g, want));
        const auto before = stats().launches;
        kiln_cuda_emu::run_symbolic(m, src, s, args_for(g, got), n);
        CHECK(stats().launches - before == c.kernels);
        std::string r = compare(g.graph, got.pointers, want.pointers);
        CHECK_MESSAGE(r.empty(), c.name << ", n = " << n << ": " << r);
      }
    }
  }
}

namespace {
/// Indices into a dim of `bound`, `n` of them, every value in range (a fixed pattern with repeats).
std::vector<std::int64_t> spread_indices(std::int64_t n, std::int64_t bound) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (i * 7 + i / 3) % bound;
  return v;
}
/// embedding(W, ids): rows of W at ids, as the front end builds it.
NodePtr rows_of(const NodePtr& w, const NodePtr& ids) {
  const std::int64_t n = ids->shape.numel(), d = w->shape[1];
  return ir::gather(w, ir::broadcast(ir::reshape(ids, Shape{n, 1}), Shape{n, d}), 0, ir::GatherSite::Embedding);
}
}  // namespace

TEST_CASE("cuda emulator: gathers fuse with what reads them and give the reference executor's results") {
  if (!have_host_compiler()) return;
  NodePtr w = input({50, 64}, f32, 201), pos = input({37, 64}, f32, 202);
  NodePtr ids = input_values<std::int64_t>({37}, spread_indices(37, 50));
  // Gathered rows scaled and shifted: one kernel, the rows read with vector loads.
  NodePtr emb = add(mul(rows_of(w, ids), cst(2.0, pos)), pos);
  std::uint64_t kernels = 0;
  std::string r = emulate({emb}, {}, false, 1.0, &kernels);
  CHECK_MESSAGE(r.empty(), r);
  CHECK(kernels == 1);
  {
    ir::Captured c = capture({emb});
    codegen::CudaSource src =
        codegen::generate_cuda(c.graph, sched::schedule(c.graph), "kiln_test", kiln_cuda_emu::small_target());
    CHECK_MESSAGE(has(src.source, "uint4"), src.source);
    CHECK(has(src.source, "kiln_gather_index"));
  }
  // Half-precision rows (8 lanes), and the rows of a computed table.
  NodePtr wh = input({50, 64}, f16, 203);
  r = emulate({rows_of(wh, ids), rows_of(un(Op::Exp, w), ids)});
  CHECK_MESSAGE(r.empty(), r);
  // A per-element index along the last axis (take_along_dim: the index differs lane by lane),
  // and along the first, from a permuted input.
  NodePtr x = input({6, 40}, f32, 204);
  NodePtr along = input_values<std::int64_t>({6, 40}, spread_indices(240, 40));
  NodePtr down = input_values<std::int64_t>({3, 40}, spread_indices(120, 6));
  NodePtr xt = input({6, 40}, f32, 205, Strides{1, 6}, 240);  // a transposed [40, 6] buffer
  r = emulate({ir::gather(x, along, 1, ir::GatherSite::TakeAlongDim), ir::gather(x, down, 0, ir::GatherSite::Gather),
               ir::gather(xt, ir::gather(along, down, 0, ir::GatherSite::Gather), 1, ir::GatherSite::Gather)});
  CHECK_MESSAGE(r.empty(), r);
  // Gathered values summed per row, and a pick per row beside a row reduction (cross_entropy's
  // shape: logsumexp - x[target]).
  NodePtr logits = input({64, 300}, f32, 206);
  NodePtr t = input_values<std::int64_t>({64, 1}, spread_indices(64, 300));
  NodePtr lse = un(Op::Log, red(Op::ReduceSum, un(Op::Exp, logits), {1}));
  r = emulate({red(Op::ReduceSum, rows_of(w, ids), {1}), sub(lse, ir::gather(logits, t, 1, ir::GatherSite::CrossEntropy))});
  CHECK_MESSAGE(r.empty(), r);
}

TEST_CASE("cuda emulator: an index out of range is recorded for the host to raise, naming the op; reads stay in range") {
  if (!have_host_compiler()) return;
  NodePtr w = input({50, 64}, f32, 207);
  std::vector<std::int64_t> bad = spread_indices(37, 50);
  bad[20] = 50;
  bad[30] = -3;
  ir::Captured c = capture({rows_of(w, input_values<std::int64_t>({37}, bad))});
  Outputs got = make_outputs(c.graph, 0xAB);
  kiln_cuda_emu::run(c.graph, args_for(c, got), kiln_cuda_emu::small_target());
  std::string message;
  try {
    kiln::detail::raise_host_index_fault();
  } catch (const IndexError& e) {
    message = e.what();
  }
  CHECK_MESSAGE(has(message, "embedding: index "), message);
  CHECK_MESSAGE((has(message, "index 50 is out of bounds for dimension 0 with size 50") ||
                 has(message, "index -3 is out of bounds for dimension 0 with size 50")),
                message);
  // The record is cleared once raised: nothing more to raise.
  CHECK_NOTHROW(kiln::detail::raise_host_index_fault());
  // Rows 20 and 30 read the clamped rows 49 and 0.
  const float* wv = nullptr;
  for (auto& leaf : c.leaves)
    if (leaf->shape == Shape{50, 64}) wv = static_cast<const float*>(leaf->buffer->data());
  REQUIRE(wv != nullptr);
  const float* out = static_cast<const float*>(got.pointers[0]);
  CHECK(out[20 * 64 + 5] == wv[49 * 64 + 5]);
  CHECK(out[30 * 64 + 5] == wv[0 * 64 + 5]);
}

TEST_CASE("cuda codegen: gathers (rows, per-element picks, their range checks) compile with NVRTC for sm_90 and sm_80") {
  if (!have_nvrtc()) return;
  NodePtr w = shape_only({50304, 1024}, f32), ids = shape_only({32768}, i64);
  NodePtr x = shape_only({64, 300}, bf16), t = shape_only({64, 1}, i64);
  compile_both("gather", {rows_of(w, ids), ir::gather(x, t, 1, ir::GatherSite::CrossEntropy)});
}

TEST_CASE("cuda codegen: scatter steps (deterministic and atomic, every dtype) compile with NVRTC for sm_90 and sm_80") {
  if (!have_nvrtc()) return;
  for (DType dt : {f32, f64, f16, bf16, i32, i64, DType::Bool}) {
    for (bool atomic : {false, true}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(atomic);
      NodePtr base = shape_only({50, 8}, dt), src = shape_only({37, 8}, dt);
      NodePtr ids = ir::broadcast(ir::reshape(shape_only({37}, i64), Shape{37, 1}), Shape{37, 8});
      ir::Captured c = capture({ir::scatter(base, ids, src, 0, true, atomic, ir::GatherSite::IndexAdd)});
      sched::StepPlan plan = sched::plan_steps(c.graph, true);
      REQUIRE(plan.scatters.size() == 1);
      codegen::ScatterSource s = codegen::generate_cuda_scatter(plan.scatters[0], "kiln_test");
      CHECK(s.atomic == (atomic && (dt == f32 || dt == f64 || dt == i32 || dt == i64)));
      CHECK(s.scatter_threads == (s.atomic ? 37 * 8 / 4 : 8));  // atomics: four columns a thread
      CHECK(s.index_elements == 37);                             // the 1-d index, checked once per row
      std::vector<codegen::ScatterSource> units{s};
      if (!plan.scatters[0].atomic_adds()) {  // a GPU's plan sorts the runs of this index
        sched::ScatterCall sorted = plan.scatters[0];
        sorted.sorted_runs = true;
        units.push_back(codegen::generate_cuda_scatter(sorted, "kiln_test"));
        CHECK(units.back().sorted_runs);
      }
      for (const auto& u : units)
        for (auto target : {codegen::CudaTarget::sm90(), codegen::CudaTarget::sm80()}) {
          try {
            std::string cubin = runtime::compile_cuda_to_cubin(u.source, "scatter.cu", target.arch());
            CHECK(cubin.compare(0, 4, "\x7f" "ELF") == 0);
          } catch (const CompileError& e) {
            FAIL_CHECK(target.arch() << ": " << e.what());
          }
        }
    }
  }
}

TEST_CASE("cuda emulator: a value one for every vector lane, kept in registers between passes, is read back by each lane") {
  if (!have_host_compiler()) return;
  // GPU fuzz seed 41 graph 1114: the variance of sinh over rows whose lanes all read one
  // element (the rows of a one-row table, gathered by an embedding; a broadcast alike). The
  // second pass read lane 1's register slot, which the first pass had left unwritten.
  NodePtr table = input({1, 7}, f32, 211);
  NodePtr ids = input_values<std::int64_t>({6}, {0, 0, 0, 0, 0, 0});
  auto variance = [](const NodePtr& v) {
    NodePtr s = un(Op::Exp, v);  // a transcendental the second pass needs again
    NodePtr mean = div(red(Op::ReduceSum, s, {0, 1}), cst(static_cast<double>(v->shape.numel()), red(Op::ReduceSum, s, {0, 1})));
    NodePtr d = sub(s, ir::broadcast(mean, s->shape));
    return red(Op::ReduceSum, mul(d, d), {0, 1});
  };
  std::string r = emulate({variance(ir::reshape(rows_of(table, ids), Shape{6, 7}))});
  CHECK_MESSAGE(r.empty(), r);
  r = emulate({variance(ir::broadcast(table, Shape{6, 7}))});
  CHECK_MESSAGE(r.empty(), r);
}

TEST_CASE("cuda emulator: scan kernels (a warp per row) give the reference's scans; they compile with NVRTC") {
  if (!have_host_compiler()) return;
  struct Case {
    NodePtr x;
    std::int64_t axis;
    ir::ScanKind kind;
    DType out;
  };
  std::vector<std::int64_t> ints(37 * 5);
  for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<std::int64_t>((i * 7) % 11) - 5;
  std::vector<float> with_nan(1000, 1.0f);
  for (std::size_t i = 0; i < with_nan.size(); ++i) with_nan[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  with_nan[777] = std::nanf("");
  const std::vector<Case> cases = {
      {input({3, 1000}, f32, 221), 1, ir::ScanKind::Sum, f32},          // eight steps of a row and a tail
      {input({40, 6}, f64, 222), 0, ir::ScanKind::Prod, f64},           // along a strided dim, short rows
      {input({5, 77}, bf16, 223), 1, ir::ScanKind::Sum, bf16},
      {input({2, 300}, f32, 224, {}, -1, 0, 20.0), 1, ir::ScanKind::LogSumExp, f32},
      {input_values<std::int64_t>({37, 5}, ints), 0, ir::ScanKind::Sum, i64},
      {input_values<std::int64_t>({37, 5}, ints), 0, ir::ScanKind::ArgMin, i64},
      {input_values<float>({1, 1000}, with_nan), 1, ir::ScanKind::Max, f32},
      {input_values<float>({1, 1000}, with_nan), 1, ir::ScanKind::ArgMax, i64},
      {input({37, 5}, DType::Bool, 225), 0, ir::ScanKind::ArgMax, i64},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    const Case& cs = cases[k];
    ir::Captured c = capture({ir::scan(cs.x, cs.axis, cs.kind, cs.out)});
    sched::StepPlan plan = sched::plan_steps(c.graph, true);
    REQUIRE(plan.scans.size() == 1);
    REQUIRE(plan.scans[0].src.kind == sched::Slot::Leaf);  // every case scans a leaf in place
    const sched::ScanCall& sc = plan.scans[0];
    codegen::ScanSource src = codegen::generate_cuda_scan(sc, "kiln_scan");
    // contiguous f32 rows of a float kind take the four-lane loop (the rest, the scalar one)
    CHECK((src.source.find("float4") != std::string::npos) == (k == 0 || k == 3));
    if (runtime::nvrtc_available())
      for (auto target : {codegen::CudaTarget::sm90(), codegen::CudaTarget::sm80()}) {
        try {
          CHECK(runtime::compile_cuda_to_cubin(src.source, "scan.cu", target.arch()).compare(0, 4, "\x7f" "ELF") == 0);
        } catch (const CompileError& e) {
          FAIL_CHECK(target.arch() << ": " << e.what());
        }
      }
    std::string unit = kiln_cuda_emu::kPrelude;
    unit += src.source;
    unit += "\nstatic void kiln_emu_scan_body(void* p) { kiln_scan(*(kiln_scan_args*)p); }\n"
            "extern \"C\" void kiln_emu_scan_launch(unsigned grid, unsigned block, void** args) {\n"
            "  kiln_scan_args a; memcpy(a.p, args, sizeof a.p); ::kiln_emu::run_grid(grid, block, 0, kiln_emu_scan_body, &a);\n}\n";
    auto lib = kiln_cuda_emu::load_library(unit);
    auto launch = reinterpret_cast<void (*)(unsigned, unsigned, void**)>(lib->symbol("kiln_emu_scan_launch"));
    Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
    backend::RunArgs args = args_for(c, got);
    backend::run_reference(c.graph, args_for(c, want));
    void* argv[2] = {const_cast<void*>(args.inputs[static_cast<std::size_t>(sc.src.index)]), got.pointers[0]};
    launch(static_cast<unsigned>((src.threads + 255) / 256), 256, argv);
    std::string m = compare(c.graph, got.pointers, want.pointers, 1.0);
    CHECK_MESSAGE(m.empty(), m);
  }
}

TEST_CASE("cuda emulator: sort kernels (radix select, bitonic network, global scratch) give the reference's positions; NVRTC compiles them") {
  if (!have_host_compiler()) return;
  struct Case {
    NodePtr x;
    std::int64_t axis, k;
    bool descending;
    std::int64_t scratch_rows;  ///< > 0: the rows' working sets in global scratch, this many at a time
  };
  std::vector<float> ties(2 * 300);
  for (std::size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>((i * 37) % 13) - 6.0f;
  ties[7] = std::nanf(""), ties[8] = -0.0f, ties[9] = 0.0f, ties[400] = std::nanf("");
  const std::vector<Case> cases = {
      {input({3, 1000}, f32, 231), 1, 10, true, 0},   // a top-k: the select resolves in the key digits
      {input_values<float>({2, 300}, ties), 1, 50, true, 0},   // ties: the select goes down to positions
      {input_values<float>({2, 300}, ties), 1, 299, false, 0},  // ascending, NaN last
      {input({4, 77}, f64, 232), 1, 77, false, 0},    // a full sort of wide keys
      {input({5, 40}, bf16, 233), 1, 7, false, 0},
      {input({37, 5}, i64, 234), 0, 37, true, 0},     // along a strided dim, integers with ties
      {input({3, 33}, DType::Bool, 235), 1, 4, true, 0},
      {input({37, 6}, i32, 236), 0, 3, false, 0},
      {input({3, 20000}, f32, 237), 1, 20000, true, 2},  // rows in global scratch, blocks striding
      {input({2, 9000}, f64, 238), 1, 100, false, 1},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    const Case& cs = cases[k];
    ir::Captured c = capture({ir::sort(cs.x, cs.axis, cs.k, cs.descending)});
    sched::StepPlan plan = sched::plan_steps(c.graph, true);
    REQUIRE(plan.sorts.size() == 1);
    REQUIRE(plan.sorts[0].src.kind == sched::Slot::Leaf);
    sched::SortCall sc = plan.sorts[0];
    if (cs.scratch_rows > 0) {  // as the planner does for a GPU graph
      CHECK(sc.gpu_row_bytes() > sched::SortCall::kSharedBudget);
      sc.scratch = 0;
      sc.scratch_rows = cs.scratch_rows;
    } else {
      CHECK(sc.gpu_row_bytes() <= sched::SortCall::kSharedBudget);
    }
    codegen::SortSource src = codegen::generate_cuda_sort(sc, "kiln_sort");
    if (runtime::nvrtc_available())
      for (auto target : {codegen::CudaTarget::sm90(), codegen::CudaTarget::sm80()}) {
        try {
          CHECK(runtime::compile_cuda_to_cubin(src.source, "sort.cu", target.arch()).compare(0, 4, "\x7f" "ELF") == 0);
        } catch (const CompileError& e) {
          FAIL_CHECK(target.arch() << ": " << e.what());
        }
      }
    std::string unit = kiln_cuda_emu::kPrelude;
    unit += src.source;
    unit += "\nstatic void kiln_emu_sort_body(void* p) { kiln_sort(*(kiln_sort_args*)p); }\n"
            "extern \"C\" void kiln_emu_sort_launch(unsigned grid, unsigned block, unsigned smem, void** args) {\n"
            "  kiln_sort_args a; memcpy(a.p, args, sizeof a.p); ::kiln_emu::run_grid(grid, block, smem, kiln_emu_sort_body, &a);\n}\n";
    auto lib = kiln_cuda_emu::load_library(unit);
    auto launch = reinterpret_cast<void (*)(unsigned, unsigned, unsigned, void**)>(lib->symbol("kiln_emu_sort_launch"));
    Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
    backend::RunArgs args = args_for(c, got);
    backend::run_reference(c.graph, args_for(c, want));
    StoragePtr scratch = runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(16, sc.scratch_rows * sc.gpu_row_bytes())));
    void* argv[3] = {const_cast<void*>(args.inputs[static_cast<std::size_t>(sc.src.index)]), got.pointers[0],
                     sc.scratch >= 0 ? scratch->data : nullptr};
    CHECK(src.grid == (cs.scratch_rows > 0 ? std::min(cs.scratch_rows, sc.rows()) : sc.rows()));
    launch(static_cast<unsigned>(src.grid), static_cast<unsigned>(src.block), static_cast<unsigned>(src.shared_bytes), argv);
    std::string m = compare(c.graph, got.pointers, want.pointers, 1.0);
    CHECK_MESSAGE(m.empty(), m);
  }
}

/// A host leaf of values k / 3 + 1 / 7 (k = 0, 1, ..., 96, again), rounded to T: none exact, so
/// their sums depend on the order.
template <class T>
NodePtr thirds(const Shape& shape) {
  std::vector<T> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(static_cast<double>(i % 97) / 3.0 + 1.0 / 7.0);
  return input_values<T>(shape, v);
}

TEST_CASE("cuda emulator: scatters of a row index counting-sort the positions by target and apply each run in order, whatever order the atomics hand out places") {
  if (!have_host_compiler()) return;
  auto row_index = [](const std::vector<std::int64_t>& ids, const Shape& shape, std::int64_t axis) {
    Shape one(shape.size(), 1);
    one[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(ids.size());
    return ir::broadcast(ir::reshape(input_values<std::int64_t>({static_cast<std::int64_t>(ids.size())}, ids), one), shape);
  };
  std::vector<std::int64_t> small(37), wide(3000), same(500, 7), cols(70), ten(10), part(25);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<std::int64_t>((i * 17) % 50);
  for (std::size_t i = 0; i < small.size(); i += 5) small[i] = 3;  // repeats
  for (std::size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<std::int64_t>((i * 7919) % 300);
  for (std::size_t i = 0; i < cols.size(); ++i) cols[i] = static_cast<std::int64_t>((i * 13) % 40);
  for (std::size_t i = 0; i < ten.size(); ++i) ten[i] = static_cast<std::int64_t>((i * 3) % 4);
  for (std::size_t i = 0; i < part.size(); ++i) part[i] = static_cast<std::int64_t>((i * 11) % 30);
  struct Case {
    NodePtr root;
    bool ordered;       ///< deterministic: runs in position order (the atomic mode: linked, any order)
    bool quad = false;  ///< rows move in 16-byte quads
  };
  const std::vector<Case> cases = {
      // index_add of 37 rows into a zero [50, 8] (E2's form), repeats among them
      {ir::scatter(ir::constant(0.0, f32, {50, 8}, Device::cpu()), row_index(small, {37, 8}, 0), input({37, 8}, f32, 241), 0,
                   true, false, ir::GatherSite::IndexAdd), true, true},
      // 3000 f32 rows into a read base of 300 (quads from base and src), runs of ten
      {ir::scatter(input({300, 12}, f32, 252), row_index(wide, {3000, 12}, 0), input({3000, 12}, f32, 253), 0, true,
                   false, ir::GatherSite::IndexAdd), true, true},
      // int32 sums, wrapping as PyTorch's
      {ir::scatter(input({50, 4}, i32, 254), row_index(small, {37, 4}, 0), input({37, 4}, i32, 255), 0, true, false,
                   ir::GatherSite::IndexAdd), true, true},
      // 3000 rows into 300, into a base that is read
      {ir::scatter(input({300, 5}, f64, 242), row_index(wide, {3000, 5}, 0), input({3000, 5}, f64, 243), 0, true, false,
                   ir::GatherSite::IndexAdd), true},
      // index_copy: the last position of each run wins
      {ir::scatter(input({20, 6}, i64, 244), row_index(ten, {10, 6}, 0), input({10, 6}, i64, 245), 0, false, false,
                   ir::GatherSite::IndexCopy), true},
      // along the last dim, half floats
      {ir::scatter(input({4, 40}, f16, 246), row_index(cols, {4, 70}, 1), input({4, 70}, f16, 247), 1, true, false,
                   ir::GatherSite::IndexAdd), true},
      // an index smaller than the base off the axis: the rest is the base's
      {ir::scatter(input({30, 8}, f32, 248), row_index(part, {25, 5}, 0), input({25, 5}, f32, 249), 0, true, false,
                   ir::GatherSite::ScatterAdd), true},
      // one run of 500 (every position the same target), bf16 sums in order
      {ir::scatter(input({10, 4}, bf16, 250), row_index(same, {500, 4}, 0), input({500, 4}, bf16, 251), 0, true, false,
                   ir::GatherSite::IndexAdd), true},
      // 21 output elements (odd): one a thread, where even counts take two a thread
      {ir::scatter(input({7, 3}, f32, 263), row_index(ten, {10, 3}, 0), input({10, 3}, f32, 264), 0, true, false,
                   ir::GatherSite::IndexAdd), true},
      // rows of 256 doubles: four lanes 32 apart
      {ir::scatter(input({50, 256}, f64, 261), row_index(small, {37, 256}, 0), input({37, 256}, f64, 262), 0, true,
                   false, ir::GatherSite::IndexAdd), true},
      // the atomic mode: the runs summed in the order their lists were linked (full-mantissa
      // values, so that another order rounds differently)
      {ir::scatter(ir::constant(0.0, f32, {10, 8}, Device::cpu()), row_index(same, {500, 8}, 0), thirds<float>({500, 8}), 0,
                   true, true, ir::GatherSite::IndexAdd), false, true},
      {ir::scatter(input({300, 5}, f64, 257), row_index(wide, {3000, 5}, 0), thirds<double>({3000, 5}), 0, true, true,
                   ir::GatherSite::IndexAdd), false},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    ir::Captured c = capture({cases[k].root});
    sched::StepPlan plan = sched::plan_steps(c.graph, true);
    REQUIRE(plan.scatters.size() == 1);
    sched::ScatterCall sc = plan.scatters[0];
    REQUIRE(sc.index.kind == sched::Slot::Leaf);
    sc.sorted_runs = true;  // as the planner does for a GPU graph
    codegen::ScatterSource src = codegen::generate_cuda_scatter(sc, "kiln_scatter");
    REQUIRE(src.sorted_runs);
    CHECK(src.linked == !cases[k].ordered);
    CHECK(src.init.empty());  // the apply writes every output element
    CHECK((src.source.find("kiln_store4(") != std::string::npos) == cases[k].quad);
    std::string unit = kiln_cuda_emu::kPrelude;
    unit += src.source;
    unit += "\nstruct kiln_emu_scatter_call { void (*fn)(kiln_scatter_args); kiln_scatter_args a; };\n"
            "static void kiln_emu_scatter_body(void* p) { auto* c = (kiln_emu_scatter_call*)p; c->fn(c->a); }\n"
            "extern \"C\" void kiln_emu_scatter_launch(const char* name, unsigned grid, unsigned block, void** args) {\n"
            "  kiln_emu_scatter_call c; c.fn = nullptr; memcpy(c.a.p, args, sizeof c.a.p);\n";
    for (const std::string& kname : {src.check, src.reserve, src.place, src.order, src.scatter})
      if (!kname.empty()) unit += "  if (!strcmp(name, \"" + kname + "\")) c.fn = " + kname + ";\n";
    unit += "  ::kiln_emu::run_grid(grid, block, 0, kiln_emu_scatter_body, &c);\n}\n";
    auto lib = kiln_cuda_emu::load_library(unit);
    auto launch = reinterpret_cast<void (*)(const char*, unsigned, unsigned, void**)>(lib->symbol("kiln_emu_scatter_launch"));
    Outputs got = make_outputs(c.graph, 0xAB), want = make_outputs(c.graph, 0xAB);
    backend::RunArgs args = args_for(c, got);
    backend::run_reference(c.graph, args_for(c, want));
    StoragePtr scratch = runtime::allocate_host(static_cast<std::size_t>(sc.flag_ints()) * 4);
    std::memset(scratch->data, 0xCD, scratch->bytes);
    std::memset(scratch->data, 0, static_cast<std::size_t>(src.zero_bytes));
    auto leaf = [&](const sched::Slot& s) { return const_cast<void*>(args.inputs[static_cast<std::size_t>(s.index)]); };
    void* argv[5] = {sc.base_constant ? nullptr : leaf(sc.base), leaf(sc.index), leaf(sc.src), got.pointers[0], scratch->data};
    auto blocks = [](std::int64_t threads) { return static_cast<unsigned>((threads + 255) / 256); };
    launch(src.check.c_str(), blocks(src.index_elements), 256, argv);
    if (!src.linked) {
      // The emulator's threads take their places in position order; a GPU's atomics hand them
      // out in any order. Reversing each run's places makes the order kernel do real work.
      const sched::ScatterCall::RunsLayout layout = sc.runs_layout();
      auto* ints = static_cast<std::uint32_t*>(scratch->data);
      for (std::int64_t p = 0; p < sc.length(); ++p) {
        const std::uint32_t t = ints[layout.keys + p];
        ints[layout.slots + p] = ints[layout.counts + t] - 1 - ints[layout.slots + p];
      }
      launch(src.reserve.c_str(), static_cast<unsigned>(src.reserve_blocks), 1024, argv);
      launch(src.place.c_str(), blocks(src.positions), 256, argv);
      launch(src.order.c_str(), blocks(src.positions), 256, argv);
    }  // (linked runs, pushed in position order, are walked from the last: sums in another order)
    launch(src.scatter.c_str(), blocks(src.scatter_threads), 256, argv);
    // Ordered runs give the reference's bits; the atomic mode's sums in another order are close.
    std::string m = compare(c.graph, got.pointers, want.pointers, cases[k].ordered ? 0.0 : 1.0);
    CHECK_MESSAGE(m.empty(), m);
    if (!cases[k].ordered) {  // and the reversed order did change some bits (else the case tests nothing)
      const ir::GraphNode& o = c.graph.nodes[static_cast<std::size_t>(c.graph.outputs[0])];
      const std::size_t bytes = static_cast<std::size_t>(o.shape.numel()) * itemsize(o.dtype);
      CHECK(std::memcmp(got.pointers[0], want.pointers[0], bytes) != 0);
    }
    if (runtime::nvrtc_available()) {
      try {
        CHECK(runtime::compile_cuda_to_cubin(src.source, "scatter.cu", "sm_90").compare(0, 4, "\x7f" "ELF") == 0);
      } catch (const CompileError& e) {
        FAIL_CHECK(e.what());
      }
    }
  }
}

TEST_CASE("cuda scatter: an index with an empty dim off the axis places nothing") {
  // Fuzz seed 600, graph 654 (--grad, GPU): a slice's gradient scattered one row along dim 0
  // with an index of [1, 129, 1, 0]: the check (over the index's elements) never ran, while the
  // place and order kernels ran one position reading scratch nobody wrote (an illegal address).
  NodePtr root = ir::scatter(ir::constant(0.0, f32, {3, 0}, Device::cpu()), input_values<std::int64_t>({1, 0}, {}),
                             input({1, 0}, f32, 271), 0, true, false, ir::GatherSite::IndexAdd);
  ir::Captured c = capture({root});
  sched::StepPlan plan = sched::plan_steps(c.graph, true);
  REQUIRE(plan.scatters.size() == 1);
  sched::ScatterCall sc = plan.scatters[0];
  sc.sorted_runs = true;
  REQUIRE(sc.length() == 1);
  const codegen::ScatterSource src = codegen::generate_cuda_scatter(sc, "kiln_scatter");
  REQUIRE(src.sorted_runs);
  CHECK(src.index_elements == 0);
  CHECK(src.positions == 0);  // no place or order kernel runs
}

TEST_CASE("codegen: a concat whose pieces are all empty along its axis, in C++ and CUDA") {
  // Fuzz seed 600, graph 852 (--grad): min's gradient over the concat of three [0, 1] pieces
  // (ties split evenly: a row kernel over no rows). Both writers read the last non-empty piece
  // of the concat, of which there was none (signal 11).
  NodePtr x0 = input({0, 1}, f32, 281), x1 = input({0, 1}, f32, 282), g = input({0, 1}, f32, 283);
  NodePtr c = ir::concat({x0, x1, x1}, 0);
  NodePtr m = ir::reduce(ir::Op::ReduceMin, c, {1});
  NodePtr ties = ir::binary(ir::Op::Eq, c, m);
  NodePtr zero = ir::constant(0.0, f32, {0, 1}, Device::cpu());
  NodePtr count = ir::reduce(ir::Op::ReduceSum, ir::where(ties, ir::constant(1.0, f32, {0, 1}, Device::cpu()), zero), {1});
  NodePtr share = ir::where(ties, ir::binary(ir::Op::Div, g, count), zero);
  ir::Captured cap = capture({share, ir::binary(ir::Op::Add, share, share)});
  sched::Schedule s = sched::schedule(cap.graph);
  REQUIRE(!s.kernels.empty());
  const codegen::CppSource cpp = codegen::generate_cpp(cap.graph, s, "kiln_empty");
  CHECK(cpp.source.find("kiln_empty") != std::string::npos);
  const codegen::CudaSource cuda = codegen::generate_cuda(cap.graph, s, "kiln_empty");
  REQUIRE(cuda.kernels.size() == s.kernels.size());
  compile_both("empty_rows", {share});
}

}  // namespace kiln_test_codegen_cuda_codegen
