"""Functional forms of syncnorm's norms, with torch.nn.functional's signatures (CPU tensors in
float32, bfloat16 or float16; parameters are used in float32; statistics in fp64)."""
import numbers
from types import SimpleNamespace

import torch

from ._kernels import GroupNormFn, LayerNormFn, RMSNormFn
from ._sync import _BatchNormFn, _Layer
from ._util import channels_last, dense, sn_dtype
from .. import _lib as L

__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm", "add_layer_norm",
           "add_rms_norm"]


def _norm_size(x, normalized_shape, what, *params):
    """d, the product of normalized_shape, after checking it against x and the parameters
    (weight, bias: None or of shape normalized_shape, as torch checks them)."""
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    shape = tuple(int(v) for v in normalized_shape)
    if len(shape) == 0 or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"{what}: normalized_shape {shape} must be the last dimensions of the "
                         f"input, of shape {tuple(x.shape)}")
    for name, p in zip(("weight", "bias"), params):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"{what}: expected {name} of shape {shape} (normalized_shape), got "
                             f"{tuple(p.shape)}")
    d = 1
    for v in shape:
        d *= v
    return d


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm."""
    d = _norm_size(input, normalized_shape, "layer_norm", weight, bias)
    return LayerNormFn.apply(input, weight, bias, d, float(eps), None)


def add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(layer_norm(input + residual), input + residual) in one pass over memory (the
    pre-norm transformer block's residual add); gradients flow to both inputs."""
    d = _norm_size(input, normalized_shape, "add_layer_norm", weight, bias)
    return LayerNormFn.apply(input, weight, bias, d, float(eps), residual)


def _rms_eps(x, eps):
    return float(torch.finfo(x.dtype).eps) if eps is None else float(eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm (PyTorch 2.4+): y = x / √(mean(x²) + eps) · weight; eps None
    is torch.finfo(input.dtype).eps."""
    d = _norm_size(input, normalized_shape, "rms_norm", weight)
    return RMSNormFn.apply(input, weight, d, _rms_eps(input, eps), None)


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None):
    """(rms_norm(input + residual), input + residual), as add_layer_norm."""
    d = _norm_size(input, normalized_shape, "add_rms_norm", weight)
    return RMSNormFn.apply(input, weight, d, _rms_eps(input, eps), residual)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm (contiguous or channels_last input)."""
    c = input.shape[1] if input.dim() >= 2 else -1
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (c,):
            raise ValueError(f"group_norm: expected {name} of shape ({c},) (the input's "
                             f"channels), got {tuple(p.shape)}")
    return GroupNormFn.apply(input, weight, bias, int(num_groups), float(eps))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm, local (no synchronization): training normalizes with the
    batch statistics and, where running_mean/running_var are given, updates them in place with
    factor `momentum` (unbiased variance); otherwise the running statistics normalize."""
    sn_dtype(input)
    if input.dim() < 2:
        raise ValueError(f"batch_norm: input of at least 2 dimensions expected, got "
                         f"{tuple(input.shape)}")
    track = running_mean is not None and running_var is not None
    if not training and not track:
        raise ValueError("batch_norm: running_mean and running_var are needed when not training")
    c = input.shape[1]
    for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if p is not None and tuple(p.shape) != (c,):
            raise ValueError(f"batch_norm: expected {name} of shape ({c},) (the input's "
                             f"channels), got {tuple(p.shape)}")
    nhwc = channels_last(input)
    x = dense(input, nhwc)
    layer = _Layer(None, x.shape[1], float(eps), float(momentum), True, track,
                   L.LAYOUT_NHWC if nhwc else L.LAYOUT_NCHW, sn_dtype(x), False)
    state = SimpleNamespace(running_mean=running_mean, running_var=running_var,
                            num_batches_tracked=torch.zeros((), dtype=torch.int64))
    return _BatchNormFn.apply(x, weight, bias, state, layer, bool(training), nhwc)
