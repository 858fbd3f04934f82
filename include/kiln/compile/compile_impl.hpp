#pragma once
// The definitions of kiln::compile's code that does not depend on the compiled function's type
// (compile/compile.hpp): the modes and backends, and detail::CompiledCore. Header-only mode
// includes them from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp).
#include <cstdio>
#include <sstream>

#include "kiln/compile/compile.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY const std::vector<std::string>& valid_modes() {
  static const std::vector<std::string> m = [] {
    std::vector<std::string> v;
    for (const auto& n : kModeNames) v.push_back(n.name);
    return v;
  }();
  return m;
}

KILN_ENTRY CompileMode parse_mode(const std::string& name) {
  for (const auto& n : kModeNames)
    if (name == n.name) return n.mode;
  std::string all;
  for (const auto& v : valid_modes()) all += (all.empty() ? "" : ", ") + v;
  throw Error("kiln::compile: unknown mode \"" + name + "\"; valid modes: " + all);
}

/// What a mode means for CPU kernels: "reduce-overhead" runs the graph through one entry (one
/// parallel region); "max-autotune" tunes each kernel and also times that entry against them;
/// "max-autotune-no-cudagraphs" tunes each kernel only. On CUDA, `autotune` selects the tuned
/// kernels (backend::tune_cuda_plan) of "max-autotune-no-cudagraphs" ("max-autotune" runs
/// them in a CUDA graph, see the "kiln" backend below).
KILN_ENTRY backend::CpuLaunchOptions cpu_launch_options(CompileMode mode) {
  backend::CpuLaunchOptions o;
  o.graph_entry = mode == CompileMode::ReduceOverhead;
  o.autotune = mode == CompileMode::MaxAutotune || mode == CompileMode::MaxAutotuneNoCudagraphs;
  o.autotune_graph = mode == CompileMode::MaxAutotune;
  return o;
}

KILN_ENTRY BackendRegistry::BackendRegistry() {
  // The graph is bound to its executor once; a replay only launches.
  factories["kiln"] = [](const ir::Graph& g, const CompileOptions& o) -> GraphRunner {
    // reduce-overhead and max-autotune on CUDA (as torch.compile's max-autotune, it uses
    // CUDA graphs): the graph's launches are captured into a CUDA graph and replayed
    // (backend::CudaGraphRunner); replays take its static outputs as results.
    const CompileMode mode = parse_mode(o.mode);
    // Graphs with library calls (matrix products) are captured as their steps.
    if (g.device.is_cuda() && (mode == CompileMode::ReduceOverhead || mode == CompileMode::MaxAutotune) &&
        !g.outputs.empty())
      return backend::CudaGraphRunFn{backend::entry::cuda_graph_runner(g, 2, mode == CompileMode::MaxAutotune)};
    auto prepared = backend::entry::prepare(g, Backend::Auto, cpu_launch_options(mode));
    return [prepared](const ir::Graph&, const backend::RunArgs& a) { backend::entry::run_prepared(*prepared, a); };
  };
  factories["trace"] = [](const ir::Graph& g, const CompileOptions&) -> GraphRunner {
    auto prepared = backend::entry::prepare(g, Backend::Eager);
    return [prepared](const ir::Graph&, const backend::RunArgs& a) { backend::entry::run_prepared(*prepared, a); };
  };
  // "eager" never captures: it is handled by the caller (the function runs op by op).
  factories["eager"] = factories["trace"];
}

KILN_ENTRY BackendRegistry& backend_registry() {
  static BackendRegistry r;
  return r;
}

KILN_ENTRY std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// ---- CompiledCore --------------------------------------------------------------------------

KILN_ENTRY CompiledCore::CompiledCore(CompileOptions opts) : options(std::move(opts)) {
  auto& r = backend_registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.factories.count(options.backend)) {
      std::vector<std::string> names;
      for (auto& [k, v] : r.factories) names.push_back(k);
      throw Error("kiln::compile: unknown backend \"" + options.backend + "\"; valid backends: " + join(names));
    }
    factory = r.factories.at(options.backend);
  }
  mode = parse_mode(options.mode);
}

