"""Checking that BatchNorm statistics are equivalent across ranks: check_equivalence (live, over
a process group) and save_state_dict (one safetensors file per rank, for
`syncnorm-statcheck --compare`)."""
import ctypes

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _lib as L

__all__ = ["check_equivalence", "save_state_dict"]

_KEYS = ("running_mean", "running_var", "num_batches_tracked")


def _bn_state(model, params):
    """{layer name: {key: numpy array}} of every BatchNorm-like module (torch.nn's BatchNorm*d and
    SyncBatchNorm, syncnorm.torch's)."""
    out = {}
    for name, m in model.named_modules():
        if not isinstance(m, _BatchNorm):
            continue
        keys = _KEYS + (("weight", "bias") if params else ())
        out[name] = {k: getattr(m, k).detach().cpu().numpy().copy() for k in keys
                     if getattr(m, k, None) is not None}
    return out


def _compare(arrays):
    """arrays: {rank: numpy array}. Groups the ranks by identical bytes; against the largest
    group: max abs and relative difference, the worst element, the ranks outside it."""
    groups = []
    for r, a in arrays.items():
        for g in groups:
            b = arrays[g[0]]
            if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
                g.append(r)
                break
        else:
            groups.append([r])
    groups.sort(key=lambda g: (-len(g), g[0]))
    ref = arrays[groups[0][0]].astype(np.float64).reshape(-1)
    max_abs = max_rel = 0.0
    worst = None
    for g in groups[1:]:
        a = arrays[g[0]].astype(np.float64).reshape(-1)
        if a.shape != ref.shape:
            max_abs = max_rel = float("inf")
            continue
        d = np.abs(a - ref)
        d[np.isnan(d)] = np.inf
        i = int(np.argmax(d))
        if worst is None or d[i] > max_abs:
            max_abs, worst = float(d[i]), i
        max_rel = max(max_rel, float(np.max(d / np.maximum(np.abs(ref), 1e-300))))
    return {"identical": len(groups) == 1, "max_abs": max_abs, "max_rel": max_rel,
            "worst_channel": worst, "ranks_differ": sorted(r for g in groups[1:] for r in g)}


def check_equivalence(model, process_group=None, params=False, tol=0.0, verbose=True):
    """Compares every BatchNorm-like module's running_mean, running_var and num_batches_tracked
    (and weight, bias with params=True) across the ranks of process_group (None: the default
    group). Collective (one all_gather_object). Returns, on every rank, {layer name: {tensor:
    {"identical", "max_abs", "max_rel", "worst_channel", "ranks_differ"}, "missing_on": [ranks
    without the layer]}} and, with verbose, rank 0 prints it. A tensor agrees when identical, or
    within tol relative when tol > 0. The report's "ok" entry is whether everything agreed."""
    group = process_group or dist.group.WORLD
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = _bn_state(model, params)
    every = [None] * size
    dist.all_gather_object(every, mine, group=group)
    report, ok = {}, True
    names = []
    for state in every:
        names += [n for n in state if n not in names]
    for name in names:
        have = [r for r in range(size) if name in every[r]]
        entry = {"missing_on": [r for r in range(size) if r not in have]}
        ok &= not entry["missing_on"]
        keys = []
        for r in have:
            keys += [k for k in every[r][name] if k not in keys]
        for k in keys:
            arrays = {r: every[r][name][k] for r in have if k in every[r][name]}
            res = _compare(arrays)
            res["missing_on"] = [r for r in have if k not in every[r][name]]
            entry[k] = res
            ok &= not res["missing_on"] and (res["identical"] or res["max_rel"] <= tol)
        report[name] = entry
    report_ok = bool(ok)
    if verbose and rank == 0:
        print(f"syncnorm.torch.check_equivalence: {len(names)} BatchNorm layers on {size} ranks")
        for name, entry in report.items():
            line = [f"  {name or '(model)'}:"]
            if entry["missing_on"]:
                line.append(f"MISSING on ranks {entry['missing_on']}")
            for k, res in entry.items():
                if k == "missing_on":
                    continue
                if res["identical"]:
                    line.append(f"{k} identical")
                else:
                    line.append(f"{k} DIFFERS on ranks {res['ranks_differ']} (max abs "
                                f"{res['max_abs']:.3e}, max rel {res['max_rel']:.3e}, at "
                                f"{res['worst_channel']})")
            print(" ".join(line))
        print("all BatchNorm state identical on every rank" if report_ok else
              "BatchNorm state differs across ranks")
    report["ok"] = report_ok
    return report


class _Tensor(ctypes.Structure):
    """sn_tensor_t (include/syncnorm_dist.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("is_i64", ctypes.c_int),
                ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * 8), ("data", ctypes.c_void_p)]


_SAVE_DTYPES = {torch.float32: L.DTYPE_F32, torch.bfloat16: L.DTYPE_BF16,
                torch.float16: L.DTYPE_F16, torch.float64: L.DTYPE_F64}


def save_state_dict(state, path):
    """Writes a module's state_dict (or a state_dict) to `path` as safetensors with the same keys
    (atomically: sn_safetensors_save), without the safetensors package: the file each rank
    writes for `syncnorm-statcheck --compare`. Tensors: float32, bfloat16, float16, float64,
    int64 (num_batches_tracked); another dtype raises TypeError naming the key."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    keep, tensors = [], []
    for key, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.int64:
            dtype, is_i64 = L.DTYPE_F64, 1
        elif t.dtype in _SAVE_DTYPES:
            dtype, is_i64 = _SAVE_DTYPES[t.dtype], 0
        else:
            raise TypeError(f"save_state_dict: '{key}' has dtype {t.dtype}; float32, bfloat16, "
                            "float16, float64 or int64 expected")
        if t.dim() > 8:
            raise ValueError(f"save_state_dict: '{key}' has {t.dim()} dimensions (at most 8)")
        name = key.encode()
        keep += [t, name]
        shape = (ctypes.c_int64 * 8)(*t.shape)
        tensors.append(_Tensor(name, dtype, is_i64, t.dim(), shape,
                               t.data_ptr() if t.numel() else None))
    arr = (_Tensor * len(tensors))(*tensors)
    lib = L.lib()
    fn = lib.sn_safetensors_save
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64]
    L.check(fn(str(path).encode(), ctypes.addressof(arr) if tensors else None, len(tensors)))
