#pragma once
// kiln::compile: trace a function once per guard, then replay the captured graph.
//
// Tracing runs the user's function on the real argument tensors with evaluation deferred, so
// the tensor work it does is recorded as one lazy graph. The graph is then captured and handed
// to a backend; later calls whose guards match bind the new arguments' buffers to the graph's
// leaves and launch, without running the C++ function again. A read of tensor data during the
// trace (item(), to_vector(), data_ptr(), assign()) is a graph break: the work before it runs
// for real, the C++ code continues with the value, and that entry then re-runs the function on
// every call, its graph pieces reusing compiled kernels by their keys.
#include <algorithm>
#include <any>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/entry.hpp"
#include "kiln/compile/backward_graph.hpp"
#include "kiln/compile/symbolic.hpp"
#include "kiln/core/log.hpp"
#include "kiln/tensor/autocast.hpp"
#include "kiln/tensor/autograd.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln {

/// A graph break where `fullgraph = true` forbids one; says why and where.
class GraphBreakError : public Error {
 public:
  using Error::Error;
};

/// Options of kiln::compile (torch.compile's, carried over).
struct CompileOptions {
  std::string backend = "kiln";  ///< "kiln", "eager", "trace" or a registered name
  std::string mode = "default";  ///< "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
  bool fullgraph = false;        ///< a graph break throws GraphBreakError
  std::optional<bool> dynamic = std::nullopt;  ///< false: specialise shapes; true: symbolic; unset: automatic
  int recompile_limit = 8;                     ///< guard entries per compiled function before falling back
  bool error_on_recompile_limit = false;       ///< throw instead of falling back past the limit
};

/// Counters of one compiled function.
struct CompileStats {
  std::uint64_t traces = 0;        ///< times the function was traced
  std::uint64_t recompiles = 0;    ///< traces caused by a failed guard (not the first)
  std::uint64_t graph_breaks = 0;  ///< data reads met while tracing
  std::uint64_t cache_hits = 0;    ///< calls served by an existing guard entry
  std::uint64_t fallbacks = 0;     ///< calls run uncompiled past the recompile limit
};

/// Runs a captured graph over bound buffers.
using GraphRunner = backend::GraphRun;
/// Makes the runner for a captured graph (called once per new graph).
using BackendFactory = std::function<GraphRunner(const ir::Graph&, const CompileOptions&)>;

