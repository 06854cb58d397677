"""loom.optim against torch.optim 1.13: SGD and AdamW trajectories over 50 steps, param groups,
lr changes without recompiling, state_dict layout and loading both ways, errors."""
import numpy as np
import pytest
import torch

import loom
import loom.nn as nn
from conftest import from_torch

STEPS = 50


def models(dtype=torch.float64, seed=0, hidden=8):
    """The same small MLP in torch and loom (loom's parameters copied from torch's)."""
    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(5, hidden), torch.nn.GELU(),
                             torch.nn.Linear(hidden, 3)).to(dtype)
    lm = nn.Sequential(nn.Linear(5, hidden), nn.GELU(), nn.Linear(hidden, 3))
    lm.to(loom.float64 if dtype == torch.float64 else loom.float32)
    lm.load_state_dict(tm.state_dict())
    return tm, lm


def data(step, dtype=torch.float64):
    rng = np.random.default_rng(100 + step)
    return (torch.from_numpy(rng.standard_normal((6, 5))).to(dtype),
            torch.from_numpy(rng.standard_normal((6, 3))).to(dtype))


def torch_step(tm, opt, step, dtype=torch.float64):
    x, y = data(step, dtype)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(tm(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def loom_step(lm, opt, step, dtype=torch.float64):
    x, y = data(step, dtype)
    opt.zero_grad()
    loss = nn.functional.mse_loss(lm(from_torch(x)), from_torch(y))
    loss.backward()
    opt.step()
    loom.sync()  # the step boundary (what compile marks): one graph per step, compiled once
    return loss.item()


def assert_params_close(lm, tm, rtol):
    for (k, tp), (k2, lp) in zip(tm.named_parameters(), lm.named_parameters()):
        assert k == k2
        np.testing.assert_allclose(lp.numpy(), tp.detach().numpy(), rtol=rtol, atol=rtol,
                                   err_msg=k)


# torch 2.x's param_groups carry options that torch 1.13's, and loom's, have not: "fused" (SGD,
# AdamW), "differentiable" (AdamW) and "decoupled_weight_decay" (AdamW, an Adam with it on). loom's
# update is what torch's is at these values; a layout check leaves them out of torch's group.
TORCH2_ONLY_OPTIONS = {"fused": (None, False), "differentiable": (False,),
                       "decoupled_weight_decay": (True,)}


def assert_group_layout(lg, tg):
    """loom's param_group against torch's: the same options with the same values, but for the
    options only torch 2.x has, which must hold the value loom's update implements."""
    extra = set(tg) - set(lg)
    assert extra <= set(TORCH2_ONLY_OPTIONS), (sorted(lg), sorted(tg))
    for k in extra:
        assert tg[k] in TORCH2_ONLY_OPTIONS[k], (k, tg[k])
    assert dict(lg) == {k: v for k, v in tg.items() if k not in extra}


def run_both(make_torch, make_loom, dtype=torch.float64, steps=STEPS, rtol=1e-10, each=None):
    tm, lm = models(dtype)
    topt, lopt = make_torch(tm.parameters()), make_loom(lm.parameters())
    for s in range(steps):
        if each:
            each(s, topt, lopt)
        tl = torch_step(tm, topt, s, dtype)
        ll = loom_step(lm, lopt, s, dtype)
        assert abs(tl - ll) <= rtol * max(1.0, abs(tl)), (s, tl, ll)
        if s % 10 == 9:
            assert_params_close(lm, tm, rtol)
    assert_params_close(lm, tm, rtol)
    return tm, lm, topt, lopt


SGD_CONFIGS = [dict(lr=0.1), dict(lr=0.05, momentum=0.9),
               dict(lr=0.05, momentum=0.9, dampening=0.3),
               dict(lr=0.05, momentum=0.8, nesterov=True),
               dict(lr=0.1, weight_decay=0.05), dict(lr=0.05, momentum=0.9, weight_decay=0.01),
               dict(lr=0.002, momentum=0.5, maximize=True)]


@pytest.mark.parametrize("cfg", SGD_CONFIGS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_sgd_trajectory_equals_torch(cfg):
    run_both(lambda p: torch.optim.SGD(p, **cfg), lambda p: loom.optim.SGD(p, **cfg))


ADAMW_CONFIGS = [dict(), dict(lr=0.01), dict(lr=0.01, weight_decay=0.0),
                 dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
                 dict(lr=0.01, amsgrad=True), dict(lr=0.001, maximize=True)]


@pytest.mark.parametrize("cfg", ADAMW_CONFIGS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_adamw_trajectory_equals_torch(cfg):
    run_both(lambda p: torch.optim.AdamW(p, **cfg), lambda p: loom.optim.AdamW(p, **cfg))


def test_float32_trajectories_relative():
    run_both(lambda p: torch.optim.AdamW(p, lr=0.01), lambda p: loom.optim.AdamW(p, lr=0.01),
             dtype=torch.float32, rtol=1e-5)
    run_both(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
             lambda p: loom.optim.SGD(p, lr=0.05, momentum=0.9), dtype=torch.float32, rtol=1e-5)


def test_param_groups_and_a_parameter_without_grad():
    def groups(m):
        return [{"params": list(m[0].parameters()), "lr": 0.03, "weight_decay": 0.2},
                {"params": list(m[2].parameters())}]

    tm, lm = models()
    unused_t = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    unused_l = nn.Parameter(loom.ones(2, dtype=loom.float64))
    topt = torch.optim.AdamW(groups(tm) + [{"params": [unused_t]}], lr=0.01)
    lopt = loom.optim.AdamW(groups(lm) + [{"params": [unused_l]}], lr=0.01)
    assert [g["lr"] for g in lopt.param_groups] == [g["lr"] for g in topt.param_groups]
    assert [g["weight_decay"] for g in lopt.param_groups] == \
        [g["weight_decay"] for g in topt.param_groups]
    for s in range(STEPS):
        torch_step(tm, topt, s)
        loom_step(lm, lopt, s)
    assert_params_close(lm, tm, 1e-10)
    np.testing.assert_array_equal(unused_l.numpy(), np.ones(2))  # skipped: no grad
    assert sorted(lopt.state_dict()["state"]) == sorted(topt.state_dict()["state"]) == [0, 1, 2, 3]


def test_add_param_group():
    tm, lm = models()
    topt = torch.optim.SGD(tm[0].parameters(), lr=0.05, momentum=0.9)
    lopt = loom.optim.SGD(lm[0].parameters(), lr=0.05, momentum=0.9)
    for s in range(5):
        torch_step(tm, topt, s)
        loom_step(lm, lopt, s)
    topt.add_param_group({"params": tm[2].parameters(), "lr": 0.2})
    lopt.add_param_group({"params": lm[2].parameters(), "lr": 0.2})
    assert_group_layout({k: v for k, v in lopt.param_groups[1].items() if k != "params"},
                        {k: v for k, v in topt.param_groups[1].items() if k != "params"})
    for s in range(5, 20):
        torch_step(tm, topt, s)
        loom_step(lm, lopt, s)
    assert_params_close(lm, tm, 1e-10)
    with pytest.raises(ValueError, match="more than one parameter group"):
        lopt.add_param_group({"params": [lm[0].weight]})


def test_lr_changed_every_step_follows_torch_and_compiles_once():
    def schedule(s, topt, lopt):
        for tg, lg in zip(topt.param_groups, lopt.param_groups):
            tg["lr"] = lg["lr"] = 0.02 * (0.9 ** s) + 0.001 * (s % 3)
    # values: the new lr is what each step reads
    run_both(lambda p: torch.optim.AdamW(p, lr=0.02), lambda p: loom.optim.AdamW(p, lr=0.02),
             each=schedule)
    run_both(lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9),
             lambda p: loom.optim.SGD(p, lr=0.02, momentum=0.9), each=schedule)
    # compiles: one graph for all 50 steps, though lr changes every step (a model size no
    # other test uses, so that the cache starts without it)
    for make in (lambda p: loom.optim.AdamW(p, lr=0.02),
                 lambda p: loom.optim.SGD(p, lr=0.02, momentum=0.9, nesterov=True)):
        _, lm = models(hidden=7)
        opt = make(lm.parameters())
        x, y = (from_torch(t) for t in data(0))
        loom.sync()
        loom.reset_metrics()
        for s in range(STEPS):
            opt.param_groups[0]["lr"] = 0.02 / (s + 1)
            assert opt.param_groups[0].tensor("lr").item() == 0.02 / (s + 1)
            opt.zero_grad()
            loss = nn.functional.mse_loss(lm(x), y)
            loss.backward()
            opt.step()
            loom.sync()
            loss.item()
        m = loom.metrics()
        assert m.compiles == 1, loom.metrics_report()
        assert m.cache_hits == STEPS - 1


def test_state_is_updated_in_place():
    _, lm = models()
    opt = loom.optim.AdamW(lm.parameters(), lr=0.01, amsgrad=True)
    params = list(lm.parameters())
    before = {id(p): {k: id(t) for k, t in opt.state[p].items()} for p in params}
    lr_tensor = opt.param_groups[0].tensor("lr")
    for s in range(3):
        loom_step(lm, opt, s)
    assert [id(p) for p in lm.parameters()] == [id(p) for p in params]
    assert {id(p): {k: id(t) for k, t in opt.state[p].items()} for p in params} == before
    assert opt.param_groups[0].tensor("lr") is lr_tensor
    opt.param_groups[0]["lr"] = 0.5
    assert lr_tensor.item() == 0.5 and opt.param_groups[0]["lr"] == 0.5
    assert opt.state[params[0]]["step"].item() == 3


def torchify(sd):
    """A loom optimizer state_dict with torch tensors (through numpy)."""
    return {"state": {i: {k: torch.from_numpy(np.array(v.numpy())) for k, v in s.items()}
                      for i, s in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_state_dict_layout_and_loading_both_ways(kind):
    if kind == "sgd":
        def mk_t(p):
            return torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1)

        def mk_l(p):
            return loom.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1)
    else:
        def mk_t(p):
            return torch.optim.AdamW(p, lr=0.01, amsgrad=True)

        def mk_l(p):
            return loom.optim.AdamW(p, lr=0.01, amsgrad=True)
    tm, lm = models()
    topt, lopt = mk_t(tm.parameters()), mk_l(lm.parameters())
    assert lopt.state_dict()["state"] == {} == topt.state_dict()["state"]
    for s in range(10):
        torch_step(tm, topt, s)
        loom_step(lm, lopt, s)
    tsd, lsd = topt.state_dict(), lopt.state_dict()
    assert len(lsd["param_groups"]) == len(tsd["param_groups"])
    for lg, tg in zip(lsd["param_groups"], tsd["param_groups"]):
        assert_group_layout(lg, tg)
    assert sorted(lsd["state"]) == sorted(tsd["state"])
    for i in tsd["state"]:
        assert sorted(lsd["state"][i]) == sorted(tsd["state"][i])
        for k, v in tsd["state"][i].items():
            np.testing.assert_allclose(lsd["state"][i][k].numpy(), v.numpy(), rtol=1e-10)

    # torch's state into a fresh loom optimizer over torch's parameters: both continue alike
    lm2 = nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 3)).double()
    lm2.load_state_dict(tm.state_dict())
    lopt2 = mk_l(lm2.parameters())
    lopt2.load_state_dict(tsd)
    # and loom's state into a fresh torch optimizer
    tm3 = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    tm3 = tm3.double()
    tm3.load_state_dict({k: torch.from_numpy(np.array(v.numpy()))
                         for k, v in lm.state_dict().items()})
    topt3 = mk_t(tm3.parameters())
    topt3.load_state_dict(torchify(lsd))
    for s in range(10, 20):
        torch_step(tm, topt, s)
        loom_step(lm2, lopt2, s)
        torch_step(tm3, topt3, s)
    assert_params_close(lm2, tm, 1e-10)
    assert_params_close(lm2, tm3, 1e-10)


def test_zero_grad():
    _, lm = models()
    opt = loom.optim.SGD(lm.parameters(), lr=0.1)
    loom_step(lm, opt, 0)
    nn.functional.mse_loss(lm(loom.ones(2, 5, dtype=loom.float64)),
                           loom.zeros(2, 3, dtype=loom.float64)).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in lm.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in lm.parameters())


