#pragma once
// The step planner: a graph holding library ops (matrix products) becomes a sequence of
// steps: generated-kernel segments (each an ordinary graph for the fusion scheduler) and
// library calls between them.
//
// Every node gets a level: leaves 0, a library op one more than the highest of its operands,
// any other node the highest of its inputs. Segment s computes the nodes of level s, after
// the library calls of level s; so everything after a product that a kernel can compute (its
// pointwise consumers, a softmax over its rows) fuses into the one segment that follows it.
// Values a later step needs are written to memory by the segment of their level: a library
// call's operands (unless they are leaves the library can read through their strides), and
// reductions of a lower level; cheap pointwise values of a lower level are recomputed, as the
// fusion scheduler does inside a segment. With `fuse_epilogues` (cuBLASLt), a product's bias
// add and activation (relu, tanh-form gelu) join the call itself when the product has no
// other reader. A product with an empty result or an empty inner dim is no call: its value is
// a zero constant of the segment.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/decomp/decompose.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/gemm.hpp"
#include "kiln/sched/schedule.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::sched {

/// Memory a step reads or writes: one of the graph's leaves or outputs, or a temporary.
struct Slot {
  enum Kind : std::uint8_t { None, Leaf, Output, Temp };
  Kind kind = None;
  int index = -1;
  Strides strides;  ///< element strides of the value in that memory
  /// Bytes from the memory's start to the value's first element: a view into memory that holds
  /// a larger value (an attention's operand read in place from the product that computed q, k
  /// and v together; a gradient written into its part of the concatenation that reads it).
  std::int64_t byte_offset = 0;
  bool operator==(const Slot&) const = default;
};

/// A buffer between steps (contiguous).
struct StepTemp {
  Shape shape;
  DType dtype;
};

/// Generated kernels: `graph` is an ordinary graph (no library ops) whose leaf i is bound to
/// leaves[i] and whose output i is written to outputs[i].
struct Segment {
  ir::Graph graph;
  std::vector<Slot> leaves;
  std::vector<Slot> outputs;
};

/// What a library product applies before storing (the call's epilogue). GeluTanhGrad is a
/// backward's step through a tanh-form GELU: the product (the gradient of the GELU's output)
/// times the GELU's derivative at its input, which the call reads from `LibraryCall::aux`.
enum class Activation : std::uint8_t { None, Relu, GeluTanh, GeluTanhGrad };

/// One library product: out = activation(a @ b + bias) over the batch dims of `shape`.
struct LibraryCall {
  int node = -1;                  ///< the MatMul node of the original graph
  int result = -1;                ///< the node whose value the call produces (the last absorbed epilogue op)
  Shape a_shape, b_shape, shape;  ///< operands and result ([..., M, K], [..., K, N], [..., M, N])
  DType dtype = DType::Float32;   ///< operands' and result's dtype
  Slot a, b, out;
  bool bias = false;  ///< a bias of N elements (contiguous) added to every row
  Slot bias_slot;
  DType bias_dtype = DType::Float32;
  Activation activation = Activation::None;
  /// The GELU's input held as an auxiliary matrix of the result's shape (row-major, contiguous):
  /// with GeluTanh the call also stores there its biased product (node `aux`), which later steps
  /// read (a backward's GeluTanhGrad, another reader of the pre-activation); with GeluTanhGrad the
  /// call reads node `aux` there. -1: none.
  int aux = -1;
  Slot aux_slot;
  int level = 1;
  /// A cast to `dtype` folded into the call (CPU): the operand's memory holds this dtype.
  std::optional<DType> a_from, b_from;
};

/// One scatter (sched's Scatter primitive, run by the runtime's scatter kernels): out = base,
/// then src written or added where index says along `axis`.
struct ScatterCall {
  int node = -1;     ///< the Scatter node of the original graph
  Shape shape;       ///< the result's (and base's) shape
  Shape index_shape; ///< index's and src's
  DType dtype = DType::Float32;
  std::int64_t axis = 0;
  bool accumulate = false, atomic = false;
  std::int64_t site = 0;  ///< ir::GatherSite, for range errors
  Slot base, index, src, out;
  /// base is a constant (zeros_like(t).index_add_(...)): the output is filled with it, no read.
  bool base_constant = false;
  double base_scalar = 0;
  std::int64_t base_iscalar = 0;
  int flag = -1;  ///< the temporary holding the call's range flag (a GPU checks before writing)
  int level = 1;
  /// GPU, an index that is one row of positions (broadcast off the axis, as index_add's and
  /// index_copy's): the positions are counting-sorted by target (each target's count, their
  /// running sum, each position placed in its target's run) and one thread per output element
  /// applies its target's run, so every output element is written once, untouched ones included.
  /// Deterministic calls (ordered_runs) put each run in position order first; the atomic mode
  /// links each target's positions in a list instead, in whatever order its atomics run. The
  /// flag's temporary then holds the runs' buffers too (runs_layout).
  bool sorted_runs = false;

  std::int64_t length() const { return index_shape[static_cast<std::size_t>(axis)]; }
  std::int64_t bound() const { return shape[static_cast<std::size_t>(axis)]; }
  /// Whether the GPU accumulates this call with atomics (in any order): asked for, adding, and
  /// a dtype with hardware atomics.
  bool atomic_adds() const {
    return atomic && accumulate &&
           (dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Int32 || dtype == DType::Int64);
  }
  /// Sorted runs: each run is summed (or written) in position order, the same bits on every run;
  /// not in the atomic mode, which takes the places' arrival order.
  bool ordered_runs() const { return !atomic_adds(); }
  /// Where the sorted-runs buffers lie in the flag's temporary, in int32s: the flag, the cursor
  /// that hands out the runs' places, each target's count (these three cleared before the
  /// check, `cleared` ints), each target's first place and its run's first position (in the
  /// run's order), each position's target and arrival
  /// place in its run, the runs as placed, and the runs in position order. The atomic mode's
  /// linked runs hold each target's list head (cleared) and each position's link instead.
  /// Arrays start on 16-byte boundaries.
  struct RunsLayout {
    std::int64_t cursor = 1, counts = 4, offsets = 0, heads = 0, keys = 0, slots = 0, placed = 0, ordered = 0, links = 0,
                 ints = 1, cleared = 1;
  };
  RunsLayout runs_layout() const {
    RunsLayout l;
    if (!sorted_runs) return l;
    auto round4 = [](std::int64_t v) { return (v + 3) / 4 * 4; };
    const std::int64_t b = round4(bound()), n = round4(length());
    if (!ordered_runs()) {  // linked runs: each target's list head (cleared), each position's link
      l.heads = 4;
      l.links = l.heads + b;
      l.ints = l.links + n;
      l.cleared = l.heads + bound();
      return l;
    }
    l.offsets = l.counts + b;
    l.heads = l.offsets + b;
    l.keys = l.heads + b;
    l.slots = l.keys + n;
    l.placed = l.slots + n;
    l.ordered = l.placed + n;
    l.ints = l.ordered + n;
    l.cleared = l.counts + bound();
    return l;
  }
  /// int32s of the flag's temporary: the flag, and with sorted runs their buffers.
  std::int64_t flag_ints() const { return runs_layout().ints; }
};

/// One scan (the Scan primitive, run by the runtime's scan kernels): out = the running `kind`
/// of src along `axis`.
struct ScanCall {
  int node = -1;
  Shape shape;
  DType in = DType::Float32, out = DType::Float32;
  std::int64_t axis = 0;
  ir::ScanKind kind = ir::ScanKind::Sum;
  Slot src, result;
  int level = 1;
};

/// One sort (the Sort primitive, run by the runtime's sort kernels): out = the int64 positions
/// of each row's `k` first elements of src along `axis` (largest first when `descending`).
struct SortCall {
  int node = -1;
  Shape shape;  ///< the input's
  DType in = DType::Float32;
  std::int64_t axis = 0, k = 0;
  bool descending = false;
  Slot src, result;
  /// GPU: the temporary holding the rows' working sets when they do not fit the shared-memory
  /// budget (-1: they do), for `scratch_rows` rows at a time.
  int scratch = -1;
  std::int64_t scratch_rows = 0;
  int level = 1;

  /// Bytes of shared memory a GPU sort may use per block; larger rows work in global scratch.
  /// Within every supported architecture's opt-in limit, and two blocks fit an sm_80's SM.
  static constexpr std::int64_t kSharedBudget = 64 * 1024;

  std::int64_t length() const { return shape[static_cast<std::size_t>(axis)]; }
  std::int64_t rows() const { return length() == 0 || k == 0 ? 0 : shape.numel() / length(); }
  bool wide_key() const { return in == DType::Int64 || in == DType::Float64; }
  /// Whether the GPU selects the k first before sorting them (a top-k) or sorts the whole row.
  bool selects() const { return k < length(); }
  /// The candidates the GPU's bitonic network sorts: a power of two.
  std::int64_t network() const {
    std::int64_t p = 1;
    while (p < (selects() ? k : length())) p <<= 1;
    return p;
  }
  /// GPU: one row's working set in bytes: its keys (a top-k's select), then the candidates'
  /// keys and positions, each array 16-byte aligned.
  std::int64_t gpu_row_bytes() const {
    auto align = [](std::int64_t b) { return (b + 15) / 16 * 16; };
    const std::int64_t ks = wide_key() ? 8 : 4;
    return (selects() ? align(length() * ks) : 0) + align(network() * ks) + align(network() * 4);
  }
};

/// One fused attention (the Attention primitives, run by the runtime's attention kernels):
/// softmax(q kᵀ · scale + mask) v over [batch, heads, L, E] without the [L, S] scores in memory
/// (an online softmax over key blocks), or its backward, which recomputes the scores block by
/// block from the forward's saved row log-sum-exp.
///
/// Tensors are [batch, heads, rows, features]: q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev],
/// out and dout [B, H, L, Ev], lse [B, H, L] (contiguous, of accumulation_dtype(): float32, or
/// float64 for float64 operands); dq, dk, dv as q, k, v. Each
/// slot's `strides` are 4 element strides (the last 1, except for the mask); the mask is an
/// additive one of `mask_dtype` read at [b, h, i, j] through its strides, 0 on broadcast dims.
/// Heads share key/value heads in groups of heads / kv_heads (grouped-query attention): head h
/// reads kv head h / (heads / kv_heads), and dk, dv sum over a group's heads.
struct AttentionCall {
  enum Kind : std::uint8_t { Forward, Backward };
  Kind kind = Forward;
  int node = -1;  ///< the forward's output (or lse) node; the backward's first gradient node
  DType dtype = DType::Float32;  ///< q, k, v, out, dout, dq, dk, dv
  std::int64_t batch = 0, heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0, value_dim = 0;
  bool causal = false;  ///< key j > query i masked out (torch's is_causal: the top-left triangle)
  double scale = 1.0;   ///< the scores' factor (1 / sqrt(E) by default)
  bool has_mask = false;
  DType mask_dtype = DType::Float32;
  /// Dropout on P (0: none): keep where Philox's uniform_f32(seed, ((b H + h) L + i) S + j) >=
  /// (float)dropout_p, scaled by 1 / (1 - dropout_p) (see ir::Op::Attention).
  double dropout_p = 0.0;
  /// Operands (Slot::None where absent) and results (Slot::None where nobody reads them: the
  /// kernels skip their work). Forward: q, k, v, mask, seed -> out, lse. Backward: q, k, v,
  /// mask, out, dout, lse, seed -> dq, dk, dv. seed: the dropout's 0-dim int64 key.
  Slot q, k, v, mask, out, dout, lse, dq, dk, dv, seed;
  /// Backward: the temporary [B, H, L] of accumulation_dtype() holding rowsum(dout * out) (-1 in
  /// a forward).
  int delta = -1;
  int level = 1;

