"""loom.torch's convolutions, pooling, batch/group norm, scatter and advanced indexing (built from
loom's ops: loom has no conv or pool op): values and gradients against torch eager on the CPU,
and a torchvision-style ResNet trained with SGD as on eager."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import loom
import loom.torch as lt

dev = lt.device()


def check(fn, *inputs, grad=True, rtol=1e-4, atol=1e-5):
    """fn on loom and on eager from the same inputs: the output and (grad) every floating
    input's gradient of <out, w>, w random."""
    g = torch.Generator().manual_seed(7)
    ts = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    ls = [lt.to_loom(t.detach()).requires_grad_(grad and t.is_floating_point()) for t in inputs]
    want, got = fn(*ts), fn(*ls)
    torch.testing.assert_close(lt.to_torch(got), want.detach(), rtol=rtol, atol=atol)
    if not (grad and want.requires_grad):
        return
    w = torch.randn(want.shape, generator=g, dtype=want.dtype)
    (want * w).sum().backward()
    (got * lt.to_loom(w)).sum().backward()
    for k, (a, b) in enumerate(zip(ts, ls)):
        if a.requires_grad:
            torch.testing.assert_close(lt.to_torch(b.grad), a.grad, rtol=rtol, atol=atol,
                                       msg=lambda m: f"input {k}'s gradient: {m}")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CONV2D = [  # weight shape, bias, keywords
    ((6, 4, 3, 3), True, {}),
    ((6, 4, 3, 3), False, dict(stride=2, padding=1)),
    ((6, 2, 3, 2), True, dict(stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=2)),
    ((4, 1, 3, 3), False, dict(padding="same", groups=4)),  # depthwise
    ((8, 4, 1, 1), False, dict(stride=2)),  # ResNet's downsample
    ((5, 4, 2, 4), True, dict(padding="valid", dilation=2)),
]


@pytest.mark.parametrize("case", range(len(CONV2D)))
def test_conv2d_values_and_gradients(case):
    shape, bias, kw = CONV2D[case]
    args = [rand(2, 4, 9, 7), rand(*shape, seed=1)] + ([rand(shape[0], seed=2)] if bias else [])
    check(lambda x, w, *b: F.conv2d(x, w, *b, **kw), *args)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding="same"),
                                dict(dilation=3, groups=3)])
def test_conv1d_and_conv3d(kw):
    check(lambda x, w, b: F.conv1d(x, w, b, **kw), rand(2, 3, 11), rand(6, 3 // kw.get("groups", 1),
                                                                          2, seed=1), rand(6))
    kw3 = {k: v for k, v in kw.items() if k != "dilation"}
    check(lambda x, w: F.conv3d(x, w, **kw3), rand(1, 3, 5, 6, 4),
          rand(3, 3 // kw.get("groups", 1), 3, 3, 3, seed=1))


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1, output_padding=1, groups=2),
                                dict(stride=3, padding=2, dilation=2), dict()])
def test_conv_transpose(kw):
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), rand(2, 4, 5, 6),
          rand(4, 3, 3, 3, seed=1), rand(3 * kw.get("groups", 1), seed=2))
    check(lambda x, w: F.conv_transpose1d(x, w, **kw), rand(2, 4, 7), rand(4, 2, 3, seed=1))


CONV_MISTAKES = [  # the call, on a device; the words torch and loom both say
    (lambda d: nn.Conv2d(4, 8, 3).to(d)(torch.randn(2, 3, 28, 28).to(d)),
     r"groups=1, weight of size \[8, 4, 3, 3\], expected input\[2, 3, 28, 28\] to have 4 "
     r"channels, but got 3 channels instead"),
    (lambda d: F.conv1d(torch.randn(2, 6, 9).to(d), torch.randn(8, 4, 3).to(d), groups=2),
     r"groups=2, weight of size \[8, 4, 3\], expected input\[2, 6, 9\] to have 8 channels"),
    (lambda d: F.conv2d(torch.randn(2, 8, 9, 9).to(d), torch.randn(9, 4, 3, 3).to(d), groups=2),
     r"groups=2, expected weight to be divisible by 2 at dimension 0"),
    (lambda d: F.conv_transpose2d(torch.randn(2, 3, 9, 9).to(d), torch.randn(4, 3, 3, 3).to(d)),
     r"transposed=1, weight of size \[4, 3, 3, 3\], expected input\[2, 3, 9, 9\] to have 4 "
     r"channels, but got 3"),
    (lambda d: F.conv2d(torch.randn(2, 4, 9, 9).to(d), torch.randn(8, 4, 3, 3).to(d),
                        torch.randn(7).to(d)),
     r"expected bias to be 1-dimensional with 8 elements, but got bias of size \[7\]"),
]


