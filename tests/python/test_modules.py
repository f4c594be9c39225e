"""syncnorm.torch's modules against torch.nn's, in one process: forward, input gradient,
weight/bias gradients and buffers; f32 against torch's float64 result, bf16/f16 within the
library's stated bound; contiguous and channels_last; state_dict both ways; errors."""
import copy

import numpy as np
import pytest
import torch

import syncnorm
import syncnorm.torch as st
from bounds import (RTOL_F32, RTOL_F32_BWD, RTOL_HALF_BWD, check_half_forward, check_rel)

F = torch.nn.functional
HALF = [torch.bfloat16, torch.float16]
DTYPES = [torch.float32] + HALF


def rand(*shape, dtype=torch.float32, mean=0.0, std=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (mean + std * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def grads_f64(fn, inputs, dy):
    """Outputs and input gradients of fn in float64 (the reference)."""
    leaves = [t.detach().double().requires_grad_(True) if t is not None else None
              for t in inputs]
    out = fn(*leaves)
    out.backward(dy.double())
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def run(module_or_fn, inputs, dy):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None
              for t in inputs]
    out = module_or_fn(*leaves)
    out.backward(dy)
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def compare(got, want, dtype, what, fwd_bound=None):
    if dtype == torch.float32:
        check_rel(got[0], want[0], RTOL_F32, what + " y")
    else:
        check_half_forward(got[0].double().numpy(), want[0].numpy(), *fwd_bound, dtype,
                           what + " y")
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        if w is None:
            continue
        rtol = RTOL_F32_BWD if dtype == torch.float32 or g.dtype == torch.float32 \
            else RTOL_HALF_BWD[dtype]
        check_rel(g.double().numpy(), w.numpy(), rtol, f"{what} grad {i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,norm", [((3, 5, 17), (17,)), ((2, 3, 4, 65), (4, 65)),
                                        ((1, 1), (1,))])
def test_layer_norm(dtype, shape, norm):
    x = rand(*shape, dtype=dtype, mean=3.0, std=2.0)
    w, b = rand(*norm, seed=1) + 1.0, rand(*norm, seed=2)
    dy = rand(*shape, dtype=dtype, seed=3)
    m = st.LayerNorm(norm)
    with torch.no_grad():
        m.weight.copy_(w), m.bias.copy_(b)
    got = run(lambda x_, w_, b_: st.functional.layer_norm(x_, norm, w_, b_, 1e-5), [x, w, b],
              dy)
    want = grads_f64(lambda x_, w_, b_: F.layer_norm(x_, norm, w_, b_, 1e-5), [x, w, b], dy)
    xh = F.layer_norm(x.double(), norm, None, None, 1e-5)
    compare(got, want, dtype, f"layer_norm {dtype}", ((xh * w.double()).abs().numpy(),
                                                     b.double().abs().numpy()))
    # the module is the function with its parameters
    y = m(x)
    assert torch.equal(y, got[0]) and y.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    shape, norm, eps = (4, 7, 33), (33,), 1e-6
    x = rand(*shape, dtype=dtype, std=3.0)
    w = rand(*norm, seed=1) + 1.0
    dy = rand(*shape, dtype=dtype, seed=3)

    def ref(x_, w_):
        return x_ * torch.rsqrt(x_.pow(2).mean(-1, keepdim=True) + eps) * w_

    got = run(lambda x_, w_: st.functional.rms_norm(x_, norm, w_, eps), [x, w], dy)
    want = grads_f64(ref, [x, w], dy)
    xh = ref(x.double(), torch.ones(norm, dtype=torch.float64))
    compare(got, want, dtype, f"rms_norm {dtype}", ((xh * w.double()).abs().numpy(), 0.0))
    m = st.RMSNorm(33, eps=eps)
    assert list(m.state_dict()) == ["weight"] and m.normalized_shape == (33,)
    with torch.no_grad():
        m.weight.copy_(w)
    assert torch.equal(m(x), got[0])
    # eps None: torch.finfo(dtype).eps, as torch.nn.RMSNorm
    d = st.functional.rms_norm(x, norm, w) - st.functional.rms_norm(
        x, norm, w, torch.finfo(dtype).eps)
    assert d.abs().max() == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm(dtype, channels_last):
    shape, groups = (3, 6, 5, 7), 3
    x = rand(*shape, dtype=dtype, mean=-2.0, std=0.5)
    w, b = rand(6, seed=1) + 1.0, rand(6, seed=2)
    dy = rand(*shape, dtype=dtype, seed=3)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        dy = dy.contiguous(memory_format=torch.channels_last)
    got = run(lambda x_, w_, b_: st.functional.group_norm(x_, groups, w_, b_, 1e-5),
              [x, w, b], dy)
    want = grads_f64(lambda x_, w_, b_: F.group_norm(x_, groups, w_, b_, 1e-5), [x, w, b], dy)
    xh = F.group_norm(x.double(), groups, None, None, 1e-5)
    w4 = w.double().reshape(1, 6, 1, 1)
    compare(got, want, dtype, f"group_norm {dtype}",
            ((xh * w4).abs().numpy(), b.double().reshape(1, 6, 1, 1).abs().numpy()))
    if channels_last:
        assert got[0].is_contiguous(memory_format=torch.channels_last)
    m = st.GroupNorm(groups, 6)
    with torch.no_grad():
        m.weight.copy_(w), m.bias.copy_(b)
    assert torch.equal(m(x), got[0])


@pytest.mark.parametrize("fused", ["layer", "rms"])
def test_add_norm(fused):
    shape, norm = (5, 3, 40), (40,)
    x, res = rand(*shape, mean=1.0), rand(*shape, seed=1, std=4.0)
    w, b = rand(*norm, seed=2) + 1.0, rand(*norm, seed=3)
    dy, dsum = rand(*shape, seed=4), rand(*shape, seed=5)
    xs = [t.clone().requires_grad_(True) for t in (x, res, w, b)]
    if fused == "layer":
        y, h = st.functional.add_layer_norm(xs[0], xs[1], norm, xs[2], xs[3])
    else:
        y, h = st.functional.add_rms_norm(xs[0], xs[1], norm, xs[2], 1e-6)
    (y * dy).sum().add_((h * dsum).sum()).backward()
    ds = [t.double().requires_grad_(True) for t in (x, res, w, b)]
    h64 = ds[0] + ds[1]
    if fused == "layer":
        y64 = F.layer_norm(h64, norm, ds[2], ds[3], 1e-5)
    else:
        y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * ds[2]
    (y64 * dy.double()).sum().add_((h64 * dsum.double()).sum()).backward()
    check_rel(y.detach().numpy(), y64.detach().numpy(), RTOL_F32, "y")
    check_rel(h.detach().numpy(), h64.detach().numpy(), RTOL_F32, "x + residual")
    n = 4 if fused == "layer" else 3
    for i in range(n):
        check_rel(xs[i].grad.numpy(), ds[i].grad.numpy(), RTOL_F32_BWD, f"grad {i}")


def cancelling_bias(xg, index):
    """β = −x̂·γ at one element of each feature: y there is ~2^-24 of its terms (β is that value
    rounded to f32), and so wherever the input repeats it."""
    return (-xg[index]).float()


@pytest.mark.parametrize("dtype", HALF)
def test_beta_cancels(dtype):
    """Outputs whose bias cancels x̂·γ, at the mixed bound (check_half_forward): layer_norm and
    add_layer_norm (row 1 cancels), group_norm and batch_norm, training and eval, contiguous and
    channels_last (sample 1, position (2, 3) cancels)."""
    x = rand(4, 33, dtype=dtype, mean=0.5, std=2.0)
    res = rand(4, 33, dtype=dtype, seed=9)
    w = rand(33, seed=1) + 1.0
    for fused in (False, True):
        h = (x.float() + res.float()).to(dtype) if fused else x
        xg = F.layer_norm(h.double(), (33,), None, None, 1e-5) * w.double()
        b = cancelling_bias(xg, 1)
        y = (st.functional.add_layer_norm(x, res, (33,), w, b)[0] if fused
             else st.functional.layer_norm(x, (33,), w, b))
        check_half_forward(y.double().numpy(), (xg + b.double()).numpy(), xg.abs().numpy(),
                           b.double().abs().numpy(), dtype, f"layer_norm fused={fused}")
    w4 = (rand(6, seed=2) + 1.0).double()
    for channels_last in (False, True):
        x = rand(3, 6, 5, 7, dtype=dtype, mean=1.0, std=2.0, seed=3)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        cases = [("group_norm", F.group_norm(x.double(), 3, None, None, 1e-5))]
        cases.append(("batch_norm", F.batch_norm(x.double(), None, None, training=True, eps=1e-5)))
        rm, rv = torch.linspace(0.5, 1.5, 6), torch.linspace(2.0, 5.0, 6)
        cases.append(("batch_norm eval", F.batch_norm(x.double(), rm.double(), rv.double(),
                                                      training=False, eps=1e-5)))
        for name, xh in cases:
            xg = xh * w4.reshape(1, 6, 1, 1)
            b = cancelling_bias(xg, (1, slice(None), 2, 3))
            wf = w4.float()
            if name == "group_norm":
                y = st.functional.group_norm(x, 3, wf, b, 1e-5)
            elif name == "batch_norm":
                y = st.functional.batch_norm(x, None, None, wf, b, training=True)
            else:
                y = st.functional.batch_norm(x, rm, rv, wf, b, training=False)
            b4 = b.double().reshape(1, 6, 1, 1)
            check_half_forward(y.double().numpy(), (xg + b4).numpy(), xg.abs().numpy(),
                               b4.abs().numpy(), dtype, f"{name} channels_last={channels_last}")


def bn_pair(cls, c, momentum=0.1, affine=True, track=True, seed=1, ndim=4):
    ours = cls(c, momentum=momentum, affine=affine, track_running_stats=track)
    ref = {st.BatchNorm1d: torch.nn.BatchNorm1d, st.BatchNorm2d: torch.nn.BatchNorm2d,
           st.BatchNorm3d: torch.nn.BatchNorm3d}.get(cls, {2: torch.nn.BatchNorm1d,
                                                          3: torch.nn.BatchNorm1d,
                                                          4: torch.nn.BatchNorm2d,
                                                          5: torch.nn.BatchNorm3d}[ndim])
    ref = ref(c, momentum=momentum, affine=affine, track_running_stats=track).double()
    if affine:
        w, b = rand(c, seed=seed) + 1.0, rand(c, seed=seed + 1)
        with torch.no_grad():
            ours.weight.copy_(w), ours.bias.copy_(b), ref.weight.copy_(w), ref.bias.copy_(b)
    return ours, ref


@pytest.mark.parametrize("cls,shape", [(st.BatchNorm1d, (6, 5)), (st.BatchNorm1d, (4, 5, 9)),
                                       (st.BatchNorm2d, (3, 5, 4, 7)),
                                       (st.BatchNorm3d, (2, 5, 3, 2, 3)),
                                       (st.SyncBatchNorm, (3, 5, 4, 7)),
                                       (st.SyncBatchNorm, (6, 5))])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_modules(cls, shape, dtype, momentum, channels_last):
    if channels_last and len(shape) < 4:
        pytest.skip("channels_last needs 4 or 5 dimensions")
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    c = shape[1]
    ours, ref = bn_pair(cls, c, momentum, ndim=len(shape))
    for step in range(3):
        x = rand(*shape, dtype=dtype, mean=5.0 + step, std=2.0, seed=10 + step)
        dy = rand(*shape, dtype=dtype, seed=20 + step)
        if channels_last:
            x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
        xo = x.clone().requires_grad_(True)
        y = ours(xo)
        y.backward(dy)
        xr = x.double().requires_grad_(True)
        yr = ref(xr)
        yr.backward(dy.double())
        assert y.dtype == dtype and y.shape == x.shape
        if channels_last:
            assert y.is_contiguous(memory_format=fmt)
        if dtype == torch.float32:
            check_rel(y.detach().numpy(), yr.detach().numpy(), RTOL_F32, f"y step {step}")
            check_rel(xo.grad.numpy(), xr.grad.numpy(), RTOL_F32_BWD, f"dx step {step}")
        else:
            dims = [0] + list(range(2, len(shape)))
            xh = F.batch_norm(x.double(), None, None, training=True, eps=ours.eps)
            bshape = [1, c] + [1] * (len(shape) - 2)
            check_half_forward(y.detach().double().numpy(), yr.detach().numpy(),
                               (xh * ref.weight.detach().reshape(bshape)).abs().numpy(),
                               ref.bias.detach().reshape(bshape).abs().numpy(), dtype,
                               f"y step {step}")
            check_rel(xo.grad.double().numpy(), xr.grad.numpy(), RTOL_HALF_BWD[dtype],
                      f"dx step {step}")
            del dims
        check_rel(ours.weight.grad.numpy(), ref.weight.grad.numpy(), RTOL_F32_BWD * 10,
                  "dweight")
        check_rel(ours.bias.grad.numpy(), ref.bias.grad.numpy(), RTOL_F32_BWD * 10, "dbias")
        ours.weight.grad = ours.bias.grad = ref.weight.grad = ref.bias.grad = None
        check_rel(ours.running_mean.numpy(), ref.running_mean.numpy(), RTOL_F32_BWD,
                  "running_mean")
        check_rel(ours.running_var.numpy(), ref.running_var.numpy(), RTOL_F32_BWD,
                  "running_var")
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
    # eval: the running statistics, no update; a frozen backward
    ours.eval(), ref.eval()
    x = rand(*shape, dtype=dtype, seed=99)
    xo, xr = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    y, yr = ours(xo), ref(xr)
    y.sum().backward(), yr.sum().backward()
    if dtype == torch.float32:
        check_rel(y.detach().numpy(), yr.detach().numpy(), RTOL_F32, "eval y")
    else:  # against the exact map of the layer's own running statistics
        bshape = [1, c] + [1] * (len(shape) - 2)
        rm = ours.running_mean.double().reshape(bshape)
        rv = ours.running_var.double().reshape(bshape)
        xg = (x.double() - rm) / torch.sqrt(rv + ours.eps) * ours.weight.detach().double().reshape(
            bshape)
        b = ours.bias.detach().double().reshape(bshape)
        check_half_forward(y.detach().double().numpy(), (xg + b).numpy(), xg.abs().numpy(),
                           b.abs().numpy(), dtype, "eval y")
    rtol = RTOL_F32 if dtype == torch.float32 else RTOL_HALF_BWD[dtype]
    check_rel(xo.grad.double().numpy(), xr.grad.numpy(), rtol, "eval dx")
    assert int(ours.num_batches_tracked) == 3


def test_batch_norm_without_running_stats_and_affine():
    ours, ref = bn_pair(st.BatchNorm2d, 4, affine=False, track=False)
    assert ours.running_mean is None and list(ours.state_dict()) == []
    x = rand(3, 4, 5, 5, mean=2.0)
    for mode in (True, False):  # eval without running statistics: batch statistics
        ours.train(mode), ref.train(mode)
        check_rel(ours(x).detach().numpy(), ref(x.double()).detach().numpy(), RTOL_F32, "y")


def test_functional_batch_norm():
    x = rand(4, 3, 6, mean=1.0)
    rm, rv = torch.zeros(3), torch.ones(3)
    rm64, rv64 = rm.double(), rv.double()
    w, b = rand(3, seed=1) + 1.0, rand(3, seed=2)
    y = st.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
    yr = F.batch_norm(x.double(), rm64, rv64, w.double(), b.double(), training=True,
                      momentum=0.3)
    check_rel(y.numpy(), yr.numpy(), RTOL_F32, "y")
    check_rel(rm.numpy(), rm64.numpy(), RTOL_F32_BWD, "running_mean")
    check_rel(rv.numpy(), rv64.numpy(), RTOL_F32_BWD, "running_var")
    y = st.functional.batch_norm(x, rm, rv, w, b, training=False)
    yr = F.batch_norm(x.double(), rm64, rv64, w.double(), b.double(), training=False)
    check_rel(y.numpy(), yr.numpy(), RTOL_F32, "eval y")


def test_empty_batch_and_one_value():
    m = st.SyncBatchNorm(3)
    y = m(torch.empty(0, 3, 4, 4))
    assert y.shape == (0, 3, 4, 4) and int(m.num_batches_tracked) == 1
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        m(torch.ones(1, 3))
    assert int(m.num_batches_tracked) == 1 and torch.equal(m.running_var, torch.ones(3))
    try:
        m(torch.ones(1, 3))
    except syncnorm.SyncnormError as e:
        assert e.status_name == "SN_ERR_INSUFFICIENT_COUNT"


def test_state_dict_both_ways():
    ours, ref = bn_pair(st.SyncBatchNorm, 4, momentum=None)
    ref = ref.float()
    x = rand(5, 4, 3, 3, mean=1.0)
    ours(x), ours(x * 2)
    sd = ours.state_dict()
    assert list(sd) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    plain = torch.nn.BatchNorm2d(4, momentum=None)
    plain.load_state_dict(sd)
    assert all(torch.equal(plain.state_dict()[k], sd[k]) for k in sd)
    fresh = st.SyncBatchNorm(4, momentum=None)
    fresh.load_state_dict(plain.state_dict())
    ours.eval(), fresh.eval(), plain.eval()
    assert torch.equal(fresh(x), ours(x))
    check_rel(fresh(x).detach().numpy(), plain(x).detach().numpy(), RTOL_F32,
              "eval after loading")
    # a copy works on its own (the C layer is made again)
    twin = copy.deepcopy(ours)
    assert torch.equal(twin(x), ours(x))


def test_convert_and_revert():
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 6),
                                torch.nn.BatchNorm1d(6))
    bn2d = model[1]
    conv = st.convert_sync_batchnorm(model)
    assert isinstance(conv[1], st.SyncBatchNorm) and isinstance(conv[4], st.SyncBatchNorm)
    assert conv[1].weight is bn2d.weight and conv[1].running_mean is bn2d.running_mean
    conv(rand(5, 2, 6, 6))
    back = st.revert_sync_batchnorm(conv)
    assert type(back[1]) is torch.nn.BatchNorm2d and type(back[4]) is torch.nn.BatchNorm1d
    assert back[1].weight is bn2d.weight and int(back[1].num_batches_tracked) == 1
    # one built directly: the class its last input asks for
    s = st.SyncBatchNorm(3)
    s(rand(4, 3, 2, 2, 2))
    assert type(st.revert_sync_batchnorm(s)) is torch.nn.BatchNorm3d


