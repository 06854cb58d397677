"""AdamW (decoupled weight decay, optional AMSGrad): torch.optim.AdamW's update."""
from .. import _loom
from .optimizer import Optimizer, _copy_into, _materialized_zeros, _number


class AdamW(Optimizer):
    """p *= 1 - lr * weight_decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) (AMSGrad: the running max of
    v). State per parameter: "step" (t), "exp_avg", "exp_avg_sq" ("max_exp_avg_sq"), tensors
    updated in place; the bias corrections are computed from t inside the step's graph."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False):
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise TypeError(f"AdamW(): argument 'betas' must be a pair of numbers, got "
                            f"{betas!r}") from None
        defaults = dict(lr=_number("AdamW", "lr", lr),
                        betas=(_number("AdamW", "betas", b1), _number("AdamW", "betas", b2)),
                        eps=_number("AdamW", "eps", eps),
                        weight_decay=_number("AdamW", "weight_decay", weight_decay),
                        amsgrad=bool(amsgrad), foreach=None, maximize=bool(maximize),
                        capturable=False)
        super().__init__(params, defaults)

    def _check_group(self, g):
        if g["lr"] < 0:
            raise ValueError(f"Invalid learning rate: {g['lr']}")
        if g["eps"] < 0:
            raise ValueError(f"Invalid epsilon value: {g['eps']}")
        for i in (0, 1):
            if not 0.0 <= g["betas"][i] < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {g['betas'][i]}")
        if g["weight_decay"] < 0:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")

    def _init_state(self, p, group):
        shape, dt = p._shape(), p.dtype
        st = {"step": _materialized_zeros((), _loom.dtype.float64),
              "exp_avg": _materialized_zeros(shape, dt),
              "exp_avg_sq": _materialized_zeros(shape, dt)}
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = _materialized_zeros(shape, dt)
        return st

    def _update(self, group):
        lr = group.tensor("lr")
        b1, b2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            self._stepped.add(p)
            st = self.state[p]
            if group["amsgrad"] and "max_exp_avg_sq" not in st:
                st["max_exp_avg_sq"] = _materialized_zeros(p._shape(), p.dtype)
            _loom._adamw_update(p, p.grad, st["exp_avg"], st["exp_avg_sq"],
                                st.get("max_exp_avg_sq") if group["amsgrad"] else None,
                                st["step"], lr, b1, b2, group["eps"], group["weight_decay"],
                                group["amsgrad"], group["maximize"])

    def _export_state(self, p, group):
        st = self.state[p]
        if p not in self._stepped:
            return None
        out = {"step": _loom.to(st["step"], _loom.dtype.float32),
               "exp_avg": st["exp_avg"].detach(), "exp_avg_sq": st["exp_avg_sq"].detach()}
        if "max_exp_avg_sq" in st:
            out["max_exp_avg_sq"] = st["max_exp_avg_sq"].detach()
        return out

    def _import_state(self, p, group, saved):
        st = self.state[p]
        if group["amsgrad"] and "max_exp_avg_sq" not in st:
            st["max_exp_avg_sq"] = _materialized_zeros(p._shape(), p.dtype)
        if not saved:
            self._stepped.discard(p)
            with _loom.no_grad():
                for t in st.values():
                    t.zero_()
            return
        self._stepped.add(p)
        _copy_into(st["step"], saved["step"], "step")
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if k in st:
                if k in saved:
                    _copy_into(st[k], saved[k], k)
                else:
                    with _loom.no_grad():
                        st[k].zero_()
