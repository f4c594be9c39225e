"""autograd.Functions over the library's stateless kernels: LayerNorm, RMSNorm (with their fused
residual adds), GroupNorm. Forward and backward each call one C kernel; statistics are fp64
(include/syncnorm.h states each kernel's bound)."""
import torch
from torch.autograd.function import once_differentiable

from .. import _lib as L
from ._util import channels_last, dense, f32_param, ncs, ptr, sn_dtype


def _grad_like(g, p):
    """A gradient (f32) in the dtype of its parameter p; None where p needs none."""
    if p is None or not p.requires_grad:
        return None
    return g.reshape(p.shape).to(p.dtype)


def _residual(x, residual, what):
    """The residual of a fused add, dense, after checking it matches x."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"{what}: x and residual must have the same shape and dtype, got "
                         f"{tuple(x.shape)} {x.dtype} and {tuple(residual.shape)} "
                         f"{residual.dtype}")
    return dense(residual)


class LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, d, eps, residual):
        dt = sn_dtype(x)
        x = dense(x)
        rows = x.numel() // d if d > 0 else 0
        g, b = f32_param(weight), f32_param(bias)
        y = torch.empty_like(x)
        mean = torch.empty(rows, dtype=torch.float32)
        rstd = torch.empty(rows, dtype=torch.float32)
        lib = L.lib()
        if residual is None:
            L.check(lib.sn_layernorm_fwd(ptr(y), ptr(mean), ptr(rstd), ptr(x), ptr(g), ptr(b),
                                         rows, d, eps, dt))
            h = x
        else:
            residual = _residual(x, residual, "add_layer_norm")
            h = torch.empty_like(x)
            L.check(lib.sn_add_layernorm_fwd(ptr(y), ptr(h), ptr(mean), ptr(rstd), ptr(x),
                                             ptr(residual), ptr(g), ptr(b), rows, d, eps, dt))
        ctx.save_for_backward(h, mean, rstd, g)
        ctx.d, ctx.dt, ctx.rows = d, dt, rows
        ctx.params = (weight, bias)
        ctx.fused = residual is not None
        if ctx.fused:
            return y, h
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh=None):
        h, mean, rstd, g = ctx.saved_tensors
        weight, bias = ctx.params
        dy = dense(dy.to(h.dtype))
        dx = torch.empty_like(h)
        dg = torch.empty(ctx.d, dtype=torch.float32) if weight is not None else None
        db = torch.empty(ctx.d, dtype=torch.float32) if bias is not None else None
        L.check(L.lib().sn_layernorm_bwd(ptr(dx), ptr(dg), ptr(db), ptr(dy), ptr(h), ptr(mean),
                                         ptr(rstd), ptr(g), ctx.rows, ctx.d, ctx.dt))
        if ctx.fused and dh is not None:
            dx = dx + dh
        gw, gb = _grad_like(dg, weight), _grad_like(db, bias)
        return dx, gw, gb, None, None, (dx if ctx.fused else None)


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, d, eps, residual):
        dt = sn_dtype(x)
        x = dense(x)
        rows = x.numel() // d if d > 0 else 0
        g = f32_param(weight)
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32)
        lib = L.lib()
        if residual is None:
            L.check(lib.sn_rmsnorm_fwd(ptr(y), ptr(rstd), ptr(x), ptr(g), rows, d, eps, dt))
            h = x
        else:
            residual = _residual(x, residual, "add_rms_norm")
            h = torch.empty_like(x)
            L.check(lib.sn_add_rmsnorm_fwd(ptr(y), ptr(h), ptr(rstd), ptr(x), ptr(residual),
                                           ptr(g), rows, d, eps, dt))
        ctx.save_for_backward(h, rstd, g)
        ctx.d, ctx.dt, ctx.rows, ctx.weight = d, dt, rows, weight
        ctx.fused = residual is not None
        if ctx.fused:
            return y, h
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh=None):
        h, rstd, g = ctx.saved_tensors
        dy = dense(dy.to(h.dtype))
        dx = torch.empty_like(h)
        dg = torch.empty(ctx.d, dtype=torch.float32) if ctx.weight is not None else None
        L.check(L.lib().sn_rmsnorm_bwd(ptr(dx), ptr(dg), ptr(dy), ptr(h), ptr(rstd), ptr(g),
                                       ctx.rows, ctx.d, ctx.dt))
        if ctx.fused and dh is not None:
            dx = dx + dh
        return dx, _grad_like(dg, ctx.weight), None, None, (dx if ctx.fused else None)


class GroupNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, groups, eps):
        dt = sn_dtype(x)
        if x.dim() < 2:
            raise ValueError(f"group_norm: input of at least 2 dimensions expected, got "
                             f"{tuple(x.shape)}")
        nhwc = channels_last(x)
        x = dense(x, nhwc)
        n, c, s = ncs(x)
        g, b = f32_param(weight), f32_param(bias)
        y = torch.empty_like(x)
        mean = torch.empty(n * groups, dtype=torch.float32)
        rstd = torch.empty(n * groups, dtype=torch.float32)
        layout = L.LAYOUT_NHWC if nhwc else L.LAYOUT_NCHW
        L.check(L.lib().sn_groupnorm_fwd(ptr(y), ptr(mean), ptr(rstd), ptr(x), ptr(g), ptr(b), n,
                                         c, s, groups, eps, layout, dt))
        ctx.save_for_backward(x, mean, rstd, g)
        ctx.shape = (n, c, s, groups, layout, dt, nhwc)
        ctx.params = (weight, bias)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, mean, rstd, g = ctx.saved_tensors
        n, c, s, groups, layout, dt, nhwc = ctx.shape
        weight, bias = ctx.params
        dy = dense(dy.to(x.dtype), nhwc)
        dx = torch.empty_like(x)
        dg = torch.empty(c, dtype=torch.float32) if weight is not None else None
        db = torch.empty(c, dtype=torch.float32) if bias is not None else None
        L.check(L.lib().sn_groupnorm_bwd(ptr(dx), ptr(dg), ptr(db), ptr(dy), ptr(x), ptr(mean),
                                         ptr(rstd), ptr(g), n, c, s, groups, layout, dt))
        return dx, _grad_like(dg, weight), _grad_like(db, bias), None, None
