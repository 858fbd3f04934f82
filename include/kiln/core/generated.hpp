#pragma once
// What the code generators and the runtime agree on about a generated unit's text.

namespace kiln::detail {

/// The line generated sources put between their prelude (the helpers every unit carries: vector
/// math, Philox, half conversions) and their kernels: KILN_LOGS=output_code shows what follows it.
inline constexpr const char* kKernelsBeginMarker = "// ---- kiln: the kernels of this unit ----\n";

}  // namespace kiln::detail