KILN_ENTRY void CompiledCore::register_clearer(const std::shared_ptr<CompiledCore>& self) {
  std::weak_ptr<CompiledCore> weak = self;
  self->clearer = std::make_shared<std::function<void()>>([weak] {
    if (auto s = weak.lock()) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->entries.clear();
    }
  });
  auto& reg = compiled_registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.clearers.push_back(self->clearer);
}

KILN_ENTRY CompiledCore::Decision CompiledCore::decide(const std::vector<GuardItem>& call, bool grad_mode,
                                                       std::uint32_t autocast,
                                                       const std::vector<const Tensor*>& tensor_args) {
  for (auto& e : entries) {
    if (e->grad_mode != grad_mode || e->autocast != autocast || !guards_match(e->guard, call)) continue;
    stats.cache_hits++;
    if (e->rerun) return {Next::Rerun};
    for (auto& [g, replay] : e->replays)
      if (guards_match(g, call)) return {Next::Replay, e.get(), replay.get()};
    // A dynamic entry meets new sizes: its graph follows them without running the function
    // (symbolic sizes); when some size cannot follow, it is traced again for these sizes.
    if (auto r = derive_replay(*e, call, tensor_args)) {
      // A bounded memory of sizes seen (the first, the traced one, stays).
      if (e->replays.size() >= kMaxReplays) e->replays.erase(e->replays.begin() + 1);
      e->replays.emplace_back(call, r);
      return {Next::Replay, e.get(), r.get()};
    }
    return {Next::Trace, e.get()};
  }

  if (static_cast<int>(entries.size()) >= options.recompile_limit) {
    std::string why =
        entries.empty() ? std::string("recompile_limit is 0") : first_failure(entries.back()->guard, call);
    if (options.error_on_recompile_limit)
      throw Error("kiln::compile: recompile limit (" + std::to_string(options.recompile_limit) + ") reached; " + why);
    if (!warned) {
      std::fprintf(stderr,
                   "kiln: warning: kiln::compile reached its recompile limit (%d); running uncompiled from now on. "
                   "Last failed guard: %s\n",
                   options.recompile_limit, why.c_str());
      warned = true;
    }
    stats.fallbacks++;
    return {Next::Uncompiled};
  }

  auto entry = std::make_shared<Entry>();
  entry->guard = call;
  entry->grad_mode = grad_mode;
  entry->autocast = autocast;
  if (!entries.empty()) {
    stats.recompiles++;
    const auto& last = entries.back()->guard;
    // Automatic dynamic: a size that changed becomes symbolic.
    if (!options.dynamic.has_value()) mark_changed_sizes_dynamic(*entry, last);
    std::string why =
        "recompiling: " +
        (entries.back()->grad_mode != grad_mode
             ? std::string("grad mode changed (is_grad_enabled() is ") + (grad_mode ? "true" : "false") + ")"
         : entries.back()->autocast != autocast ? "autocast changed (now " + autocast_describe() + ")"
                                                : first_failure(last, call));
    if (!options.dynamic.has_value() && entry->dynamic) why += "; now symbolic: " + dynamic_dims_text(entry->guard);
    log(LogChannel::recompiles, why);
  }
  if (options.dynamic.value_or(false)) mark_all_sizes_dynamic(*entry);
  entries.push_back(entry);
  if (log_enabled(LogChannel::guards)) {
    std::string g = "new guard entry:";
    for (std::size_t i = 0; i < call.size(); ++i)
      g += "\n  arg " + std::to_string(i) + ": " + entry->guard[i].describe();
    if (entry->dynamic) g += "\n  symbolic: " + dynamic_dims_text(entry->guard) + " (sizes 0 and 1 stay distinct)";
    log(LogChannel::guards, g);
  }
  return {Next::Trace, entry.get()};
}

