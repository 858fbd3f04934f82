#pragma once
// Pointwise kernels: one thread per vector of consecutive elements of the unit-stride loop
// group, grid-stride over the rest, a scalar tail for what the vectors leave over.
#include "kiln/codegen/cuda/kernel_writer.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

class PointwiseKernel : public KernelWriter {
 public:
  using KernelWriter::KernelWriter;

  /// The launch of a pointwise kernel, decided before any text.
  struct Plan {
    bool one_element = false;  ///< a 0-dim space: one thread
    int block = 256;           ///< threads per block
    int lanes = 1;             ///< elements per thread and step (one vector)
    int unroll = 1;            ///< vectors per thread and loop step
    i64 vectors = 0;           ///< whole vectors of the space (static sizes)
    i64 tail = 0;              ///< elements the vectors leave over
    i64 per_size = 0;          ///< symbolic size: elements per unit of the size
    CudaKernelInfo launch;
  };

  /// The plan step: 16-byte vectors (fewer lanes in bodies heavy in transcendental functions),
  /// `unroll` vectors per thread, a grid of at most 256 blocks per multiprocessor. Fixes the
  /// lanes; writes no text.
  Plan plan() {
    Plan pl;
    const auto& p = k_.loops;
    const int block = pl.block = std::clamp(t_.pointwise_block, 32, 1024) / 32 * 32;
    pl.launch.block = static_cast<unsigned>(block);
    const i64 numel = k_.space.numel();
    if (p.order.empty()) {
      pl.one_element = true;
      pl.launch.grid = 1;
      pl.launch.strategy = "pointwise, one element";
      return pl;
    }
    const int inner = p.order.back();
    const bool single = p.order.size() == 1;
    const bool heavy = heavy_ops() > 4;
    int v = choose_vec(inner, !single);
    if (heavy && t_.pointwise_lanes_heavy > 0) v = std::min(v, t_.pointwise_lanes_heavy);
    set_vec(inner, v);
    pl.lanes = v;
    pl.vectors = numel / v;
    pl.tail = numel - pl.vectors * v;
    const int unroll = pl.unroll =
        std::max(1, heavy ? t_.pointwise_unroll_heavy : gathers() ? t_.pointwise_unroll_gather : t_.pointwise_unroll);
    // Each thread takes `unroll` vectors and leaves (the hardware balances blocks across the
    // GPU); only very large tensors loop, over at most 256 blocks' worth per multiprocessor.
    const i64 per_block = static_cast<i64>(block) * unroll;
    // A symbolic size: the vectors, the tail and the grid follow the size read at launch.
    pl.per_size = sym_ ? per_size(p.order) : 0;
    // (A symbolic size over a space with an empty dim: nothing per unit of the size, so no
    // rule; one block that does nothing, never a grid of 0.)
    const i64 max_grid = t_.sm_count * i64(256);
    if (sym_ && pl.per_size > 0) {
      pl.launch.grid = 0;
      pl.launch.grid_rule = CudaGridRule{pl.per_size, v, per_block, max_grid};
    } else {
      pl.launch.grid =
          static_cast<unsigned>(std::max<i64>(1, std::min<i64>((pl.vectors + per_block - 1) / per_block, max_grid)));
    }
    pl.launch.strategy = "pointwise, " + std::to_string(v) + " lane(s) per thread, grid " +
                         (pl.launch.grid == 0 ? rule_text(pl.launch.grid_rule) : std::to_string(pl.launch.grid)) +
                         "x" + std::to_string(block);
    if (unroll > 1) pl.launch.strategy += ", " + std::to_string(unroll) + " steps per iteration";
    return pl;
  }

  /// The print step: a grid-stride loop over the vectors (whole unrolled steps first), then
  /// the tail, one element per thread of the first block.
  void print(const Plan& pl) {
    const auto& p = k_.loops;
    const std::string name = info_.name;
    info_ = pl.launch;
    info_.name = name;
    if (pl.one_element) {
      open("if (blockIdx.x == 0 && threadIdx.x == 0)");
      for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
      close();
      return;
    }
    const int block = pl.block, v = pl.lanes, unroll = pl.unroll;
    const int inner = p.order.back();
    const i64 nvec = pl.vectors, tail = pl.tail, per_n = pl.per_size;
    std::string nv = lit(nvec);
    if (sym_) {
      nv = "kiln_nv";
      line("const long long kiln_nv = " +
           (per_n % v == 0 ? std::string(kSizeVar) + " * " + lit(per_n / v)
                           : std::string(kSizeVar) + " * " + lit(per_n) + " / " + lit(v)) +
           ";");
    }
    if (sym_ || nvec > 0) {
      auto body = [&](const std::string& t) {
        open("", groups_mask(p.order));
        decode(t, p.order, v);
        for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
        close();
      };
      line(it_ + " t = (" + it_ + ")blockIdx.x * " + lit(block) + " + threadIdx.x;");
      line("const " + it_ + " G = (" + it_ + ")gridDim.x * " + lit(block) + ";");
      if (unroll > 1) {
        // Whole steps without bounds checks, so the loads of every element are in flight at once.
        open("for (; t + " + lit(unroll - 1) + " * G < " + nv + "; t += " + lit(unroll) + " * G)");
        for (int u = 0; u < unroll; ++u) {
          std::string tu = "tu" + std::to_string(u);
          line("const " + it_ + " " + tu + " = t + " + lit(u) + " * G;");
          body(tu);
        }
        close();
        open("for (; t < " + nv + "; t += G)");
        body("t");
        close();
      } else {
        open("for (; t < " + nv + "; t += G)");
        body("t");
        close();
      }
    }
    // With a symbolic size, a tail is possible when the work per unit of size is not a whole
    // number of vectors (then the space is one group: the tail's position is its variable).
    if (sym_ ? per_n % v != 0 : tail > 0) {
      // The elements the vectors leave over, one per thread of the first block.
      set_vec(inner, 1);
      const std::string left =
          sym_ ? "(long long)threadIdx.x < " + std::string(kSizeVar) + " * " + lit(per_n) + " - " + nv + " * " + lit(v)
               : "threadIdx.x < " + std::to_string(tail);
      open("if (blockIdx.x == 0 && " + left + ")", groups_mask(p.order));
      line("const " + it_ + " " + var(inner) + " = " + (sym_ ? nv + " * " + lit(v) : lit(nvec * v)) + " + (" + it_ +
           ")threadIdx.x;");
      for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
      close();
    }
  }

  /// Whether the kernel reads through a gathered index (a data-dependent load).
  bool gathers() const {
    return reached([](const ir::GraphNode& nn) { return nn.op == Op::Gather; }) > 0;
  }

  /// Transcendental functions a pointwise kernel evaluates per element (heavy bodies are not
  /// unrolled: they are bound by arithmetic, and code size costs compile time).
  int heavy_ops() const {
    return reached([](const ir::GraphNode& nn) { return ir::has_flag(nn.op, ir::kMathCall) || nn.op == Op::Random; });
  }

  /// The nodes the kernel computes (from its stores back to its loads) for which `pred` holds.
  template <class Pred>
  int reached(Pred pred) const {
    std::set<int> seen;
    std::vector<int> todo;
    for (auto& st : k_.stores) todo.push_back(st.node);
    int count = 0;
    while (!todo.empty()) {
      int n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second) continue;
      const ir::GraphNode& nn = node(n);
      if (pred(nn)) ++count;
      if (nn.op == Op::Input || ir::is_reduction(nn.op)) continue;
      for (int i : nn.inputs) todo.push_back(i);
    }
    return count;
  }
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
