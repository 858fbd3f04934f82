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

/// The names CompileOptions::mode accepts.
KILN_ENTRY const std::vector<std::string>& valid_modes();

/// The mode `name` names; an Error listing the valid modes otherwise.
KILN_ENTRY CompileMode parse_mode(const std::string& name);

/// What a mode means for CPU kernels (see compile_impl.hpp).
KILN_ENTRY backend::CpuLaunchOptions cpu_launch_options(CompileMode mode);

/// CompileOptions::backend's names and what each makes of a captured graph.
struct BackendRegistry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
  KILN_ENTRY BackendRegistry();
};
KILN_ENTRY BackendRegistry& backend_registry();

/// "a, b, c".
KILN_ENTRY std::string join(const std::vector<std::string>& v);

// ---- guards --------------------------------------------------------------------------------

/// What a call's argument must look like for an entry to serve it.
struct GuardItem {
  enum class Kind : std::uint8_t { Tensor, Number, Undefined } kind = Kind::Undefined;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  Shape shape;
  Strides strides;
  std::vector<bool> dynamic_dims;  ///< sizes not guarded (only whether they are 0, 1 or more)
  bool requires_grad = false;      ///< a tensor that requires grad gets a replay with a backward
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
  static_assert(Scalar<R>,
                "kiln::compile: results must be Tensor, C++ numbers, std::vector<Tensor>, or std::tuple/std::pair of them");
  static void flatten(const R&, std::vector<Tensor>&) {}
  static R rebuild(const R& traced, const std::vector<Tensor>&, std::size_t&) { return traced; }
  static R numbers_only(const R& r) { return r; }
};
template <>
struct ResultCodec<Tensor> {
  static void flatten(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static Tensor rebuild(const Tensor&, const std::vector<Tensor>& ts, std::size_t& i) { return ts[i++]; }
  static Tensor numbers_only(const Tensor&) { return Tensor(); }
};
/// A list of tensors (what autograd::grad returns, a module's several outputs): as many on
/// replay as the trace returned (the same guard traces the same graph, so the same count).
template <>
struct ResultCodec<std::vector<Tensor>> {
  static void flatten(const std::vector<Tensor>& r, std::vector<Tensor>& out) { out.insert(out.end(), r.begin(), r.end()); }
  static std::vector<Tensor> rebuild(const std::vector<Tensor>& traced, const std::vector<Tensor>& ts, std::size_t& i) {
    std::vector<Tensor> v;
    v.reserve(traced.size());
    for (std::size_t k = 0; k < traced.size(); ++k) v.push_back(ts[i++]);
    return v;
  }
  static std::vector<Tensor> numbers_only(const std::vector<Tensor>& r) { return std::vector<Tensor>(r.size()); }
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
  static std::tuple<Ts...> numbers_only(const std::tuple<Ts...>& r) {
    return std::apply([](const auto&... e) { return std::tuple<Ts...>{ResultCodec<Ts>::numbers_only(e)...}; }, r);
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
  static std::pair<A, B> numbers_only(const std::pair<A, B>& r) {
    return {ResultCodec<A>::numbers_only(r.first), ResultCodec<B>::numbers_only(r.second)};
  }
};

/// Whether a result of type R holds C++ numbers (they may have been computed from sizes, which
/// a replay for new sizes cannot redo).
template <class R>
inline constexpr bool kHasNumbers = !std::is_same_v<R, Tensor>;
template <>
inline constexpr bool kHasNumbers<std::vector<Tensor>> = false;
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
  std::any traced_result;  ///< the function's result at trace time, its tensors left out (its numbers are specialised)
  GraphRunner runner;
  /// Results that require grad: their backward (the graph's outputs after the function's own
  /// results are the values it saves).
  std::shared_ptr<const CompiledBackward> backward;
  /// Results that require grad whose graph the function itself freed (PendingBackward::freed).
  std::vector<std::size_t> freed_results;
  // Reused by every replay (calls hold the compiled function's lock), so a cached call
  // allocates no pointer vectors; emptied of storages after each call.
  backend::RunArgs args;
  std::vector<StoragePtr> storages;
};

struct Entry {
  std::vector<GuardItem> guard;
  bool grad_mode = true;       ///< is_grad_enabled() at the call (results require grad or not)
  std::uint32_t autocast = 0;  ///< detail::autocast_key() at the call (which inputs the ops cast)
  bool rerun = false;          ///< had graph breaks: the function runs on every call
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

/// kiln::compile's state and all it does that does not depend on the function's type: guard
/// entries, where a call goes, turning a trace into a replay, deriving replays for new sizes,
/// running them. Compiled<F> adds only the function and the calls into it, so every compiled
/// function shares this code (built once into kiln_compiled in compiled mode).
class CompiledCore {
 public:
  /// Looks up the backend (an Error naming the valid ones) and parses the mode.
  KILN_ENTRY explicit CompiledCore(CompileOptions options);

