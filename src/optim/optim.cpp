// SGD and AdamW.
#include "loom/optim/optim.h"

#include <cmath>

#include "loom/trace/autograd.h"
#include "loom/trace/ops.h"

namespace loom::optim {

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
  if (momentum_ != 0)
    for (const Tensor& p : params_) buf_.push_back(loom::zeros(p.shape(), p.dtype()));
}

void SGD::step() {
  NoGradGuard guard;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (weight_decay_ != 0) g = g + p * weight_decay_;
    if (momentum_ != 0) {
      buf_[i].copy_(buf_[i] * momentum_ + g);
      g = buf_[i];
    }
    p.copy_(p - g * lr_);
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
    m_.push_back(loom::zeros(p.shape(), p.dtype()));
    v_.push_back(loom::zeros(p.shape(), p.dtype()));
  }
  step_ = loom::zeros({}, DType::Float64);
}

void AdamW::step() {
  NoGradGuard guard;
  // The step count is a tensor updated in place, so the bias corrections are computed in the
  // graph (compile's trace_once replays them; a host count would be frozen).
  step_.add_(loom::ones({}, DType::Float64));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor c1 = loom::to(1.0 - loom::exp(step_ * std::log(beta1_)), p.dtype());
    Tensor c2 = loom::to(1.0 - loom::exp(step_ * std::log(beta2_)), p.dtype());
    m_[i].copy_(m_[i] * beta1_ + g * (1 - beta1_));
    v_[i].copy_(v_[i] * beta2_ + g * g * (1 - beta2_));
    Tensor update = (m_[i] / c1) / (loom::sqrt(v_[i] / c2) + eps_);
    p.copy_(p * (1 - lr_ * weight_decay_) - update * lr_);
  }
}

}  // namespace loom::optim
