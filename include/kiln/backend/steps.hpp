#pragma once
// The step executor: a graph holding library ops (matrix products) runs as its step plan
// (sched/steps.hpp): each segment of generated kernels bound once (a PreparedGraph), each
// library call by the device's library (a CBLAS on the host, cuBLASLt on the GPU), the
// temporaries between them allocated per run on the graph's device (stream-ordered on CUDA,
// so freeing them at the end of a run waits for nothing).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/dispatch.hpp"
#include "kiln/runtime/cblas.hpp"
#include "kiln/runtime/cublaslt.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln::backend {

namespace detail {

inline runtime::GemmEpilogue gemm_epilogue(const sched::LibraryCall& c) {
  using E = runtime::GemmEpilogue;
  switch (c.activation) {
    case sched::Activation::None:
      return c.bias ? E::Bias : E::None;
    case sched::Activation::Relu:
      return c.bias ? E::ReluBias : E::Relu;
    case sched::Activation::GeluTanh:
      return c.bias ? E::GeluBias : E::Gelu;
  }
  return E::None;
}

/// Runs one library product over its batch dims: the innermost batch dim whose strides merge
/// is the library's batch; any others are looped over here. `tune` (max-autotune, GPU): the
/// library's top candidate algorithms are timed on these buffers and the fastest kept.
inline void run_library_call(const sched::LibraryCall& c, const char* a, const char* b, char* out, const void* bias,
                             Device device, bool tune = false) {
  const std::size_t r = c.shape.size();
  const Strides &sa = c.a.strides, &sb = c.b.strides, &so = c.out.strides;
  struct Dim {
    std::int64_t size, a, b, o;
  };
  std::vector<Dim> batch;  // outer to inner, size-1 dims dropped, mergeable neighbours merged
  for (std::size_t d = 0; d + 2 < r; ++d) {
    if (c.shape[d] == 1) continue;
    Dim x{c.shape[d], sa[d], sb[d], so[d]};
    if (!batch.empty()) {
      Dim& p = batch.back();
      if (p.a == x.a * x.size && p.b == x.b * x.size && p.o == x.o * x.size) {
        p = Dim{p.size * x.size, x.a, x.b, x.o};
        continue;
      }
    }
    batch.push_back(x);
  }
  runtime::GemmShape s;
  s.dtype = s.out_dtype = c.dtype;
  s.m = c.shape[r - 2];
  s.n = c.shape[r - 1];
  s.k = c.a_shape[r - 1];
  s.a_rs = sa[r - 2], s.a_cs = sa[r - 1], s.b_rs = sb[r - 2], s.b_cs = sb[r - 1];
  s.d_rs = so[r - 2];
  s.epilogue = gemm_epilogue(c);
  s.bias_dtype = c.bias_dtype;
  s.allow_tf32 = c.dtype == DType::Float32 && runtime::float32_matmul_precision_setting().load() != 0;
  if (!batch.empty()) {
    s.batch = batch.back().size;
    s.a_bs = batch.back().a, s.b_bs = batch.back().b, s.d_bs = batch.back().o;
    batch.pop_back();
  }
  const std::int64_t isz = static_cast<std::int64_t>(itemsize(c.dtype));
  std::vector<std::int64_t> at(batch.size(), 0);
  for (;;) {
    std::int64_t oa = 0, ob = 0, oo = 0;
    for (std::size_t d = 0; d < batch.size(); ++d) {
      oa += at[d] * batch[d].a;
      ob += at[d] * batch[d].b;
      oo += at[d] * batch[d].o;
    }
    if (device.is_cpu())
      runtime::cpu_gemm(s, a + oa * isz, b + ob * isz, out + oo * isz);
    else if (tune)
      runtime::cublaslt_autotune(s, a + oa * isz, b + ob * isz, out + oo * isz, bias, device.index);
    else
      runtime::cublaslt_matmul(s, a + oa * isz, b + ob * isz, out + oo * isz, bias, device.index);
    std::size_t d = batch.size();
    while (d > 0 && ++at[d - 1] == batch[d - 1].size) at[--d] = 0;
    if (d == 0) break;
  }
}

}  // namespace detail

