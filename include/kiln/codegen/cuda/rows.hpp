#pragma once
// Row reductions: a warp (short rows) or a block per row; the row is read once into
// registers (or shared memory) when later passes need it again.
#include "kiln/codegen/cuda/reduction.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

class RowKernel : public ReductionKernel {
 public:
  using ReductionKernel::ReductionKernel;

  /// Where a row that later passes read again is kept between passes.
  enum class RowCache { None, Registers, Shared };

  /// The launch of a row kernel, decided before any text.
  struct Plan {
    i64 rows = 0;             ///< rows of the kernel (static sizes)
    i64 reduced = 0;          ///< elements per row
    int lanes = 1;            ///< vector lanes per thread along the row
    int threads = 32;         ///< threads per row
    i64 slots = 0;            ///< vectors per thread per pass (the unrolled loop's trip count)
    int rows_per_block = 1;   ///< rows per block (a warp per row: several)
    bool guard = false;       ///< the last slot runs past the row's end
    RowCache cache = RowCache::None;
    std::map<std::string, std::pair<int, std::size_t>> reads;  ///< leaf reads kept between passes
    std::map<std::string, int> values;  ///< values kept in registers between passes
    /// Softmax's max and sum of exp in one pass: phase -> (max node, sum node); `skip` holds the
    /// passes that this folds away.
    std::map<int, std::pair<int, int>> online;
    std::set<int> skip;
    bool one_row_per_warp = false;  ///< the grid covers every row: each warp (or block) takes one
    CudaKernelInfo launch;  ///< block, grid (or its rule), dynamic shared memory, strategy
  };

  /// Threads per row: a warp for short rows, else enough threads for about `vectors_per_thread`
  /// vectors each (a power of two, at most 1024).
  int threads_for(i64 R, int V, int vectors_per_thread) const {
    const i64 vpt = std::max(1, vectors_per_thread);
    int t = 32;
    if (R > static_cast<i64>(32) * V * std::max(1, t_.warp_row_vectors)) {
      i64 want = (R + V * vpt - 1) / (V * vpt);
      t = 64;
      while (t < 1024 && t < want) t *= 2;
    }
    return t;
  }

  /// The plan step. It fixes the row's vector lanes (the decode state every later read
  /// follows); it writes no text.
  Plan plan() {
    Plan pl;
    const int V = pl.lanes = plan_row_lanes();
    const auto& p = k_.loops;
    pl.rows = p.rows;
    const i64 R = pl.reduced = reduced_extent();
    int T = threads_for(R, V, t_.row_vectors_per_thread);
    i64 E = R == 0 ? 0 : (R + static_cast<i64>(T) * V - 1) / (static_cast<i64>(T) * V);
    // (A symbolic number of rows may be large: 8.)
    const i64 warp_rows = std::clamp(t_.warp_rows_per_block, 1, 32);
    const int rpb = T == 32 ? static_cast<int>(sym_ ? warp_rows : std::max<i64>(1, std::min<i64>(warp_rows, pl.rows)))
                            : 1;
    // The row cache: registers when small, else shared memory, else none (re-read).
    pl.reads = multi_pass_reads();
    std::size_t slot_bytes = 0;
    for (auto& [key, info] : pl.reads) slot_bytes += (info.second + 15) / 16 * 16;
    const i64 reg_words = E * static_cast<i64>(slot_bytes) / 4;
    const i64 row_bytes = E * static_cast<i64>(slot_bytes) * T * rpb;
    if (!pl.reads.empty() && E > 0) {
      const i64 reg_limit = std::min<i64>(32, 65536 / (T * rpb) - 40);
      if (reg_words <= reg_limit)
        pl.cache = RowCache::Registers;
      else if (t_.row_cache_shared && row_bytes <= t_.max_shared_per_block_optin - 8192)
        pl.cache = RowCache::Shared;
    }
    if (pl.cache == RowCache::None && !pl.reads.empty() && rpb == 1 && t_.row_vectors_per_thread_uncached > 0) {
      // A long row that later passes re-read from L2: fewer threads per row with more vectors
      // each keep several rows in flight per multiprocessor, so one row's block reduction
      // overlaps another's loads (N6, 128 KiB rows: 1024 threads 0.41 x copy, 256 threads 0.76).
      T = threads_for(R, V, t_.row_vectors_per_thread_uncached);
      E = R == 0 ? 0 : (R + static_cast<i64>(T) * V - 1) / (static_cast<i64>(T) * V);
    }
    pl.threads = T;
    pl.slots = E;
    pl.rows_per_block = rpb;
    pl.guard = R % (static_cast<i64>(T) * V) != 0;
    pl.launch.block = static_cast<unsigned>(T * rpb);
    // Values more than one pass computes, kept in registers beside a register-cached row when
    // the budget allows (at most 64 words per thread in all).
    if (pl.cache == RowCache::Registers) {
      pl.values = multi_pass_values();
      const i64 value_words = E * V * static_cast<i64>(pl.values.size());
      const i64 limit = std::min<i64>(64, 65536 / (T * rpb) - 40);
      if (pl.values.empty() || reg_words + value_words > limit) pl.values.clear();
    }
    if (pl.cache == RowCache::Shared) pl.launch.shared_bytes = static_cast<unsigned>(row_bytes);
    // One row (a warp's rows) per block: blocks that loop over many rows would run in uneven
    // waves whenever fewer fit on the GPU at once than the grid holds.
    // A symbolic size: the rows are n times the other kept dims, and the grid follows n.
    // (Kept dims with an empty one: no rows whatever the size, one block that does nothing.)
    if (sym_ && per_size(p.kept_groups) > 0) {
      pl.launch.grid = 0;
      pl.launch.grid_rule = CudaGridRule{per_size(p.kept_groups), 1, rpb, i64(1) << 30};
    } else {
      pl.launch.grid =
          static_cast<unsigned>(std::max<i64>(1, std::min<i64>((pl.rows + rpb - 1) / rpb, i64(1) << 30)));
      pl.one_row_per_warp = static_cast<i64>(pl.launch.grid) * rpb >= pl.rows;
    }
    pl.launch.strategy = "row reduction, " + std::to_string(T) + " thread(s) per row, " + std::to_string(V) +
                         " lane(s), " + std::to_string(E) + " slot(s), row " +
                         (pl.cache == RowCache::Registers ? "cached in registers"
                          : pl.cache == RowCache::Shared  ? "cached in shared memory"
                                                          : "read per pass") +
                         ", grid " + (pl.launch.grid == 0 ? rule_text(pl.launch.grid_rule) : std::to_string(pl.launch.grid)) + "x" +
                         std::to_string(pl.launch.block);
    // A row that is not in registers is read once less when softmax's max and sum of exp
    // share a pass.
    if (pl.cache != RowCache::Registers)
      for (int ph = 1; ph < k_.phases; ++ph) {
        int m = -1, sum = online_sum_of(ph, m);
        if (sum >= 0 && !pl.skip.count(ph)) {
          pl.online[ph] = {m, sum};
          pl.skip.insert(ph + 1);
        }
      }
    return pl;
  }

