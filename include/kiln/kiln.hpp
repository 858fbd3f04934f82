#pragma once
/// kiln: lazy tensor expressions, fused and compiled at run time.
/// Include this one header; `using namespace kiln;` brings the API into scope.
#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/linalg.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/print.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/scans.hpp"
#include "kiln/tensor/shape_ops.hpp"
#include "kiln/tensor/tensor.hpp"
#include "kiln/compile/compile.hpp"
