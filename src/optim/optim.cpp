// SGD and AdamW: parameters and state around the update rules of loom/trace/update_rules.h.
#include "loom/optim/optim.h"

#include <cmath>

#include "loom/trace/autograd.h"
#include "loom/trace/interop.h"
#include "loom/trace/ops.h"
#include "loom/trace/update_rules.h"

namespace loom::optim {

namespace {

// State that is data from the start (no graph op): lazy zeros would be a graph of fills that the
// first step's cut compiles and runs before the step (the GPT bench's 228 fills: ~60 ms).
Tensor zeros_now(const Shape& shape, DType dtype) {
  return tensor_from_buffer(Buffer::allocate(static_cast<size_t>(shape.numel() * itemsize(dtype))),
                            shape, dtype);
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  LOOM_CHECK(lr >= 0, "[optim] learning rate must be >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i)
    LOOM_CHECK(params_[i].defined() && params_[i].requires_grad(), "[optim] parameter ", i,
               " is undefined or does not require grad");
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.reset_grad();
}

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double weight_decay)
    : Optimizer(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay) {
  LOOM_CHECK(momentum >= 0 && weight_decay >= 0,
             "[SGD] momentum and weight_decay must be >= 0, got ", momentum, " and ", weight_decay);
  // Zeros, updated in place: buf = momentum * buf + g is PyTorch's first-step buf = g, and an
  // in-place update is what compile's trace_once replays.
  if (momentum_ != 0) {
    for (const Tensor& p : params_) {
      buf_.push_back(zeros_now(p.shape(), p.dtype()));
      steps_.push_back(zeros_now({}, DType::Float64));
    }
  } else {
    buf_.resize(params_.size());
    steps_.resize(params_.size());
  }
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (g.defined())
      sgd_update(params_[i], g, buf_[i], steps_[i], lr_,
                 {.momentum = momentum_, .weight_decay = weight_decay_});
  }
}

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer(std::move(params), lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay) {
  LOOM_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0 && weight_decay >= 0,
             "[AdamW] expected betas in [0, 1), eps >= 0 and weight_decay >= 0, got (", beta1, ", ",
             beta2, "), ", eps, ", ", weight_decay);
  for (const Tensor& p : params_) {
    m_.push_back(zeros_now(p.shape(), p.dtype()));
    v_.push_back(zeros_now(p.shape(), p.dtype()));
    step_.push_back(zeros_now({}, DType::Float64));
  }
}

void AdamW::step() {
  Tensor unused;  // no AMSGrad here
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (g.defined())
      adamw_update(params_[i], g, m_[i], v_[i], unused, step_[i], lr_,
                   {beta1_, beta2_, eps_, weight_decay_});
  }
}

}  // namespace loom::optim
