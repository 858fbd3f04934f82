#pragma once
// Few long rows: every row split over blocks whose partials the last block combines.
#include "kiln/codegen/cuda/reduction.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

class SplitRowKernel : public ReductionKernel {
 public:
  using ReductionKernel::ReductionKernel;

  /// The launch of a split-row kernel, decided before any text.
  struct Plan {
    i64 rows = 0;      ///< rows (fewer than multiprocessors)
    i64 reduced = 0;   ///< elements per row
    int lanes = 1;     ///< vector lanes per thread
    int threads = 256; ///< threads per block
    i64 splits = 1;    ///< blocks per row
    i64 chunk = 0;     ///< elements of a row per block (whole vectors)
    i64 blocks = 0;    ///< rows x splits
    CudaKernelInfo launch;
  };

  /// The plan step: about split_blocks_per_sm blocks per multiprocessor, each chunk whole
  /// vectors and at least four per thread. Fixes the lanes; writes no text.
  Plan plan() {
    Plan pl;
    const int V = pl.lanes = plan_row_lanes();
    const auto& p = k_.loops;
    pl.rows = p.rows;
    const i64 R = pl.reduced = reduced_extent();
    const int T = pl.threads;
    const i64 target = static_cast<i64>(t_.sm_count) * std::max(1, t_.split_blocks_per_sm);
    i64 splits = std::max<i64>(1, target / std::max<i64>(1, pl.rows));
    splits = std::max<i64>(1, std::min<i64>(splits, R / (static_cast<i64>(T) * V * 4)));
    i64 chunk = (R + splits - 1) / splits;
    chunk = (chunk + V - 1) / V * V;
    pl.splits = (R + chunk - 1) / chunk;
    pl.chunk = chunk;
    pl.blocks = pl.rows * pl.splits;
    pl.launch.block = static_cast<unsigned>(T);
    pl.launch.grid = static_cast<unsigned>(pl.blocks);
    pl.launch.strategy = "split row reduction, " + std::to_string(pl.splits) + " block(s) per row of " +
                         std::to_string(R) + ", " + std::to_string(V) + " lane(s), grid " + std::to_string(pl.blocks) +
                         "x" + std::to_string(T);
    return pl;
  }

  /// The print step: each row split into chunks, one per block; the last block to finish
  /// combines every row's chunks in order, then writes the row values and the finals.
  void print(const Plan& pl) {
    const auto& p = k_.loops;
    const i64 rows = pl.rows, R = pl.reduced, splits = pl.splits, chunk = pl.chunk, blocks = pl.blocks;
    const int V = pl.lanes, T = pl.threads;
    const std::string name = info_.name;
    info_ = pl.launch;
    info_.name = name;
    row_threads_ = T;
    std::vector<Red> reds = phase_reds(1), fins = final_reds();
    std::vector<std::string> pv, px;
    for (auto& r : reds) {
      pv.push_back(scratch_array(r.acc_t, blocks, acc_bytes(r.acc_t)));
      px.push_back(r.arg ? scratch_array("long long", blocks, 8) : "");
    }
    line("const int tid = threadIdx.x;");
    open("", groups_mask(p.kept_groups));
    line("const " + it_ + " row = (" + it_ + ")blockIdx.x / " + lit(splits) + ";");
    line("const " + it_ + " lo = ((" + it_ + ")blockIdx.x % " + lit(splits) + ") * " + lit(chunk) + ";");
    line("const " + it_ + " hi = lo + " + lit(chunk) + " < " + lit(R) + " ? lo + " + lit(chunk) + " : " + lit(R) + ";");
    decode("row", p.kept_groups);
    for (auto& r : reds) declare_acc(r);
    // Four vectors in flight per thread and iteration.
    open("for (" + it_ + " base = lo + (" + it_ + ")tid * " + lit(V) + "; base < hi; base += " + lit(4 * T * V) + ")");
    open("for (int u = 0; u < 4; ++u)", 0, "#pragma unroll");
    line("const " + it_ + " pos = base + (" + it_ + ")u * " + lit(T * V) + ";");
    open("if (pos < hi)", groups_mask(p.red_groups));
    decode("pos", p.red_groups);
    fold_body(reds, 1, false);
    close();
    close();
    close();
    block_reduce(reds, T);
    open("if (tid == 0)");
    for (std::size_t i = 0; i < reds.size(); ++i) {
      line(pv[i] + "[blockIdx.x] = " + acc_name(reds[i]) + ";");
      if (reds[i].arg) line(px[i] + "[blockIdx.x] = " + idx_name(reds[i]) + ";");
    }
    close();
    close();
    // The last block.
    std::string counter = counters(1) + "[0]";
    shared_decl("unsigned int", "kiln_last", 1);
    open("if (threadIdx.x == 0)");
    line("__threadfence();");
    line("kiln_last[0] = atomicAdd(&" + counter + ", 1u) == " + std::to_string(blocks - 1) + "u;");
    close();
    line("__syncthreads();");
    open("if (kiln_last[0])");
    line("__threadfence();");
    for (auto& r : fins) declare_acc(r, "f");
    open("for (" + it_ + " row = 0; row < " + lit(rows) + "; ++row)", groups_mask(p.kept_groups));
    decode("row", p.kept_groups);
    const int row_scope = top();
    set_vec(-1, 1);
    for (auto& r : reds) declare_acc(r);
    std::vector<PartialRead> reads;
    for (std::size_t i = 0; i < reds.size(); ++i)
      reads.push_back(
          {reds[i], pv[i], px[i], "", [&](const std::string& u) { return "row * " + lit(splits) + " + " + u; }});
    fold_partials(reads, "(" + it_ + ")tid", splits, T);
    block_reduce(reds, T);
    for (auto& r : reds) {
      std::string res = "r" + std::to_string(r.node);
      line_at(row_scope,
              "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r), idx_name(r)) + ";");
      bound_[r.node] = Binding{{res}, 0, row_scope};
    }
    open("if (tid == 0)");
    row_stores();
    fold_finals(fins, 1);
    close();
    close();
    if (!fins.empty() || has_level(sched::Level::Final)) {
      for (auto& r : fins) {
        std::string res = "r" + std::to_string(r.node);
        line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r, "f"), idx_name(r, "f")) +
             ";");
        bound_[r.node] = Binding{{res}, 0, top()};
      }
      open("if (tid == 0)");
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Final) store(st, sched::detail::zero_index(node(st.node).shape));
      close();
    }
    line("if (tid == 0) " + counter + " = 0u;");
    close();
  }
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
