"""Tensor plumbing shared by the syncnorm.torch modules: dtypes, memory formats, pointers."""
import torch

from .. import _lib as L

_DTYPES = {torch.float32: L.DTYPE_F32, torch.bfloat16: L.DTYPE_BF16, torch.float16: L.DTYPE_F16}


def sn_dtype(x, what="input"):
    """The library's dtype code of a CPU tensor in f32, bf16 or f16; raises otherwise."""
    if x.device.type != "cpu":
        raise ValueError(f"syncnorm.torch: {what} is on {x.device}: syncnorm's modules take CPU "
                         "tensors (for CUDA tensors use torch.nn.SyncBatchNorm and torch.nn's "
                         "norms)")
    code = _DTYPES.get(x.dtype)
    if code is None:
        raise TypeError(f"syncnorm.torch: {what} has dtype {x.dtype}; float32, bfloat16 or "
                        "float16 expected")
    return code


def layout_of(x):
    """True where x (4-D or 5-D) is channels_last (NHWC / NDHWC) and not contiguous, False where
    it is contiguous and not channels_last (or has fewer dimensions), None where it is both (an
    empty tensor, or one spatial position: the two layouts are the same memory) or neither."""
    if x.dim() == 4:
        fmt = torch.channels_last
    elif x.dim() == 5:
        fmt = torch.channels_last_3d
    else:
        return False
    cl, c = x.is_contiguous(memory_format=fmt), x.is_contiguous()
    return None if cl == c else cl


def channels_last(x):
    """Whether x is read as channels_last (an ambiguous tensor: as contiguous)."""
    return layout_of(x) is True


def memory_format(x, nhwc):
    if not nhwc:
        return torch.contiguous_format
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


def dense(x, nhwc=False):
    """x in the layout the C kernels read: contiguous, or channels_last where nhwc."""
    return x.contiguous(memory_format=memory_format(x, nhwc))


def ptr(t):
    """The data pointer of a tensor (None for None or an empty tensor)."""
    if t is None or t.numel() == 0:
        return None
    return t.data_ptr()


def f32_param(p):
    """A parameter as the contiguous f32 tensor the kernels take (None stays None)."""
    if p is None:
        return None
    return p.detach().to(torch.float32).contiguous()


def ncs(x):
    """(n, c, s) of an [N, C, *] tensor: s is the product of the spatial sizes (1 for [N, C])."""
    n, c = x.shape[0], x.shape[1]
    s = 1
    for v in x.shape[2:]:
        s *= v
    return n, c, s