KILN_ENTRY CompiledCore::Traced CompiledCore::finish_trace(Entry& entry, const std::vector<GuardItem>& call,
                                                           const std::vector<const Tensor*>& tensor_args,
                                                           std::vector<Tensor> outs, std::any traced_result,
                                                           bool returns_numbers) {
  Traced t;
  // Results that require grad (a model's forward): the backward is derived now from the
  // traced forward, and the forward graph also outputs the values it saves
  // (compile/backward_graph.hpp). A result that requires grad and is not computed by the
  // graph (an argument returned as it is) keeps the tape by running the function every call.
  std::optional<PendingBackward> pending;
  if (std::any_of(outs.begin(), outs.end(), [](const Tensor& x) { return x.defined() && x.requires_grad(); })) {
    if (std::any_of(outs.begin(), outs.end(),
                    [](const Tensor& x) { return x.defined() && x.requires_grad() && x.is_evaluated(); })) {
      log(LogChannel::graph_breaks,
          "kiln::compile: a result that requires grad is not computed by the traced "
          "graph; this entry runs the function on every call");
      stats.graph_breaks++;
      entry.rerun = true;
      return t;
    }
    pending = trace_backward(outs, tensor_args);
  }
  std::vector<std::size_t> freed;
  if (pending) {
    freed = std::move(pending->freed);
    if (pending->results.empty()) pending.reset();  // only results whose graph the function freed
  }
  const std::size_t own_results = outs.size();
  if (pending) {
    // Still deferred, as inside the trace: a Tensor of a large lazy node would evaluate it.
    TraceSession quiet;
    TraceScope scope(quiet);
    for (const ir::NodePtr& n : pending->saved) outs.push_back(Tensor(n));
  }
  auto replay = std::make_shared<Replay>();
  build_replay(*replay, outs, tensor_args);
  replay->freed_results = std::move(freed);
  replay->traced_result = std::move(traced_result);
  if (log_enabled(LogChannel::graph) || log_enabled(LogChannel::recompiles) || log_enabled(LogChannel::guards)) {
    std::size_t ops = 0;
    for (auto& n : replay->graph.nodes) ops += n.op != ir::Op::Input;
    log(LogChannel::graph, "compiling new graph: " + std::to_string(ops) + " ops\n" + replay->graph.str());
  }
  // A replay with a backward is specialised to its sizes (its backward graph is).
  if (entry.dynamic && !entry.base && !pending) {
    entry.base = replay;
    if (returns_numbers)
      log(LogChannel::recompiles, "dynamic entry: new sizes will re-trace: the function returns C++ numbers");
    else
      make_symbolic(entry, call, tensor_args);
  }
  replay->runner = make_runner(entry, replay->graph, tensor_args);
  if (pending) {
    // The first forward run gives the saved values, at which the backward graphs stop.
    std::vector<Tensor> first = run_replay(*replay, tensor_args);
    std::vector<Tensor> saved(first.begin() + static_cast<std::ptrdiff_t>(own_results), first.end());
    replay->backward = capture_backward(*pending, saved, own_results, tensor_args);
    t.first = std::move(first);
    t.ran = true;
  }
  entry.replays.emplace_back(call, replay);
  t.replay = std::move(replay);
  return t;
}

KILN_ENTRY std::string CompiledCore::explain_traced(const TraceSession& session,
                                                    const std::vector<Tensor>& outs) const {
  std::ostringstream os;
  std::vector<ir::NodePtr> roots;
  for (auto& t : outs)
    if (t.defined() && !t.is_evaluated()) roots.push_back(t.node());
  os << "kiln::explain: backend " << options.backend << ", mode " << options.mode << "\n";
  os << "graph breaks: " << session.breaks.size() << "\n";
  for (auto& b : session.breaks) os << "  - " << b << "\n";
  if (!roots.empty()) {
    ir::Captured c = ir::capture(roots, roots.front()->device);
    std::size_t ops = 0;
    for (auto& n : c.graph.nodes) ops += n.op != ir::Op::Input;
    os << "graph after the last break: " << c.graph.nodes.size() << " nodes (" << ops << " ops, " << c.leaves.size()
       << " inputs, " << c.graph.outputs.size() << " outputs)\n";
    os << explain_graph(c.graph);
  } else {
    os << "no tensor work after the last break\n";
  }
  return os.str();
}

KILN_ENTRY bool CompiledCore::guards_match(const std::vector<GuardItem>& g, const std::vector<GuardItem>& call) {
  if (g.size() != call.size()) return false;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!g[i].matches(call[i])) return false;
  return true;
}