@pytest.mark.parametrize("case", range(len(CONV_MISTAKES)))
def test_conv_shape_mistakes_are_named_before_any_reshape_as_torch_names_them(case):
    call, words = CONV_MISTAKES[case]
    with pytest.raises(RuntimeError, match=words):
        call("cpu")
    with pytest.raises(loom.ShapeError, match=r"aten\.convolution: given .*" + words):
        call(dev)


POOLS = [
    lambda x: F.max_pool2d(x, 3, 2, 1),
    lambda x: F.max_pool2d(x, 2, 2, 1, dilation=2, ceil_mode=True),
    lambda x: F.max_pool2d(x, (3, 2), (1, 2)),
    lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(),
    lambda x: F.max_pool1d(x[:, :, 0], 3, 2, 1),
    lambda x: F.max_pool3d(x[None], 2, 1),
    lambda x: F.avg_pool2d(x, 3, 2, 1),
    lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda x: F.avg_pool2d(x, 2, 3, 1, ceil_mode=True, divisor_override=3),
    lambda x: F.avg_pool1d(x[:, :, 0], 3, 2, 1, ceil_mode=True),
    lambda x: F.adaptive_avg_pool2d(x, 1),
    lambda x: F.adaptive_avg_pool2d(x, (3, 4)),  # windows of uneven sizes
    lambda x: F.adaptive_avg_pool1d(x[:, :, 0], 2),
    lambda x: F.adaptive_max_pool2d(x, (3, 4)),
    lambda x: F.unfold(x, 2, padding=1, stride=2),
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pooling_values_and_gradients(case):
    check(POOLS[case], rand(2, 3, 9, 7))


def test_fold_and_the_norms():
    check(lambda c: F.fold(c, (5, 6), 2, stride=2, padding=1), rand(2, 8, 12))
    check(lambda x, w, b: F.group_norm(x, 2, w, b), rand(2, 4, 5, 3), rand(4, seed=1),
          rand(4, seed=2))
    check(lambda x: F.instance_norm(x), rand(2, 3, 5, 4))
    check(lambda x: F.layer_norm(x, [4]), rand(2, 3, 5, 4))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_values_gradients_and_running_stats(training):
    x, w, b = rand(4, 3, 5, 5), rand(3, seed=1), rand(3, seed=2)
    stats = [rand(3, seed=3), rand(3, seed=4).abs() + 0.5]
    ref_stats = [s.clone() for s in stats]
    loom_stats = [lt.to_loom(s) for s in stats]
    check(lambda x, w, b: F.batch_norm(x, *(loom_stats if x.device.type != "cpu" else ref_stats),
                                       w, b, training=training, momentum=0.3), x, w, b)
    for got, want in zip(loom_stats, ref_stats):  # updated in place (once) when training
        torch.testing.assert_close(lt.to_torch(got), want)
    if training:
        assert not torch.equal(ref_stats[1], stats[1])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(16, 8, 26, 26), (256, 16)], ids=["2d", "1d"])
def test_batch_norm_is_as_accurate_as_eager_far_from_zero(shape, training):
    """float32 batch norm of values near 1000, forward and backward, against float64: within a
    small factor of eager's own float32 error (the statistics summed in float32 over [0, 2, 3]
    were 20-60x off)."""
    g = torch.Generator().manual_seed(3)
    c = shape[1]
    x, dy = 1000 + torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    stats = [1000 + torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5]

    def run(dtype, device):
        leaves = [t.to(dtype).to(device).requires_grad_() for t in (x, w, b)]
        y = F.batch_norm(leaves[0], *(s.to(dtype).to(device) for s in stats), *leaves[1:],
                         training=training)
        (y * dy.to(dtype).to(device)).sum().backward()
        return [lt.to_torch(t).double() for t in [y.detach()] + [t.grad for t in leaves]]

    want = run(torch.float64, "cpu")
    eager, got = run(torch.float32, "cpu"), run(torch.float32, dev)
    for name, e, l, r in zip(["out", "x.grad", "w.grad", "b.grad"], eager, got, want):
        scale = r.abs().max()
        err, eager_err = float((l - r).abs().max() / scale), float((e - r).abs().max() / scale)
        assert err <= 3 * max(eager_err, 1e-7), f"{name}: {err:.2e}, eager {eager_err:.2e}"