  std::int64_t group() const { return kv_heads > 0 ? heads / kv_heads : 1; }
  /// The softmax statistics' dtype (lse, delta): float64 for float64 operands, else float32.
  DType accumulation_dtype() const { return dtype == DType::Float64 ? DType::Float64 : DType::Float32; }
  bool wants(const Slot& s) const { return s.kind != Slot::None; }
  bool has_dropout() const { return dropout_p != 0.0; }
  /// The slot holding the value of `role` (the output, the lse or a gradient).
  Slot& result(ir::AttentionRole role) {
    switch (role) {
      case ir::AttentionRole::Out:
        return out;
      case ir::AttentionRole::Lse:
        return lse;
      case ir::AttentionRole::DQ:
        return dq;
      case ir::AttentionRole::DK:
        return dk;
      case ir::AttentionRole::DV:
        break;
    }
    return dv;
  }
  const Slot& result(ir::AttentionRole role) const { return const_cast<AttentionCall*>(this)->result(role); }
  /// Whether the scores' product runs on tensor cores on the GPU (half types, feature dims a
  /// multiple of 16 up to 256): the others take the generic kernel.
  bool tensor_cores() const {
    return (dtype == DType::Float16 || dtype == DType::BFloat16) && head_dim % 16 == 0 && value_dim % 16 == 0 &&
           head_dim <= 256 && value_dim <= 256;
  }
};

/// One step: a segment, a product, a scatter, a scan, a sort or an attention.
struct Step {
  enum Kind : std::uint8_t { Kernels, Call, Scatter, Scan, Sort, Attention };
  Kind kind;
  int index;
};

/// A graph as steps, in order, with the temporaries between them.
struct StepPlan {
  std::vector<Segment> segments;
  std::vector<LibraryCall> calls;
  std::vector<ScatterCall> scatters;
  std::vector<ScanCall> scans;
  std::vector<SortCall> sorts;
  std::vector<AttentionCall> attentions;
  std::vector<Step> order;
  std::vector<StepTemp> temps;

  /// One line per step (what KILN_LOGS=schedule and explain() print).
  std::string str() const;

  /// The temporaries step `st` reads or writes (repeats possible).
  std::vector<int> temps_of(const Step& st) const;

  /// Calls f(slot) for every memory slot step `st` reads or writes (a plan, const or not).
  template <class Plan, class F>
  static void for_each_slot(Plan& plan, const Step& st, F&& f);
};

/// Whether `g` holds a library op, so that it runs as steps.
inline bool has_library_calls(const ir::Graph& g) {
  return std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::GraphNode& n) { return ir::is_library_call(n.op); });
}

/// Whether a library product can read matrix dims of `shape` through `strides` directly
/// (runtime::matrix_layout: row- or column-major, the other stride spanning the inner dim).
/// Batch dims may have any non-negative stride (0 broadcasts).
inline bool library_readable(const Shape& shape, const Strides& strides) {
  const std::size_t r = shape.size();
  for (auto s : strides)
    if (s < 0) return false;
  return runtime::matrix_layout(shape[r - 2], shape[r - 1], strides[r - 2], strides[r - 1]).has_value();
}

/// Plans `g` as steps (see the header comment). `fuse_epilogues`: bias and activation join
/// the call (the library can apply them); `training_epilogues` (with it): also the epilogues a
/// training step's products take: through a reshape that splits a product's rows, a GELU whose
/// input is read again (keeping that input beside the result: cuBLASLt's GELU_AUX) and the
/// GELU's gradient (DGELU).
inline StepPlan plan_steps(const ir::Graph& g, bool fuse_epilogues, bool training_epilogues = true);

namespace detail {

/// Whether the subgraph of `g` under `node` is the subgraph of `p` under `proot` with p's
/// placeholder (p.outputs[1]) standing for `hole` (equal ops, dtypes, shapes, attrs, node for node).
/// Further placeholders (p.outputs[2], ...) stand for any node of their dtype and shape, the same
/// node wherever they occur: `seen` maps them (as every matched pattern node) to it.
inline bool same_subgraph(const ir::Graph& g, int node, const ir::Graph& p, int proot, int hole,
                          std::map<int, int>& seen) {
  const ir::GraphNode& pn = p.nodes[static_cast<std::size_t>(proot)];
  if (proot == p.outputs[1]) return node == hole;  // the pattern's placeholder
  auto it = seen.find(proot);
  if (it != seen.end()) return it->second == node;
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(node)];
  if (std::find(p.outputs.begin() + 2, p.outputs.end(), proot) != p.outputs.end()) {
    if (n.dtype != pn.dtype || n.shape != pn.shape) return false;
    seen[proot] = node;
    return true;
  }
  if (n.op != pn.op || n.dtype != pn.dtype || n.shape != pn.shape || !(n.attrs == pn.attrs) ||
      n.inputs.size() != pn.inputs.size())
    return false;
  seen[proot] = node;
  for (std::size_t k = 0; k < n.inputs.size(); ++k)
    if (!same_subgraph(g, n.inputs[k], p, pn.inputs[k], hole, seen)) return false;
  return true;
}

/// `root`'s graph as a pattern: output 0 the root, then each placeholder (-1 where unused).
inline ir::Graph flatten_pattern(const ir::NodePtr& root, const std::vector<ir::NodePtr>& placeholders) {
  std::map<const ir::Node*, int> index;
  ir::Graph pg;
  std::vector<std::pair<const ir::Node*, std::size_t>> stack{{root.get(), 0}};
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->inputs.size()) {
      const ir::Node* c = n->inputs[next++].get();
      if (!index.count(c)) stack.push_back({c, 0});
      continue;
    }
    if (!index.count(n)) {
      ir::GraphNode gn;
      gn.op = n->op;
      gn.dtype = n->dtype;
      gn.shape = n->shape;
      gn.attrs = n->attrs;
      for (auto& in : n->inputs) gn.inputs.push_back(index.at(in.get()));
      index[n] = static_cast<int>(pg.nodes.size());
      pg.nodes.push_back(std::move(gn));
    }
    stack.pop_back();
  }
  pg.outputs.push_back(index.at(root.get()));
  for (const ir::NodePtr& x : placeholders) pg.outputs.push_back(index.count(x.get()) ? index.at(x.get()) : -1);
  return pg;
}

/// The graph `make(x)` builds over a placeholder x of `x_node`'s dtype and shape: the pattern
/// an epilogue op is recognised by (the decomposition the front end itself produces). Output 0
/// is the root, output 1 the placeholder.
template <class Make>
ir::Graph pattern_of(const ir::GraphNode& x_node, Make&& make) {
  // An iota stands for the operand (a leaf no decomposition folds); flatten_pattern walks what
  // `make` built.
  ir::NodePtr x = ir::iota(x_node.shape, 0, x_node.dtype, Device::cpu());
  return flatten_pattern(make(x), {x});
}

/// The same over two placeholders of `x_node`'s dtype and shape: output 1 is the first (the
/// hole same_subgraph is given), output 2 the second (free). Distinct leaves: iotas along
/// different dims, so `x_node` needs two dims.
template <class Make>
ir::Graph pattern_of2(const ir::GraphNode& x_node, Make&& make) {
  ir::NodePtr x = ir::iota(x_node.shape, 0, x_node.dtype, Device::cpu());
  ir::NodePtr y = ir::iota(x_node.shape, 1, x_node.dtype, Device::cpu());
  return flatten_pattern(make(x, y), {x, y});
}

/// A value whose recomputation would read this many large values (each at least a sixteenth of
/// its elements) is stored rather than recomputed: by a lower level's segment for the later
/// steps that read it, and by a compiled forward for its backward (compile/backward_graph.hpp).
inline constexpr std::size_t kRecomputeReadLimit = 3;

class StepPlanner {
 public:
  StepPlanner(const ir::Graph& g, bool fuse, bool training)
      : g_(g), fuse_(fuse), training_(fuse && training), n_(g.nodes.size()) {}

  StepPlan run() {
    uses_.assign(n_, 0);
    users_.assign(n_, {});
    for (std::size_t j = 0; j < n_; ++j)
      for (auto in : g_.nodes[j].inputs) {
        ++uses_[static_cast<std::size_t>(in)];
        std::vector<int>& u = users_[static_cast<std::size_t>(in)];
        if (u.empty() || u.back() != static_cast<int>(j)) u.push_back(static_cast<int>(j));
      }
    for (auto o : g_.outputs) ++uses_[static_cast<std::size_t>(o)];
    call_of_result_.assign(n_, -1);
    scatter_of_result_.assign(n_, -1);
    scan_of_result_.assign(n_, -1);
    sort_of_result_.assign(n_, -1);
    attention_of_result_.assign(n_, -1);
    absorbed_.assign(n_, 0);
    zero_.assign(n_, 0);
    level_.assign(n_, 0);
    materialized_.assign(n_, Slot{});
    stored_at_.assign(n_, -1);
    assembled_.assign(n_, Slot{});
    result_view_.assign(n_, Slot{});
    plan_calls();
    count_user_levels();
    plan_outputs();
    build_segments();
    order_steps();
    plan_overwrites();
    return std::move(plan_);
  }

 private:
  using i64 = std::int64_t;

  const ir::GraphNode& node(int i) const { return g_.nodes[static_cast<std::size_t>(i)]; }

  // The only user of `i`, or -1 when it has several (or is an output).
  int sole_user(int i) const {
    const std::size_t ii = static_cast<std::size_t>(i);
    if (uses_[ii] != 1 || users_[ii].empty()) return -1;  // a graph output counts as a use
    return users_[ii].front();
  }

