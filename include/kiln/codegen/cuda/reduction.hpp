#pragma once
// The pieces the reduction kernels share (row, split-row and column kernels): accumulators and
// their finish, a pass's per-thread fold, the cross-thread combination (warp shuffles, the
// block reduce through shared memory, partials that the last block folds in order), finals
// (reductions over all rows), the row-level gathers issued at a row's start and the row
// cache's reads.
#include "kiln/codegen/cuda/kernel_writer.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

class ReductionKernel : public KernelWriter {
 public:
  using KernelWriter::KernelWriter;

 protected:
  /// A row kind's first planning step: fixes the vector lanes along the row's innermost reduced
  /// group (the decode state every later read follows); the lanes.
  int plan_row_lanes() {
    const int inner = k_.loops.red_groups.empty() ? -1 : k_.loops.red_groups.back();
    set_vec(inner, choose_vec(inner, true));
    return vec_;
  }

  /// Whether the kernel's reduction j is folded element by element in pass p's loop.
  bool folded_in(std::size_t j, int p) const { return k_.phase[j] == p; }

  /// Transcendental values along the row that more than one pass computes (softmax's
  /// exp(x - max): the sum's pass and the output's pass): kept in registers after the first.
  std::map<std::string, int> multi_pass_values() const {
    std::map<std::string, std::set<int>> passes;
    std::map<std::string, int> nodes;
    Index id = sched::identity_index(k_.space);
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::unordered_set<std::string> seen;
      std::function<void(int, const Index&)> walk = [&](int nid, const Index& idx) {
        const std::string key = std::to_string(nid) + "|" + sched::index_key(idx);
        if (!seen.insert(key).second) return;
        const ir::GraphNode& n = node(nid);
        if (ir::op_kind(n.op) == ir::OpKind::Leaf || ir::op_kind(n.op) == ir::OpKind::Reduce ||
            ir::op_kind(n.op) == ir::OpKind::IndexMap)
          return;
        if (sched::detail::reads_memory(s_, nid, kid_, g_)) return;  // stored by another kernel: loaded, not computed
        if (ir::has_flag(n.op, ir::kMathCall) && n.dtype == DType::Float32) {
          passes[key].insert(pass);
          nodes[key] = nid;
        }
        for (std::size_t k = 0; k < n.inputs.size(); ++k)
          walk(n.inputs[k], sched::input_index(g_, n, k, idx, k_.space));
      };
      for (std::size_t j = 0; j < k_.reductions.size(); ++j)
        if (folded_in(j, pass)) walk(node(k_.reductions[j]).inputs[0], id);
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Full && st.pass == pass) walk(st.node, id);
    }
    std::map<std::string, int> out;
    for (auto& [key, ps] : passes)
      if (ps.size() > 1) out[key] = nodes[key];
    return out;
  }


  // ---- reductions: shared pieces --------------------------------------------------------------
  std::vector<Red> phase_reds(int p) const {
    std::vector<Red> v;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (folded_in(j, p)) v.push_back(red_info(g_, k_.reductions[j]));
    return v;
  }
  std::vector<Red> final_reds() const {
    std::vector<Red> v;
    for (int f : k_.finals) v.push_back(red_info(g_, f));
    return v;
  }
  static std::string acc_name(const Red& r, const std::string& suffix = "") {
    return "a" + std::to_string(r.node) + suffix;
  }
  static std::string idx_name(const Red& r, const std::string& suffix = "") {
    return "x" + std::to_string(r.node) + suffix;
  }
  void declare_acc(const Red& r, const std::string& suffix = "") {
    line(r.acc_t + " " + acc_name(r, suffix) + " = " + r.init + ";");
    if (r.arg) line("long long " + idx_name(r, suffix) + " = -1;");
    if (r.online_sum >= 0) line("double " + sum_name(r, suffix) + " = 0.0;");
  }
  static std::string sum_name(const Red& r, const std::string& suffix = "") {
    return "a" + std::to_string(r.online_sum) + suffix;
  }
  std::string finish(const Red& r, const std::string& a, const std::string& x) {
    return c_family::finish(r, a, x, "", c_family::kCudaDialect, needs_);
  }
  /// The position of the element along the reduced dims (arg reductions), and of the current
  /// row among all rows (arg finals): sched's index algebra, rendered for `lane`.
  std::string reduced_position(int lane) const {
    return "(long long)" + render(sched::reduced_position(k_), lane);
  }
  std::string row_position(int lane) const { return "(long long)" + render(sched::row_position(k_), lane); }

  /// Folds every lane's value of the inputs of `reds` into accumulators (`per_lane`: one
  /// accumulator per lane, for columns), then writes the Full stores of `pass`.
  /// Whether every term of a float sum is >= 0 (or NaN) by construction: then the lanes of a
  /// vector may be added in f32 first (pairwise: a few ulp of a sum of like-signed terms)
  /// before the double accumulator, one conversion per vector instead of per element.
  bool nonnegative(int id) const {
    const ir::GraphNode& n = node(id);
    switch (n.op) {
      case Op::Exp:
      case Op::Exp2:
      case Op::Abs:
      case Op::Sqrt:
        return true;
      case Op::Mul:
        return n.inputs[0] == n.inputs[1];
      default:
        return false;
    }
  }
  static std::string pairwise(std::vector<std::string> v) {
    while (v.size() > 1) {
      std::vector<std::string> next;
      for (std::size_t i = 0; i + 1 < v.size(); i += 2) next.push_back("(" + v[i] + " + " + v[i + 1] + ")");
      if (v.size() % 2) next.push_back(v.back());
      v = std::move(next);
    }
    return v[0];
  }
  /// Online max and sum of exp over the lanes of one vector: the vector's max first, so the
  /// running max (and the rescale of the sum) changes at most once per vector.
  static std::string online_step_vector(const Red& r, const std::string& m, const std::string& s,
                                        const std::vector<std::string>& v) {
    const bool dbl = r.in == DType::Float64;
    const std::string t = r.acc_t, ex = dbl ? "exp(" : "expf(", ninf = dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)";
    std::string out = "{ " + t + " vm = " + v[0] + "; ";
    for (std::size_t j = 1; j < v.size(); ++j)
      out += "vm = (" + v[j] + " > vm || " + v[j] + " != " + v[j] + ") ? " + v[j] + " : vm; ";
    out += "const " + t + " nm = (vm > " + m + " || vm != vm) ? vm : " + m + "; if (nm != " + m + ") { " + s +
           " *= (double)" + ex + m + " - nm); " + m + " = nm; } ";
    std::vector<std::string> terms;
    for (auto& x : v) terms.push_back(ex + x + " - " + m + ")");
    // Each term is at most 1 (or NaN): added in the compute type first. While the max is
    // still -inf every value so far is -inf and contributes nothing.
    out += "if (" + m + " != " + ninf + ") " + s + " += (double)" + pairwise(terms) + "; }";
    return out;
  }

  void fold_body(const std::vector<Red>& reds, int pass, bool per_lane) {
    Index id = sched::identity_index(k_.space);
    const int lanes = vec_ > 1 ? vec_ : 1;
    for (auto& r : reds) {
      if (!per_lane && lanes > 1 &&
          (r.online_sum >= 0 ||
           (r.op == Op::ReduceSum && r.fl && r.in != DType::Float64 && nonnegative(node(r.node).inputs[0])))) {
        std::vector<std::string> vals;
        for (int j = 0; j < lanes; ++j) vals.push_back(value(node(r.node).inputs[0], id, j).expr);
        if (r.online_sum >= 0)
          line(online_step_vector(r, acc_name(r), sum_name(r), vals));
        else
          line(acc_name(r) + " += (double)" + pairwise(vals) + ";");
        continue;
      }
      for (int j = 0; j < lanes; ++j) {
        Val v = value(node(r.node).inputs[0], id, j);
        std::string sfx = per_lane ? "_" + std::to_string(j) : "";
        if (r.online_sum >= 0)
          line(online_step(r, acc_name(r, sfx), sum_name(r, sfx), v.expr));
        else
          line(step(r, acc_name(r, sfx), idx_name(r, sfx), v.expr, r.arg ? reduced_position(j) : "0"));
      }
    }
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Full && st.pass == pass) store(st, id);
  }

  /// Butterfly over the 32 lanes of each warp (every lane ends with the warp's combination).
  /// An online (max, sum of exp) pair combines its maxima first, then rescales each lane's sum
  /// once to the warp's max and adds the sums: one exp per lane, where merging pairs would
  /// take two per step (ten, each inlined: a fifth of NVRTC's time on N6's kernel).
  void warp_reduce(const std::vector<Red>& reds, const std::string& sfx = "") {
    if (reds.empty()) return;
    std::vector<std::string> merges, sums;
    for (auto& r : reds) {
      const std::string a = acc_name(r, sfx), x = idx_name(r, sfx);
      merges.push_back("{ const " + r.acc_t + " pv = __shfl_xor_sync(0xffffffffu, " + a + ", o);" +
                       (r.arg ? " const long long px = __shfl_xor_sync(0xffffffffu, " + x + ", o);" : "") + " " +
                       merge(r, a, x, "pv", r.arg ? "px" : "0") + " }");
      if (r.online_sum >= 0)
        sums.push_back(sum_name(r, sfx) + " += __shfl_xor_sync(0xffffffffu, " + sum_name(r, sfx) + ", o);");
    }
    if (sums.empty()) {
      butterfly(merges);
      return;
    }
    open("");
    for (auto& r : reds)
      if (r.online_sum >= 0)
        line("const " + r.acc_t + " kiln_om" + std::to_string(r.node) + sfx + " = " + acc_name(r, sfx) + ";");
    butterfly(merges);
    for (auto& r : reds)
      if (r.online_sum >= 0) {
        const std::string own = "kiln_om" + std::to_string(r.node) + sfx;
        line(sum_name(r, sfx) + " = " + rescaled_sum(r, sum_name(r, sfx), own, acc_name(r, sfx)) + ";");
      }
    butterfly(sums);
    close();
  }

  /// The loop over the butterfly's distances o = 16, 8, ..., 1, doing `steps` at each.
  void butterfly(const std::vector<std::string>& steps) {
    open("for (int o = 16; o > 0; o >>= 1)", 0, "#pragma unroll");
    for (auto& st : steps) line(st);
    close();
  }

  /// Online pair `r`'s sum `sum`, kept relative to max `from`, made relative to the larger max
  /// `to`. Equal maxima keep the sum (also two infinities, where the exp would give NaN).
  static std::string rescaled_sum(const Red& r, const std::string& sum, const std::string& from,
                                  const std::string& to) {
    return "(" + from + " == " + to + " ? " + sum + " : " + sum + " * (double)" +
           (r.in == DType::Float64 ? "exp(" : "expf(") + from + " - " + to + "))";
  }

  /// Combines accumulators across the `threads` threads (a multiple of 32, one row) starting
  /// at thread 0 of the block; every thread ends with the result. The warps' partials meet in
  /// shared memory; every thread folds them in warp order (few warps), or every warp reads
  /// them into its lanes and reduces them with a second butterfly (many warps).
  void block_reduce(const std::vector<Red>& reds, int threads, const std::string& sfx = "") {
    warp_reduce(reds, sfx);
    if (threads <= 32 || reds.empty()) return;
    const int warps = threads / 32;
    auto sm = [&](const Red& r, const char* part) { return "kiln_w" + std::to_string(r.node) + part + sfx; };
    for (auto& r : reds) {
      shared_decl(r.acc_t, sm(r, ""), 32);
      if (r.arg) shared_decl("long long", sm(r, "x"), 32);
      if (r.online_sum >= 0) shared_decl("double", sm(r, "s"), 32);
    }
    open("if ((threadIdx.x & 31) == 0)");
    for (auto& r : reds) {
      line(sm(r, "") + "[threadIdx.x >> 5] = " + acc_name(r, sfx) + ";");
      if (r.arg) line(sm(r, "x") + "[threadIdx.x >> 5] = " + idx_name(r, sfx) + ";");
      if (r.online_sum >= 0) line(sm(r, "s") + "[threadIdx.x >> 5] = " + sum_name(r, sfx) + ";");
    }
    close();
    line("__syncthreads();");
    if (warps <= 8) {
      const std::string nw = std::to_string(warps);
      for (auto& r : reds) {
        line(acc_name(r, sfx) + " = " + sm(r, "") + "[0];");
        if (r.arg) line(idx_name(r, sfx) + " = " + sm(r, "x") + "[0];");
        line("for (int w = 1; w < " + nw + "; ++w) " +
             merge(r, acc_name(r, sfx), idx_name(r, sfx), sm(r, "") + "[w]", r.arg ? sm(r, "x") + "[w]" : "0"));
        if (r.online_sum >= 0) {
          // The block's max is known: each warp's sum is rescaled to it once, then added.
          line(sum_name(r, sfx) + " = 0.0;");
          line("for (int w = 0; w < " + nw + "; ++w) " + sum_name(r, sfx) +
               " += " + rescaled_sum(r, sm(r, "s") + "[w]", sm(r, "") + "[w]", acc_name(r, sfx)) + ";");
        }
      }
    } else {
      open("");
      line("const int lane = threadIdx.x & 31;");
      for (auto& r : reds) {
        line(acc_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "") + "[lane] : " + r.init + ";");
        if (r.arg) line(idx_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "x") + "[lane] : -1;");
        if (r.online_sum >= 0)
          line(sum_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "s") + "[lane] : 0.0;");
      }
      warp_reduce(reds, sfx);
      close();
    }
    line("__syncthreads();");
  }

  void shared_decl(const std::string& type, const std::string& name, i64 count) {
    if (!declared_.insert(name).second) return;
    decls_.push_back("__shared__ " + type + " " + name + "[" + std::to_string(std::max<i64>(1, count)) + "];");
  }

  /// The kernel's self-resetting arrival counters (module globals, zero at load).
  std::string counters(i64 count) {
    std::string name = "kiln_cnt_" + info_.name;
    globals_ += "__device__ unsigned int " + name + "[" + std::to_string(std::max<i64>(1, count)) + "];\n";
    return name;
  }

  /// One reduction's partials in scratch memory, read back by a grid's last block: partial u
  /// of the accumulators with suffix `sfx` is element `at(u)` of pv (px: arg indices).
  struct PartialRead {
    Red r;
    std::string pv, px, sfx;
    std::function<std::string(const std::string&)> at;
  };
  /// Merges partials u = first, first + stride, ... < count (in that order) into the
  /// accumulators of `reads`. Four partials are loaded before they are merged: a loop that loads
  /// one partial and merges it before the next load waits a full L2 latency per partial, all in
  /// the one block the grid waits for (R3 on an H200: 16 splits x 4 columns read that way were
  /// 12 of the kernel's 83 us).
  void fold_partials(const std::vector<PartialRead>& reads, const std::string& first, i64 count, i64 stride) {
    if (reads.empty() || count <= 0) return;
    constexpr int kBatch = 4;
    open("for (" + it_ + " u0 = " + first + "; u0 < " + lit(count) + "; u0 += " + lit(kBatch * stride) + ")");
    std::vector<std::vector<std::pair<std::string, std::string>>> got(reads.size());
    for (int b = 0; b < kBatch; ++b) {
      const std::string u = b == 0 ? "u0" : "(u0 + " + lit(b * stride) + ")";
      const std::string ok = b == 0 ? "" : u + " < " + lit(count) + " ? ";
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const PartialRead& pr = reads[i];
        const std::string name = "kiln_p" + std::to_string(i) + "_" + std::to_string(b);
        const std::string v = "((volatile " + pr.r.acc_t + "*)" + pr.pv + ")[" + pr.at(u) + "]";
        line("const " + pr.r.acc_t + " " + name + " = " + (ok.empty() ? v : ok + v + " : " + pr.r.init) + ";");
        std::string xname = "0";
        if (pr.r.arg) {
          xname = name + "x";
          const std::string x = "((volatile long long*)" + pr.px + ")[" + pr.at(u) + "]";
          line("const long long " + xname + " = " + (ok.empty() ? x : ok + x + " : -1LL") + ";");
        }
        got[i].push_back({name, xname});
      }
    }
    for (int b = 0; b < kBatch; ++b)
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const PartialRead& pr = reads[i];
        line(merge(pr.r, acc_name(pr.r, pr.sfx), idx_name(pr.r, pr.sfx), got[i][static_cast<std::size_t>(b)].first,
                   got[i][static_cast<std::size_t>(b)].second));
      }
    close();
  }

  /// Publishes this unit's final partials, and in the unit that arrives last combines every
  /// unit's partials in unit order and writes the Final stores. `fins` accumulators are in
  /// thread 0; `units` is the number of units; `unit` names this block's unit.
  void finals_epilogue(const std::vector<Red>& fins, i64 units, const std::string& unit, const std::string& counter) {
    if (fins.empty() && !has_level(sched::Level::Final)) return;
    std::vector<std::string> pv, px;
    for (auto& r : fins) {
      pv.push_back(scratch_array(r.acc_t, units, acc_bytes(r.acc_t)));
      px.push_back(r.arg ? scratch_array("long long", units, 8) : "");
    }
    shared_decl("unsigned int", "kiln_last", 1);
    open("if (threadIdx.x == 0)");
    for (std::size_t i = 0; i < fins.size(); ++i) {
      line(pv[i] + "[" + unit + "] = " + acc_name(fins[i], "f") + ";");
      if (fins[i].arg) line(px[i] + "[" + unit + "] = " + idx_name(fins[i], "f") + ";");
    }
    line("__threadfence();");
    line("kiln_last[0] = atomicAdd(&" + counter + ", 1u) == " + std::to_string(units - 1) + "u;");
    close();
    line("__syncthreads();");
    open("if (kiln_last[0])");
    line("__threadfence();");
    for (auto& r : fins) declare_acc(r, "g");
    std::vector<PartialRead> reads;
    for (std::size_t i = 0; i < fins.size(); ++i)
      reads.push_back({fins[i], pv[i], px[i], "g", [](const std::string& u) { return u; }});
    fold_partials(reads, "(" + it_ + ")threadIdx.x", units, info_.block);
    block_reduce(fins, static_cast<int>(info_.block), "g");
    for (auto& r : fins) {
      std::string res = "r" + std::to_string(r.node);
      line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r, "g"), idx_name(r, "g")) +
           ";");
      bound_[r.node] = Binding{{res}, 0, top()};
    }
    open("if (threadIdx.x == 0)");
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Final) store(st, sched::detail::zero_index(node(st.node).shape));
    line(counter + " = 0u;");
    close();
    close();
  }
  bool has_level(sched::Level l) const {
    for (auto& st : k_.stores)
      if (st.level == l) return true;
    return false;
  }

  /// Row-level stores of the current row (every value is at hand in every thread).
  void row_stores() {
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Row) store(st, sched::detail::level_index(k_, st.level, node(st.node).shape));
  }

  /// Folds the current row's value of each final's input into its accumulator.
  void fold_finals(const std::vector<Red>& fins, int lanes) {
    Index ri = sched::identity_index(k_.row_shape());
    for (int j = 0; j < lanes; ++j)
      for (auto& r : fins) {
        Val v = value(node(r.node).inputs[0], ri, j);
        line(step(r, acc_name(r, "f"), idx_name(r, "f"), v.expr, r.arg ? row_position(j) : "0"));
      }
  }

  // ---- row-level gathers ------------------------------------------------------------------------
  /// Issues the loads of the row-level gathers (an element per row that a final or a row store
  /// reads, e.g. cross_entropy's x[target]) at the row's start, before its passes: the index's and
  /// the element's loads then overlap the row's reads instead of stalling the block after them
  /// (two DRAM latencies a row). Gathers that read this kernel's own reductions wait for them.
  void prefetch_row_gathers() {
    std::vector<std::pair<int, Index>> found;
    auto collect = [&](int root, const Index& idx) {
      sched::detail::Visitor v;
      v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
      v.gather = [&](int n, const Index& i) { found.emplace_back(n, i); };
      std::unordered_set<std::string> seen;
      sched::detail::walk(g_, root, idx, k_.space, v, seen);
    };
    for (int f : k_.finals) collect(node(f).inputs[0], sched::identity_index(k_.row_shape()));
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Row && !ir::is_reduction(node(st.node).op))
        collect(st.node, sched::detail::level_index(k_, st.level, node(st.node).shape));
    int issued = 0;
    for (auto& [gid, idx] : found) {
      // A gather read at a gathered position (x[a[b[i]]]) is issued where its outer gather is:
      // the walk names that position by the scheduler's placeholder, not by the variable.
      bool nested = false;
      for (auto& e : idx) nested = nested || !e.values.empty() || !e.text.empty();
      if (nested) continue;
      bool own = false;
      sched::detail::Visitor v;
      v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
      v.reduction = [&](int n, const Index&) {
        own = own || (ir::is_reduction(node(n).op) && s_.owner[static_cast<std::size_t>(n)] == kid_);
      };
      std::unordered_set<std::string> seen;
      sched::detail::walk(g_, gid, idx, k_.space, v, seen);
      if (own) continue;
      value(gid, idx, 0);
      ++issued;
    }
    if (issued > 0) info_.strategy += ", " + std::to_string(issued) + " row gather(s) issued at the row's start";
  }

  // ---- row reductions -------------------------------------------------------------------------
  i64 reduced_extent() const {
    i64 r = 1;
    for (int gi : k_.loops.red_groups) r *= extent(gi);
    return r;
  }

  /// Leaf reads along the row that more than one pass needs: kept on chip after the first.
  /// A read every row shares (a layer norm's weight, broadcast down the rows) is not kept:
  /// the rows' blocks find it in L1 and L2, and the registers it would take are what keeps
  /// the rows themselves on chip (B1's backward row: its row, weight, bias and weight again
  /// came to 64 words a thread, so the row was read from memory in each of four passes).
  std::map<std::string, std::pair<int, std::size_t>> multi_pass_reads() const {
    std::map<std::string, std::set<int>> passes;
    std::map<std::string, std::pair<int, std::size_t>> info;  // key -> (node, bytes per slot)
    const std::uint64_t red_mask = groups_mask(k_.loops.red_groups);
    const std::uint64_t row_mask = k_.loops.rows > 1 ? groups_mask(k_.loops.kept_groups) : 0;
    Index id = sched::identity_index(k_.space);
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<int> roots;
      for (std::size_t j = 0; j < k_.reductions.size(); ++j)
        if (folded_in(j, pass)) roots.push_back(node(k_.reductions[j]).inputs[0]);
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Full && st.pass == pass) roots.push_back(st.node);
      for (int root : roots) {
        sched::detail::Visitor v;
        v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
        v.leaf = [&](int n, const Index& i) {
          const ir::GraphNode& nn = node(n);
          IndexExpr off = sched::strided_offset(i, nn.strides, nn.shape);
          if (!(off.dep_mask() & red_mask) || !vector_ok(off, al_.input(nn.leaf))) return;
          if (row_mask != 0 && !(off.dep_mask() & row_mask)) return;  // shared by every row
          std::string key = "L" + std::to_string(n) + "|" + off.key();
          passes[key].insert(pass);
          info[key] = {n, itemsize(nn.dtype) * static_cast<std::size_t>(lane_dep(off) ? vec_ : 1)};
        };
        std::unordered_set<std::string> seen;
        sched::detail::walk(g_, root, id, k_.space, v, seen);
      }
    }
    std::map<std::string, std::pair<int, std::size_t>> out;
    for (auto& [key, ps] : passes)
      if (ps.size() > 1) out[key] = info[key];
    return out;
  }

  /// The sum of phase p+1 that folds into phase p's max in one pass (online softmax), or -1:
  /// phase p+1 is exactly sum(exp(A - broadcast(max(A)))) with the max in phase p, and pass p+1
  /// stores nothing.
  int online_sum_of(int p, int& max_node) const {
    std::vector<int> next;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (folded_in(j, p + 1)) next.push_back(k_.reductions[j]);
    if (next.size() != 1) return -1;
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Full && st.pass == p + 1) return -1;
    const ir::GraphNode& sum = node(next[0]);
    if (sum.op != Op::ReduceSum) return -1;
    const ir::GraphNode& e = node(sum.inputs[0]);
    if (e.op != Op::Exp || (e.dtype != DType::Float32 && e.dtype != DType::Float64)) return -1;
    const ir::GraphNode& d = node(e.inputs[0]);
    if (d.op != Op::Sub) return -1;
    const ir::GraphNode& b = node(d.inputs[1]);
    if (b.op != Op::Broadcast) return -1;
    const int m = b.inputs[0];
    const ir::GraphNode& mx = node(m);
    if (mx.op != Op::ReduceMax || mx.inputs[0] != d.inputs[0] || s_.owner[static_cast<std::size_t>(m)] != kid_)
      return -1;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (k_.reductions[j] == m && k_.phase[j] != p) return -1;
    max_node = m;
    return next[0];
  }
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
