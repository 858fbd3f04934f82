#pragma once
// Rows along one axis, for the step kernels that walk a row at a time (scans, sorts): the C
// text placing row number `row` in two tensors of the same dims off the axis.
#include <cstdint>
#include <string>

#include "kiln/core/shape.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::c_family {

/// Statements defining `long long xo, oo`: the offsets of row `row`'s first element (a C
/// expression counting the rows, every dim of `shape` but `axis` row-major) in the tensor of
/// strides `xs` and in the one of strides `os`.
inline std::string axis_row_offsets(const Shape& shape, std::int64_t axis, const Strides& xs, const Strides& os,
                                    const std::string& row, const std::string& indent) {
  std::string s = indent + "long long rest = " + row + ", xo = 0, oo = 0;\n";
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (static_cast<std::int64_t>(d) == axis || shape[d] == 1) continue;
    s += indent + "{ const long long cd = rest % " + std::to_string(shape[d]) + "LL; rest /= " +
         std::to_string(shape[d]) + "LL; xo += cd * " + std::to_string(xs[d]) + "LL; oo += cd * " +
         std::to_string(os[d]) + "LL; }\n";
  }
  return s + indent + "(void)rest;\n";
}

}  // namespace kiln::codegen::c_family

KILN_COLD_CODE_END