def test_gather_scatter_and_their_reductions():
    z = rand(4, 5)
    i = torch.tensor([[0, 1, 0], [2, 3, 3]])
    src = rand(2, 3, seed=1)

    def on(t, x):
        return x.to(t.device)

    check(lambda z: z.gather(1, on(z, i)), z)
    check(lambda z, s: z.scatter_add(0, on(z, i), s), z, src)
    check(lambda z, s: torch.take_along_dim(z[:2], on(z, i), 1) * s, z, src)
    torch2 = int(torch.__version__.split(".")[0]) >= 2
    for r in ("sum", "mean", "amax", "amin", "prod"):
        for inc in (True, False):
            check(lambda z, s: z.scatter_reduce(1, on(z, i), s, r, include_self=inc), z, src,
                  grad=torch2 or r != "prod")  # 1.13 has no backward for prod
    check(lambda z, s: z.scatter(0, on(z, i), s, reduce="add"), z, src, grad=False)
    check(lambda z: z.scatter(1, on(z, i), 2.0, reduce="multiply"), z, grad=False)
    check(lambda z, s: z.index_add(1, on(z, torch.tensor([4, 0, 4])), s, alpha=2), z, rand(4, 3))


def test_advanced_indexing_reads_and_writes():
    z, y = rand(4, 5), rand(3, 4, 5)
    a, b = torch.tensor([[0, 1, 0], [2, 3, 3]]), torch.tensor([1, 2, -1])

    def on(t, x):
        return x.to(t.device)

    check(lambda z: z[on(z, a), on(z, b)], z)  # broadcast together
    check(lambda z: z[:, on(z, a)], z)
    check(lambda y: y[on(y, a[0, :2]), :, on(y, b[:2])], y)  # apart: B's dims first
    check(lambda y: y[:, on(y, a[0, :2]), on(y, b[:2])], y)  # together: in place

    def put(z, v, acc):
        z = z.clone()
        z.index_put_((on(z, torch.tensor([0, 2, 0])),), v, accumulate=acc)
        return z

    check(lambda z, v: put(z, v, True), z, rand(3, 5))
    check(lambda z, v: put(z, v, False), z, rand(5), grad=False)  # a repeat: the last write

    def setitem(z, v):
        z = z * 1
        z[:, on(z, torch.tensor([1, 3]))] = v
        return z

    check(setitem, z, rand(4, 2))


def test_what_is_not_lowered_says_so():
    x = rand(3, 4).to(dev)
    with pytest.raises(loom.Error, match="bitwise_and"):
        torch.bitwise_and(x.long(), x.long())
    with pytest.raises(loom.Error, match="aten.as_strided has no lowering.*strides"):
        x.as_strided((2, 2), (1, 2))
    with pytest.raises(loom.Error, match="scatter.*reduce"):
        x.scatter_reduce(0, torch.zeros(1, 4, dtype=torch.long, device=dev), x, "median")


# ---- a ResNet as torchvision writes it ---------------------------------------------------------