  // Levels and the library calls, in node order (so operands' levels are known).
  void plan_calls() {
    for (std::size_t i = 0; i < n_; ++i) {
      const ir::GraphNode& nd = g_.nodes[i];
      if (absorbed_[i] || call_of_result_[i] >= 0) continue;  // an earlier call's epilogue (level set there)
      int lvl = 0;
      for (auto in : nd.inputs) lvl = std::max(lvl, level_[static_cast<std::size_t>(in)]);
      level_[i] = lvl;
      if (!ir::is_library_call(nd.op)) continue;
      if (ir::is_scatter(nd.op)) {
        plan_scatter(static_cast<int>(i), lvl);
        continue;
      }
      if (ir::is_scan(nd.op)) {
        ScanCall c;
        c.node = static_cast<int>(i);
        c.shape = nd.shape;
        c.in = node(nd.inputs[0]).dtype;
        c.out = nd.dtype;
        c.axis = nd.attrs.ints.at(0);
        c.kind = static_cast<ir::ScanKind>(nd.attrs.ints.at(1));
        c.level = level_[i] = lvl + 1;
        scan_of_result_[i] = static_cast<int>(plan_.scans.size());
        plan_.scans.push_back(std::move(c));
        continue;
      }
      if (ir::is_attention(nd.op)) {
        plan_attention(static_cast<int>(i), lvl);
        continue;
      }
      if (ir::is_sort(nd.op)) {
        SortCall c;
        c.node = static_cast<int>(i);
        c.shape = node(nd.inputs[0]).shape;
        c.in = node(nd.inputs[0]).dtype;
        c.axis = nd.attrs.ints.at(0);
        c.k = nd.attrs.ints.at(1);
        c.descending = nd.attrs.ints.at(2) != 0;
        c.level = level_[i] = lvl + 1;
        sort_of_result_[i] = static_cast<int>(plan_.sorts.size());
        plan_.sorts.push_back(std::move(c));
        continue;
      }
      const ir::GraphNode& a = node(nd.inputs[0]);
      const std::size_t r = nd.shape.size();
      if (nd.shape.numel() == 0 || a.shape[r - 1] == 0) {
        zero_[i] = 1;  // nothing to multiply: a zero (or empty) constant in its segment
        continue;
      }
      LibraryCall c;
      c.node = c.result = static_cast<int>(i);
      c.a_shape = a.shape;
      c.b_shape = node(nd.inputs[1]).shape;
      c.shape = nd.shape;
      c.dtype = nd.dtype;
      c.level = level_[i] = lvl + 1;
      if (fuse_ && r == 2) absorb_epilogue(c);
      const int id = static_cast<int>(plan_.calls.size());
      operands_.push_back({nd.inputs[0], nd.inputs[1]});  // slots once every call's result has one
      call_of_result_[static_cast<std::size_t>(c.result)] = id;
      if (c.aux >= 0 && c.activation == Activation::GeluTanh) call_of_result_[static_cast<std::size_t>(c.aux)] = id;
      plan_.calls.push_back(std::move(c));
    }
  }

  // An attention value joins the call computing its siblings (the same operands and
  // attributes: the forward's output and log-sum-exp, the backward's three gradients) or
  // starts one.
  void plan_attention(int i, int lvl) {
    const ir::GraphNode& nd = node(i);
    const ir::AttentionAttrs attrs = ir::AttentionAttrs::of(nd.attrs);
    const bool backward = attrs.gradient();
    auto ii = static_cast<std::size_t>(i);
    for (std::size_t a = 0; a < plan_.attentions.size(); ++a) {
      const ir::GraphNode& other = node(attention_nodes_[a].front());
      const bool other_backward = plan_.attentions[a].kind == AttentionCall::Backward;
      if (other_backward != backward || other.inputs != nd.inputs ||
          !std::equal(other.attrs.ints.begin() + 1, other.attrs.ints.end(), nd.attrs.ints.begin() + 1,
                      nd.attrs.ints.end()) ||
          ir::Attrs::hash_double_bits(other.attrs.scalar) != ir::Attrs::hash_double_bits(nd.attrs.scalar))
        continue;
      attention_of_result_[ii] = static_cast<int>(a);
      level_[ii] = plan_.attentions[a].level;
      attention_nodes_[a].push_back(i);
      return;
    }
    const ir::GraphNode &q = node(nd.inputs[0]), &k = node(nd.inputs[1]), &v = node(nd.inputs[2]);
    AttentionCall c;
    c.kind = backward ? AttentionCall::Backward : AttentionCall::Forward;
    c.node = i;
    c.dtype = q.dtype;
    c.batch = q.shape[0], c.heads = q.shape[1], c.q_len = q.shape[2], c.head_dim = q.shape[3];
    c.kv_heads = k.shape[1], c.kv_len = k.shape[2], c.value_dim = v.shape[3];
    c.causal = attrs.causal;
    c.has_mask = attrs.has_mask;
    if (c.has_mask) c.mask_dtype = node(nd.inputs[static_cast<std::size_t>(attrs.mask_input())]).dtype;
    c.dropout_p = attrs.dropout_p;
    c.scale = nd.attrs.scalar;
    c.level = level_[ii] = lvl + 1;
    attention_of_result_[ii] = static_cast<int>(plan_.attentions.size());
    attention_nodes_.push_back({i});
    plan_.attentions.push_back(std::move(c));
  }

  // Where an attention reads node i: through any strides whose last is 1 (`any_last`: any
  // strides at all, the mask's), contiguous where `dense` (the log-sum-exp).
  Slot attention_operand_slot(int i, bool any_last, bool dense) {
    const ir::GraphNode& nd = node(i);
    auto fits = [&](const Shape& shape, const Strides& st) {
      if (dense) return is_contiguous(shape, st);
      for (auto x : st)
        if (x < 0) return false;
      return any_last || st.empty() || st.back() == 1 || shape.back() <= 1;
    };
    if (is_call_result(i)) {
      Slot r = result_slot(i);
      if (fits(nd.shape, r.strides)) return r;
    } else if (nd.op == ir::Op::Input && fits(nd.shape, nd.strides)) {
      return Slot{Slot::Leaf, nd.leaf, nd.strides};
    } else {
      // q, k and v sliced out of the one product that computed them (a [B, T, 3, H, D]
      // output read as three [B, H, T, D] operands), or a gradient transposed to heads: read
      // in place, not copied by a kernel first.
      int base = -1;
      std::optional<Slot> v = view_of_memory(i, 4 * nd.shape.numel(), &base);
      if (v && fits(nd.shape, v->strides) && v->byte_offset % kViewAlignment == 0) {
        if (base >= 0) {  // the value under the views, stored once
          const Slot m = materialize(base);
          v->kind = m.kind;
          v->index = m.index;
          v->byte_offset += m.byte_offset;
        }
        return *v;
      }
    }
    return materialize(i);
  }

  /// Views into other memory start at multiples of this many bytes (what vector loads and
  /// cuDNN's operands need).
  static constexpr std::int64_t kViewAlignment = 16;

  // Node i read in place from memory some step holds anyway, where i is only shape ops
  // (reshape, permute, slice, broadcast: ir::view_layout) over that memory: a leaf, a call's
  // result or a value a segment stores. The slot carries i's strides (the caller refuses those
  // its step cannot read, negative ones included) and its first element's offset; nullopt
  // where an op on the way is not such a view of the memory below it.
  // `store_up_to` (elements): where the ops start from a computed value of at most that size
  // that is stored anyway (a graph output: a compiled forward's saved projection) or read only
  // through such views (q, k and v sliced from it), that value is stored, once, and viewed,
  // rather than each view copied: `*store` receives it, and the slot's strides are those of
  // it stored row-major, its kind and index for the caller to fill (it stores it only where
  // the view suits it).
  std::optional<Slot> view_of_memory(int i, i64 store_up_to = 0, int* store = nullptr) const {
    const ir::GraphNode& nd = node(i);
    const std::size_t ii = static_cast<std::size_t>(i);
    if (is_call_result(i)) return result_slot(i);
    if (nd.op == ir::Op::Input) return Slot{Slot::Leaf, nd.leaf, nd.strides};
    if (materialized_[ii].kind != Slot::None) return materialized_[ii];
    if (nd.op != ir::Op::Reshape && nd.op != ir::Op::Permute && nd.op != ir::Op::Slice && nd.op != ir::Op::Broadcast) {
      if (!store || nd.shape.numel() > store_up_to || absorbed_[ii] || zero_[ii] ||
          !(is_graph_output(i) || read_only_through_views(i)))
        return std::nullopt;
      *store = i;
      return Slot{Slot::None, -1, contiguous_strides(nd.shape)};
    }
    const ir::GraphNode& in = node(nd.inputs[0]);
    std::optional<Slot> s = view_of_memory(nd.inputs[0], store_up_to, store);
    if (!s || s->strides.size() != in.shape.size()) return std::nullopt;
    std::optional<ir::StridedLayout> l = ir::view_layout(nd.op, nd.attrs, in.shape, {0, s->strides}, nd.shape);
    if (!l) return std::nullopt;
    s->strides = std::move(l->strides);
    s->byte_offset += l->offset * static_cast<i64>(itemsize(nd.dtype));
    return s;
  }

  bool is_graph_output(int i) const { return std::find(g_.outputs.begin(), g_.outputs.end(), i) != g_.outputs.end(); }

  // Whether every reader of node i is a shape op that views it (reshape, permute, slice).
  bool read_only_through_views(int i) const {
    const std::vector<int>& users = users_[static_cast<std::size_t>(i)];
    return !users.empty() && std::all_of(users.begin(), users.end(), [&](int j) {
      const ir::Op op = node(j).op;
      return op == ir::Op::Reshape || op == ir::Op::Permute || op == ir::Op::Slice;
    });
  }

  // A concatenation whose every part is an attention's result, reshaped or permuted and read by
  // nothing else, is assembled in place: each attention writes its result through strides into
  // its part of the concatenation's memory, and no kernel copies the parts together. The
  // gradients of q, k and v sliced from one product's output are such a concatenation (the
  // product's backward reads it whole). Inductor lets the inputs of its concatenations write
  // into the output the same way.
  void plan_assembled_concats() {
    for (std::size_t i = 0; i < n_; ++i) {
      const ir::GraphNode& nd = g_.nodes[i];
      if (nd.op != ir::Op::Concat || absorbed_[i] || nd.shape.numel() == 0) continue;
      const std::size_t axis = static_cast<std::size_t>(nd.attrs.ints.at(0));
      const Strides whole = contiguous_strides(nd.shape);
      const i64 item = static_cast<i64>(itemsize(nd.dtype));
      std::vector<std::pair<int, Slot>> parts;  // (attention result, where it goes)
      i64 at = 0;
      bool ok = true;
      for (std::size_t p = 0; p < nd.inputs.size() && ok; ++p) {
        Slot view{Slot::None, -1, whole, at * whole[axis] * item};
        at += node(nd.inputs[p]).shape[axis];
        int x = nd.inputs[p];
        // Down the chain: the strides of each op's input, from its output's.
        while (ok && attention_of_result_[static_cast<std::size_t>(x)] < 0) {
          const ir::GraphNode& xn = node(x);
          ok = (xn.op == ir::Op::Reshape || xn.op == ir::Op::Permute) && sole_user(x) >= 0;
          if (!ok) break;
          const ir::GraphNode& in = node(xn.inputs[0]);
          ir::Attrs inverse;  // the op that takes xn back to its input: a reshape, or the inverse permute
          if (xn.op == ir::Op::Permute) {
            inverse.ints.assign(xn.attrs.ints.size(), 0);
            for (std::size_t k = 0; k < xn.attrs.ints.size(); ++k)
              inverse.ints[static_cast<std::size_t>(xn.attrs.ints[k])] = static_cast<std::int64_t>(k);
          }
          std::optional<ir::StridedLayout> l = ir::view_layout(xn.op, inverse, xn.shape, {0, view.strides}, in.shape);
          ok = l.has_value();
          if (ok) view.strides = std::move(l->strides);
          x = xn.inputs[0];
        }
        // What every attention kernel writes: rows of contiguous features, 16-byte aligned.
        ok = ok && sole_user(x) >= 0 && view.strides.size() == 4 && view.strides[3] == 1 &&
             view.byte_offset % kViewAlignment == 0;
        for (std::size_t d = 0; ok && d < 3; ++d) ok = view.strides[d] % 8 == 0;
        parts.push_back({x, view});
      }
      if (!ok) continue;
      // Dense memory: element addresses as `whole`'s (strides of size-1 dims aside).
      const Slot memory = contiguous_result(static_cast<int>(i));
      assembled_[i] = memory;
      for (auto& [r, view] : parts) {
        view.kind = memory.kind;
        view.index = memory.index;
        result_view_[static_cast<std::size_t>(r)] = view;
      }
    }
  }