KILN_ENTRY std::string CompiledCore::first_failure(const std::vector<GuardItem>& old,
                                                   const std::vector<GuardItem>& call) {
  for (std::size_t i = 0; i < old.size() && i < call.size(); ++i)
    if (!old[i].matches(call[i]))
      return "guard on argument " + std::to_string(i) + " failed: expected " + old[i].describe() + ", got " +
             call[i].describe();
  return "argument count changed";
}

KILN_ENTRY void CompiledCore::mark_changed_sizes_dynamic(Entry& e, const std::vector<GuardItem>& last) {
  for (std::size_t i = 0; i < e.guard.size(); ++i) {
    auto& g = e.guard[i];
    if (g.kind != detail::GuardItem::Kind::Tensor || last[i].kind != g.kind || last[i].shape.size() != g.shape.size())
      continue;
    for (std::size_t d = 0; d < g.shape.size(); ++d)
      if (last[i].shape[d] != g.shape[d]) {
        if (g.dynamic_dims.empty()) g.dynamic_dims.assign(g.shape.size(), false);
        g.dynamic_dims[d] = true;
        e.dynamic = true;
      }
  }
}

KILN_ENTRY void CompiledCore::mark_all_sizes_dynamic(Entry& e) {
  for (auto& g : e.guard)
    if (g.kind == detail::GuardItem::Kind::Tensor) {
      g.dynamic_dims.assign(g.shape.size(), true);
      e.dynamic = true;
    }
}

KILN_ENTRY void CompiledCore::build_replay(Replay& r, const std::vector<Tensor>& outs,
                                           const std::vector<const Tensor*>& tensor_args) {
  std::vector<ir::NodePtr> roots;
  std::vector<int> root_of(outs.size(), -1);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const Tensor& t = outs[i];
    detail::ResultSource src;
    if (!t.defined()) {
      src.kind = detail::ResultSource::Kind::Constant;
    } else if (t.is_evaluated()) {
      int a = detail::argument_of_storage(t.node()->buffer->storage, tensor_args);
      if (a >= 0) {
        src.kind = detail::ResultSource::Kind::ArgView;
        src.index = a;
        src.offset = t.node()->buffer->offset - tensor_args[a]->node()->buffer->offset;
        src.strides = t.node()->buffer->strides;
        src.shape = t.shape();
        src.whole = src.offset == 0 && src.shape == tensor_args[a]->shape() && src.strides == tensor_args[a]->strides();
      } else {
        src.kind = detail::ResultSource::Kind::Constant;
        src.constant = t;
      }
    } else {
      src.kind = detail::ResultSource::Kind::GraphOutput;
      src.index = static_cast<int>(roots.size());
      roots.push_back(t.node());
    }
    r.results.push_back(std::move(src));
  }
  if (roots.empty()) return;
  ir::Captured c = ir::capture(roots, roots.front()->device);
  r.graph = std::move(c.graph);
  for (auto& leaf : c.leaves) {
    detail::LeafSource ls;
    ls.arg = detail::argument_of_storage(leaf->buffer->storage, tensor_args);
    if (ls.arg >= 0)
      ls.offset = leaf->buffer->offset - tensor_args[ls.arg]->node()->buffer->offset;
    else
      ls.constant = leaf;
    r.leaves.push_back(std::move(ls));
  }
}

/// "arg 0 dim 0, arg 1 dim 0": the dims an entry's guard leaves symbolic (sizes of 2 or more).
KILN_ENTRY std::string CompiledCore::dynamic_dims_text(const std::vector<GuardItem>& guard) {
  std::string t;
  for (std::size_t i = 0; i < guard.size(); ++i)
    for (std::size_t d = 0; d < guard[i].dynamic_dims.size(); ++d)
      if (guard[i].dynamic_dims[d] && guard[i].shape[d] >= 2)
        t += (t.empty() ? "" : ", ") + std::string("arg ") + std::to_string(i) + " dim " + std::to_string(d);
  return t.empty() ? std::string("none (every dynamic size is 0 or 1)") : t;
}