  /// Registers `self`'s entries with kiln::reset().
  KILN_ENTRY static void register_clearer(const std::shared_ptr<CompiledCore>& self);

  /// Where a call goes once no replay matched its arguments directly (the hot path).
  enum class Next : std::uint8_t { Replay, Rerun, Trace, Uncompiled };
  struct Decision {
    Next next = Next::Trace;
    Entry* entry = nullptr;    ///< Trace: the entry to trace for
    Replay* replay = nullptr;  ///< Replay: the replay to run
  };
  /// The entry whose guards `call` (the arguments' guards) meets, and in it the replay for
  /// these sizes (derived for a dynamic entry when it can be); a new entry past none, or running
  /// uncompiled past the recompile limit (an Error with error_on_recompile_limit).
  KILN_ENTRY Decision decide(const std::vector<GuardItem>& call, bool grad_mode, std::uint32_t autocast,
                             const std::vector<const Tensor*>& tensor_args);

  /// What a trace without graph breaks became: its replay (null: the entry runs the function
  /// on every call, a result that requires grad not being computed by the graph) and, when the
  /// replay has a backward, the results of its first run (`ran`).
  struct Traced {
    std::shared_ptr<Replay> replay;
    std::vector<Tensor> first;
    bool ran = false;
  };
  /// Captures the traced results `outs` (flattened; `traced_result` the function's result) of
  /// a call with guards `call` into a replay of `entry`, with its backward when results
  /// require grad, and makes what runs it.
  KILN_ENTRY Traced finish_trace(Entry& entry, const std::vector<GuardItem>& call,
                                 const std::vector<const Tensor*>& tensor_args, std::vector<Tensor> outs,
                                 std::any traced_result, bool returns_numbers);

  /// Runs a replay's graph: its flattened results (the saved values of a backward after them).
  KILN_ENTRY static std::vector<Tensor> run_replay(Replay& r, const std::vector<const Tensor*>& tensor_args);

  /// kiln::explain's report of a trace that gave `outs` in `session`.
  KILN_ENTRY std::string explain_traced(const TraceSession& session, const std::vector<Tensor>& outs) const;

  CompileOptions options;
  CompileMode mode = CompileMode::Default;  ///< options.mode, parsed once
  BackendFactory factory;
  std::mutex mu;
  std::vector<std::shared_ptr<Entry>> entries;
  CompileStats stats;
  bool warned = false;
  std::shared_ptr<std::function<void()>> clearer;
  std::vector<const Tensor*> tensor_args;  ///< the current call's tensors (reused under `mu`)

 private:
  static constexpr std::size_t kMaxReplays = 64;  // concrete sizes kept per dynamic entry