  // Where each attention writes its results: before any step's operands are planned, since a
  // scan, sort or scatter reading one asks for its slot.
  void plan_attention_results() {
    for (std::size_t a = 0; a < plan_.attentions.size(); ++a) {
      AttentionCall& c = plan_.attentions[a];
      for (int r : attention_nodes_[a]) {
        const Slot& view = result_view_[static_cast<std::size_t>(r)];
        c.result(static_cast<ir::AttentionRole>(node(r).attrs.ints.at(0))) =
            view.kind != Slot::None ? view : contiguous_result(r);
      }
    }
  }

  void plan_attention_slots() {
    for (std::size_t a = 0; a < plan_.attentions.size(); ++a) {
      AttentionCall& c = plan_.attentions[a];
      const ir::GraphNode& first = node(attention_nodes_[a].front());
      const ir::AttentionAttrs attrs = ir::AttentionAttrs::of(first.attrs);
      const std::vector<int>& in = first.inputs;
      c.q = attention_operand_slot(in[0], false, false);
      c.k = attention_operand_slot(in[1], false, false);
      c.v = attention_operand_slot(in[2], false, false);
      if (c.kind == AttentionCall::Backward) {
        c.out = attention_operand_slot(in[3], false, false);
        c.dout = attention_operand_slot(in[4], false, false);
        c.lse = attention_operand_slot(in[5], false, true);
        c.delta = static_cast<int>(plan_.temps.size());
        plan_.temps.push_back({Shape{c.batch * c.heads * c.q_len}, c.accumulation_dtype()});
      }
      if (c.has_mask) {
        const int m = in[static_cast<std::size_t>(attrs.mask_input())];
        c.mask = attention_operand_slot(m, true, false);
        // A mask of one batch or one head reads that one for every batch or head.
        for (std::size_t d = 0; d < 2; ++d)
          if (node(m).shape[d] == 1) c.mask.strides[d] = 0;
      }
      if (c.has_dropout())
        c.seed = attention_operand_slot(in[static_cast<std::size_t>(attrs.seed_input())], true, false);
    }
  }

  void plan_scatter(int i, int lvl) {
    const ir::GraphNode& nd = node(i);
    ScatterCall c;
    c.node = i;
    c.shape = nd.shape;
    c.index_shape = node(nd.inputs[1]).shape;
    c.dtype = nd.dtype;
    c.axis = nd.attrs.ints.at(0);
    c.accumulate = nd.attrs.ints.at(1) != 0;
    c.atomic = nd.attrs.ints.at(2) != 0;
    c.site = nd.attrs.ints.at(3);
    const ir::GraphNode& base = node(nd.inputs[0]);
    if (base.op == ir::Op::Constant) {
      c.base_constant = true;
      c.base_scalar = base.attrs.scalar;
      c.base_iscalar = base.attrs.iscalar;
    }
    c.level = level_[static_cast<std::size_t>(i)] = lvl + 1;
    scatter_of_result_[static_cast<std::size_t>(i)] = static_cast<int>(plan_.scatters.size());
    plan_.scatters.push_back(std::move(c));
  }