def test_errors():
    p = nn.Parameter(loom.ones(2))
    with pytest.raises(TypeError, match="'lr'"):
        loom.optim.SGD([p], lr="0.1")
    with pytest.raises(TypeError, match="'betas'"):
        loom.optim.AdamW([p], betas=0.9)
    with pytest.raises(TypeError, match="'momentum'"):
        loom.optim.SGD([p], lr=0.1, momentum=None)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        loom.optim.SGD(p, lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        loom.optim.SGD({p}, lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        loom.optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(ValueError, match="require grad"):
        loom.optim.SGD([loom.ones(2)], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        loom.optim.AdamW([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        loom.optim.SGD([p, p], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        loom.optim.SGD([p], lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        loom.optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        loom.optim.AdamW([p], betas=(0.9, 1.0))
    opt = loom.optim.AdamW([p])
    with pytest.raises(TypeError, match="'lr' must be a number"):
        opt.param_groups[0]["lr"] = "fast"
    with pytest.raises(ValueError, match="number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="size of optimizer's group"):
        opt.load_state_dict({"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]})
    with pytest.raises(TypeError, match="'state_dict'"):
        opt.load_state_dict([1])
    bad = {"state": {0: {"step": 1.0, "exp_avg": loom.ones(3), "exp_avg_sq": loom.ones(2)}},
           "param_groups": [dict(opt.param_groups[0], params=[0])]}
    with pytest.raises(loom.ShapeError, match="exp_avg"):
        opt.load_state_dict(bad)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_trace_once_step_with_lr_changed_every_step_equals_torch(kind):
    """The whole step under compile(trace_once=True): traced once, the optimizer's in-place
    state replayed, each group's lr read at its current value, torch's trajectory."""
    tm, lm = models(hidden=9)
    if kind == "adamw":
        topt = torch.optim.AdamW(tm.parameters(), lr=0.02, weight_decay=0.05)
        lopt = loom.optim.AdamW(lm.parameters(), lr=0.02, weight_decay=0.05)
    else:
        topt = torch.optim.SGD(tm.parameters(), lr=0.02, momentum=0.9, nesterov=True)
        lopt = loom.optim.SGD(lm.parameters(), lr=0.02, momentum=0.9, nesterov=True)
    traces = {"n": 0}

    @loom.compile(trace_once=True)
    def step(x, y):
        traces["n"] += 1
        lopt.zero_grad()
        loss = nn.functional.mse_loss(lm(x), y)
        loss.backward()
        lopt.step()
        return loss

    loom.sync()
    loom.reset_metrics()
    for s in range(STEPS):
        lr = 0.02 / (1 + 0.1 * s)
        topt.param_groups[0]["lr"] = lr
        lopt.param_groups[0]["lr"] = lr
        tl = torch_step(tm, topt, s)
        x, y = data(s)
        ll = step(from_torch(x), from_torch(y)).item()
        assert abs(tl - ll) <= 1e-10 * max(1.0, abs(tl)), (s, tl, ll)
        if s == 1:  # the traced first call and the first replay compiled; nothing after
            loom.reset_metrics()
    assert traces["n"] == 1
    assert loom.metrics().compiles == 0 and loom.metrics().executions >= STEPS - 2
    assert_params_close(lm, tm, 1e-10)