/// Guard index of each tensor argument (tensor_args skips the numbers).
KILN_ENTRY std::vector<std::size_t> CompiledCore::tensor_guard_index(const std::vector<GuardItem>& call) {
  std::vector<std::size_t> v;
  for (std::size_t i = 0; i < call.size(); ++i)
    if (call[i].kind != detail::GuardItem::Kind::Number) v.push_back(i);
  return v;
}

/// Infers the symbolic sizes of a dynamic entry's first graph (entry.base); on failure the
/// entry re-traces for new sizes, and the recompiles log says why.
KILN_ENTRY void CompiledCore::make_symbolic(Entry& entry, const std::vector<GuardItem>& call,
                                            const std::vector<const Tensor*>& tensor_args) {
  const detail::Replay& r = *entry.base;
  const auto gi = tensor_guard_index(call);
  std::vector<detail::ArgDims> dims(tensor_args.size());
  std::vector<bool> symbolic_arg(tensor_args.size(), false);
  for (std::size_t k = 0; k < tensor_args.size(); ++k) {
    const auto& g = entry.guard[gi[k]];
    dims[k].shape = g.shape;
    dims[k].strides = g.strides;
    dims[k].dynamic.assign(g.shape.size(), false);
    for (std::size_t d = 0; d < g.dynamic_dims.size(); ++d) {
      dims[k].dynamic[d] = g.dynamic_dims[d];
      symbolic_arg[k] = symbolic_arg[k] || (g.dynamic_dims[d] && g.shape[d] >= 2);
    }
  }
  std::string why;
  auto fail = [&](const std::string& reason) {
    log(LogChannel::recompiles, "dynamic entry: new sizes will re-trace: " + reason);
  };
  for (auto& res : r.results)
    if (res.kind == detail::ResultSource::Kind::ArgView && symbolic_arg[static_cast<std::size_t>(res.index)] &&
        !res.whole)
      return fail("a result is a view of part of argument " + std::to_string(gi[static_cast<std::size_t>(res.index)]));
  if (r.graph.outputs.empty()) {
    entry.symbolic = std::make_shared<detail::SymbolicGraph>();
    return;
  }
  std::vector<detail::SymbolicGraph::LeafView> leaves;
  for (std::size_t l = 0; l < r.leaves.size(); ++l) {
    const auto& ls = r.leaves[l];
    detail::SymbolicGraph::LeafView v;
    if (ls.arg >= 0) {
      const std::vector<int> found = r.graph.inputs_of(static_cast<std::int32_t>(l));
      const ir::GraphNode* leaf = found.empty() ? nullptr : &r.graph.nodes[static_cast<std::size_t>(found.back())];
      if (!leaf) return fail("internal: leaf " + std::to_string(l) + " has no node");
      const std::size_t a = static_cast<std::size_t>(ls.arg);
      v = detail::leaf_view(ls.arg, dims[a], leaf->shape, leaf->strides, ls.offset);
      // A view that baked a dynamic size (a flattening view, a slice): a call that changes
      // that size re-traces (symbol_values says why).
    }
    leaves.push_back(std::move(v));
  }
  auto sg = detail::infer_symbolic(r.graph, leaves, dims, why);
  if (!sg) return fail(why);
  for (auto& sym : sg->symbols) sym.label = static_cast<int>(gi[static_cast<std::size_t>(sym.arg)]);
  // Kernels read the leading size at launch only where it is dim 0 of contiguous arguments
  // (then no stride depends on it).
  for (auto& sym : sg->symbols)
    if (sg->leading >= 0 && sg->cls[static_cast<std::size_t>(&sym - sg->symbols.data())] == sg->leading) {
      const Tensor& t = *tensor_args[static_cast<std::size_t>(sym.arg)];
      if (sym.dim != 0 || !is_contiguous(t.shape(), t.strides())) sg->leading = -1;
    }
  entry.symbolic = std::make_shared<detail::SymbolicGraph>(std::move(*sg));
}