/// A graph's steps bound to their executors: built once per structure, run many times.
class StepProgram {
 public:
  StepProgram(const ir::Graph& g, Mode mode, CpuLaunchOptions launch)
      : graph_(g), plan_(sched::plan_steps(g, g.device.is_cuda())), autotune_(launch.autotune) {
    for (const auto& seg : plan_.segments)
      segments_.push_back(std::make_unique<PreparedGraph>(seg.graph, mode, launch));
    if (log_enabled(LogChannel::schedule)) log(LogChannel::schedule, "steps:\n" + plan_.str());
  }

  void run(const RunArgs& args) const {
    // max-autotune: the first run times each call's candidate algorithms on its buffers (the
    // choice is kept in memory with the call's descriptors).
    const bool tune = autotune_ && graph_.device.is_cuda() && !tuned_.exchange(true);
    std::vector<StoragePtr> temps;
    temps.reserve(plan_.temps.size());
    for (const auto& t : plan_.temps)
      temps.push_back(backend::allocate(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype), graph_.device));
    auto address = [&](const sched::Slot& s) -> char* {
      switch (s.kind) {
        case sched::Slot::Leaf:
          return const_cast<char*>(static_cast<const char*>(args.inputs[static_cast<std::size_t>(s.index)]));
        case sched::Slot::Output:
          return static_cast<char*>(args.outputs[static_cast<std::size_t>(s.index)]);
        case sched::Slot::Temp:
          return static_cast<char*>(temps[static_cast<std::size_t>(s.index)]->data);
        case sched::Slot::None:
          break;
      }
      throw InternalError("kiln: step plan: an unbound slot");
    };
    for (const sched::Step& st : plan_.order) {
      if (st.kind == sched::Step::Call) {
        const sched::LibraryCall& c = plan_.calls[static_cast<std::size_t>(st.index)];
        detail::run_library_call(c, address(c.a), address(c.b), address(c.out), c.bias ? address(c.bias_slot) : nullptr,
                                 graph_.device, tune);
        kiln::detail::counters().library_calls.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const sched::Segment& seg = plan_.segments[static_cast<std::size_t>(st.index)];
      RunArgs a;
      for (const auto& l : seg.leaves) a.inputs.push_back(address(l));
      for (const auto& o : seg.outputs) a.outputs.push_back(address(o));
      segments_[static_cast<std::size_t>(st.index)]->run(a);
    }
  }

  const sched::StepPlan& plan() const { return plan_; }
  const ir::Graph& graph() const { return graph_; }

 private:
  ir::Graph graph_;
  sched::StepPlan plan_;
  std::vector<std::unique_ptr<PreparedGraph>> segments_;
  bool autotune_ = false;
  mutable std::atomic<bool> tuned_{false};
};

namespace detail {

/// Step programs of the graphs lazy evaluation runs (not prepared by their caller), by structure.
class StepProgramCache {
 public:
  static StepProgramCache& instance() {
    static StepProgramCache* c = new StepProgramCache;  // leaked: programs may run during exit
    return *c;
  }
  std::shared_ptr<const StepProgram> get(const ir::Graph& g, Mode mode) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = programs_[g.key];
    for (auto& [m, p] : list)
      if (m == mode && ir::same_graph(p->graph(), g)) return p;
    auto p = std::make_shared<const StepProgram>(g, mode, CpuLaunchOptions{});
    list.emplace_back(mode, p);
    return p;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    programs_.clear();
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::vector<std::pair<Mode, std::shared_ptr<const StepProgram>>>> programs_;
};

}  // namespace detail

inline void run_steps(const ir::Graph& g, const RunArgs& args, Mode mode) {
  detail::StepProgramCache::instance().get(g, mode)->run(args);
}

inline std::string explain_steps(const ir::Graph& g, Mode mode) {
  sched::StepPlan plan = sched::plan_steps(g, g.device.is_cuda());
  std::string s = "steps (library calls between generated kernels):\n" + plan.str();
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    s += "segment " + std::to_string(i) + ": " + backend::explain(plan.segments[i].graph, mode);
  return s;
}

inline std::shared_ptr<const StepProgram> make_step_program(const ir::Graph& g, Mode mode, CpuLaunchOptions launch) {
  return std::make_shared<const StepProgram>(g, mode, launch);
}

inline void run_step_program(const StepProgram& p, const RunArgs& args) { p.run(args); }

inline void clear_step_programs() { detail::StepProgramCache::instance().clear(); }

}  // namespace kiln::backend
