#pragma once
// Reduction kernels on the CPU: whole rows per tile (every pass of a row back to back), or, for
// few rows, each pass split into chunks whose partials combine in a fixed order.
#include "kiln/codegen/cpp/kernel_writer.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::detail {

/// Reduction kernels whose tiles each cover whole rows: every pass of a row runs back to back
/// in one tile (the row stays in cache between passes).
inline void KernelWriter::reduce_tiles() {
  const auto& p = k_.loops;
  const i64 tiles = p.tiles();
  std::vector<Red> fins = final_reds();
  declare_final_partials(fins, tiles);
  open(shared_loop(" schedule(static)"),
       "for (long long t = 0; t < " + (sym_ ? extents_text(p.kept_groups) : std::to_string(tiles) + "LL") + "; ++t)",
       kept_mask());
  tile_vars("t");
  tile_scope_ = top();
  for (auto& d : stash_decls_) line(d);
  if (!stash_names_.empty() || analysis_ || !p.column) stash_pos_ = reduced_position();
  for (int pass = 1; pass <= k_.passes; ++pass) {
    std::vector<Red> reds = phase_reds(pass);
    block_sums(reds);
    for (auto& r : reds) declare_acc(r, p.column ? std::to_string(p.block) : "");
    const i64 chunk = reds.empty() && !stash_pos_.empty() ? stream_chunk_elems(pass) : 0;
    if (chunk > 0) {
      // The last pass of a streamed row, 64 bytes at a time: computed, then stored around
      // the cache (kiln_stream_chunk), chunk by chunk.
      const int gi = p.red_groups.front();
      const std::string c = std::to_string(chunk) + "LL";
      open("", "for (long long kc = 0; kc < " + std::to_string(extent(gi)) + "LL; kc += " + c + ")", 0);
      chunk_scope_ = top();
      open("#pragma omp simd", "for (long long " + var(gi) + " = kc; " + var(gi) + " < kc + " + c + "; ++" + var(gi) + ")",
           group_mask(gi));
      chunk_ = chunk;
      pass_ = pass;
      streaming_ = true;
      pass_body(reds, pass);
      streaming_ = false;
      pass_ = 0;
      chunk_ = 0;
      close();
      flush_chunk_streams();
      close();
      line("kiln_stream_fence();");
      continue;
    }
    int opened = open_reduced_loops(reds, "", "");
    pass_ = p.column ? 0 : pass;
    streaming_ = !analysis_ && !p.column && stash_pos_.size() > 0;
    pass_body(reds, pass);
    streaming_ = false;
    pass_ = 0;
    close_reduced_loops(reds, opened);
    flush_streams();
    for (auto& r : reds) {
      std::string res = "r" + std::to_string(r.node);
      if (p.column) {
        line(std::string(ctype(r.out)) + " " + res + "[" + std::to_string(p.block) + "];");
        line("for (long long kk = 0; kk < kn; ++kk) " + res +
             "[kk] = " + finish(r, r.name + "[kk]", "x" + r.name + "[kk]", "") + ";");
        bound_[r.node] = Binding{res + "[kk]", group_mask(p.vec_group), 1};
      } else {
        line("const " + std::string(ctype(r.out)) + " " + res + " = " +
             finish(r, r.name, "x" + r.name, r.flag ? "f" + r.name : "") + ";");
        bound_[r.node] = Binding{res, 0, 1};
      }
    }
  }
  row_stores();
  finals_partial(fins, "t");
  close();
  if (!fins.empty()) begin_serial();
  finals_combine(fins, tiles);
}