/// The replay of a dynamic entry for new sizes: the first graph with its sizes re-derived,
/// run by symbolic kernels or by kernels compiled for these sizes. Null: trace again.
KILN_ENTRY std::shared_ptr<Replay> CompiledCore::derive_replay(Entry& e, const std::vector<GuardItem>& call,
                                                               const std::vector<const Tensor*>& tensor_args) {
  if (!e.symbolic || !e.base) return nullptr;
  auto r = std::make_shared<detail::Replay>(*e.base);
  if (!r->graph.outputs.empty()) {
    std::vector<Shape> shapes;
    std::vector<Strides> strides;
    for (auto* t : tensor_args) {
      shapes.push_back(t->defined() ? t->shape() : Shape{});
      strides.push_back(t->defined() ? t->strides() : Strides{});
    }
    const detail::SymbolicGraph& sg = *e.symbolic;
    std::string why;
    auto values = detail::symbol_values(sg, shapes, strides, why);
    if (!values) {
      log(LogChannel::recompiles, "dynamic entry: re-tracing: " + why);
      return nullptr;
    }
    r->graph = detail::instantiate(sg, *values, strides);
    r->runner = make_runner(e, r->graph, tensor_args);
  }
  if (log_enabled(LogChannel::guards)) {
    std::string t = "dynamic entry replays its graph for new sizes (no trace):";
    for (std::size_t i = 0; i < call.size(); ++i)
      if (call[i].kind == detail::GuardItem::Kind::Tensor) t += " arg " + std::to_string(i) + " " + call[i].shape.str();
    log(LogChannel::guards, t + "; symbolic: " + dynamic_dims_text(e.guard));
  }
  return r;
}

/// What runs `graph` (a graph of entry `e`).
/// The kernels of a dynamic entry read its leading symbolic size at launch (one compile for
/// every size) where they can: the "kiln" backend in the default mode, on the CPU JIT and on
/// CUDA. Other backends and modes get kernels compiled for each size.
KILN_ENTRY GraphRunner CompiledCore::make_runner(Entry& e, const ir::Graph& graph,
                                                 const std::vector<const Tensor*>& tensor_args) {
  if (auto r = symbolic_runner(e, graph, tensor_args)) return r;
  return factory(graph, options);
}

KILN_ENTRY GraphRunner CompiledCore::symbolic_runner(Entry& e, const ir::Graph& graph,
                                                     const std::vector<const Tensor*>& tensor_args) {
  if (!e.symbolic || e.symbolic->leading < 0 || graph.outputs.empty()) return nullptr;
  auto specialised = [&](const std::string& why) -> GraphRunner {
    log(LogChannel::recompiles, "dynamic entry: kernels compiled for these sizes (symbolic " +
                                    e.symbolic->name_of(e.symbolic->leading) + " not read at launch): " + why);
    return nullptr;
  };
  if (options.backend != "kiln") return nullptr;  // user backends receive each concrete graph
  const bool cuda = graph.device.is_cuda();
  if (!cuda && !graph.device.is_cpu()) return nullptr;
  if (mode != CompileMode::Default)
    return specialised(cuda && mode == CompileMode::ReduceOverhead
                           ? "mode reduce-overhead captures a CUDA graph per size"
                           : "mode " + options.mode + " tunes kernels per size");
  if (cuda ? !backend::entry::cuda_jit_available() : !backend::entry::cpu_uses_jit(Backend::Auto)) return nullptr;
  const detail::SymbolicGraph& sg = *e.symbolic;
  for (auto& nd : graph.nodes)
    for (auto d : nd.shape)
      if (d >= backend::kSymbolicPlaceholder && d <= backend::kSymbolicPlaceholder + 30)
        return specialised("a size of " + std::to_string(d) + " is reserved for symbolic kernels");
  std::vector<Shape> shapes;
  std::vector<Strides> strides;
  for (auto* t : tensor_args) {
    shapes.push_back(t->defined() ? t->shape() : Shape{});
    strides.push_back(t->defined() ? t->strides() : Strides{});
  }
  std::string why;
  auto values = detail::symbol_values(sg, shapes, strides, why);
  if (!values) return nullptr;
  ir::Graph canonical = detail::canonical_graph(sg, *values, strides, backend::kSymbolicPlaceholder);
  std::size_t probe = 0;
  while (sg.dims[probe].empty() || sg.dims[probe][0].sym != sg.leading) ++probe;
  if (auto run = backend::entry::symbolic_runner(canonical, probe, why)) return run;
  return specialised(why);
}

