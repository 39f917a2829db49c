// SGD (momentum, Nesterov, weight decay) and AdamW (decoupled weight decay, bias correction),
// each with optional gradient clipping by global norm; an update is one fused pass over the
// parameters. Both follow PyTorch's definitions (torch.optim.SGD, torch.optim.AdamW).
//
// Built from a model, an optimizer also serves its precision: it divides the loss scale out of
// the gradients in the update's multiply, and (unless the scale is the identity) checks them for
// inf/NaN first. On overflow the step is skipped: weights, moments and the step count stay as they
// were, step() returns false and the scale backs off. A mixed-precision model's compute copy of
// the weights is written in the same pass as the fp32 master weights.
//
// The parts: optimizer_base.hpp (what they share), adamw.hpp, offloaded_adamw.hpp, sgd.hpp,
// schedule.hpp (learning-rate schedules).
#pragma once

#include "adamw.hpp"
#include "offloaded_adamw.hpp"
#include "schedule.hpp"
#include "sgd.hpp"