/// Reduction kernels with few rows: each pass is split into chunks along the outer reduced
/// loop, computed in parallel, and the chunks' partials are combined in a fixed order.
inline void KernelWriter::reduce_split() {
  const auto& p = k_.loops;
  const i64 tiles = p.tiles();
  const i64 chunks = p.chunks;
  const i64 lanes = p.column ? p.block : 1;
  const i64 e0 = extent(p.red_groups.front());
  std::vector<Red> fins = final_reds();
  auto lane = [&](const std::string& base) {
    return p.column ? base + " * " + std::to_string(lanes) + "LL + kk" : base;
  };
  for (int pass = 1; pass <= k_.passes; ++pass) {
    std::vector<Red> reds = phase_reds(pass);
    for (auto& r : reds) {
      acc_array(r.acc_t, "pp" + std::to_string(r.node), tiles * chunks * lanes);
      if (r.arg) acc_array("long long", "px" + std::to_string(r.node), tiles * chunks * lanes);
    }
    open(shared_loop(" schedule(static)"), "for (long long u = 0; u < " + std::to_string(tiles * chunks) + "LL; ++u)",
         kept_mask());
    line("const long long t = u / " + std::to_string(chunks) + "LL, ch = u % " + std::to_string(chunks) + "LL;");
    tile_vars("t");
    line("const long long lo = ch * " + std::to_string(p.chunk_len) + "LL;");
    line("const long long hi = lo + " + std::to_string(p.chunk_len) + "LL < " + std::to_string(e0) + "LL ? lo + " +
         std::to_string(p.chunk_len) + "LL : " + std::to_string(e0) + "LL;");
    for (auto& r : reds) declare_acc(r, p.column ? std::to_string(p.block) : "");
    int opened = open_reduced_loops(reds, "lo", "hi");
    pass_body(reds, pass);
    close_reduced_loops(reds, opened);
    for (auto& r : reds) {
      std::string pv = "pp" + std::to_string(r.node), px = "px" + std::to_string(r.node);
      if (p.column) {
        line("for (long long kk = 0; kk < kn; ++kk) { " + pv + "[" + lane("u") + "] = " + r.name + "[kk];" +
             (r.arg ? " " + px + "[" + lane("u") + "] = x" + r.name + "[kk];" : "") + " }");
      } else {
        line(pv + "[u] = " + (r.flag ? "f" + r.name + " ? " + nan_of(r) + " : " + r.name : r.name) + ";");
        if (r.arg) line(px + "[u] = x" + r.name + ";");
      }
    }
    close();
    // Combine the chunks of every row in order.
    if (!reds.empty()) begin_serial();
    for (auto& r : reds) {
      std::string res = "rr" + std::to_string(r.node);
      acc_array(ctype(r.out), res, tiles * lanes);
      open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", 0);
      if (p.column) {
        block_vars("t");
        open("", "for (long long kk = 0; kk < kn; ++kk)", 0);
      }
      line(r.acc_t + " a = " + r.init + "; long long x = -1; (void)x;");
      std::string at = "(t * " + std::to_string(chunks) + "LL + c)";
      line("for (long long c = 0; c < " + std::to_string(chunks) + "LL; ++c) { " +
           merge(r, "a", "x", "pp" + std::to_string(r.node) + "[" + lane(at) + "]",
                 r.arg ? "px" + std::to_string(r.node) + "[" + lane(at) + "]" : "0") +
           " }");
      line(res + "[" + lane("t") + "] = " + finish(r, "a", "x", "") + ";");
      if (p.column) close();
      close();
      bound_[r.node] = Binding{res + "[" + lane("t") + "]", p.column ? group_mask(p.vec_group) : 0, 1};
    }
  }
  // Row-level stores and finals, one tile at a time (there are few tiles).
  bool any_row = false;
  for (auto& st : k_.stores) any_row = any_row || st.level == sched::Level::Row;
  if (any_row) {
    begin_serial();
    open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", kept_mask());
    tile_vars("t");
    row_stores();
    close();
  }
  if (!fins.empty()) begin_serial();
  if (!fins.empty()) {
    declare_final_partials(fins, tiles);
    open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", kept_mask());
    tile_vars("t");
    finals_partial(fins, "t");
    close();
  }
  finals_combine(fins, tiles);
}

}  // namespace kiln::codegen::detail

KILN_COLD_CODE_END
