// Optimizers, after torch.optim: step() updates the parameters in place from their grad()
// (lazily, under NoGradGuard, so the update joins the step's graph); zero_grad() clears the
// gradients (to undefined, as PyTorch's set_to_none). The learning rate and the bias
// corrections are host numbers, graph inputs: changing them between steps does not
// recompile. Parameters without a gradient are skipped. State (momentum buffers, moments,
// AdamW's step count) is held in tensors updated in place, so compile's trace_once replays it.
#pragma once

#include <vector>

#include "loom/trace/tensor.h"

namespace loom::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  std::vector<Tensor> params_;
  double lr_;
};

// p -= lr * (g + weight_decay p), with momentum buffers b = momentum b + g (PyTorch's SGD;
// the rule is loom::sgd_update, loom/trace/update_rules.h, shared with loom.optim).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0, double weight_decay = 0);
  void step() override;

 private:
  double momentum_, weight_decay_;
  std::vector<Tensor> buf_, steps_;
};

// AdamW (decoupled weight decay), as torch.optim.AdamW (loom::adamw_update).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 1e-2);
  void step() override;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Tensor> m_, v_, step_;  // step: a f64 scalar per parameter, updated in place
};

}  // namespace loom::optim