namespace detail {

/// torch.compile's modes, parsed from CompileOptions::mode in one place (parse_mode).
enum class CompileMode : std::uint8_t { Default, ReduceOverhead, MaxAutotune, MaxAutotuneNoCudagraphs };

struct ModeName {
  CompileMode mode;
  const char* name;
};
inline constexpr ModeName kModeNames[] = {{CompileMode::Default, "default"},
                                          {CompileMode::ReduceOverhead, "reduce-overhead"},
                                          {CompileMode::MaxAutotune, "max-autotune"},
                                          {CompileMode::MaxAutotuneNoCudagraphs, "max-autotune-no-cudagraphs"}};

inline const std::vector<std::string>& valid_modes() {
  static const std::vector<std::string> m = [] {
    std::vector<std::string> v;
    for (const auto& n : kModeNames) v.push_back(n.name);
    return v;
  }();
  return m;
}

/// The mode `name` names; an Error listing the valid modes otherwise.
inline CompileMode parse_mode(const std::string& name) {
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
inline backend::CpuLaunchOptions cpu_launch_options(CompileMode mode) {
  backend::CpuLaunchOptions o;
  o.graph_entry = mode == CompileMode::ReduceOverhead;
  o.autotune = mode == CompileMode::MaxAutotune || mode == CompileMode::MaxAutotuneNoCudagraphs;
  o.autotune_graph = mode == CompileMode::MaxAutotune;
  return o;
}

struct BackendRegistry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
  BackendRegistry() {
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
};
inline BackendRegistry& backend_registry() {
  static BackendRegistry r;
  return r;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// ---- guards --------------------------------------------------------------------------------

/// What a call's argument must look like for an entry to serve it.
struct GuardItem {
  enum class Kind : std::uint8_t { Tensor, Number, Undefined } kind = Kind::Undefined;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  Shape shape;
  Strides strides;
  std::vector<bool> dynamic_dims;  ///< sizes not guarded (only whether they are 0, 1 or more)
  bool requires_grad = false;  ///< a tensor that requires grad gets a replay with a backward
  double number = 0;
  int number_type = 0;

  bool matches(const GuardItem& call) const {
    if (kind != call.kind) return false;
    if (kind == Kind::Number)
      return number_type == call.number_type && std::memcmp(&number, &call.number, sizeof(double)) == 0;
    if (kind == Kind::Undefined) return true;
    if (dtype != call.dtype || device != call.device || shape.size() != call.shape.size() ||
        requires_grad != call.requires_grad)
      return false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (dynamic_dims.empty() || !dynamic_dims[d]) {
        if (shape[d] != call.shape[d] || strides[d] != call.strides[d]) return false;
      } else {
        auto cls = [](std::int64_t s) { return s < 2 ? s : 2; };
        if (cls(shape[d]) != cls(call.shape[d])) return false;
      }
    }
    if (!dynamic_dims.empty()) {  // dynamic: contiguity is what is guarded
      if (kiln::is_contiguous(shape, strides) != kiln::is_contiguous(call.shape, call.strides)) return false;
    }
    return true;
  }
  /// matches(guard_of(t)) without building the call's guard (the cached call's hot path).
  bool matches_value(const Tensor& t) const {
    if (!t.defined() || !t.is_evaluated()) return matches(guard_of_tensor(t));
    if (kind != Kind::Tensor) return false;
    const ir::Node& n = *t.node();
    if (dtype != n.dtype || device != n.device || shape.size() != n.shape.size() || requires_grad != n.requires_grad)
      return false;
    const Strides& st = n.buffer->strides;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (dynamic_dims.empty() || !dynamic_dims[d]) {
        if (shape[d] != n.shape[d] || strides[d] != st[d]) return false;
      } else {
        auto cls = [](std::int64_t s) { return s < 2 ? s : 2; };
        if (cls(shape[d]) != cls(n.shape[d])) return false;
      }
    }
    if (!dynamic_dims.empty() && kiln::is_contiguous(shape, strides) != kiln::is_contiguous(n.shape, st)) return false;
    return true;
  }
  template <class T>
  requires Scalar<T>
  bool matches_value(const T& v) const {
    GuardItem g;
    g.kind = Kind::Number;
    g.number = static_cast<double>(v);
    g.number_type = std::is_same_v<T, bool> ? 1 : std::is_integral_v<T> ? 2 : 3;
    return matches(g);
  }
  static GuardItem guard_of_tensor(const Tensor& t);
  std::string describe() const {
    if (kind == Kind::Number) {
      std::ostringstream os;
      os << number;
      return os.str();
    }
    if (kind == Kind::Undefined) return "undefined";
    std::string s = std::string(dtype_name(dtype)) + shape.str() + " strides [";
    for (std::size_t i = 0; i < strides.size(); ++i) s += (i ? ", " : "") + std::to_string(strides[i]);
    return s + "] " + device.str() + (requires_grad ? " requires_grad" : "");
  }
};

inline GuardItem guard_of(const Tensor& t) {
  GuardItem g;
  if (!t.defined()) return g;
  g.kind = GuardItem::Kind::Tensor;
  g.dtype = t.dtype();
  g.device = t.device();
  g.shape = t.shape();
  g.strides = t.strides();
  g.requires_grad = t.requires_grad();
  return g;
}
inline GuardItem GuardItem::guard_of_tensor(const Tensor& t) { return guard_of(t); }
template <class T>
requires Scalar<T> GuardItem guard_of(const T& v) {
  GuardItem g;
  g.kind = GuardItem::Kind::Number;
  g.number = static_cast<double>(v);
  g.number_type = std::is_same_v<T, bool> ? 1 : std::is_integral_v<T> ? 2 : 3;
  return g;
}

// ---- function results ----------------------------------------------------------------------

/// Results with typed expressions in them become Tensors (the compiled callable returns those).
template <class R>
struct Normalized {
  using type = std::conditional_t<TensorLike<R>, Tensor, R>;
  static type from(const R& r) {
    if constexpr (TensorLike<R>)
      return Tensor(r);
    else
      return r;
  }
};
template <class... Ts>
struct Normalized<std::tuple<Ts...>> {
  using type = std::tuple<typename Normalized<Ts>::type...>;
  static type from(const std::tuple<Ts...>& r) {
    return std::apply([](const auto&... e) { return type{Normalized<std::remove_cvref_t<decltype(e)>>::from(e)...}; },
                      r);
  }
};
template <class A, class B>
struct Normalized<std::pair<A, B>> {
  using type = std::pair<typename Normalized<A>::type, typename Normalized<B>::type>;
  static type from(const std::pair<A, B>& r) { return {Normalized<A>::from(r.first), Normalized<B>::from(r.second)}; }
};
template <class R>
using normalized_t = typename Normalized<R>::type;

template <class R>
struct ResultCodec {
  static_assert(Scalar<R>, "kiln::compile: results must be Tensor, C++ numbers, or std::tuple/std::pair of them");
  static void flatten(const R&, std::vector<Tensor>&) {}
  static R rebuild(const R& traced, const std::vector<Tensor>&, std::size_t&) { return traced; }
};
template <>
struct ResultCodec<Tensor> {
  static void flatten(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static Tensor rebuild(const Tensor&, const std::vector<Tensor>& ts, std::size_t& i) { return ts[i++]; }
};
template <class... Ts>
struct ResultCodec<std::tuple<Ts...>> {
  static void flatten(const std::tuple<Ts...>& r, std::vector<Tensor>& out) {
    std::apply([&](const auto&... e) { (ResultCodec<std::remove_cvref_t<decltype(e)>>::flatten(e, out), ...); }, r);
  }
  static std::tuple<Ts...> rebuild(const std::tuple<Ts...>& traced, const std::vector<Tensor>& ts, std::size_t& i) {
    return rebuild_impl(traced, ts, i, std::index_sequence_for<Ts...>{});
  }
  template <std::size_t... I>
  static std::tuple<Ts...> rebuild_impl(const std::tuple<Ts...>& traced, const std::vector<Tensor>& ts, std::size_t& i,
                                        std::index_sequence<I...>) {
    // Braced initialisation evaluates left to right, keeping the tensors in order.
    return std::tuple<Ts...>{ResultCodec<Ts>::rebuild(std::get<I>(traced), ts, i)...};
  }
};
template <class A, class B>
struct ResultCodec<std::pair<A, B>> {
  static void flatten(const std::pair<A, B>& r, std::vector<Tensor>& out) {
    ResultCodec<A>::flatten(r.first, out);
    ResultCodec<B>::flatten(r.second, out);
  }
  static std::pair<A, B> rebuild(const std::pair<A, B>& traced, const std::vector<Tensor>& ts, std::size_t& i) {
    A a = ResultCodec<A>::rebuild(traced.first, ts, i);
    B b = ResultCodec<B>::rebuild(traced.second, ts, i);
    return {std::move(a), std::move(b)};
  }
};

/// Whether a result of type R holds C++ numbers (they may have been computed from sizes, which
/// a replay for new sizes cannot redo).
template <class R>
inline constexpr bool kHasNumbers = !std::is_same_v<R, Tensor>;
template <class... Ts>
inline constexpr bool kHasNumbers<std::tuple<Ts...>> = (kHasNumbers<Ts> || ...);
template <class A, class B>
inline constexpr bool kHasNumbers<std::pair<A, B>> = kHasNumbers<A> || kHasNumbers<B>;

// ---- a traced graph and how to replay it -----------------------------------------------------

/// Where a leaf's buffer comes from on replay.
struct LeafSource {
  int arg = -1;             ///< argument index, or -1 for a tensor the function captured (a constant)
  std::int64_t offset = 0;  ///< element offset relative to the argument's own offset
  ir::NodePtr constant;     ///< arg == -1: kept alive with the entry
};

/// Where a flattened result tensor comes from on replay.
struct ResultSource {
  enum class Kind : std::uint8_t { GraphOutput, ArgView, Constant } kind = Kind::GraphOutput;
  int index = 0;            ///< graph output index, or argument index
  std::int64_t offset = 0;  ///< ArgView: element offset relative to the argument's
  Strides strides;          ///< ArgView
  Shape shape;              ///< ArgView
  bool whole = false;       ///< ArgView of the whole argument: takes its shape and strides on replay
  Tensor constant;          ///< Constant
};

struct Replay {
  ir::Graph graph;
  std::vector<LeafSource> leaves;
  std::vector<ResultSource> results;
  std::any traced_result;  ///< the function's result at trace time (its numbers are specialised)
  GraphRunner runner;
  /// Results that require grad: their backward (the graph's outputs after the function's own
  /// results are the values it saves).
  std::shared_ptr<const CompiledBackward> backward;
  // Reused by every replay (calls hold the compiled function's lock), so a cached call
  // allocates no pointer vectors; emptied of storages after each call.
  backend::RunArgs args;
  std::vector<StoragePtr> storages;
};

struct Entry {
  std::vector<GuardItem> guard;
  bool grad_mode = true;  ///< is_grad_enabled() at the call (results require grad or not)
  std::uint32_t autocast = 0;  ///< detail::autocast_key() at the call (which inputs the ops cast)
  bool rerun = false;  ///< had graph breaks: the function runs on every call
  bool dynamic = false;
  std::vector<std::pair<std::vector<GuardItem>, std::shared_ptr<Replay>>> replays;  ///< per concrete guard
  /// Dynamic entries: the first replay and its graph's symbolic sizes, from which a call with
  /// new sizes gets its graph without re-tracing (null: it re-traces).
  std::shared_ptr<Replay> base;
  std::shared_ptr<SymbolicGraph> symbolic;
};

/// Collects graph breaks while a function is being traced.
struct TraceSession : TraceHook {
  bool fullgraph = false;
  std::vector<std::string> breaks;
  void on_data_read(const char* what, std::source_location where) override {
    std::string reason = std::string(what) + " reads tensor data at " + where.file_name() + ":" +
                         std::to_string(where.line()) + " (" + where.function_name() + ")";
    if (fullgraph) throw GraphBreakError("kiln::compile(fullgraph=true): graph break: " + reason);
    // The work before the read runs now, for real; tracing goes on after it.
    breaks.push_back(reason);
    log(LogChannel::graph_breaks, "graph break: " + reason);
  }
};

/// Installs a trace session for a scope.
struct TraceScope {
  TraceHook* previous;
  explicit TraceScope(TraceSession& session) : previous(active_trace) { active_trace = &session; }
  ~TraceScope() { active_trace = previous; }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

/// Every compiled function's state, so kiln::reset() can clear them all.
struct CompiledRegistry {
  std::mutex mu;
  std::vector<std::weak_ptr<std::function<void()>>> clearers;
};
inline CompiledRegistry& compiled_registry() {
  static CompiledRegistry r;
  return r;
}

}  // namespace detail

/// Makes `name` usable as CompileOptions::backend: `factory` receives each captured graph and
/// returns what runs it.
inline void register_backend(const std::string& name, BackendFactory factory) {
  auto& r = detail::backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

/// Names usable as CompileOptions::backend.
inline std::vector<std::string> list_backends() {
  auto& r = detail::backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (auto& [k, v] : r.factories) names.push_back(k);
  return names;
}

/// A function compiled by kiln::compile: call it as the function itself.
template <class F>
class Compiled {
 public:
  Compiled(F fn, CompileOptions options) : state_(std::make_shared<State>(std::move(fn), std::move(options))) {
    auto& r = detail::backend_registry();
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (!r.factories.count(state_->options.backend)) {
        std::vector<std::string> names;
        for (auto& [k, v] : r.factories) names.push_back(k);
        throw Error("kiln::compile: unknown backend \"" + state_->options.backend +
                    "\"; valid backends: " + detail::join(names));
      }
      state_->factory = r.factories.at(state_->options.backend);
    }
    state_->mode = detail::parse_mode(state_->options.mode);
    std::weak_ptr<State> weak = state_;
    state_->clearer = std::make_shared<std::function<void()>>([weak] {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mu);
        s->entries.clear();
      }
    });
    auto& reg = detail::compiled_registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.clearers.push_back(state_->clearer);
  }