def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(1, 1), num_classes=10, width=8):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_a_resnet_trains_with_sgd_momentum_as_on_torch_and_compiles_once():
    """5 SGD(momentum) steps of a torchvision-style ResNet (BasicBlock, BatchNorm2d, max pool,
    adaptive avg pool) on loom and on eager from the same weights and batches: losses, weights
    and BatchNorm's running statistics agree; nothing compiles after step 1."""
    torch.manual_seed(0)
    ref = ResNet()
    model = copy.deepcopy(ref).to(dev)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
            for m in (model, ref)]
    g = torch.Generator().manual_seed(1)
    loom.reset_metrics()
    compiles = []
    for step in range(5):
        x, y = torch.randn(4, 3, 20, 20, generator=g), torch.randint(0, 10, (4,), generator=g)
        losses = []
        for m, o, d in zip((model, ref), opts, (dev, "cpu")):
            loss = F.cross_entropy(m(x.to(d)), y.to(d))
            loss.backward()
            o.step()
            o.zero_grad()
            losses.append(loss.item())
        compiles.append(loom.metrics().compiles)
        assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-5), f"step {step}"
    assert compiles[-1] == compiles[1], compiles
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(lt.to_torch(a), b, rtol=1e-3, atol=1e-4,
                                   msg=lambda m: f"{name}: {m}")
    model.eval()
    ref.eval()
    x = torch.randn(2, 3, 20, 20, generator=g)
    torch.testing.assert_close(lt.to_torch(model(x.to(dev))), ref(x), rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_of_a_cnn_with_batch_norm_trains_as_eager():
    """Through aot_autograd: _native_batch_norm_legit_functional and its running statistics."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    model = copy.deepcopy(ref)
    compiled = torch.compile(model, backend="loom")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    g = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8, generator=g)
        for m, o in ((compiled, opts[0]), (ref, opts[1])):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", [((2, 3, 7), (2, 3)), ((1, 2, 5, 6), (1, 2, 3, 0)),
                                       ((1, 1, 3, 4, 5), (1, 1, 2, 0, 1, 2))],
                         ids=["1d", "2d", "3d"])
def test_reflect_replicate_and_circular_padding_as_eager(mode, shape, pad):
    """F.pad's index modes (and nn.ReflectionPad/ReplicationPad's ops): values and the input's
    gradient (each output position summed into its source) as eager."""
    if mode == "circular" and int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("torch 1.13's circular pad is Python slicing whose backward uses a strided "
                    "view loom.torch does not lower (torch >= 2.0 sends it as one op)")
    torch.manual_seed(5)
    x = torch.randn(*shape)
    a, b = x.clone().requires_grad_(), x.to(dev).requires_grad_()
    w = torch.randn(*F.pad(x, pad, mode=mode).shape)
    ya, yb = F.pad(a, pad, mode=mode), F.pad(b, pad, mode=mode)
    (ya * w).sum().backward()
    (yb * w.to(dev)).sum().backward()
    torch.testing.assert_close(lt.to_torch(yb), ya.detach())
    torch.testing.assert_close(lt.to_torch(b.grad), a.grad)


def test_reflection_pad_as_wide_as_the_input_is_refused_as_torch():
    x = torch.randn(1, 1, 3)
    with pytest.raises(RuntimeError):
        F.pad(x, (3, 0), mode="reflect")
    with pytest.raises(loom.ShapeError, match="less than the corresponding input dimension"):
        F.pad(x.to(dev), (3, 0), mode="reflect")


@pytest.mark.parametrize("shape,kw", [
    ((1, 2, 5), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 5), dict(size=8, mode="linear")),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 4, 5), dict(size=(7, 9), mode="nearest")),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 4, 5), dict(size=(7, 3), mode="bilinear", align_corners=True)),
    ((2, 3, 6, 5), dict(scale_factor=0.5, mode="bilinear")),
    ((1, 1, 3, 4, 5), dict(scale_factor=2, mode="trilinear")),
    ((1, 1, 3, 4, 5), dict(size=(4, 6, 7), mode="nearest")),
], ids=["nearest1d", "linear1d", "nearest2d-x2", "nearest2d-size", "bilinear-x2",
        "bilinear-align", "bilinear-down", "trilinear", "nearest3d"])
def test_interpolate_as_eager(shape, kw):
    """F.interpolate's nearest and (bi/tri)linear modes (sizes and scale factors, up and down,
    align_corners): values and the input's gradient as eager."""
    torch.manual_seed(6)
    x = torch.randn(*shape)
    a, b = x.clone().requires_grad_(), x.to(dev).requires_grad_()
    ya, yb = F.interpolate(a, **kw), F.interpolate(b, **kw)
    w = torch.randn(*ya.shape)
    (ya * w).sum().backward()
    (yb * w.to(dev)).sum().backward()
    torch.testing.assert_close(lt.to_torch(yb), ya.detach())
    torch.testing.assert_close(lt.to_torch(b.grad), a.grad)
