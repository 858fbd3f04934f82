#pragma once
/// kiln::optim: fused optimizers (SGD, Adam, AdamW), learning-rate schedulers, gradient
/// clipping and kiln::GradScaler, as torch.optim, torch.nn.utils.clip_grad_* and
/// torch.amp.GradScaler. One update kernel per group of parameters of one dtype and device
/// (optim/optimizer.hpp says how).
#include "kiln/optim/adam.hpp"
#include "kiln/optim/clip_grad.hpp"
#include "kiln/optim/grad_scaler.hpp"
#include "kiln/optim/lr_scheduler.hpp"
#include "kiln/optim/optimizer.hpp"
#include "kiln/optim/sgd.hpp"
