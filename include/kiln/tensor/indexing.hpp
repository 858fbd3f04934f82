#pragma once
// Data-dependent reads: gather, index_select, take_along_dim, embedding. Each is one Gather
// primitive (the index read inside the kernel that reads the result, so `embedding(W, ids) *
// scale + pos` is one kernel), with PyTorch's names, argument orders, shapes and dtype rules.
// Data-dependent writes: scatter, scatter_add, index_add, index_copy, out of place (a new
// tensor; assign it into a view to write in place). Each is one Scatter primitive: a step of
// its own after the kernels that compute its operands. Accumulation is deterministic by default
// (repeated indices summed in the order of their positions: the same bits on every run);
// set_scatter_mode(ScatterMode::Atomic) trades that for atomics on a GPU.
//
// Indices are int64 or int32 (cast to int64 inside the kernel). A negative index is an error, as
// on PyTorch's CUDA path (no wrap-around). Out-of-range indices raise IndexError: before anything
// is compiled when the index is already in host memory, otherwise from the kernel that read it
// (core/index_fault.hpp: the read is clamped into range and the run's results are discarded).
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/linkage.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

/// The index tensor of `op` as int64 (DTypeError unless int32/int64; ShapeError if on another
/// device than `x`).
KILN_ENTRY ir::NodePtr index_node(const Tensor& x, const Tensor& index, const char* op);

/// IndexError naming `op` for the first entry of `index` outside [0, bound) when the index is
/// already in host memory (lazy or device indices are checked by the kernel that reads them).
KILN_ENTRY void check_host_index(const Tensor& x, const Tensor& index, std::int64_t axis, std::int64_t bound,
                                 const char* op);

/// A gather with nothing to read from: an error unless the index is empty too.
KILN_ENTRY void check_gather_source(const Tensor& x, const Tensor& index, std::int64_t axis, const char* op);

/// gather(x, index) along `axis` on nodes of equal rank >= 1 (index's shape at most x's off the axis).
KILN_ENTRY Tensor gather_nodes(const Tensor& x, const ir::NodePtr& index, std::int64_t axis, ir::GatherSite site);

}  // namespace detail

/// How scatter_add and index_add accumulate repeated indices.
enum class ScatterMode {
  Deterministic,  ///< in the order of their positions: the same bits on every run (the default)
  Atomic,         ///< with atomics, in any order (GPU, float32/float64/int32/int64; faster)
};

namespace detail {
KILN_ENTRY std::atomic<int>& scatter_mode_setting();
}  // namespace detail

/// Selects how later scatter_add / index_add calls accumulate (KILN_SCATTER_MODE=atomic sets
/// the initial mode). The mode is part of the op, so graphs traced before a change keep theirs.
inline void set_scatter_mode(ScatterMode mode) {
  detail::scatter_mode_setting().store(mode == ScatterMode::Atomic ? 1 : 0);
}
inline ScatterMode scatter_mode() {
  return detail::scatter_mode_setting().load() != 0 ? ScatterMode::Atomic : ScatterMode::Deterministic;
}

/// Values of `input` along `dim` at `index`: out[i][j][k] = input[index[i][j][k]][j][k] (dim 0),
/// as torch.gather. index has input's rank and, off `dim`, sizes at most input's; the result
/// has index's shape and input's dtype.
KILN_ENTRY Tensor gather(const Tensor& input, std::int64_t dim, const Tensor& index);

/// The entries of `input` along `dim` at the positions of the 1-d (or 0-d) `index`, as
/// torch.index_select: input's shape with dim's size index.numel().
KILN_ENTRY Tensor index_select(const Tensor& input, std::int64_t dim, const Tensor& index);

/// Values of `input` at `indices` along `dim`, input and indices broadcast against each other off
/// `dim`, as torch.take_along_dim; without `dim`, both are flattened first.
KILN_ENTRY Tensor take_along_dim(const Tensor& input, const Tensor& indices,
                                 std::optional<std::int64_t> dim = std::nullopt);

/// Rows of the 2-d `weight` [num_embeddings, embedding_dim] at `index` (any shape): the
/// result is index's shape + [embedding_dim], as torch.nn.functional.embedding.
KILN_ENTRY Tensor embedding(const Tensor& weight, const Tensor& index);

namespace detail {

/// The Scatter node of scatter/scatter_add: shapes and dtypes checked as torch.scatter does
/// (index of input's rank; off `dim` at most input's; src at least index's everywhere, its
/// leading index-shaped part used).
KILN_ENTRY Tensor scatter_into(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& src,
                               bool accumulate, ir::GatherSite site, const char* op);

/// index_add / index_copy: the 1-d index spread over source's shape, then a scatter.
KILN_ENTRY Tensor index_scatter(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& source,
                                bool accumulate, ir::GatherSite site, const char* op);

}  // namespace detail

/// input with src[p] written at p with p[dim] = index[p], for every p of index's shape, as
/// torch.scatter (repeated indices: the last position wins). A new tensor.
inline Tensor scatter(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& src) {
  return detail::scatter_into(input, dim, index, src, false, ir::GatherSite::Scatter, "scatter");
}

/// scatter with every written value `value` (cast to input's dtype).
KILN_ENTRY Tensor scatter(const Tensor& input, std::int64_t dim, const Tensor& index, double value);

/// input with src[p] added at p with p[dim] = index[p], as torch.scatter_add; repeated indices
/// are summed (deterministically unless set_scatter_mode(ScatterMode::Atomic)). A new tensor.
/// Under an AutocastGuard input and src run in the wider of their dtypes (torch's promote list).
KILN_ENTRY Tensor scatter_add(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& src);

/// input with alpha * source's slices added at the positions `index` (1-d) gives along `dim`,
/// as torch.index_add: out.select(dim, index[i]) += alpha * source.select(dim, i). A new tensor.
KILN_ENTRY Tensor index_add(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& source,
                            double alpha = 1.0);

/// input with source's slices written at the positions `index` (1-d) gives along `dim`, as
/// torch.index_copy (repeated indices: the last wins). A new tensor.
inline Tensor index_copy(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& source) {
  return detail::index_scatter(input, dim, index, source, false, ir::GatherSite::IndexCopy, "index_copy");
}

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/indexing_impl.hpp"
#endif
