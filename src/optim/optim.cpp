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
  LOOM_CHECK(momentum >= 0 && weight_decay >= 0, "[SGD] momentum and weight_decay must be >= 0, got ",
             momentum, " and ", weight_decay);
  buf_.resize(params_.size());
}

void SGD::step() {
  NoGradGuard guard;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (weight_decay_ != 0) g = g + p * weight_decay_;
    if (momentum_ != 0) {
      buf_[i] = buf_[i].defined() ? buf_[i] * momentum_ + g : g;
      g = buf_[i];
    }
    p.copy_(p - g * lr_);
  }
}

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer(std::move(params), lr), beta1_(beta1), beta2_(beta2), eps_(eps),
      weight_decay_(weight_decay) {
  LOOM_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0 && weight_decay >= 0,
             "[AdamW] expected betas in [0, 1), eps >= 0 and weight_decay >= 0, got (", beta1, ", ",
             beta2, "), ", eps, ", ", weight_decay);
  for (const Tensor& p : params_) {
    m_.push_back(loom::zeros(p.shape(), p.dtype()));
    v_.push_back(loom::zeros(p.shape(), p.dtype()));
  }
}

void AdamW::step() {
  NoGradGuard guard;
  ++t_;
  const double c1 = 1 - std::pow(beta1_, static_cast<double>(t_));
  const double c2 = 1 - std::pow(beta2_, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    m_[i] = m_[i] * beta1_ + g * (1 - beta1_);
    v_[i] = v_[i] * beta2_ + g * g * (1 - beta2_);
    Tensor update = (m_[i] / c1) / (loom::sqrt(v_[i] / c2) + eps_);
    p.copy_(p * (1 - lr_ * weight_decay_) - update * lr_);
  }
}

}  // namespace loom::optim