  // The nodes of a match (`seen`: pattern node -> graph node) that a call can compute in its
  // epilogue because nothing else reads them: each is read only by the match's root or by
  // other such nodes (a fixpoint). Leaves (constants are shared freely) and `keep` never are.
  std::set<int> interior(const std::map<int, int>& seen, int root, const std::set<int>& keep) const {
    std::set<int> in;
    for (auto& [p, m] : seen)
      if (m != root && !keep.count(m) && ir::op_kind(node(m).op) != ir::OpKind::Leaf) in.insert(m);
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = in.begin(); it != in.end();) {
        bool only_inside = !is_graph_output(*it);
        for (int u : users_[static_cast<std::size_t>(*it)]) only_inside = only_inside && (u == root || in.count(u));
        if (only_inside) {
          ++it;
          continue;
        }
        it = in.erase(it);
        changed = true;
      }
    }
    return in;
  }

  // Whether call `c` (one [M, N] product) can hold a GELU's input as cuBLASLt's auxiliary
  // matrix: a contiguous [M, N] with N a multiple of 8, in a type whose GELU is accurate.
  static bool aux_fits(const LibraryCall& c) {
    return c.shape.size() == 2 && c.shape[1] % 8 == 0 &&
           (c.dtype == DType::BFloat16 || c.dtype == DType::Float16 || c.dtype == DType::Float32);
  }

  // The reshape that is the only reader of product i and splits its rows ([B*T, N] seen as
  // [B, T, N]: a linear over a batch of sequences), or -1. The same memory in the same order,
  // so an epilogue on the reshaped value is one on the product.
  int row_split_reader(int i) const {
    const int u = sole_user(i);
    if (u < 0 || node(u).op != ir::Op::Reshape) return -1;
    const Shape& from = node(i).shape;
    const Shape& to = node(u).shape;
    return from.size() == 2 && to.size() >= 2 && to.back() == from[1] ? u : -1;
  }

  // bias add, then relu or tanh-gelu, each the sole reader of what precedes it; a tanh-gelu
  // whose input other steps read too keeps that input as the call's auxiliary output. Or a
  // backward's gradient through a tanh-gelu (try_gelu_gradient).
  void absorb_epilogue(LibraryCall& c) {
    if (training_ && try_gelu_gradient(c)) return;
    // Through a reshape splitting the rows: the epilogue's ops are on the reshaped value.
    const int split = training_ ? row_split_reader(c.node) : -1;
    int cur = split >= 0 ? split : c.node;
    const i64 N = c.shape[1];
    int user = sole_user(cur);
    if (user >= 0 && node(user).op == ir::Op::Add && node(user).inputs[0] != node(user).inputs[1]) {
      const ir::GraphNode& add = node(user);
      const int other = add.inputs[0] == cur ? add.inputs[1] : add.inputs[0];
      const ir::GraphNode& o = node(other);
      const std::size_t r = o.shape.size();
      int source = -1;  // the [1, ..., 1, N] value broadcast over the rows
      if (o.op == ir::Op::Broadcast && sole_user(other) == user && node(o.inputs[0]).shape.numel() == N &&
          node(o.inputs[0]).shape.back() == N && level_[static_cast<std::size_t>(o.inputs[0])] < c.level)
        source = o.inputs[0];
      // A realized bias arrives broadcast already: a leaf whose rows have stride 0.
      bool leaf_rows = o.op == ir::Op::Input && (o.strides[r - 1] == 1 || N == 1);
      for (std::size_t d = 0; d + 1 < r; ++d) leaf_rows = leaf_rows && o.strides[d] == 0;
      if (source >= 0 || leaf_rows) {
        c.bias = true;
        c.bias_dtype = o.dtype;
        bias_source_.push_back({static_cast<int>(plan_.calls.size()), source >= 0 ? source : other});
        if (source >= 0) absorbed_[static_cast<std::size_t>(other)] = 1;
        absorbed_[static_cast<std::size_t>(user)] = 1;
        cur = user;
      }
    }
    // The activation: its whole decomposition reads only `cur` and is read only at its root.
    const ir::GraphNode& x = node(cur);
    auto try_activation = [&](Activation act, const ir::Graph& pattern) {
      // Candidate root: a later node; the pattern's root op decides quickly.
      const ir::GraphNode& proot = pattern.nodes[static_cast<std::size_t>(pattern.outputs[0])];
      for (std::size_t j = static_cast<std::size_t>(cur) + 1; j < n_; ++j) {
        if (g_.nodes[j].op != proot.op || g_.nodes[j].shape != x.shape) continue;
        std::map<int, int> seen;
        if (!same_subgraph(g_, static_cast<int>(j), pattern, pattern.outputs[0], cur, seen)) continue;
        const std::set<int> inside = interior(seen, static_cast<int>(j), {});
        std::size_t computed = 0;  // matched nodes other than the root and leaves
        for (auto& [p, m] : seen) computed += m != static_cast<int>(j) && ir::op_kind(node(m).op) != ir::OpKind::Leaf;
        bool cur_inside = !is_graph_output(cur);
        for (int u : users_[static_cast<std::size_t>(cur)])
          cur_inside = cur_inside && (u == static_cast<int>(j) || inside.count(u));
        if (inside.size() != computed || !cur_inside) {
          // Read elsewhere too (a backward's gradient through the GELU reads its input): cuBLASLt
          // stores the input beside the result, and the other readers read it there (the parts
          // of the decomposition they share are recomputed from it).
          if (act != Activation::GeluTanh || !training_ || !aux_fits(c)) continue;
          c.aux = cur;
        }
        for (int m : inside) absorbed_[static_cast<std::size_t>(m)] = 1;
        if (cur != c.node) absorbed_[static_cast<std::size_t>(cur)] = 1;
        c.activation = act;
        c.result = static_cast<int>(j);
        return true;
      }
      return false;
    };
    if (!try_activation(Activation::Relu, pattern_of(x, [](const ir::NodePtr& v) { return decomp::relu(v); })))
      try_activation(Activation::GeluTanh, pattern_of(x, [](const ir::NodePtr& v) { return decomp::gelu(v, true); }));
    if (c.activation == Activation::None && !c.bias) return;  // a split alone is no epilogue
    if (c.result != c.node) absorbed_[static_cast<std::size_t>(c.node)] = 1;
    if (split >= 0) absorbed_[static_cast<std::size_t>(split)] = 1;
    if (c.activation == Activation::None && cur != c.node) c.result = cur;
    if (c.result != c.node) {
      level_[static_cast<std::size_t>(c.result)] = c.level;
      absorbed_[static_cast<std::size_t>(c.result)] = 0;
    }
    if (c.aux >= 0) {  // the call's second result
      level_[static_cast<std::size_t>(c.aux)] = c.level;
      absorbed_[static_cast<std::size_t>(c.aux)] = 0;
    }
  }

  // A backward's gradient through a tanh-form GELU, cast(gelu_backward(x, p)) (the GELU's own
  // gradient rule) of this product p (or a reshape splitting its rows), the gradient of the
  // GELU's output: the call computes it (cuBLASLt's DGELU), reading the GELU's input x from
  // memory as its auxiliary matrix (where the forward's call stored it, a saved leaf, or a
  // segment's store), so neither the product nor the derivative is a kernel of its own. The
  // call waits for x's level.
  bool try_gelu_gradient(LibraryCall& c) {
    if (!aux_fits(c) || c.shape[0] < 2 || c.shape[1] < 2 || is_graph_output(c.node)) return false;
    const int split = row_split_reader(c.node);
    const int hole = split >= 0 ? split : c.node;  // the gradient of the GELU's output
    const ir::GraphNode& p = node(hole);
    const ir::Graph pattern = pattern_of2(p, [](const ir::NodePtr& g, const ir::NodePtr& x) {
      return ir::cast(decomp::gelu_backward(x, g, true), x->dtype);
    });
    // The pattern's nodes that depend on the product: the call computes all of them.
    std::vector<char> on_product(pattern.nodes.size(), 0);
    for (std::size_t k = 0; k < pattern.nodes.size(); ++k) {
      on_product[k] = static_cast<int>(k) == pattern.outputs[1];
      for (int in : pattern.nodes[k].inputs) on_product[k] |= on_product[static_cast<std::size_t>(in)];
    }
    const ir::GraphNode& proot = pattern.nodes[static_cast<std::size_t>(pattern.outputs[0])];
    for (std::size_t j = static_cast<std::size_t>(hole) + 1; j < n_; ++j) {
      if (g_.nodes[j].op != proot.op || g_.nodes[j].shape != p.shape) continue;
      std::map<int, int> seen;
      if (!same_subgraph(g_, static_cast<int>(j), pattern, pattern.outputs[0], hole, seen)) continue;
      auto found = seen.find(pattern.outputs[2]);
      if (found == seen.end()) continue;
      const int x = found->second;
      const ir::GraphNode& xn = node(x);
      // x's level is known (a leaf: a compiled backward's saved value; or an earlier node) and it
      // has memory of its own, row-major.
      if ((xn.op != ir::Op::Input && x >= c.node) || absorbed_[static_cast<std::size_t>(x)] ||
          zero_[static_cast<std::size_t>(x)] || (xn.op == ir::Op::Input && xn.strides != contiguous_strides(xn.shape)))
        continue;
      const std::set<int> inside = interior(seen, static_cast<int>(j), {x});
      bool whole = !is_graph_output(hole);
      for (int u : users_[static_cast<std::size_t>(hole)]) whole = whole && (u == static_cast<int>(j) || inside.count(u));
      for (auto& [pn, m] : seen)
        if (on_product[static_cast<std::size_t>(pn)] && m != static_cast<int>(j) && !inside.count(m)) whole = false;
      if (!whole) continue;
      for (int m : inside) absorbed_[static_cast<std::size_t>(m)] = 1;
      absorbed_[static_cast<std::size_t>(c.node)] = absorbed_[static_cast<std::size_t>(hole)] = 1;
      c.activation = Activation::GeluTanhGrad;
      c.aux = x;
      c.result = static_cast<int>(j);
      c.level = std::max(c.level, level_[static_cast<std::size_t>(x)] + 1);
      level_[static_cast<std::size_t>(c.node)] = level_[j] = c.level;
      absorbed_[j] = 0;
      return true;
    }
    return false;
  }

  // A temporary for node i, dense in the order of `strides` (row-major by default).
  Slot temp(int i, std::optional<Strides> strides = std::nullopt) {
    Slot s{Slot::Temp, static_cast<int>(plan_.temps.size()), strides ? *strides : contiguous_strides(node(i).shape)};
    plan_.temps.push_back({node(i).shape, node(i).dtype});
    return s;
  }

  // Dense strides that keep node i's elements in the order its source holds them, where i is
  // a cast (or another one-input pointwise op) of a transposed leaf or of a permute and that
  // order is not row-major. Stored that way, the segment writing i reads and writes along the
  // same dim (a transposed bf16 copy of a [50304, 768] table is scattered 2-byte stores, ten
  // times the copy's time); a library call reads either order.
  std::optional<Strides> source_order(int i) const {
    const ir::GraphNode* nd = &node(i);
    const Shape& shape = nd->shape;
    while (ir::op_kind(nd->op) == ir::OpKind::Unary && node(nd->inputs[0]).shape == shape) nd = &node(nd->inputs[0]);
    std::vector<std::size_t> order(shape.size());  // dims from the outermost in the source
    for (std::size_t d = 0; d < order.size(); ++d) order[d] = d;
    if (nd->op == ir::Op::Input) {
      for (auto st : nd->strides)
        if (st <= 0) return std::nullopt;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return nd->strides[a] > nd->strides[b]; });
    } else if (nd->op == ir::Op::Permute) {
      // Output dim d is input dim perm[d]; the input is row-major, so d's rank is perm[d].
      for (std::size_t d = 0; d < order.size(); ++d) order[static_cast<std::size_t>(nd->attrs.ints[d])] = d;
    } else {
      return std::nullopt;
    }
    Strides dense(shape.size());
    i64 step = 1;
    for (std::size_t k = order.size(); k-- > 0;) {
      dense[order[k]] = step;
      step *= shape[order[k]];
    }
    if (dense == contiguous_strides(shape)) return std::nullopt;
    return dense;
  }

  // The value under a chain of reshapes ending at node o (o itself when it is no reshape):
  // row-major reshapes, so the same elements in the same order.
  int reshape_source(int o) const {
    while (node(o).op == ir::Op::Reshape) o = node(o).inputs[0];
    return o;
  }

  // What the segment storing node o into memory `slot` computes there. A value that only
  // reshapes one its segment computes ([B, T, C] returned or passed to a product as [B*T, C],
  // contiguous both ways) holds the same elements in the same order: the segment writes the
  // value itself, with its own shape's strides, so the kernel computing it stores it there. As
  // a reshape it would be a kernel of its own over the other shape, copying a temporary (a gelu
  // backward's [16384, 3072] gradient, 47 us a layer on an H200), or a second kernel that
  // recomputes the value because the shapes cannot share a loop (a gelu's input kept for the
  // backward over [B, T, 4C] beside its output for the next product over [B*T, 4C]).
  std::pair<int, Slot> reshape_request(int o, const Slot& slot) const {
    if (node(o).op != ir::Op::Reshape || !is_contiguous(node(o).shape, slot.strides)) return {o, slot};
    const int x = reshape_source(o);
    const ir::GraphNode& src = node(x);
    if (src.op == ir::Op::Input || src.op == ir::Op::Constant || is_call_result(x)) return {o, slot};
    Slot as_source = slot;
    as_source.strides = contiguous_strides(src.shape);
    return {x, as_source};
  }

  // What the segment writing graph output k (node o) computes into that memory.
  std::pair<int, Slot> output_request(int o, int k) const {
    return reshape_request(o, Slot{Slot::Output, k, g_.output_strides[static_cast<std::size_t>(k)]});
  }

  // Memory holding node i's value for a later step: requested of the segment of its level.
  // `order`: the layout of a new temporary (row-major when none).
  Slot materialize(int i, std::optional<Strides> order = std::nullopt) {
    Slot& m = materialized_[static_cast<std::size_t>(i)];
    if (m.kind != Slot::None) return m;
    for (std::size_t k = 0; k < g_.outputs.size(); ++k)
      if (g_.outputs[k] == i && is_contiguous(node(i).shape, g_.output_strides[k]) &&
          !output_taken_.count(static_cast<int>(k))) {
        output_taken_.insert(static_cast<int>(k));
        m = Slot{Slot::Output, static_cast<int>(k), g_.output_strides[k]};
        stored_at_[static_cast<std::size_t>(i)] = level_[static_cast<std::size_t>(i)];
        requests_[level_[static_cast<std::size_t>(i)]].push_back(output_request(i, static_cast<int>(k)));
        return m;
      }
    m = temp(i, order);
    const int at = store_level(i);
    stored_at_[static_cast<std::size_t>(i)] = at;
    requests_[at].push_back(reshape_request(i, m));
    return m;
  }

  // The level whose segment stores node i (a temporary): the one just before the first step
  // that reads it when only library steps do (directly, or through a transpose only they
  // read), else i's own. In a backward the values the weights' gradients read (a layer's
  // normalised input, its gelu, recomputed from what the forward kept) are all computable in
  // the first segment, yet read one layer at a time in reverse: stored where the first
  // segment runs, every layer's would be held through the whole backward (beside the logits
  // and their gradient, at the step's peak); stored just before their product, one layer's
  // at a time. The same reads and writes either way: i's inputs are read once, where i is.
  int store_level(int i) const {
    const std::size_t ii = static_cast<std::size_t>(i);
    int first = -1;
    auto library_reader = [&](int j) {
      const ir::GraphNode& u = node(j);
      if (!ir::is_library_call(u.op) || absorbed_[static_cast<std::size_t>(j)]) return false;
      const int l = level_[static_cast<std::size_t>(j)];
      first = first < 0 ? l : std::min(first, l);
      return true;
    };
    if (is_graph_output(i)) return level_[ii];
    for (int j : users_[ii]) {
      if (library_reader(j)) continue;
      if (node(j).op != ir::Op::Permute || is_graph_output(j) || users_[static_cast<std::size_t>(j)].empty())
        return level_[ii];
      for (int k : users_[static_cast<std::size_t>(j)])
        if (!library_reader(k)) return level_[ii];
    }
    return first < 0 ? level_[ii] : std::max(level_[ii], first - 1);
  }

  // Where a call reads node i: another call's result where that call wrote it, a leaf in
  // place, else memory the segment of i's level writes.
  Slot operand_slot(int i) {
    const ir::GraphNode& nd = node(i);
    if (is_call_result(i)) return result_slot(i);
    if (nd.op == ir::Op::Input && library_readable(nd.shape, nd.strides)) return Slot{Slot::Leaf, nd.leaf, nd.strides};
    // A reshape of memory that is there anyway reads that memory: a call's result (an
    // assembled concatenation flattened to the product's [B*T, N]), a leaf, or a computed value
    // that the segment writing the reshape would read from memory rather than recompute (a
    // backward's layer-norm output [B, T, C], computed where the forward's saved values are
    // read, that a weight gradient reads as [B*T, C]): stored once and read in place, not
    // stored and then copied. A value that segment recomputes (a GELU of a saved input) is
    // written there, reshaped, as before. Offsets stay 0: the library's kernels are chosen
    // for operands aligned as allocations are.
    if (nd.op == ir::Op::Reshape) {
      int base = -1;
      std::optional<Slot> v = view_of_memory(i, nd.shape.numel(), &base);
      if (v && v->byte_offset == 0 && library_readable(nd.shape, v->strides)) {
        if (base < 0) return *v;
        const int at = store_level(i);
        if (level_[static_cast<std::size_t>(base)] < at && reads_too_much_to_recompute(base, at)) {
          const Slot m = materialize(base);
          v->kind = m.kind;
          v->index = m.index;
          return *v;
        }
      }
    }
    // A transpose of a value some step writes anyway (another call's result, or a value a
    // segment stores: the forward's activation whose transpose a weight gradient reads): the
    // call reads that memory through the permuted strides instead of a transposed copy.
    if (nd.op == ir::Op::Permute && node(nd.inputs[0]).op != ir::Op::Input) {
      const int src = nd.inputs[0];
      const std::size_t si = static_cast<std::size_t>(src);
      const Strides base = is_call_result(src)                   ? result_slot(src).strides
                           : materialized_[si].kind != Slot::None ? materialized_[si].strides
                                                                  : library_order(src).value_or(
                                                                        contiguous_strides(node(src).shape));
      std::optional<ir::StridedLayout> l = ir::view_layout(nd.op, nd.attrs, node(src).shape, {0, base}, nd.shape);
      if (l && library_readable(nd.shape, l->strides)) {
        Slot m = operand_slot(src);
        if (m.strides == base) return Slot{m.kind, m.index, l->strides, m.byte_offset};
      }
    }
    return materialize(i, library_order(i));
  }

  // source_order(i) where a library call can read that layout.
  std::optional<Strides> library_order(int i) const {
    std::optional<Strides> o = source_order(i);
    if (o && !library_readable(node(i).shape, *o)) return std::nullopt;
    return o;
  }

  // Where a scatter or a scan reads node i: kiln's own step kernels read any strides of a leaf.
  // A broadcast or a reshape of a computed value is that value's memory seen through strides
  // (0 along the broadcast dims): an embedding gradient's row index, broadcast over the
  // columns, is stored once per row and reads as one index per row, the case the scatter
  // kernels sort by runs instead of walking each column through every row.
  Slot scatter_operand_slot(int i) {
    const ir::GraphNode& nd = node(i);
    if (is_call_result(i)) return result_slot(i);
    if (nd.op == ir::Op::Input) {
      bool ok = true;
      for (auto st : nd.strides) ok = ok && st >= 0;
      if (ok) return Slot{Slot::Leaf, nd.leaf, nd.strides};
    }
    if (materialized_[static_cast<std::size_t>(i)].kind == Slot::None &&
        (nd.op == ir::Op::Broadcast || nd.op == ir::Op::Reshape)) {
      const ir::GraphNode& in = node(nd.inputs[0]);
      Slot s = scatter_operand_slot(nd.inputs[0]);
      if (nd.op == ir::Op::Broadcast) {
        for (std::size_t d = 0; d < nd.shape.size(); ++d)
          if (in.shape[d] == 1) s.strides[d] = 0;
        return s;
      }
      if (std::optional<Strides> st = ir::view_strides(in.shape, s.strides, nd.shape)) return Slot{s.kind, s.index, *st};
    }
    return materialize(i);
  }

  // Where a step written by kiln's own kernels (a scatter, a scan) puts node i: a graph output
  // holding i, contiguous and not yet taken, else a temporary.
  Slot contiguous_result(int i) {
    for (std::size_t k = 0; k < g_.outputs.size(); ++k) {
      if (g_.outputs[k] != i || output_taken_.count(static_cast<int>(k)) ||
          !is_contiguous(node(i).shape, g_.output_strides[k]))
        continue;
      output_taken_.insert(static_cast<int>(k));
      return Slot{Slot::Output, static_cast<int>(k), g_.output_strides[k]};
    }
    return temp(i);
  }

  // The memory a call (product or scatter) writes its result `i` to.
  Slot result_slot(int i) const {
    const std::size_t ii = static_cast<std::size_t>(i);
    if (assembled_[ii].kind != Slot::None) return assembled_[ii];
    if (call_of_result_[ii] >= 0) {
      const LibraryCall& c = plan_.calls[static_cast<std::size_t>(call_of_result_[ii])];
      Slot s = c.result == i ? c.out : c.aux_slot;  // else the GELU's input it keeps
      // A result in a row-split shape ([B, T, N]) is the call's contiguous [M, N].
      if (s.strides.size() != node(i).shape.size()) s.strides = contiguous_strides(node(i).shape);
      return s;
    }
    if (scan_of_result_[ii] >= 0) return plan_.scans[static_cast<std::size_t>(scan_of_result_[ii])].result;
    if (sort_of_result_[ii] >= 0) return plan_.sorts[static_cast<std::size_t>(sort_of_result_[ii])].result;
    if (attention_of_result_[ii] >= 0)
      return plan_.attentions[static_cast<std::size_t>(attention_of_result_[ii])].result(
          static_cast<ir::AttentionRole>(node(i).attrs.ints.at(0)));
    return plan_.scatters[static_cast<std::size_t>(scatter_of_result_[ii])].out;
  }

  // Where each call writes (a graph output directly when it can) and reads.
  void plan_outputs() {
    plan_assembled_concats();
    plan_attention_results();
    for (auto& c : plan_.calls) {
      // A result in a row-split shape is written as the call's contiguous [M, N] (result_slot
      // gives its readers the split shape's strides).
      const bool split = node(c.result).shape.size() != c.shape.size();
      for (std::size_t k = 0; split && k < g_.outputs.size() && c.out.kind == Slot::None; ++k)
        if (g_.outputs[k] == c.result && !output_taken_.count(static_cast<int>(k)) &&
            is_contiguous(node(c.result).shape, g_.output_strides[k])) {
          output_taken_.insert(static_cast<int>(k));
          c.out = Slot{Slot::Output, static_cast<int>(k), contiguous_strides(c.shape)};
        }
      if (split && c.out.kind == Slot::None) {
        c.out = temp(c.result);
        c.out.strides = contiguous_strides(c.shape);
      }
      for (std::size_t k = 0; k < g_.outputs.size() && c.out.kind == Slot::None; ++k) {
        const Strides& os = g_.output_strides[k];
        const std::size_t r = c.shape.size();
        if (g_.outputs[k] != c.result || output_taken_.count(static_cast<int>(k)) || os[r - 1] != 1 ||
            (c.shape[r - 2] > 1 && os[r - 2] < c.shape[r - 1]))
          continue;
        bool ok = true;
        for (auto s : os) ok = ok && s >= 0;
        if (!ok) continue;
        output_taken_.insert(static_cast<int>(k));
        c.out = Slot{Slot::Output, static_cast<int>(k), os};
      }
      // An output that only reshapes the result (a [B*T, N] product returned as [B, T, N]):
      // the call writes the output's memory, which holds the same elements in the same order.
      for (std::size_t k = 0; k < g_.outputs.size() && c.out.kind == Slot::None; ++k) {
        const int o = g_.outputs[k];
        if (o == c.result || output_taken_.count(static_cast<int>(k)) ||
            !is_contiguous(node(o).shape, g_.output_strides[k]))
          continue;
        if (reshape_source(o) != c.result) continue;
        output_taken_.insert(static_cast<int>(k));
        c.out = Slot{Slot::Output, static_cast<int>(k), contiguous_strides(c.shape)};
      }
      if (c.out.kind == Slot::None) c.out = temp(c.result);
      if (c.aux >= 0 && c.activation == Activation::GeluTanh) {
        c.aux_slot = contiguous_result(c.aux);
        c.aux_slot.strides = contiguous_strides(c.shape);
      }
    }
    // Scatters and scans write a contiguous graph output directly, else a temporary.
    for (auto& c : plan_.scatters) c.out = contiguous_result(c.node);
    for (auto& c : plan_.scans) c.result = contiguous_result(c.node);
    for (auto& c : plan_.scans) c.src = scatter_operand_slot(node(c.node).inputs[0]);
    for (auto& c : plan_.sorts) {
      c.result = contiguous_result(c.node);
      c.src = scatter_operand_slot(node(c.node).inputs[0]);
      if (g_.device.is_cuda() && c.rows() > 0 && c.gpu_row_bytes() > SortCall::kSharedBudget) {
        // The blocks stride over the rows: at most 512 in flight, and no more than 1 GiB of
        // scratch (one block per SM or so for rows of hundreds of MiB; at least one row).
        const std::int64_t fit = std::max<std::int64_t>(1, (std::int64_t{1} << 30) / c.gpu_row_bytes());
        c.scratch_rows = std::min<std::int64_t>({c.rows(), std::int64_t{512}, fit});
        c.scratch = static_cast<int>(plan_.temps.size());
        plan_.temps.push_back({Shape{c.scratch_rows * c.gpu_row_bytes() / 4}, DType::Int32});
      }
    }
    for (std::size_t k = 0; k < plan_.calls.size(); ++k) {
      LibraryCall& c = plan_.calls[k];
      c.a = operand_slot(fold_cast(operands_[k].first, c.a_from));
      c.b = operand_slot(fold_cast(operands_[k].second, c.b_from));
    }
    for (auto& c : plan_.scatters) {
      const ir::GraphNode& nd = node(c.node);
      if (!c.base_constant) c.base = scatter_operand_slot(nd.inputs[0]);
      c.index = scatter_operand_slot(nd.inputs[1]);
      c.src = scatter_operand_slot(nd.inputs[2]);
      bool row_index = c.length() > 0 && c.length() < (std::int64_t{1} << 30) && c.bound() < (std::int64_t{1} << 30);
      for (std::size_t d = 0; d < c.index_shape.size(); ++d)
        if (static_cast<std::int64_t>(d) != c.axis && c.index_shape[d] > 1 && c.index.strides[d] != 0) row_index = false;
      c.sorted_runs = g_.device.is_cuda() && row_index;
      c.flag = static_cast<int>(plan_.temps.size());
      plan_.temps.push_back({Shape{c.flag_ints()}, DType::Int32});
    }
    plan_attention_slots();
    // A GELU's input a gradient's call reads: where it is, or a row-major copy.
    for (LibraryCall& c : plan_.calls) {
      if (c.activation != Activation::GeluTanhGrad) continue;
      const ir::GraphNode& xn = node(c.aux);
      if (xn.op == ir::Op::Input)
        c.aux_slot = Slot{Slot::Leaf, xn.leaf, xn.strides};
      else if (is_call_result(c.aux))
        c.aux_slot = result_slot(c.aux);
      if (c.aux_slot.kind == Slot::None || c.aux_slot.byte_offset != 0 ||
          c.aux_slot.strides != contiguous_strides(xn.shape))
        c.aux_slot = materialize(c.aux);
    }
    for (auto& [call, src] : bias_source_) {
      const ir::GraphNode& s = node(src);
      LibraryCall& c = plan_.calls[static_cast<std::size_t>(call)];
      if (s.op == ir::Op::Input && (s.strides.back() == 1 || s.shape.back() == 1))
        c.bias_slot = Slot{Slot::Leaf, s.leaf, s.strides};  // [1, N], or [M, N] with row stride 0
      else if (is_call_result(src))
        c.bias_slot = operand_slot(src);
      else
        c.bias_slot = materialize(src);
    }
  }

  bool is_call_result(int i) const {
    return call_of_result_[static_cast<std::size_t>(i)] >= 0 || scatter_of_result_[static_cast<std::size_t>(i)] >= 0 ||
           scan_of_result_[static_cast<std::size_t>(i)] >= 0 || sort_of_result_[static_cast<std::size_t>(i)] >= 0 ||
           attention_of_result_[static_cast<std::size_t>(i)] >= 0 ||
           assembled_[static_cast<std::size_t>(i)].kind != Slot::None;
  }

  // The operand a call reads for node i: on the CPU, a cast between floating dtypes of a value
  // the call can read in place (a leaf, another call's result) is folded into the call (the
  // CPU product packs its operands through the cast; cuBLASLt reads one dtype, so on the GPU
  // the cast runs in the segment that writes the operand). `from` gets the stored dtype.
  int fold_cast(int i, std::optional<DType>& from) const {
    if (!g_.device.is_cpu()) return i;
    const ir::GraphNode& nd = node(i);
    if (nd.op != ir::Op::Cast || !is_floating(nd.dtype)) return i;
    const int x = nd.inputs[0];
    const ir::GraphNode& src = node(x);
    if (!is_floating(src.dtype) || src.shape != nd.shape) return i;
    const bool readable = is_call_result(x) || (src.op == ir::Op::Input && library_readable(src.shape, src.strides));
    if (!readable) return i;
    from = src.dtype;
    return x;
  }

  // For every node: how many later segments read it (distinct levels above its own among its
  // users), and whether a node of its own level reads it (so its own segment computes it anyway).
  void count_user_levels() {
    std::vector<std::set<int>> higher(n_);
    own_level_user_.assign(n_, 0);
    for (std::size_t j = 0; j < n_; ++j)
      for (auto in : g_.nodes[j].inputs) {
        const std::size_t ii = static_cast<std::size_t>(in);
        if (level_[j] > level_[ii])
          higher[ii].insert(level_[j]);
        else if (!absorbed_[j])
          own_level_user_[ii] = 1;
      }
    for (auto o : g_.outputs) own_level_user_[static_cast<std::size_t>(o)] = 1;  // its segment writes it
    later_segments_.assign(n_, 0);
    for (std::size_t i = 0; i < n_; ++i) later_segments_[i] = static_cast<int>(higher[i].size());
  }

  // Whether segment s should read node i (of a lower level) from memory rather than recompute
  // it: recomputing would read several large values where the stored one is one read. A chain
  // of residual adds (x + attn(x) + mlp(...) in every layer of a transformer, and the sum of
  // its gradients backwards) otherwise makes every later segment read every earlier layer's
  // output again, quadratic in the depth. Counted: distinct memory values (leaves, library
  // results, stored values, lower reductions) of at least a sixteenth of i's elements, so a
  // broadcast bias or a per-row statistic does not count; constants and iotas are free. A
  // value only one later segment reads, which its own level does not compute either, is still
  // recomputed there: storing it would read the same values once more and add a write.
  bool reads_too_much_to_recompute(int i, int s) const {
    const ir::GraphNode& root = node(i);
    if (!ir::is_pointwise(root.op) && !ir::is_index_map(root.op) && !ir::is_gather(root.op)) return false;
    const std::size_t ri = static_cast<std::size_t>(i);
    if (later_segments_[ri] < 2 && !own_level_user_[ri]) return false;
    const i64 large = std::max<i64>(1, root.shape.numel() / 16);
    std::set<int> seen{i}, reads;
    std::vector<int> stack(root.inputs.begin(), root.inputs.end());
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second) continue;
      const ir::GraphNode& nd = node(x);
      const std::size_t xi = static_cast<std::size_t>(x);
      const bool memory = nd.op == ir::Op::Input || is_call_result(x) ||
                          (level_[xi] < s && (materialized_[xi].kind != Slot::None || ir::is_reduction(nd.op)));
      if (memory) {
        if (nd.shape.numel() >= large) reads.insert(x);
        if (reads.size() >= kRecomputeReadLimit) return true;
        continue;
      }
      if (zero_[xi]) continue;
      stack.insert(stack.end(), nd.inputs.begin(), nd.inputs.end());
    }
    return false;
  }


  // Segment s's copy of node i (memoised in `map`), requesting lower levels' values.
  int import(int root, int s, std::map<int, int>& map, Segment& seg) {
    std::vector<std::pair<int, std::size_t>> stack{{root, 0}};
    while (!stack.empty()) {
      auto& [i, next] = stack.back();
      if (map.count(i)) {
        stack.pop_back();
        continue;
      }
      const ir::GraphNode& nd = node(i);
      const std::size_t ii = static_cast<std::size_t>(i);
      Slot leaf;
      if (nd.op == ir::Op::Input) {
        leaf = Slot{Slot::Leaf, nd.leaf, nd.strides};
      } else if (is_call_result(i)) {
        leaf = result_slot(i);
      } else if (materialized_[ii].kind != Slot::None && level_[ii] < s && stored_at_[ii] != s) {
        // Stored after s only where library steps alone read it (store_level); segment s
        // computes what it stores itself.
        if (stored_at_[ii] > s) throw InternalError("kiln: step plan: a value read before the step that stores it");
        leaf = materialized_[ii];
      } else if (level_[ii] < s && stored_at_[ii] != s &&
                 (ir::is_reduction(nd.op) || reads_too_much_to_recompute(i, s))) {
        leaf = materialize(i);
      }
      if (leaf.kind != Slot::None) {
        ir::GraphNode in;
        in.op = ir::Op::Input;
        in.dtype = nd.dtype;
        in.shape = nd.shape;
        in.strides = leaf.strides;
        in.leaf = static_cast<int>(seg.leaves.size());
        seg.leaves.push_back(leaf);
        map[i] = static_cast<int>(seg.graph.nodes.size());
        seg.graph.nodes.push_back(std::move(in));
        stack.pop_back();
        continue;
      }
      if (zero_[ii]) {
        ir::GraphNode z;
        z.op = ir::Op::Constant;
        z.dtype = nd.dtype;
        z.shape = nd.shape;
        map[i] = static_cast<int>(seg.graph.nodes.size());
        seg.graph.nodes.push_back(std::move(z));
        stack.pop_back();
        continue;
      }
      if (next < nd.inputs.size()) {
        int c = nd.inputs[next++];
        if (!map.count(c)) stack.push_back({c, 0});
        continue;
      }
      ir::GraphNode copy = nd;
      for (auto& in : copy.inputs) in = map.at(in);
      map[i] = static_cast<int>(seg.graph.nodes.size());
      seg.graph.nodes.push_back(std::move(copy));
      stack.pop_back();
    }
    return map.at(root);
  }

  void build_segments() {
    int top = 0;
    for (std::size_t i = 0; i < n_; ++i) top = std::max(top, level_[i]);
    // Graph outputs not written by a call: computed (or copied) by the segment of their level.
    for (std::size_t k = 0; k < g_.outputs.size(); ++k) {
      if (output_taken_.count(static_cast<int>(k))) continue;
      const int o = g_.outputs[k];
      const int lvl = level_[static_cast<std::size_t>(o)];
      requests_[lvl].push_back(output_request(o, static_cast<int>(k)));
    }
    segments_by_level_.assign(static_cast<std::size_t>(top) + 1, -1);
    for (int s = top; s >= 0; --s) {
      Segment seg;
      seg.graph.device = g_.device;
      std::map<int, int> map;
      // Requests may grow while this segment imports (a lower level's); this level's are fixed.
      auto& reqs = requests_[s];
      for (std::size_t r = 0; r < reqs.size(); ++r) {
        auto [i, slot] = reqs[r];
        int idx = import(i, s, map, seg);
        seg.graph.outputs.push_back(idx);
        seg.graph.output_strides.push_back(slot.strides);
        seg.outputs.push_back(slot);
      }
      if (seg.outputs.empty()) continue;
      seg.graph.rehash();
      segments_by_level_[static_cast<std::size_t>(s)] = static_cast<int>(plan_.segments.size());
      plan_.segments.push_back(std::move(seg));
    }
  }

  void order_steps() {
    int top = static_cast<int>(segments_by_level_.size()) - 1;
    for (int s = 0; s <= top; ++s) {
      for (std::size_t c = 0; c < plan_.calls.size(); ++c)
        if (plan_.calls[c].level == s) plan_.order.push_back({Step::Call, static_cast<int>(c)});
      for (std::size_t c = 0; c < plan_.scatters.size(); ++c)
        if (plan_.scatters[c].level == s) plan_.order.push_back({Step::Scatter, static_cast<int>(c)});
      for (std::size_t c = 0; c < plan_.scans.size(); ++c)
        if (plan_.scans[c].level == s) plan_.order.push_back({Step::Scan, static_cast<int>(c)});
      for (std::size_t c = 0; c < plan_.sorts.size(); ++c)
        if (plan_.sorts[c].level == s) plan_.order.push_back({Step::Sort, static_cast<int>(c)});
      for (std::size_t c = 0; c < plan_.attentions.size(); ++c)
        if (plan_.attentions[c].level == s) plan_.order.push_back({Step::Attention, static_cast<int>(c)});
      if (segments_by_level_[static_cast<std::size_t>(s)] >= 0)
        plan_.order.push_back({Step::Kernels, segments_by_level_[static_cast<std::size_t>(s)]});
    }
  }

  // A donated leaf (ir::Graph::donated: memory nothing reads after this run) whose last reader
  // is a segment gives its memory to a value that segment writes for later steps, of the same
  // size: the logits a loss's gradient is computed from hold that gradient, as Inductor reuses a
  // dead buffer for an output of the kernel that reads it last. The segment's schedule must
  // agree (sched::overwrite_refusal): the writing kernel reads the leaf only at the element it
  // writes, and every other kernel reading it runs first. Else the value keeps its temporary.
  void plan_overwrites() {
    for (std::int32_t leaf : g_.donated) {
      const std::vector<int> inputs = g_.inputs_of(leaf);
      if (inputs.size() != 1) continue;
      const ir::GraphNode& ln = node(inputs[0]);
      if (ln.strides != contiguous_strides(ln.shape)) continue;
      const std::int64_t bytes = ln.shape.numel() * static_cast<std::int64_t>(itemsize(ln.dtype));
      // The last step reading the leaf.
      int last = -1;
      for (std::size_t p = 0; p < plan_.order.size(); ++p)
        StepPlan::for_each_slot(plan_, plan_.order[p], [&](const Slot& sl) {
          if (sl.kind == Slot::Leaf && sl.index == leaf) last = static_cast<int>(p);
        });
      if (last < 0 || plan_.order[static_cast<std::size_t>(last)].kind != Step::Kernels) continue;
      Segment& seg = plan_.segments[static_cast<std::size_t>(plan_.order[static_cast<std::size_t>(last)].index)];
      int seg_leaf = -1;
      for (std::size_t j = 0; j < seg.leaves.size(); ++j)
        if (seg.leaves[j].kind == Slot::Leaf && seg.leaves[j].index == leaf)
          seg_leaf = seg_leaf == -1 && seg.leaves[j].byte_offset == 0 && seg.leaves[j].strides == ln.strides
                         ? static_cast<int>(j)
                         : -2;
      if (seg_leaf < 0) continue;
      for (std::size_t k = 0; k < seg.outputs.size(); ++k) {
        const Slot out = seg.outputs[k];
        if (out.kind != Slot::Temp || out.byte_offset != 0) continue;
        const StepTemp& t = plan_.temps[static_cast<std::size_t>(out.index)];
        if (itemsize(t.dtype) != itemsize(ln.dtype) || t.shape.numel() * static_cast<std::int64_t>(itemsize(t.dtype)) != bytes)
          continue;
        seg.graph.overwrites.push_back({static_cast<std::int32_t>(k), static_cast<std::int32_t>(seg_leaf)});
        seg.graph.rehash();
        if (!sched::overwrite_refusal(seg.graph).empty()) {
          seg.graph.overwrites.pop_back();
          seg.graph.rehash();
          continue;
        }
        // Every step that reads or writes the temporary uses the leaf's memory instead.
        for (const Step& st : plan_.order)
          StepPlan::for_each_slot(plan_, st, [&](Slot& sl) {
            if (sl.kind == Slot::Temp && sl.index == out.index) {
              sl.kind = Slot::Leaf;
              sl.index = leaf;
            }
          });
        break;
      }
    }
  }

  const ir::Graph& g_;
  bool fuse_, training_;  ///< plan_steps' fuse_epilogues and training_epilogues
  std::size_t n_;
  StepPlan plan_;
  std::vector<int> uses_, call_of_result_, scatter_of_result_, scan_of_result_, sort_of_result_, level_;
  std::vector<int> later_segments_;   ///< per node: distinct levels above its own that read it
  std::vector<char> own_level_user_;  ///< per node: read by a node of its own level
  std::vector<int> attention_of_result_;
  std::vector<std::vector<int>> attention_nodes_;  ///< per attention call: its result nodes
  std::vector<char> absorbed_, zero_;
  std::vector<Slot> materialized_;
  std::vector<int> stored_at_;      ///< per materialized node: the level whose segment stores it
  std::vector<std::vector<int>> users_;  ///< per node: the nodes reading it, in order
  std::vector<Slot> assembled_;    ///< per concatenation its parts' calls write in place: its memory
  std::vector<Slot> result_view_;  ///< per attention result written into such a concatenation: where
  std::vector<std::pair<int, int>> bias_source_;  ///< (call, node of its bias)
  std::vector<std::pair<int, int>> operands_;     ///< per call: the nodes of a and b
  std::set<int> output_taken_;
  std::map<int, std::vector<std::pair<int, Slot>>> requests_;  ///< level -> (node, where)
  std::vector<int> segments_by_level_;
};

}  // namespace detail

