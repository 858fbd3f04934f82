#pragma once
// The unit of a fused attention step (sched::AttentionCall), shared by the C++ and CUDA
// generators: its entries run in order over one argument list.
//
// Arguments (one list for every entry, null where the call has no such slot):
//   forward:  {q, k, v, mask, out, lse}
//   backward: {q, k, v, mask, out, dout, lse, dq, dk, dv, delta}
// lse and delta are of the call's accumulation_dtype() (float32, float64 for float64 operands).
// On the CPU an entry is `extern "C" int entry(void* const* args, int nth)`; on the GPU a
// kernel taking one struct of those pointers by value (`struct { void* p[N]; }`), launched as
// `grid` blocks (a 1-D grid: the kernel decodes its tile, head and batch from blockIdx.x) of
// `block` threads with `shared_bytes` of dynamic shared memory.
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::codegen {

struct AttentionSource {
  struct Entry {
    std::string name;
    std::int64_t grid = 0, block = 0, shared_bytes = 0;  ///< GPU launch (grid 0: nothing to run)
  };
  std::string source;
  std::vector<Entry> entries;  ///< run in this order
  int arguments = 0;           ///< 6 (forward) or 11 (backward)
};

}  // namespace kiln::codegen
