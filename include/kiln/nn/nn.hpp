#pragma once
// kiln::nn: modules, layers, their functional forms and checkpoints.
#include "kiln/nn/ddp.hpp"
#include "kiln/nn/functional.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/losses.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/safetensors.hpp"
#include "kiln/nn/state_dict.hpp"