// Defined in attention_match.hpp (included at the end of this file).
inline bool fuse_written_out_attention(const ir::Graph& g, ir::Graph& rewritten);

inline StepPlan plan_steps(const ir::Graph& g, bool fuse_epilogues, bool training_epilogues) {
  // Written-out attention becomes one fused call first. The rewritten graph keeps g's leaf
  // indices and output positions, so the plan's slots bind to g's buffers unchanged; it lives
  // while the planner runs (the plan holds no reference to it).
  ir::Graph rewritten;
  if (fuse_written_out_attention(g, rewritten))
    return detail::StepPlanner(rewritten, fuse_epilogues, training_epilogues).run();
  return detail::StepPlanner(g, fuse_epilogues, training_epilogues).run();
}

template <class Plan, class F>
void StepPlan::for_each_slot(Plan& plan, const Step& st, F&& f) {
  const auto i = static_cast<std::size_t>(st.index);
  switch (st.kind) {
    case Step::Kernels:
      for (auto& s : plan.segments[i].leaves) f(s);
      for (auto& s : plan.segments[i].outputs) f(s);
      break;
    case Step::Call: {
      auto& c = plan.calls[i];
      f(c.a);
      f(c.b);
      f(c.out);
      if (c.bias) f(c.bias_slot);
      if (c.aux >= 0) f(c.aux_slot);
      break;
    }
    case Step::Scatter: {
      auto& c = plan.scatters[i];
      f(c.base);
      f(c.index);
      f(c.src);
      f(c.out);
      break;
    }
    case Step::Scan:
      f(plan.scans[i].src);
      f(plan.scans[i].result);
      break;
    case Step::Sort:
      f(plan.sorts[i].src);
      f(plan.sorts[i].result);
      break;
    case Step::Attention: {
      auto& c = plan.attentions[i];
      for (auto* s : {&c.q, &c.k, &c.v, &c.mask, &c.out, &c.dout, &c.lse, &c.dq, &c.dk, &c.dv, &c.seed}) f(*s);
      break;
    }
  }
}

