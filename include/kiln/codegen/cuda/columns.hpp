#pragma once
// Column reductions: each thread owns neighbouring columns and a share of the rows.
#include "kiln/codegen/cuda/reduction.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

class ColumnKernel : public ReductionKernel {
 public:
  using ReductionKernel::ReductionKernel;

  /// The launch of a column kernel, decided before any text.
  struct Plan {
    int column_group = -1;  ///< the loop group across the columns (contiguous)
    i64 columns = 0;        ///< extent of that group
    i64 reduced = 0;        ///< reduced rows
    int lanes = 1;          ///< columns per thread
    int tile_x = 32;        ///< threads across the columns of a tile (BX)
    int tile_y = 8;         ///< threads down the rows (BY = 256 / BX)
    i64 column_tiles = 0;   ///< column tiles per outer row
    i64 tiles = 0;          ///< column tiles in all
    i64 units = 1;          ///< tiles, at least one (an empty space still writes its finals)
    i64 splits = 1;         ///< blocks per tile, each a share of the rows
    i64 row_chunk = 0;      ///< rows per split
    CudaKernelInfo launch;
  };

  /// The plan step: tiles of BX x BY threads (BX columns of vectors wide, as many as there
  /// are, at most 32), and when the tiles leave the GPU idle the rows split over blocks. Fixes
  /// the column lanes; writes no text.
  Plan plan() {
    Plan pl;
    const auto& p = k_.loops;
    const int cg = pl.column_group = p.vec_group;
    const i64 C = pl.columns = extent(cg);
    int v0 = choose_vec(cg, true);
    if (v0 > 1 && t_.column_vectors_per_thread > 1 && extent(cg) % (v0 * t_.column_vectors_per_thread) == 0)
      v0 *= t_.column_vectors_per_thread;  // several 16-byte chunks per thread: longer runs per row
    // The BY shares of every reduction combine through static shared memory, 256 x lanes
    // accumulators each (48 KiB in all, less a little for the block's flags): fewer lanes
    // when they would not fit (layer_norm of a softmax down the columns: four phases of double
    // sums at 8 lanes need 56 KiB).
    std::size_t per_lane = 0;
    for (int pass = 1; pass <= k_.passes; ++pass)
      for (const Red& r : phase_reds(pass)) per_lane += 256 * (acc_bytes(r.acc_t) + (r.arg ? 8 : 0));
    constexpr std::size_t kStaticShared = 47 * 1024;
    while (v0 > 1 && per_lane * static_cast<std::size_t>(v0) > kStaticShared) v0 /= 2;
    if (per_lane * static_cast<std::size_t>(v0) > kStaticShared)
      throw Error("kiln CUDA codegen: a column reduction of " + std::to_string(k_.reductions.size()) +
                  " reductions needs " + std::to_string(per_lane) + " bytes of shared memory per lane (at most " +
                  std::to_string(kStaticShared) + ")");
    set_vec(cg, v0);
    const int V = pl.lanes = vec_;
    const i64 R = pl.reduced = reduced_extent();
    i64 outer = 1;
    for (int gi : p.kept_groups) outer *= extent(gi);
    const i64 cvecs = (C + V - 1) / V;
    int BX = 32;
    while (BX > 1 && BX / 2 >= cvecs) BX /= 2;
    const int BY = 256 / BX;
    pl.tile_x = BX;
    pl.tile_y = BY;
    pl.column_tiles = (cvecs + BX - 1) / BX;
    const i64 tiles = pl.tiles = outer * pl.column_tiles;
    const i64 target = static_cast<i64>(t_.sm_count) * std::max(1, t_.split_blocks_per_sm);
    i64 splits = 1;
    // Values stored beside the sums (a bias gradient's column sum beside the gradient it sums)
    // are written in the same row loop, each row by the block that reads it: splitting the rows
    // splits them too. Only a second pass or phase (values that need the finished sums) keeps
    // a tile in one block.
    const bool single_pass = k_.phases <= 1 && k_.passes <= 1;
    // Rounded down: every block of the grid runs in the first wave (a 17th split of 32 tiles
    // on 528 block slots would leave a second wave of 16 blocks).
    if (single_pass && tiles > 0 && tiles < target)
      splits = std::max<i64>(1, std::min<i64>(target / tiles, R / (BY * 8)));
    pl.row_chunk = splits > 1 ? (R + splits - 1) / splits : R;
    if (splits > 1) splits = (R + pl.row_chunk - 1) / pl.row_chunk;
    pl.splits = splits;
    pl.units = std::max<i64>(1, tiles);
    pl.launch.block = 256;
    pl.launch.grid = static_cast<unsigned>(pl.units * splits);
    pl.launch.strategy = "column reduction, " + std::to_string(BX) + "x" + std::to_string(BY) + " threads, " +
                         std::to_string(V) + " column(s) per thread, " + std::to_string(splits) +
                         " split(s) of the " + std::to_string(R) + " reduced rows, grid " +
                         std::to_string(pl.launch.grid) + "x256";
    return pl;
  }