  /// The print step: the kernel's text for `pl`.
  void print(const Plan& pl) {
    const auto& p = k_.loops;
    const i64 rows = pl.rows, R = pl.reduced, E = pl.slots;
    const int V = pl.lanes, T = pl.threads, rpb = pl.rows_per_block;
    const bool guard = pl.guard;
    const int mode = pl.cache == RowCache::None ? 0 : pl.cache == RowCache::Registers ? 1 : 2;
    const auto& reads = pl.reads;
    const auto& values = pl.values;
    const auto& online = pl.online;
    const auto& skip = pl.skip;
    row_threads_ = T;
    const std::string name = info_.name;
    info_ = pl.launch;
    info_.name = name;
    if (mode == 2) line("KILN_EXTERN_SMEM(kiln_dsm);");
    std::string rows_text = lit(rows);
    if (sym_) {
      rows_text = "kiln_rows";
      line("const long long kiln_rows = " + std::string(kSizeVar) + " * " + lit(per_size(p.kept_groups)) + ";");
    }

    line("const int tid = " + std::string(rpb > 1 ? "threadIdx.x & 31" : "threadIdx.x") + ";");
    std::vector<Red> fins = final_reds();
    for (auto& r : fins) declare_acc(r, "f");
    const std::string rowv =
        rpb > 1 ? "(" + it_ + ")blockIdx.x * " + lit(rpb) + " + (threadIdx.x >> 5)" : "(" + it_ + ")blockIdx.x";
    if (pl.one_row_per_warp) {
      // The grid covers every row: no loop over rows. (A loop there, around the row's shuffles,
      // also crashed NVRTC 13.0's optimizer for one permuted store: docs/fuzzing.md.)
      open("");
      line("const " + it_ + " row = " + rowv + ";");
      open("if (row < " + rows_text + ")", groups_mask(p.kept_groups));
    } else {
      open("for (" + it_ + " row = " + rowv + "; row < " + rows_text + "; row += (" + it_ + ")gridDim.x * " +
               lit(rpb) + ")",
           groups_mask(p.kept_groups));
    }
    decode("row", p.kept_groups);
    const int row_scope = top();
    prefetch_row_gathers();
    // Declare the cache.
    slot_var_ = "s";
    std::size_t dsm_off = 0;
    for (auto& [key, info] : reads) {
      if (mode == 0) break;
      CacheSlot cs;
      std::size_t cb = std::min<std::size_t>(info.second, 16);
      cs.nch = info.second >= 16 ? info.second / 16 : 1;
      cs.type = chunk_type(cb);
      cs.name = fresh("kc");
      if (mode == 1) {
        line(cs.type + " " + cs.name + "[" + std::to_string(E * static_cast<i64>(cs.nch)) + "];");
      } else {
        cs.shared = true;
        // Each thread reads back only what it wrote: no barrier needed.
        dsm_off = (dsm_off + 15) / 16 * 16;
        line(cs.type + "* " + cs.name + " = (" + cs.type + "*)(kiln_dsm + " + std::to_string(dsm_off) + ");");
        dsm_off += static_cast<std::size_t>(E) * info_.block * cs.nch * cb;
      }
      cache_[key] = cs;
    }
    vcache_.clear();
    for (auto& [key, nid] : values) {
      (void)nid;
      std::string name = fresh("kv");
      line("float " + name + "[" + std::to_string(E * V) + "];");
      vcache_[key] = ValueSlot{name, 0};
    }
    if (!vcache_.empty())
      info_.strategy += ", " + std::to_string(vcache_.size()) + " value(s) kept in registers between passes";
    if (!online.empty()) info_.strategy += ", online max and sum of exp";
    for (int pass = 1; pass <= k_.passes; ++pass) {
      if (skip.count(pass)) continue;
      std::vector<Red> reds = phase_reds(pass);
      auto on = online.find(pass);
      if (on != online.end())
        for (auto& r : reds)
          if (r.node == on->second.first) r.online_sum = on->second.second;
      for (auto& r : reds) declare_acc(r);
      std::string pragma =
          mode == 1 ? "#pragma unroll" : "#pragma unroll " + std::to_string(std::max(1, t_.row_unroll_uncached));
      if (E > 0) {
        open("for (int s = 0; s < " + std::to_string(E) + "; ++s)", 0, pragma);
        line("const " + it_ + " pos = ((" + it_ + ")s * " + lit(T) + " + tid) * " + lit(V) + ";");
        open(guard ? "if (pos < " + lit(R) + ")" : "", groups_mask(p.red_groups));
        decode("pos", p.red_groups);
        cur_pass_ = pass;
        loop_scope_ = top();
        fold_body(reds, pass, false);
        cur_pass_ = 0;
        loop_scope_ = -1;
        close();
        close();
      }
      block_reduce(reds, T);
      for (auto& r : reds) {
        std::string res = "r" + std::to_string(r.node);
        line_at(row_scope,
                "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r), idx_name(r)) + ";");
        bound_[r.node] = Binding{{res}, 0, row_scope};
        if (r.online_sum >= 0) {
          // Every term of an all -inf row is exp(-inf - -inf) = NaN in the reference.
          const ir::GraphNode& sn = node(r.online_sum);
          const bool dbl = r.in == DType::Float64;
          std::string sres = "r" + std::to_string(r.online_sum);
          std::string sv = round16("(" + std::string(ctype(sn.dtype)) + ")" + sum_name(r), sn.dtype);
          if (R > 0)
            sv = "(" + acc_name(r) + " == " + (dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)") + " ? " +
                 (dbl ? "KILN_NAN_D" : "KILN_NAN_F") + " : " + sv + ")";
          line_at(row_scope, "const " + std::string(ctype(sn.dtype)) + " " + sres + " = " + sv + ";");
          bound_[r.online_sum] = Binding{{sres}, 0, row_scope};
        }
      }
    }
    if (has_level(sched::Level::Row) || !fins.empty()) {
      open("if (tid == 0)");
      row_stores();
      fold_finals(fins, 1);
      close();
    }
    close();
    if (pl.one_row_per_warp) close();
    // Finals: thread 0 of each warp holds its rows' partial; warp partials combine in order.
    if (!fins.empty() || has_level(sched::Level::Final)) {
      if (rpb > 1) {
        for (auto& r : fins) {
          shared_decl(r.acc_t, "kiln_fw" + std::to_string(r.node), rpb);
          if (r.arg) shared_decl("long long", "kiln_fwx" + std::to_string(r.node), rpb);
        }
        open("if (tid == 0)");
        for (auto& r : fins) {
          line("kiln_fw" + std::to_string(r.node) + "[threadIdx.x >> 5] = " + acc_name(r, "f") + ";");
          if (r.arg) line("kiln_fwx" + std::to_string(r.node) + "[threadIdx.x >> 5] = " + idx_name(r, "f") + ";");
        }
        close();
        line("__syncthreads();");
        open("if (threadIdx.x == 0)");
        for (auto& r : fins)
          line("for (int w = 1; w < " + std::to_string(rpb) + "; ++w) " +
               merge(r, acc_name(r, "f"), idx_name(r, "f"), "kiln_fw" + std::to_string(r.node) + "[w]",
                     r.arg ? "kiln_fwx" + std::to_string(r.node) + "[w]" : "0"));
        close();
      }
      finals_epilogue(fins, info_.grid, "blockIdx.x", counters(1) + "[0]");
    }
  }
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
