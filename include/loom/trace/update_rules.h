// torch.optim's SGD and AdamW update rules, shared by loom::optim and loom.optim. Each updates
// its tensors in place, gradients off; `lr` (0-d float64 tensor or number) is a graph input, so
// changing it does not recompile, and step counts are tensors that trace_once replays.
#pragma once

#include "loom/trace/tensor.h"

namespace loom {

struct SgdOptions {
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
};

// g = grad (+ weight_decay p; negated when maximizing); with momentum: buf = g at the first
// step (`steps` == 0), then buf = momentum buf + (1 - dampening) g, and g = buf (Nesterov:
// g + momentum buf); p -= lr g. `buf` and `steps` (float64, 0-d) are used only with momentum.
void sgd_update(Tensor& p, const Tensor& grad, Tensor& buf, Tensor& steps, const Tensor& lr,
                const SgdOptions& o);
void sgd_update(Tensor& p, const Tensor& grad, Tensor& buf, Tensor& steps, double lr,
                const SgdOptions& o);

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  bool amsgrad = false, maximize = false;
};

// t += 1; p *= 1 - lr weight_decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (AMSGrad:
// vmax = max(vmax, v), used for v); p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// `vmax` is used only with amsgrad.
void adamw_update(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, Tensor& step,
                  const Tensor& lr, const AdamWOptions& o);
void adamw_update(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, Tensor& step,
                  double lr, const AdamWOptions& o);

}  // namespace loom