/// Runs a replay's graph: its flattened results (the saved values of a backward after them).
KILN_ENTRY std::vector<Tensor> CompiledCore::run_replay(Replay& r, const std::vector<const Tensor*>& tensor_args) {
  std::vector<Tensor> results(r.results.size());
  std::vector<StoragePtr>& storages = r.storages;
  storages.clear();
  // The replay must not keep its results' buffers (a CUDA graph instance reuses its outputs
  // only when no one else holds them), whatever happens below.
  struct Release {
    std::vector<StoragePtr>& v;
    ~Release() { v.clear(); }
  } release{storages};
  if (!r.graph.outputs.empty()) {
    backend::RunArgs& a = r.args;
    a.inputs.clear();
    a.outputs.clear();
    for (auto& leaf : r.leaves) {
      if (leaf.arg < 0) {
        a.inputs.push_back(detail::leaf_pointer(*leaf.constant));
      } else {
        const ir::Node& n = *tensor_args[leaf.arg]->node();
        std::int64_t off = n.buffer->offset + leaf.offset;
        a.inputs.push_back(static_cast<const char*>(n.buffer->storage->data) +
                           off * static_cast<std::int64_t>(itemsize(n.dtype)));
      }
    }
    if (const auto* cuda_graph = r.runner.target<backend::CudaGraphRunFn>()) {
      // Results are the instance's static outputs (no copy, no allocation).
      backend::entry::run_cuda_graph(*cuda_graph->runner, a.inputs, storages);
    } else {
      for (auto out : r.graph.outputs) {
        const ir::GraphNode& g = r.graph.nodes[out];
        storages.push_back(
            detail::allocate(static_cast<std::size_t>(g.shape.numel()) * itemsize(g.dtype), r.graph.device));
        a.outputs.push_back(storages.back()->data);
      }
      r.runner(r.graph, a);
    }
  }
  for (std::size_t i = 0; i < r.results.size(); ++i) {
    const auto& src = r.results[i];
    switch (src.kind) {
      case detail::ResultSource::Kind::GraphOutput: {
        const ir::GraphNode& g = r.graph.nodes[r.graph.outputs[src.index]];
        results[i] = Tensor(ir::input(ir::BufferView{storages[src.index], 0, contiguous_strides(g.shape)}, g.shape,
                                      g.dtype, r.graph.device));
        break;
      }
      case detail::ResultSource::Kind::ArgView: {
        const ir::Node& n = *tensor_args[src.index]->node();
        if (src.whole)
          results[i] = Tensor(ir::input(*n.buffer, n.shape, n.dtype, n.device));
        else
          results[i] = Tensor(ir::input(ir::BufferView{n.buffer->storage, n.buffer->offset + src.offset, src.strides},
                                        src.shape, n.dtype, n.device));
        break;
      }
      case detail::ResultSource::Kind::Constant:
        results[i] = src.constant;
        break;
    }
  }
  return results;
}

}  // namespace detail

KILN_ENTRY void register_backend(const std::string& name, BackendFactory factory) {
  auto& r = detail::backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

KILN_ENTRY std::vector<std::string> list_backends() {
  auto& r = detail::backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (auto& [k, v] : r.factories) names.push_back(k);
  return names;
}

KILN_ENTRY void reset() {
  auto& reg = detail::compiled_registry();
  std::vector<std::shared_ptr<std::function<void()>>> live;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    std::vector<std::weak_ptr<std::function<void()>>> keep;
    for (auto& w : reg.clearers)
      if (auto c = w.lock()) {
        live.push_back(c);
        keep.push_back(w);
      }
    reg.clearers.swap(keep);
  }
  for (auto& c : live) (*c)();
  detail::typed_cache_generation().fetch_add(1);
  detail::clear_kernel_caches();
  backend::entry::clear_symbolic_state();
}

}  // namespace kiln
