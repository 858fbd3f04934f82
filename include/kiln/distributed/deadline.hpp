#pragma once
// How the transports and the rendezvous keep time: one clock, and durations as messages say them.
#include <string>

#include "kiln/core/duration.hpp"

namespace kiln::distributed::detail {

using Clock = std::chrono::steady_clock;

inline std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace kiln::distributed::detail