  /// Calls the function: a cached entry whose guards match replays its graph; otherwise the
  /// function is traced (and compiled) for these arguments.
  template <class... Args>
  auto operator()(Args&&... args) {
    return call(prepare_arg(args)...);
  }

  /// Counters of this compiled function.
  CompileStats stats() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->stats;
  }

  /// A printable report of what calling with `args` does: graphs, ops, breaks.
  template <class... Args>
  std::string explain(Args&&... args) {
    std::lock_guard<std::mutex> lock(state_->mu);
    State& s = *state_;
    std::ostringstream os;
    detail::TraceSession session;
    std::vector<Tensor> outs;
    std::vector<std::string> graphs;
    {
      detail::TraceScope scope(session);
      auto raw = s.fn(args...);
      using Raw = std::remove_cvref_t<decltype(raw)>;
      auto result = detail::Normalized<Raw>::from(raw);
      detail::ResultCodec<detail::normalized_t<Raw>>::flatten(result, outs);
    }
    std::vector<ir::NodePtr> roots;
    for (auto& t : outs)
      if (t.defined() && !t.is_evaluated()) roots.push_back(t.node());
    os << "kiln::explain: backend " << s.options.backend << ", mode " << s.options.mode << "\n";
    os << "graph breaks: " << session.breaks.size() << "\n";
    for (auto& b : session.breaks) os << "  - " << b << "\n";
    if (!roots.empty()) {
      ir::Captured c = ir::capture(roots, roots.front()->device);
      std::size_t ops = 0;
      for (auto& n : c.graph.nodes) ops += n.op != ir::Op::Input;
      os << "graph after the last break: " << c.graph.nodes.size() << " nodes (" << ops << " ops, " << c.leaves.size()
         << " inputs, " << c.graph.outputs.size() << " outputs)\n";
      os << detail::explain_graph(c.graph);
    } else {
      os << "no tensor work after the last break\n";
    }
    return os.str();
  }

 private:
  /// Expressions become evaluated Tensors; lazy tensors are evaluated (guards read layouts).
  template <class T>
  static auto prepare_arg(const T& a) {
    if constexpr (TensorLike<T>) {
      Tensor t(a);
      if (t.defined() && !t.is_evaluated()) detail::evaluate({t.node()});
      return t;
    } else {
      return a;
    }
  }

  template <class... Args>
  auto call(Args... args) {
    using Raw = std::remove_cvref_t<std::invoke_result_t<F&, Args&...>>;
    using R = detail::normalized_t<Raw>;
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.options.backend == "eager") return run_uncompiled<R>(args...);
    std::vector<const Tensor*>& tensor_args = s.tensor_args;  // reused: the lock is held
    tensor_args.clear();
    (collect_tensor(args, tensor_args), ...);

    // The hot path: an entry and a replay whose guards match, checked against the arguments
    // themselves (no guard objects built).
    const bool grad_mode = ir::detail::grad_mode();
    const std::uint32_t autocast = detail::autocast_key();
    for (auto& e : s.entries) {
      if (e->grad_mode != grad_mode || e->autocast != autocast || !matches_args(e->guard, args...)) continue;
      if (e->rerun) break;
      for (auto& [g, replay] : e->replays)
        if (matches_args(g, args...)) {
          s.stats.cache_hits++;
          return replay_call<R>(*replay, tensor_args);
        }
      break;
    }

    std::vector<detail::GuardItem> call{detail::guard_of(args)...};
    for (auto& e : s.entries) {
      if (e->grad_mode != grad_mode || e->autocast != autocast || !matches(e->guard, call)) continue;
      s.stats.cache_hits++;
      if (e->rerun) return rerun<R>(args...);
      for (auto& [g, replay] : e->replays)
        if (matches(g, call)) return replay_call<R>(*replay, tensor_args);
      // A dynamic entry meets new sizes: its graph follows them without running the function
      // (symbolic sizes); when some size cannot follow, it is traced again for these sizes.
      if (auto r = derive_replay(*e, call, tensor_args)) {
        // A bounded memory of sizes seen (the first, the traced one, stays).
        if (e->replays.size() >= kMaxReplays) e->replays.erase(e->replays.begin() + 1);
        e->replays.emplace_back(call, r);
        return replay_call<R>(*r, tensor_args);
      }
      return trace<R>(*e, call, tensor_args, args...);
    }

    if (static_cast<int>(s.entries.size()) >= s.options.recompile_limit) {
      std::string why =
          s.entries.empty() ? std::string("recompile_limit is 0") : first_failure(s.entries.back()->guard, call);
      if (s.options.error_on_recompile_limit)
        throw Error("kiln::compile: recompile limit (" + std::to_string(s.options.recompile_limit) + ") reached; " +
                    why);
      if (!s.warned) {
        std::fprintf(stderr,
                     "kiln: warning: kiln::compile reached its recompile limit (%d); running uncompiled from now on. "
                     "Last failed guard: %s\n",
                     s.options.recompile_limit, why.c_str());
        s.warned = true;
      }
      s.stats.fallbacks++;
      return run_uncompiled<R>(args...);
    }

    auto entry = std::make_shared<detail::Entry>();
    entry->guard = call;
    entry->grad_mode = grad_mode;
    entry->autocast = autocast;
    if (!s.entries.empty()) {
      s.stats.recompiles++;
      const auto& last = s.entries.back()->guard;
      // Automatic dynamic: a size that changed becomes symbolic.
      if (!s.options.dynamic.has_value()) mark_changed_sizes_dynamic(*entry, last);
      std::string why = "recompiling: " + (s.entries.back()->grad_mode != grad_mode
                                               ? std::string("grad mode changed (is_grad_enabled() is ") +
                                                     (grad_mode ? "true" : "false") + ")"
                                           : s.entries.back()->autocast != autocast
                                               ? "autocast changed (now " + detail::autocast_describe() + ")"
                                               : first_failure(last, call));
      if (!s.options.dynamic.has_value() && entry->dynamic) why += "; now symbolic: " + dynamic_dims_text(entry->guard);
      log(LogChannel::recompiles, why);
    }
    if (s.options.dynamic.value_or(false)) mark_all_sizes_dynamic(*entry);
    s.entries.push_back(entry);
    if (log_enabled(LogChannel::guards)) {
      std::string g = "new guard entry:";
      for (std::size_t i = 0; i < call.size(); ++i)
        g += "\n  arg " + std::to_string(i) + ": " + entry->guard[i].describe();
      if (entry->dynamic) g += "\n  symbolic: " + dynamic_dims_text(entry->guard) + " (sizes 0 and 1 stay distinct)";
      log(LogChannel::guards, g);
    }
    return trace<R>(*entry, call, tensor_args, args...);
  }

  static constexpr std::size_t kMaxReplays = 64;  // concrete sizes kept per dynamic entry

  struct State {
    State(F f, CompileOptions o) : fn(std::move(f)), options(std::move(o)) {}
    F fn;
    CompileOptions options;
    detail::CompileMode mode = detail::CompileMode::Default;  ///< options.mode, parsed once
    BackendFactory factory;
    std::mutex mu;
    std::vector<std::shared_ptr<detail::Entry>> entries;
    CompileStats stats;
    bool warned = false;
    std::shared_ptr<std::function<void()>> clearer;
    std::vector<const Tensor*> tensor_args;  ///< the current call's tensors (reused under `mu`)
  };

  template <class T>
  static void collect_tensor(const T& v, std::vector<const Tensor*>& out) {
    if constexpr (std::is_base_of_v<Tensor, std::remove_cvref_t<T>>)
      out.push_back(&v);
    else
      static_assert(Scalar<T>, "kiln::compile: arguments must be Tensors or C++ numbers");
  }

  template <class... Args>
  static bool matches_args(const std::vector<detail::GuardItem>& g, const Args&... args) {
    if (g.size() != sizeof...(Args)) return false;
    std::size_t i = 0;
    return (g[i++].matches_value(args) && ...);
  }

  static bool matches(const std::vector<detail::GuardItem>& g, const std::vector<detail::GuardItem>& call) {
    if (g.size() != call.size()) return false;
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!g[i].matches(call[i])) return false;
    return true;
  }

  static bool exact(const std::vector<detail::GuardItem>& g, const std::vector<detail::GuardItem>& call) {
    if (g.size() != call.size()) return false;
    for (std::size_t i = 0; i < g.size(); ++i) {
      detail::GuardItem strict = g[i];
      strict.dynamic_dims.clear();
      if (!strict.matches(call[i])) return false;
    }
    return true;
  }

  static std::string first_failure(const std::vector<detail::GuardItem>& old,
                                   const std::vector<detail::GuardItem>& call) {
    for (std::size_t i = 0; i < old.size() && i < call.size(); ++i)
      if (!old[i].matches(call[i]))
        return "guard on argument " + std::to_string(i) + " failed: expected " + old[i].describe() + ", got " +
               call[i].describe();
    return "argument count changed";
  }

  static void mark_changed_sizes_dynamic(detail::Entry& e, const std::vector<detail::GuardItem>& last) {
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
  static void mark_all_sizes_dynamic(detail::Entry& e) {
    for (auto& g : e.guard)
      if (g.kind == detail::GuardItem::Kind::Tensor) {
        g.dynamic_dims.assign(g.shape.size(), true);
        e.dynamic = true;
      }
  }

  template <class R, class... Args>
  R call_fn(Args&... args) {
    using Raw = std::remove_cvref_t<std::invoke_result_t<F&, Args&...>>;
    return detail::Normalized<Raw>::from(state_->fn(args...));
  }

  template <class R, class... Args>
  R run_uncompiled(Args&... args) {
    State& s = *state_;
    Backend previous = get_backend();
    if (s.options.backend == "eager") set_backend(Backend::Eager);
    struct Restore {
      Backend b;
      ~Restore() { set_backend(b); }
    } restore{previous};
    R r = call_fn<R>(args...);
    evaluate_result(r);
    return r;
  }

  template <class R>
  static void evaluate_result(const R& r) {
    std::vector<Tensor> outs;
    detail::ResultCodec<R>::flatten(r, outs);
    std::vector<ir::NodePtr> nodes;
    for (auto& t : outs)
      if (t.defined()) nodes.push_back(t.node());
    detail::evaluate(nodes);
  }

  template <class R, class... Args>
  R rerun(Args&... args) {
    R r = call_fn<R>(args...);
    evaluate_result(r);
    return r;
  }

  template <class R, class... Args>
  R trace(detail::Entry& entry, const std::vector<detail::GuardItem>& call,
          const std::vector<const Tensor*>& tensor_args, Args&... args) {
    State& s = *state_;
    s.stats.traces++;
    detail::TraceSession session;
    session.fullgraph = s.options.fullgraph;
    std::optional<R> result;
    {
      detail::TraceScope scope(session);
      result.emplace(call_fn<R>(args...));
    }
    s.stats.graph_breaks += session.breaks.size();
    if (!session.breaks.empty()) {
      entry.rerun = true;
      evaluate_result(*result);
      return std::move(*result);
    }
    std::vector<Tensor> outs;
    detail::ResultCodec<R>::flatten(*result, outs);
    // Results that require grad (a model's forward): the backward is derived now from the
    // traced forward, and the forward graph also outputs the values it saves
    // (compile/backward_graph.hpp). A result that requires grad and is not computed by the
    // graph (an argument returned as it is) keeps the tape by running the function every call.
    std::optional<detail::PendingBackward> pending;
    if (std::any_of(outs.begin(), outs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); })) {
      if (std::any_of(outs.begin(), outs.end(),
                      [](const Tensor& t) { return t.defined() && t.requires_grad() && t.is_evaluated(); })) {
        log(LogChannel::graph_breaks, "kiln::compile: a result that requires grad is not computed by the traced "
                                      "graph; this entry runs the function on every call");
        s.stats.graph_breaks++;
        entry.rerun = true;
        evaluate_result(*result);
        return std::move(*result);
      }
      pending = detail::trace_backward(outs, tensor_args);
    }
    const std::size_t own_results = outs.size();
    if (pending) {
      // Still deferred, as inside the trace: a Tensor of a large lazy node would evaluate it.
      detail::TraceSession quiet;
      detail::TraceScope scope(quiet);
      for (const ir::NodePtr& n : pending->saved) outs.push_back(Tensor(n));
    }
    auto replay = std::make_shared<detail::Replay>();
    build_replay(*replay, outs, tensor_args);
    replay->traced_result = *result;
    if (log_enabled(LogChannel::graph) || log_enabled(LogChannel::recompiles) || log_enabled(LogChannel::guards)) {
      std::size_t ops = 0;
      for (auto& n : replay->graph.nodes) ops += n.op != ir::Op::Input;
      log(LogChannel::graph, "compiling new graph: " + std::to_string(ops) + " ops\n" + replay->graph.str());
    }
    // A replay with a backward is specialised to its sizes (its backward graph is).
    if (entry.dynamic && !entry.base && !pending) {
      entry.base = replay;
      if constexpr (detail::kHasNumbers<R>)
        log(LogChannel::recompiles, "dynamic entry: new sizes will re-trace: the function returns C++ numbers");
      else
        make_symbolic(entry, call, tensor_args);
    }
    replay->runner = make_runner(entry, replay->graph, tensor_args);
    if (pending) {
      // The first forward run gives the saved values, at which the backward graphs stop.
      std::vector<Tensor> first = run_replay(*replay, tensor_args);
      std::vector<Tensor> saved(first.begin() + static_cast<std::ptrdiff_t>(own_results), first.end());
      replay->backward = detail::capture_backward(*pending, saved, own_results, tensor_args);
      entry.replays.emplace_back(call, replay);
      return finish_call<R>(*replay, std::move(first), tensor_args);
    }
    entry.replays.emplace_back(call, replay);
    return replay_call<R>(*replay, tensor_args);
  }

  static void build_replay(detail::Replay& r, const std::vector<Tensor>& outs,
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
          src.whole =
              src.offset == 0 && src.shape == tensor_args[a]->shape() && src.strides == tensor_args[a]->strides();
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
  static std::string dynamic_dims_text(const std::vector<detail::GuardItem>& guard) {
    std::string t;
    for (std::size_t i = 0; i < guard.size(); ++i)
      for (std::size_t d = 0; d < guard[i].dynamic_dims.size(); ++d)
        if (guard[i].dynamic_dims[d] && guard[i].shape[d] >= 2)
          t += (t.empty() ? "" : ", ") + std::string("arg ") + std::to_string(i) + " dim " + std::to_string(d);
    return t.empty() ? std::string("none (every dynamic size is 0 or 1)") : t;
  }

  /// Guard index of each tensor argument (tensor_args skips the numbers).
  static std::vector<std::size_t> tensor_guard_index(const std::vector<detail::GuardItem>& call) {
    std::vector<std::size_t> v;
    for (std::size_t i = 0; i < call.size(); ++i)
      if (call[i].kind != detail::GuardItem::Kind::Number) v.push_back(i);
    return v;
  }

  /// Infers the symbolic sizes of a dynamic entry's first graph (entry.base); on failure the
  /// entry re-traces for new sizes, and the recompiles log says why.
  void make_symbolic(detail::Entry& entry, const std::vector<detail::GuardItem>& call,
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
        return fail("a result is a view of part of argument " +
                    std::to_string(gi[static_cast<std::size_t>(res.index)]));
    if (r.graph.outputs.empty()) {
      entry.symbolic = std::make_shared<detail::SymbolicGraph>();
      return;
    }
    std::vector<detail::SymbolicGraph::LeafView> leaves;
    for (std::size_t l = 0; l < r.leaves.size(); ++l) {
      const auto& ls = r.leaves[l];
      detail::SymbolicGraph::LeafView v;
      if (ls.arg >= 0) {
        const ir::GraphNode* leaf = nullptr;
        for (auto& nd : r.graph.nodes)
          if (nd.op == ir::Op::Input && nd.leaf == static_cast<std::int32_t>(l)) leaf = &nd;
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
  std::shared_ptr<detail::Replay> derive_replay(detail::Entry& e, const std::vector<detail::GuardItem>& call,
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
        if (call[i].kind == detail::GuardItem::Kind::Tensor)
          t += " arg " + std::to_string(i) + " " + call[i].shape.str();
      log(LogChannel::guards, t + "; symbolic: " + dynamic_dims_text(e.guard));
    }
    return r;
  }

  /// What runs `graph` (a graph of entry `e`).
  /// The kernels of a dynamic entry read its leading symbolic size at launch (one compile for
  /// every size) where they can: the "kiln" backend in the default mode, on the CPU JIT and on
  /// CUDA. Other backends and modes get kernels compiled for each size.
  GraphRunner make_runner(detail::Entry& e, const ir::Graph& graph, const std::vector<const Tensor*>& tensor_args) {
    State& s = *state_;
    if (auto r = symbolic_runner(e, graph, tensor_args)) return r;
    return s.factory(graph, s.options);
  }

  GraphRunner symbolic_runner(detail::Entry& e, const ir::Graph& graph, const std::vector<const Tensor*>& tensor_args) {
    State& s = *state_;
    if (!e.symbolic || e.symbolic->leading < 0 || graph.outputs.empty()) return nullptr;
    auto specialised = [&](const std::string& why) -> GraphRunner {
      log(LogChannel::recompiles, "dynamic entry: kernels compiled for these sizes (symbolic " +
                                      e.symbolic->name_of(e.symbolic->leading) + " not read at launch): " + why);
      return nullptr;
    };
    if (s.options.backend != "kiln") return nullptr;  // user backends receive each concrete graph
    const bool cuda = graph.device.is_cuda();
    if (!cuda && !graph.device.is_cpu()) return nullptr;
    if (s.mode != detail::CompileMode::Default)
      return specialised(cuda && s.mode == detail::CompileMode::ReduceOverhead
                             ? "mode reduce-overhead captures a CUDA graph per size"
                             : "mode " + s.options.mode + " tunes kernels per size");
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

  template <class R>
  static R replay_call(detail::Replay& r, const std::vector<const Tensor*>& tensor_args) {
    return finish_call<R>(r, run_replay(r, tensor_args), tensor_args);
  }

  /// The function's result from a run's flattened results, with their backward if they have one.
  template <class R>
  static R finish_call(const detail::Replay& r, std::vector<Tensor> results,
                       const std::vector<const Tensor*>& tensor_args) {
    if (r.backward) detail::attach_backward(r.backward, results, tensor_args);
    std::size_t k = 0;
    return detail::ResultCodec<R>::rebuild(std::any_cast<const R&>(r.traced_result), results, k);
  }

  /// Runs a replay's graph: its flattened results (the saved values of a backward after them).
  static std::vector<Tensor> run_replay(detail::Replay& r, const std::vector<const Tensor*>& tensor_args) {
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
      if (const auto* cuda_graph = r.runner.template target<backend::CudaGraphRunFn>()) {
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

  std::shared_ptr<State> state_;
};

/// Wraps `fn` so that calls trace it once per guard and replay the compiled graph.
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, CompileOptions options = {}) {
  return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(options));
}

/// A printable report of what `f(args...)` captures: graphs, ops, kernels, graph breaks.
template <class F, class... Args>
std::string explain(Compiled<F>& f, Args&&... args) {
  return f.explain(std::forward<Args>(args)...);
}
/// The same for a temporary: `kiln::explain(kiln::compile(f), x, w)`.
template <class F, class... Args>
std::string explain(Compiled<F>&& f, Args&&... args) {
  return f.explain(std::forward<Args>(args)...);
}

/// Clears every cache in the process: compiled functions' entries and kernel caches.
inline void reset() {
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
