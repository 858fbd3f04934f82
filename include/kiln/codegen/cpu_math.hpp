#pragma once
// Moved to kiln/codegen/cpp/math.hpp; this path keeps working.
#include "kiln/codegen/cpp/math.hpp"
