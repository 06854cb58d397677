// The optimizers' update rules, in the order of torch.optim's single-tensor implementations
// (so loom.optim's results stay within rounding of torch's).
#include "loom/trace/update_rules.h"

#include "loom/trace/autograd.h"
#include "loom/trace/ops.h"

namespace loom {

namespace {
// lr and what is computed from it, at the parameter's dtype: a tensor converted, a host number
// as it is (a graph input of the op that takes it).
Tensor as_dtype(const Tensor& x, DType dt) { return x.dtype() == dt ? x : to(x, dt); }
Scalar as_dtype(double x, DType) { return x; }

template <class Lr>
void sgd(Tensor& p, const Tensor& grad, Tensor& buf, Tensor& steps, const Lr& lr,
         const SgdOptions& o) {
  NoGradGuard guard;
  const DType dt = p.dtype();
  Tensor g = o.maximize ? -grad : grad;
  if (o.weight_decay != 0) g = g + p * o.weight_decay;
  if (o.momentum != 0) {
    if (o.dampening != 0) {  // the first step takes g whole: coefficient 1, then 1 - dampening
      Tensor coef = 1.0 - minimum(steps, ones({}, steps.dtype())) * o.dampening;
      buf.copy_(buf * o.momentum + g * to(coef, dt));
    } else {
      buf.copy_(buf * o.momentum + g);  // buf starts at zeros: the first step is g
    }
    steps.copy_(steps + 1.0);
    g = o.nesterov ? g + buf * o.momentum : buf;
  }
  p.copy_(p - g * as_dtype(lr, dt));
}

template <class Lr>
void adamw(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, Tensor& step,
           const Lr& lr, const AdamWOptions& o) {
  NoGradGuard guard;
  const DType dt = p.dtype();
  Tensor g = o.maximize ? -grad : grad;
  step.copy_(step + 1.0);
  if (o.weight_decay != 0) p.copy_(p * as_dtype(1.0 - lr * o.weight_decay, dt));
  m.copy_(m * o.beta1 + g * (1.0 - o.beta1));
  v.copy_(v * o.beta2 + g * g * (1.0 - o.beta2));
  const Tensor b1 = full({}, o.beta1, DType::Float64), b2 = full({}, o.beta2, DType::Float64);
  Tensor step_size = as_dtype(lr / (1.0 - pow(b1, step)), dt);
  Tensor bc2_sqrt = as_dtype(sqrt(1.0 - pow(b2, step)), dt);
  Tensor second = v;
  if (o.amsgrad) {
    vmax.copy_(maximum(vmax, v));
    second = vmax;
  }
  Tensor denom = sqrt(second) / bc2_sqrt + o.eps;
  p.copy_(p - m / denom * step_size);
}

}  // namespace

void sgd_update(Tensor& p, const Tensor& grad, Tensor& buf, Tensor& steps, const Tensor& lr,
                const SgdOptions& o) {
  sgd(p, grad, buf, steps, lr, o);
}
void sgd_update(Tensor& p, const Tensor& grad, Tensor& buf, Tensor& steps, double lr,
                const SgdOptions& o) {
  sgd(p, grad, buf, steps, lr, o);
}
void adamw_update(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, Tensor& step,
                  const Tensor& lr, const AdamWOptions& o) {
  adamw(p, grad, m, v, vmax, step, lr, o);
}
void adamw_update(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, Tensor& step,
                  double lr, const AdamWOptions& o) {
  adamw(p, grad, m, v, vmax, step, lr, o);
}

}  // namespace loom
