"""syncnorm for PyTorch: a CPU SyncBatchNorm over torch.distributed (any backend, e.g. gloo) or
mpi4py, and syncnorm's other norms as torch.nn modules with autograd.

Modules (constructors, parameters, buffers and state_dict as torch.nn's):
  SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats, process_group,
                device, dtype, *, comm=None, check_consistency=True)
  BatchNorm1d, BatchNorm2d, BatchNorm3d (local), LayerNorm, RMSNorm, GroupNorm
Functions: convert_sync_batchnorm, revert_sync_batchnorm, fold_batchnorm, check_equivalence and
save_state_dict (statistics across ranks), and syncnorm.torch.functional (layer_norm, rms_norm, group_norm, batch_norm, add_layer_norm,
add_rms_norm).
CPU tensors in float32, bfloat16 and float16, contiguous or channels_last; a CUDA tensor raises
ValueError (torch.nn.SyncBatchNorm is the GPU layer).
"""
import copy
import numbers

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _lib as L
from .._comm import Comm
from . import functional
from ._sync import _SNBatchNorm, comm_for_group, comm_for_mpi4py
from .equivalence import check_equivalence, save_state_dict

__all__ = ["SyncBatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "RMSNorm",
           "GroupNorm", "convert_sync_batchnorm", "revert_sync_batchnorm", "fold_batchnorm",
           "functional", "comm_for_group", "comm_for_mpi4py", "check_equivalence",
           "save_state_dict"]


class SyncBatchNorm(_SNBatchNorm, _BatchNorm):
    r"""torch.nn.SyncBatchNorm for CPU tensors: BatchNorm over [N, C, *] (2 to 5 dimensions)
    whose batch statistics, in training mode, are summed over the ranks of `process_group`
    (torch.distributed, any backend; None: the default group) or of `comm` (an mpi4py
    communicator, or a syncnorm.Comm).

    Semantics are torch.nn.SyncBatchNorm's: the biased batch variance normalizes, running_var
    is updated with the unbiased one over the global count, momentum None is a cumulative
    average (1/num_batches_tracked), eval mode uses the running statistics and makes no
    collective, and uneven or empty per-rank batches are allowed (every rank calls it). One
    all-reduce per training forward and one per backward (f64 sums, the running statistics
    bitwise identical on every rank), plus, with check_consistency (default), one small
    all-reduce each that makes ranks calling mismatched layers (another num_features, dtype,
    momentum, ...) raise SyncnormError (SN_ERR_MISMATCH) on every rank instead of hanging.
    Without a process group or comm (one process) nothing is synchronized. momentum must be in
    [0, 1] or None (checked at the first call). A module built with an mpi4py comm cannot be
    pickled or deep-copied (as torch's with a process group of its own).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None, *,
                 comm=None, check_consistency=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group
        self.comm = comm
        self.check_consistency = check_consistency
        self._sn_new_id()

    def _check_input_dim(self, input):
        if input.dim() < 2 or input.dim() > 5:
            raise ValueError(f"expected 2D to 5D input (got {input.dim()}D input)")


class BatchNorm1d(_SNBatchNorm, torch.nn.BatchNorm1d):
    """torch.nn.BatchNorm1d ([N, C] or [N, C, L]) through syncnorm's kernels; local."""
    _local = True


class BatchNorm2d(_SNBatchNorm, torch.nn.BatchNorm2d):
    """torch.nn.BatchNorm2d ([N, C, H, W], contiguous or channels_last) through syncnorm's
    kernels; local."""
    _local = True


class BatchNorm3d(_SNBatchNorm, torch.nn.BatchNorm3d):
    """torch.nn.BatchNorm3d ([N, C, D, H, W], contiguous or channels_last_3d) through
    syncnorm's kernels; local."""
    _local = True


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm through syncnorm's kernels (statistics in fp64)."""

    def forward(self, input):
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias,
                                     self.eps)


class GroupNorm(torch.nn.GroupNorm):
    """torch.nn.GroupNorm through syncnorm's kernels (contiguous or channels_last input)."""

    def forward(self, input):
        return functional.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm of PyTorch 2.4+: y = x / √(mean(x²) + eps) · weight over the last
    len(normalized_shape) dimensions; eps None is torch.finfo(x.dtype).eps."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device,
                                                         dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.elementwise_affine:
            torch.nn.init.ones_(self.weight)

    def forward(self, input):
        return functional.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}"
                .format(**self.__dict__))