inline std::vector<int> StepPlan::temps_of(const Step& st) const {
  std::vector<int> t;
  for_each_slot(*this, st, [&](const Slot& s) {
    if (s.kind == Slot::Temp) t.push_back(s.index);
  });
  // Scratch temporaries that are no slot.
  const auto i = static_cast<std::size_t>(st.index);
  if (st.kind == Step::Scatter && scatters[i].flag >= 0) t.push_back(scatters[i].flag);
  if (st.kind == Step::Sort && sorts[i].scratch >= 0) t.push_back(sorts[i].scratch);
  if (st.kind == Step::Attention && attentions[i].delta >= 0) t.push_back(attentions[i].delta);
  return t;
}

inline std::string StepPlan::str() const {
  auto slot = [](const Slot& s) {
    const char* k = s.kind == Slot::Leaf ? "leaf" : s.kind == Slot::Output ? "out" : s.kind == Slot::Temp ? "tmp" : "?";
    return std::string(k) + std::to_string(s.index) + (s.byte_offset ? "+" + std::to_string(s.byte_offset) : "");
  };
  std::ostringstream os;
  for (const Step& st : order) {
    if (st.kind == Step::Attention) {
      const AttentionCall& c = attentions[static_cast<std::size_t>(st.index)];
      const bool fwd = c.kind == AttentionCall::Forward;
      os << "call attention " << (fwd ? "forward " : "backward ") << dtype_name(c.dtype) << " [" << c.batch << ", "
         << c.heads << ", " << c.q_len << ", " << c.head_dim << "] x [" << c.batch << ", " << c.kv_heads << ", "
         << c.kv_len << ", " << c.value_dim << "]" << (c.causal ? ", causal" : "") << (c.has_mask ? ", mask" : "");
      if (c.has_dropout()) os << ", dropout " << c.dropout_p;
      os << " (" << slot(c.q) << ", " << slot(c.k) << ", " << slot(c.v);
      if (c.has_mask) os << ", mask " << slot(c.mask);
      if (c.has_dropout()) os << ", key " << slot(c.seed);
      if (fwd) {
        os << ") ->";
        if (c.wants(c.out)) os << " out " << slot(c.out);
        if (c.wants(c.lse)) os << " lse " << slot(c.lse);
      } else {
        os << ", " << slot(c.out) << ", " << slot(c.dout) << ", " << slot(c.lse) << ") ->";
        if (c.wants(c.dq)) os << " dq " << slot(c.dq);
        if (c.wants(c.dk)) os << " dk " << slot(c.dk);
        if (c.wants(c.dv)) os << " dv " << slot(c.dv);
      }
      os << "\n";
      continue;
    }
    if (st.kind == Step::Scan) {
      static const char* kinds[] = {"cumsum", "cumprod", "cummax", "cummin", "cummax indices", "cummin indices",
                                    "logcumsumexp"};
      const ScanCall& c = scans[static_cast<std::size_t>(st.index)];
      os << "call " << kinds[static_cast<int>(c.kind)] << " " << dtype_name(c.in) << c.shape.str() << " along " << c.axis
         << " (" << slot(c.src) << ") -> " << slot(c.result) << " " << dtype_name(c.out) << "\n";
      continue;
    }
    if (st.kind == Step::Sort) {
      const SortCall& c = sorts[static_cast<std::size_t>(st.index)];
      os << "call sort " << dtype_name(c.in) << c.shape.str() << " along " << c.axis << ", first " << c.k
         << (c.descending ? " largest" : " smallest") << " (" << slot(c.src) << ") -> " << slot(c.result) << " int64";
      if (c.scratch >= 0) os << " + scratch " << slot(Slot{Slot::Temp, c.scratch, {}});
      os << "\n";
      continue;
    }
    if (st.kind == Step::Scatter) {
      const ScatterCall& c = scatters[static_cast<std::size_t>(st.index)];
      os << "call " << ir::gather_site_name(c.site) << " " << dtype_name(c.dtype) << " " << c.index_shape.str()
         << " into " << c.shape.str() << " along " << c.axis << (c.accumulate ? ", adding" : "")
         << (c.atomic ? ", atomic" : "") << " (" << (c.base_constant ? std::string("constant") : slot(c.base)) << ", "
         << slot(c.index) << ", " << slot(c.src) << ") -> " << slot(c.out) << "\n";
      continue;
    }
    if (st.kind == Step::Call) {
      const LibraryCall& c = calls[static_cast<std::size_t>(st.index)];
      os << "call matmul " << dtype_name(c.dtype) << " " << c.a_shape.str() << " x " << c.b_shape.str() << " ("
         << slot(c.a) << (c.a_from ? std::string(" cast from ") + dtype_name(*c.a_from) : "") << ", " << slot(c.b)
         << (c.b_from ? std::string(" cast from ") + dtype_name(*c.b_from) : "") << ") -> " << slot(c.out);
      if (c.bias) os << " + bias " << slot(c.bias_slot);
      if (c.activation == Activation::Relu) os << ", relu";
      if (c.activation == Activation::GeluTanh) os << ", gelu(tanh)";
      if (c.activation == Activation::GeluTanhGrad)
        os << ", gelu(tanh) gradient at " << slot(c.aux_slot);
      else if (c.aux >= 0)
        os << ", its input kept in " << slot(c.aux_slot);
      os << "\n";
    } else {
      const Segment& s = segments[static_cast<std::size_t>(st.index)];
      os << "kernels over " << s.graph.nodes.size() << " nodes:";
      for (auto& l : s.leaves) os << " " << slot(l);
      os << " ->";
      for (auto& o : s.outputs) os << " " << slot(o);
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace kiln::sched

KILN_COLD_CODE_END

#include "kiln/sched/attention_match.hpp"
