#pragma once
// Moved to kiln/codegen/cuda/prelude.hpp; this path keeps working.
#include "kiln/codegen/cuda/prelude.hpp"
