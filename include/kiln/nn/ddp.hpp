#pragma once
// nn::DistributedDataParallel: data-parallel training over a process group (torch's DDP). Each
// rank holds a replica of the model and trains on its own share of the batch; after every
// backward, the gradients are averaged over the ranks, so every replica takes the same step.
//
// How. At construction the ranks check that they hold the same parameters (count, shapes,
// dtypes), and rank 0's parameters and buffers are broadcast to the others. The parameters are
// split into buckets (one dtype and device each, at most bucket_cap_mb, in reverse registration
// order: roughly the order a backward produces their gradients), and every parameter gets a
// post-accumulate-grad hook.
//
// Overlap. Each bucket is a gradient evaluation group (ir::GradLeaf::evaluation_group): the
// backward evaluates the first bucket's gradients as a graph of its own, runs their hooks, then
// the next bucket's, and so on (what a later bucket needs from an earlier graph is kept, not
// computed again). A bucket whose parameters are all ready, and every bucket before it, is
// all-reduced (ReduceOp::Avg) asynchronously at once, so its reduction runs while the next
// buckets' gradients are computed (on a GPU: NCCL on its own stream beside kiln's kernels; with
// thread ranks: on the rank's communication thread). When the last bucket has been issued, kiln
// waits for every reduction (on a GPU its stream does, not the host), so the optimizer's step
// reads averaged gradients. All ranks issue the same reductions in the same order. With one
// rank, or under no_sync(), the backward stays one graph.
//
// No copies where kiln can avoid them: each parameter's gradient home (GradLeaf::home) is its
// slice of its bucket's flat buffer, so the backward writes gradients straight into the bucket
// and its reduction is one collective over that memory. A fused optimizer made after the DDP
// moves the homes into its own flat gradient buffer; a bucket whose gradients then lie side by
// side there (as consecutive parameters do) is reduced in place in that buffer instead. Only
// gradients elsewhere are copied into the bucket and back.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/distributed/distributed.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

/// DistributedDataParallel's settings (torch's constructor arguments of the same names).
struct DistributedDataParallelOptions {
  /// The largest bucket, in MiB (torch: 25).
  double bucket_cap_mb = 25;
  /// Broadcast rank 0's buffers (batch-norm statistics) before every forward.
  bool broadcast_buffers = true;
  /// The group to average over (default: distributed::default_group()).
  distributed::ProcessGroup* process_group = nullptr;
  /// Parameters the forward's output does not depend on (found by walking its graph after each
  /// forward) are ready at once, their share of a bucket reduced as zeros, instead of leaving
  /// the bucket unreduced. Afterwards a parameter some rank used holds the average (zeros
  /// counted for the ranks that did not use it); one no rank used keeps an undefined grad()
  /// (torch's find_unused_parameters).
  bool find_unused_parameters = false;
};

/// Wraps `module` for data-parallel training: forward() runs the module; every backward through
/// it averages the parameters' gradients over the group's ranks. The wrapped module is the child
/// "module" (state_dict keys "module.<name>", as torch's). Make the optimizer after it.
class DistributedDataParallel : public Module {
 public:
  KILN_ENTRY explicit DistributedDataParallel(std::shared_ptr<Module> module,
                                              DistributedDataParallelOptions options = {});
  KILN_ENTRY ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Broadcasts the buffers (with broadcast_buffers) and runs the module. ValueError when the
  /// previous backward left some buckets unreduced (a parameter got no gradient).
  KILN_ENTRY Tensor forward(const Tensor& input) override;
  std::string name() const override { return "DistributedDataParallel"; }

  /// The wrapped module.
  Module& module() const { return *module_; }

  /// While it lives, backward passes accumulate gradients locally without reducing them
  /// (gradient accumulation); the first backward after it reduces the accumulated sum. RAII form
  /// of torch's `with ddp.no_sync():`.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp), saved_(ddp.sync_) { ddp.set_sync(false); }
    ~NoSync() {
      if (ddp_) ddp_->set_sync(saved_);
    }
    NoSync(NoSync&& o) noexcept : ddp_(std::exchange(o.ddp_, nullptr)), saved_(o.saved_) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool saved_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// The buckets in the order they are reduced, each the indices (into parameters()) of its
  /// parameters.
  KILN_ENTRY std::vector<std::vector<std::size_t>> bucket_indices() const;
  /// Bucket reductions issued so far, and how many of them reduced a gradient buffer in place
  /// (no copy in or out).
  std::size_t reductions() const { return reductions_; }
  std::size_t reductions_in_place() const { return in_place_; }

 private:
  struct Bucket {
    std::vector<std::size_t> members;   ///< indices into params_, in reduction order
    std::vector<std::int64_t> offsets;  ///< each member's offset in `flat`
    std::int64_t numel = 0;
    DType dtype = DType::Float32;
    Device device = Device::cpu();
    Tensor flat;  ///< the bucket's own buffer
    std::size_t ready = 0;
  };

  /// A bucket's reduction in flight; `copied`: the averages are then copied out of the
  /// bucket's buffer into the gradients.
  struct InFlight {
    std::shared_ptr<distributed::Work> work;
    std::size_t bucket;
    bool copied;
  };

  KILN_ENTRY void make_buckets();
  KILN_ENTRY void check_replicas_agree();
  KILN_ENTRY void mark_ready(std::size_t param);
  KILN_ENTRY void reduce(std::size_t bucket);
  KILN_ENTRY void wait_for_reductions();
  /// find_unused_parameters: marks ready the parameters `output` does not depend on.
  KILN_ENTRY void mark_unused(const Tensor& output);
  /// Turns the reductions, and the evaluation groups that let them overlap, on or off.
  KILN_ENTRY void set_sync(bool on);

  std::shared_ptr<Module> module_;
  DistributedDataParallelOptions options_;
  distributed::ProcessGroup* group_;
  std::vector<Tensor> params_;
  std::vector<std::uint64_t> hook_ids_;
  std::vector<std::size_t> bucket_of_;  ///< params_ index -> bucket
  std::vector<bool> marked_;            ///< this iteration
  std::vector<bool> unused_;            ///< this iteration, by find_unused_parameters
  bool started_ = false;                ///< a hook has run this iteration
  std::vector<Bucket> buckets_;
  std::size_t next_bucket_ = 0;  ///< the first bucket not reduced yet this iteration
  std::vector<InFlight> in_flight_;
  bool sync_ = true;
  std::size_t reductions_ = 0, in_place_ = 0;
};

}  // namespace kiln::nn

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/nn/ddp_impl.hpp"
#endif