@pytest.mark.parametrize("layer", [torch.nn.Conv2d(3, 5, 3, bias=False),
                                   torch.nn.Conv1d(3, 5, 2), torch.nn.Linear(7, 5)])
def test_fold_batchnorm(layer):
    bn = torch.nn.BatchNorm2d(5) if isinstance(layer, torch.nn.Conv2d) else torch.nn.BatchNorm1d(5)
    with torch.no_grad():
        bn.running_mean.copy_(rand(5, seed=1)), bn.running_var.copy_(rand(5, seed=2).abs() + 0.1)
        bn.weight.copy_(rand(5, seed=3)), bn.bias.copy_(rand(5, seed=4))
    bn.eval()
    x = {torch.nn.Conv2d: rand(2, 3, 6, 6), torch.nn.Conv1d: rand(2, 3, 9),
         torch.nn.Linear: rand(4, 7)}[type(layer)]
    folded = st.fold_batchnorm(layer, bn)
    want = bn.double()(layer.double()(x.double())).detach()
    check_rel(folded(x).detach().numpy(), want.numpy(), 1e-6, "folded output")
    with pytest.raises(TypeError):
        st.fold_batchnorm(torch.nn.ConvTranspose2d(3, 5, 3), bn)


def test_errors():
    m = st.SyncBatchNorm(3)
    with pytest.raises(ValueError, match="torch.nn.SyncBatchNorm"):
        m(torch.empty(4, 3, device="meta"))
    with pytest.raises(ValueError, match="channels"):
        m(torch.ones(4, 2))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        m(torch.ones(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="2D to 5D"):
        m(torch.ones(4))
    with pytest.raises(syncnorm.SyncnormValueError, match="SN_ERR_INVALID_EPS"):
        st.functional.layer_norm(torch.ones(2, 3), (3,), eps=0.0)
    with pytest.raises(ValueError, match="normalized_shape"):
        st.functional.layer_norm(torch.ones(2, 3), (4,))
    # a module called twice before backward: the first call's backward is refused
    x = rand(4, 3).requires_grad_(True)
    y1 = m(x)
    m(x)
    with pytest.raises(RuntimeError, match="called again before the backward"):
        y1.sum().backward()


def test_state_written_without_a_version_bump_and_none_buffers():
    m, ref = bn_pair(st.SyncBatchNorm, 3, ndim=3)
    ref = ref.float()
    x = rand(4, 3, 5)
    m(x)
    ref(x)
    with torch.no_grad():  # .data writes (as a broadcast makes them) leave _version alone
        m.weight.data.fill_(2.0), ref.weight.data.fill_(2.0)
        m.running_var.numpy()[:] = 3.0
        ref.running_var.numpy()[:] = 3.0
    check_rel(m(x).detach().numpy(), ref(x).detach().numpy(), RTOL_F32, "y after .data writes")
    m.eval(), ref.eval()
    check_rel(m(x).detach().numpy(), ref(x).detach().numpy(), RTOL_F32, "eval after writes")
    m.train(), ref.train()
    m.running_mean = m.running_var = None  # torch: batch statistics, no update
    ref.running_mean = ref.running_var = None
    for mode in (True, False):
        m.train(mode), ref.train(mode)
        check_rel(m(x).detach().numpy(), ref(x).detach().numpy(), RTOL_F32, f"None stats {mode}")


def test_parameter_shapes_and_double_backward():
    x = rand(2, 5)
    with pytest.raises(ValueError, match="weight of shape"):
        st.functional.layer_norm(x, (5,), torch.ones(4))
    with pytest.raises(ValueError, match="weight of shape"):
        st.functional.rms_norm(x, (5,), torch.ones(2))
    with pytest.raises(ValueError, match="weight of shape"):
        st.functional.group_norm(rand(2, 6, 3), 3, torch.ones(1))
    with pytest.raises(ValueError, match="bias of shape"):
        st.functional.layer_norm(x, (5,), torch.ones(5), torch.ones(0))
    xr = x.clone().requires_grad_(True)
    y = st.SyncBatchNorm(5)(xr)
    (g,) = torch.autograd.grad(y.square().sum(), xr, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()
