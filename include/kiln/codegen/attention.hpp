#pragma once
// Source of a fused attention step (sched::AttentionCall) in the C++ and CUDA dialects: the
// forward's online softmax and the backward's recomputation from the saved log-sum-exp.
#include "kiln/codegen/cpp/attention.hpp"
#include "kiln/codegen/cuda/attention.hpp"
