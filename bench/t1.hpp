#pragma once
// T1, the GPT training step that bench_gpu (one GPU) and bench_distributed (several, under
// DistributedDataParallel) time: the model torch_suite.py trains and its token batches.
#include <cstdint>
#include <vector>

#include <kiln/kiln.hpp>

#include "gpt.hpp"

namespace t1 {

/// T1's model: torch_suite's GPT (6 layers, d 768, 12 heads, T 1024, vocabulary 50304, tied
/// head), no dropout.
inline gpt::Config config() { return gpt::small_config(50304, 1024, 6, 12, 768); }

/// Token ids in [0, vocab) of shape [B, T] on `device`, from a fixed-seed xorshift.
inline kiln::Tensor token_ids(std::int64_t B, std::int64_t T, std::int64_t vocab, std::uint64_t seed,
                              kiln::Device device) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(B * T));
  for (auto& x : v) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    x = static_cast<std::int64_t>(seed % static_cast<std::uint64_t>(vocab));
  }
  return kiln::from_vector(v, {B, T}, device);
}

}  // namespace t1