  /// The print step: per tile, each thread folds its columns over its share of the rows, the
  /// shares combine in shared memory, and split tiles' partials in the tile's last block.
  void print(const Plan& pl) {
    const auto& p = k_.loops;
    const int cg = pl.column_group;
    const i64 C = pl.columns, R = pl.reduced, ct = pl.column_tiles, tiles = pl.tiles, units = pl.units;
    const i64 splits = pl.splits, rchunk = pl.row_chunk;
    const int V = pl.lanes, BX = pl.tile_x, BY = pl.tile_y;
    const std::string name = info_.name;
    info_ = pl.launch;
    info_.name = name;
    line("const int tx = threadIdx.x % " + std::to_string(BX) + ", ty = threadIdx.x / " + std::to_string(BX) + ";");
    // Blocks of one split of every tile are neighbours: blocks running together read whole
    // rows (long contiguous runs), which DRAM serves best.
    line("const " + it_ + " tile = (" + it_ + ")blockIdx.x % " + lit(units) + ";");
    line("const " + it_ + " cb = (tile % " + lit(ct) + ") * " + lit(BX * V) + " + (" + it_ + ")tx * " + lit(V) + ";");
    line("const bool cvalid = cb < " + lit(C) + ";");
    std::vector<Red> fins = final_reds();
    for (auto& r : fins) declare_acc(r, "f");
    std::uint64_t kept_dims = groups_mask(p.kept_groups) | group_mask(cg);
    open(tiles == 0 ? "if (false)" : "", kept_dims);
    decode("(tile / " + lit(ct) + ")", p.kept_groups);
    // Threads past the last column compute a copy of the last vector (valid addresses) and
    // neither store nor fold it.
    line("const " + it_ + " " + var(cg) + " = cb < " + lit(C - V) + " ? cb : " + lit(C - V) + ";");
    const int tile_scope = top();
    // Splits take contiguous runs of rows, or (interleaved) every splits-th group of BY rows,
    // so that all blocks read rows close together.
    const bool interleave = splits > 1 && t_.column_split_interleave;
    const std::string split = "((" + it_ + ")blockIdx.x / " + lit(units) + ")";
    const i64 step = interleave ? BY * splits : BY;
    if (interleave) {
      line("const " + it_ + " rlo = " + split + " * " + lit(BY) + ";");
      line("const " + it_ + " rhi = " + lit(R) + ";");
    } else {
      line("const " + it_ + " rlo = " + (splits > 1 ? split + " * " + lit(rchunk) : lit(0)) + ";");
      line("const " + it_ + " rhi = rlo + " + lit(rchunk) + " < " + lit(R) + " ? rlo + " + lit(rchunk) + " : " +
           lit(R) + ";");
    }
    std::string counter;
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<Red> reds = phase_reds(pass);
      for (auto& r : reds)
        for (int j = 0; j < V; ++j) declare_acc(r, "_" + std::to_string(j));
      open("for (" + it_ + " rr = rlo + ty; rr < rhi; rr += " + lit(step) + ")", groups_mask(p.red_groups),
           "#pragma unroll " + std::to_string(std::max(1, t_.column_unroll)));
      decode("rr", p.red_groups);
      store_guard_ = "cvalid";
      fold_body(reds, pass, true);
      store_guard_.clear();
      close();
      if (reds.empty()) continue;
      // Combine the BY shares of each column in order through shared memory.
      auto combine_shares = [&] {
        for (auto& r : reds) {
          shared_decl(r.acc_t, "kiln_c" + std::to_string(r.node), 256 * V);
          if (r.arg) shared_decl("long long", "kiln_cx" + std::to_string(r.node), 256 * V);
          for (int j = 0; j < V; ++j) {
            std::string slot = "[threadIdx.x * " + std::to_string(V) + " + " + std::to_string(j) + "]";
            line("kiln_c" + std::to_string(r.node) + slot + " = " + acc_name(r, "_" + std::to_string(j)) + ";");
            if (r.arg)
              line("kiln_cx" + std::to_string(r.node) + slot + " = " + idx_name(r, "_" + std::to_string(j)) + ";");
          }
        }
        line("__syncthreads();");
        open("if (ty == 0)");
        for (auto& r : reds)
          for (int j = 0; j < V; ++j) {
            std::string sfx = "_" + std::to_string(j);
            std::string at =
                "[(y * " + std::to_string(BX) + " + tx) * " + std::to_string(V) + " + " + std::to_string(j) + "]";
            line("for (int y = 1; y < " + std::to_string(BY) + "; ++y) " +
                 merge(r, acc_name(r, sfx), idx_name(r, sfx), "kiln_c" + std::to_string(r.node) + at,
                       r.arg ? "kiln_cx" + std::to_string(r.node) + at : "0"));
          }
        close();
      };
      combine_shares();
      if (splits > 1) {
        // Publish this block's partials; the last block of the tile combines them, every row of
        // its threads a share of the splits, then the shares through shared memory.
        std::vector<std::string> pv, px;
        for (auto& r : reds) {
          pv.push_back(scratch_array(r.acc_t, tiles * splits * BX * V, acc_bytes(r.acc_t)));
          px.push_back(r.arg ? scratch_array("long long", tiles * splits * BX * V, 8) : "");
        }
        const std::string at = "(((" + it_ + ")blockIdx.x) * " + lit(BX * V) + " + tx * " + lit(V) + " + ";
        open("if (ty == 0)");
        for (std::size_t i = 0; i < reds.size(); ++i)
          for (int j = 0; j < V; ++j) {
            std::string sfx = "_" + std::to_string(j);
            line(pv[i] + "[" + at + std::to_string(j) + ")] = " + acc_name(reds[i], sfx) + ";");
            if (reds[i].arg) line(px[i] + "[" + at + std::to_string(j) + ")] = " + idx_name(reds[i], sfx) + ";");
          }
        close();
        counter = counters(tiles + 1);
        shared_decl("unsigned int", "kiln_last", 1);
        open("if (threadIdx.x == 0)");
        line("__threadfence();");
        line("kiln_last[0] = atomicAdd(&" + counter + "[tile], 1u) == " + std::to_string(splits - 1) + "u;");
        close();
        line("__syncthreads();");
        line("if (!kiln_last[0]) return;");
        line("__threadfence();");
        line("if (threadIdx.x == 0) " + counter + "[tile] = 0u;");
        std::vector<PartialRead> reads;
        for (std::size_t i = 0; i < reds.size(); ++i)
          for (int j = 0; j < V; ++j) {
            const std::string sfx = "_" + std::to_string(j);
            line(acc_name(reds[i], sfx) + " = " + reds[i].init + ";" +
                 (reds[i].arg ? " " + idx_name(reds[i], sfx) + " = -1;" : ""));
            reads.push_back({reds[i], pv[i], px[i], sfx, [&, j](const std::string& u) {
                               return "(" + u + " * " + lit(units) + " + tile) * " + lit(BX * V) + " + tx * " + lit(V) +
                                      " + " + std::to_string(j);
                             }});
          }
        fold_partials(reads, "(" + it_ + ")ty", splits, BY);
        combine_shares();
      }
      // Hand each column's result to every thread of the column.
      for (auto& r : reds)
        for (int j = 0; j < V; ++j) {
          std::string slot = "[tx * " + std::to_string(V) + " + " + std::to_string(j) + "]";
          line("if (ty == 0) kiln_c" + std::to_string(r.node) + slot + " = " + acc_name(r, "_" + std::to_string(j)) +
               ";");
          if (r.arg)
            line("if (ty == 0) kiln_cx" + std::to_string(r.node) + slot + " = " + idx_name(r, "_" + std::to_string(j)) +
                 ";");
        }
      line("__syncthreads();");
      for (auto& r : reds) {
        Binding b;
        b.min_scope = tile_scope;
        b.dims = group_mask(cg);
        for (int j = 0; j < V; ++j) {
          std::string slot = "[tx * " + std::to_string(V) + " + " + std::to_string(j) + "]";
          std::string res = "r" + std::to_string(r.node) + "_" + std::to_string(j);
          std::string a = "kiln_c" + std::to_string(r.node) + slot,
                      x = r.arg ? "kiln_cx" + std::to_string(r.node) + slot : "";
          line_at(tile_scope, "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, a, x) + ";");
          b.text.push_back(res);
        }
        if (V == 1) b.dims = group_mask(cg);
        bound_[r.node] = b;
      }
      line("__syncthreads();");
    }
    if (has_level(sched::Level::Row) || !fins.empty()) {
      // cb and C are multiples of V: a valid thread's lanes are all valid columns.
      open("if (ty == 0 && cvalid)");
      row_stores();
      fold_finals(fins, V);
      close();
    }
    close();
    if (!fins.empty() || has_level(sched::Level::Final)) {
      // Row 0 of the block holds the tile's partials per column thread: combine them in
      // column order within warp 0 (threads of other rows hold the identity).
      if (BX < 32) {
        open("if (ty != 0)");
        for (auto& r : fins)
          line(acc_name(r, "f") + " = " + r.init + ";" + (r.arg ? " " + idx_name(r, "f") + " = -1;" : ""));
        close();
      }
      open("if (threadIdx.x < 32)");
      warp_reduce(fins, "f");
      close();
      if (counter.empty()) counter = counters(tiles + 1);
      finals_epilogue(fins, units, "tile", counter + "[" + std::to_string(tiles) + "]");
    }
  }
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