def _copy_bn_state(src, dst):
    with torch.no_grad():
        if src.affine:
            dst.weight = src.weight
            dst.bias = src.bias
        dst.running_mean = src.running_mean
        dst.running_var = src.running_var
        dst.num_batches_tracked = src.num_batches_tracked
    dst.training = src.training
    if hasattr(src, "qconfig"):
        dst.qconfig = src.qconfig


def convert_sync_batchnorm(module, process_group=None, comm=None):
    """As torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm*D (torch.nn's or
    syncnorm's, and torch.nn.SyncBatchNorm) in module becomes a syncnorm.torch.SyncBatchNorm over
    process_group or comm, sharing the original's parameters and buffers. Returns the converted
    module (module itself where it is not a BatchNorm)."""
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group, comm=comm)
        _copy_bn_state(module, out)
        if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d,
                               torch.nn.BatchNorm3d)):
            out._sn_from = type(module)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group, comm))
    del module
    return out


_TORCH_BN = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
             5: torch.nn.BatchNorm3d}


def revert_sync_batchnorm(module):
    """The inverse of convert_sync_batchnorm: every syncnorm.torch.SyncBatchNorm (and
    torch.nn.SyncBatchNorm) becomes the torch.nn.BatchNorm*d it was converted from, else the one
    its last input's dimensions call for, else torch.nn.BatchNorm2d; parameters and buffers are
    shared. For a model to run without a process group (evaluation, export)."""
    out = module
    if isinstance(module, (SyncBatchNorm, torch.nn.SyncBatchNorm)):
        cls = getattr(module, "_sn_from", None) or _TORCH_BN.get(
            getattr(module, "_sn_last_ndim", 4), torch.nn.BatchNorm2d)
        out = cls(module.num_features, module.eps, module.momentum, module.affine,
                  module.track_running_stats)
        _copy_bn_state(module, out)
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    del module
    return out


def fold_batchnorm(layer, bn):
    """A copy of `layer` (torch.nn.Linear or Conv1d/2d/3d) with the eval-mode BatchNorm `bn`
    that follows it folded in: folded(x) == bn.eval()(layer(x)), per output channel with the
    factor in fp64 (sn_fold_batchnorm, f32 parameters; a float64 layer in fp64 throughout). bn
    must track running statistics. The copy has a bias."""
    if not isinstance(layer, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d,
                              torch.nn.Conv3d)):
        raise TypeError(f"fold_batchnorm: torch.nn.Linear or Conv1d/2d/3d expected, got "
                        f"{type(layer).__name__}")
    if not isinstance(bn, _BatchNorm) or bn.running_mean is None:
        raise TypeError("fold_batchnorm: bn must be a BatchNorm with running statistics")
    c_out = layer.weight.shape[0]
    if bn.num_features != c_out:
        raise ValueError(f"fold_batchnorm: the layer has {c_out} outputs, bn {bn.num_features} "
                         "channels")
    out = copy.deepcopy(layer)
    if layer.weight.dtype == torch.float64:  # the same algebra in fp64, beyond the C function's f32
        with torch.no_grad():
            k = (bn.weight.double() if bn.weight is not None else 1.0) / torch.sqrt(
                bn.running_var.double() + bn.eps)
            b0 = layer.bias if layer.bias is not None else torch.zeros(c_out, dtype=torch.float64)
            beta = bn.bias.double() if bn.bias is not None else 0.0
            out.weight.copy_(layer.weight * k.reshape([c_out] + [1] * (layer.weight.dim() - 1)))
            bias = (b0 - bn.running_mean.double()) * k + beta
            if out.bias is None:
                out.bias = torch.nn.Parameter(bias)
            else:
                out.bias.copy_(bias)
        return out
    # copies: sn_fold_batchnorm writes w and b in place
    w = layer.weight.detach().to(torch.float32).reshape(c_out, -1).clone()
    b = (layer.bias.detach().to(torch.float32).clone() if layer.bias is not None
         else torch.zeros(c_out, dtype=torch.float32))

    def f32(t):
        return None if t is None else t.detach().to(torch.float32).contiguous()

    gamma, beta = f32(bn.weight), f32(bn.bias)
    rm, rv = f32(bn.running_mean), f32(bn.running_var)
    from ._util import ptr
    L.check(L.lib().sn_fold_batchnorm(ptr(w), ptr(b), ptr(gamma), ptr(beta), ptr(rm), ptr(rv),
                                      c_out, w.shape[1], float(bn.eps)))
    with torch.no_grad():
        out.weight.copy_(w.reshape(layer.weight.shape))
        if out.bias is None:
            out.bias = torch.nn.Parameter(b.to(layer.weight.dtype))
        else:
            out.bias.copy_(b)
    return out