  static bool guards_match(const std::vector<GuardItem>& g, const std::vector<GuardItem>& call);
  static std::string first_failure(const std::vector<GuardItem>& old, const std::vector<GuardItem>& call);
  static void mark_changed_sizes_dynamic(Entry& e, const std::vector<GuardItem>& last);
  static void mark_all_sizes_dynamic(Entry& e);
  static std::string dynamic_dims_text(const std::vector<GuardItem>& guard);
  static std::vector<std::size_t> tensor_guard_index(const std::vector<GuardItem>& call);
  static void build_replay(Replay& r, const std::vector<Tensor>& outs, const std::vector<const Tensor*>& tensor_args);
  void make_symbolic(Entry& entry, const std::vector<GuardItem>& call, const std::vector<const Tensor*>& tensor_args);
  std::shared_ptr<Replay> derive_replay(Entry& e, const std::vector<GuardItem>& call,
                                        const std::vector<const Tensor*>& tensor_args);
  GraphRunner make_runner(Entry& e, const ir::Graph& graph, const std::vector<const Tensor*>& tensor_args);
  GraphRunner symbolic_runner(Entry& e, const ir::Graph& graph, const std::vector<const Tensor*>& tensor_args);
};

}  // namespace detail

/// Makes `name` usable as CompileOptions::backend: `factory` receives each captured graph and
/// returns what runs it.
KILN_ENTRY void register_backend(const std::string& name, BackendFactory factory);

/// Names usable as CompileOptions::backend.
KILN_ENTRY std::vector<std::string> list_backends();

/// A function compiled by kiln::compile: call it as the function itself.
template <class F>
class Compiled {
 public:
  Compiled(F fn, CompileOptions options) : state_(std::make_shared<State>(std::move(fn), std::move(options))) {
    detail::CompiledCore::register_clearer(state_);
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
    detail::TraceSession session;
    std::vector<Tensor> outs;
    {
      detail::TraceScope scope(session);
      auto raw = state_->fn(args...);
      using Raw = std::remove_cvref_t<decltype(raw)>;
      auto result = detail::Normalized<Raw>::from(raw);
      detail::ResultCodec<detail::normalized_t<Raw>>::flatten(result, outs);
    }
    return state_->explain_traced(session, outs);
  }

 private:
  struct State : detail::CompiledCore {
    State(F f, CompileOptions o) : CompiledCore(std::move(o)), fn(std::move(f)) {}
    F fn;
  };
  using Next = detail::CompiledCore::Next;

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
    const detail::CompiledCore::Decision d = s.decide(call, grad_mode, autocast, tensor_args);
    switch (d.next) {
      case Next::Replay:
        return replay_call<R>(*d.replay, tensor_args);
      case Next::Rerun:
        return rerun<R>(args...);
      case Next::Uncompiled:
        return run_uncompiled<R>(args...);
      case Next::Trace:
        break;
    }
    return trace<R>(*d.entry, call, tensor_args, args...);
  }

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
    detail::CompiledCore::Traced t =
        // The replay keeps the result's numbers only: its tensors would hold the whole traced
        // lazy graph alive (and a later write into a parameter would evaluate it, PyTorch's
        // eager order, for nothing).
        s.finish_trace(entry, call, tensor_args, std::move(outs), std::any(detail::ResultCodec<R>::numbers_only(*result)),
                       detail::kHasNumbers<R>);
    if (!t.replay) {
      evaluate_result(*result);
      return std::move(*result);
    }
    if (t.ran) return finish_call<R>(*t.replay, std::move(t.first), tensor_args);
    return replay_call<R>(*t.replay, tensor_args);
  }

  template <class R>
  static R replay_call(detail::Replay& r, const std::vector<const Tensor*>& tensor_args) {
    return finish_call<R>(r, detail::CompiledCore::run_replay(r, tensor_args), tensor_args);
  }

  /// The function's result from a run's flattened results, with their backward if they have one.
  template <class R>
  static R finish_call(const detail::Replay& r, std::vector<Tensor> results,
                       const std::vector<const Tensor*>& tensor_args) {
    if (r.backward) detail::attach_backward(r.backward, results, tensor_args);
    for (std::size_t i : r.freed_results) detail::mark_graph_freed(results[i]);
    std::size_t k = 0;
    return detail::ResultCodec<R>::rebuild(std::any_cast<const R&>(r.traced_result), results, k);
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
KILN_ENTRY void reset();

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/compile/compile_impl.hpp"
#endif
