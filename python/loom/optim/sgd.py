"""SGD with momentum, dampening, Nesterov and weight decay: torch.optim.SGD's update."""
from .. import _loom
from .optimizer import Optimizer, _copy_into, _materialized_zeros, _number


class SGD(Optimizer):
    """g = grad (+ weight_decay * p); with momentum: buf = g at the first step, then
    buf = momentum * buf + (1 - dampening) * g, and g = buf (Nesterov: g + momentum * buf);
    p -= lr * g. State per parameter (with momentum): "momentum_buffer" and a step count,
    tensors updated in place."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False):
        defaults = dict(lr=_number("SGD", "lr", lr), momentum=_number("SGD", "momentum", momentum),
                        dampening=_number("SGD", "dampening", dampening),
                        weight_decay=_number("SGD", "weight_decay", weight_decay),
                        nesterov=bool(nesterov), maximize=bool(maximize), foreach=None,
                        differentiable=False)
        super().__init__(params, defaults)

    def _check_group(self, g):
        if g["lr"] < 0:
            raise ValueError(f"Invalid learning rate: {g['lr']}")
        if g["momentum"] < 0:
            raise ValueError(f"Invalid momentum value: {g['momentum']}")
        if g["weight_decay"] < 0:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _init_state(self, p, group):
        if group["momentum"] == 0:
            return {}
        return {"momentum_buffer": _materialized_zeros(p._shape(), p.dtype),
                "step": _materialized_zeros((), _loom.dtype.float64)}

    def _update(self, group):
        lr = group.tensor("lr")
        mom = group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            buf = steps = None
            if mom != 0:
                st = self.state[p]
                if "momentum_buffer" not in st:  # momentum turned on after construction
                    st.update(self._init_state(p, group))
                buf, steps = st["momentum_buffer"], st["step"]
                self._stepped.add(p)
            _loom._sgd_update(p, p.grad, buf, steps, lr, mom, group["dampening"],
                              group["weight_decay"], group["nesterov"], group["maximize"])

    def _export_state(self, p, group):
        st = self.state[p]
        if "step" not in st or p not in self._stepped:
            return None
        return {"momentum_buffer": st["momentum_buffer"].detach()}

    def _import_state(self, p, group, saved):
        st = self.state[p]
        if "step" not in st:
            if group["momentum"] == 0:
                return
            st.update(self._init_state(p, group))
        buf = saved.get("momentum_buffer") if saved else None
        if buf is None:
            self._stepped.discard(p)
            with _loom.no_grad():
                st["momentum_buffer"].zero_()
                st["step"].zero_()
            return
        self._stepped.add(p)
        _copy_into(st["momentum_buffer"], buf, "momentum_buffer")
        _copy_into(st["step"], 1.0, "step")
