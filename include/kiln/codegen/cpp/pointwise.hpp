#pragma once
// Pointwise kernels on the CPU: the space's loops, the outer one shared among the team, the
// inner one an `omp simd` loop over contiguous elements.
#include "kiln/codegen/cpp/kernel_writer.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::detail {

// ---- pointwise kernels -------------------------------------------------------------------

inline void KernelWriter::pointwise() {
  const auto& p = k_.loops;
  std::vector<int> order = p.order;
  if (order.empty()) {
    begin_serial();
    for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
    return;
  }
  // Outer loops: merge the outermost while it is too short to share among threads.
  std::vector<int> outer(order.begin(), order.end() - 1);
  int inner = order.back();
  if (outer.empty()) {
    std::string pragma =
        p.parallel ? shared_loop(" simd schedule(simd:static" + piece(extent(inner)) + ")") : "#pragma omp simd";
    open(pragma,
         "for (long long " + var(inner) + " = 0; " + var(inner) + " < " + extent_text(inner) + "; ++" + var(inner) +
             ")",
         group_mask(inner));
  } else {
    std::size_t lead = 1;
    i64 lead_extent = extent(outer[0]);
    while (p.parallel && lead < outer.size() && lead_extent < 16) lead_extent *= extent(outer[lead++]);
    std::string pragma = p.parallel ? shared_loop(" schedule(static" + piece(lead_extent) + ")") : "";
    if (lead == 1) {
      open(pragma,
           "for (long long " + var(outer[0]) + " = 0; " + var(outer[0]) + " < " + extent_text(outer[0]) + "; ++" +
               var(outer[0]) + ")",
           group_mask(outer[0]));
    } else {
      std::uint64_t m = 0;
      for (std::size_t j = 0; j < lead; ++j) m |= group_mask(outer[j]);
      open(pragma,
           "for (long long t = 0; t < " +
               extents_text(std::vector<int>(outer.begin(), outer.begin() + static_cast<long>(lead))) + "; ++t)",
           m);
      decode("t", std::vector<int>(outer.begin(), outer.begin() + static_cast<long>(lead)));
    }
    for (std::size_t j = lead; j < outer.size(); ++j)
      open("",
           "for (long long " + var(outer[j]) + " = 0; " + var(outer[j]) + " < " + extent_text(outer[j]) + "; ++" +
               var(outer[j]) + ")",
           group_mask(outer[j]));
    open("#pragma omp simd",
         "for (long long " + var(inner) + " = 0; " + var(inner) + " < " + extent_text(inner) + "; ++" + var(inner) +
             ")",
         group_mask(inner));
  }
  for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
  while (top() > 0) close();
}

}  // namespace kiln::codegen::detail

KILN_COLD_CODE_END
