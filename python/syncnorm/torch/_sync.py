"""SyncBatchNorm and the local BatchNorm modules over the C library's SyncBatchNorm layer
(sn_syncbn_t), and the communicators they use."""
import atexit
import ctypes
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .. import _lib as L
from .._comm import Comm, _close_all, _live
from ._util import dense, layout_of, ncs, ptr, sn_dtype

_group_comms = {}  # id(process group) -> (group, Comm)
_mpi4py_comms = {}  # id(mpi4py comm) -> (comm, Comm)


@atexit.register
def _forget_groups():
    """At exit: the layers and communicators closed, and the process groups and mpi4py
    communicators no longer held here, so that torch and mpi4py tear them down in their order."""
    _close_all()
    _group_comms.clear()
    _mpi4py_comms.clear()


def comm_for_group(group):
    """The syncnorm.Comm over a torch.distributed process group (one per group, made on first
    use): a callback communicator whose all-reduces are dist.all_reduce on the group, waited
    for with the communicator's timeout (SN_COMM_TIMEOUT_S, default 1800 s)."""
    key = id(group)
    if key in _group_comms and _group_comms[key][1]._h is not None:
        return _group_comms[key][1]
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("syncnorm.torch: this process is not in the process group")
    dtypes = {ctypes.c_float: torch.float32, ctypes.c_double: torch.float64,
              ctypes.c_int64: torch.int64}
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def allreduce(buf, op, timeout_s):
        t = torch.frombuffer(buf, dtype=dtypes[buf._type_])
        work = dist.all_reduce(t, op=ops[op], group=group, async_op=True)
        if timeout_s > 0:
            work.wait(timeout=timedelta(seconds=timeout_s))
        else:
            work.wait()

    comm = Comm.from_callback(rank, size, allreduce)
    _group_comms[key] = (group, comm)
    return comm


def comm_for_mpi4py(mpi_comm):
    """The syncnorm.Comm over an mpi4py communicator (one per communicator; its creation is
    collective over it)."""
    key = id(mpi_comm)
    if key in _mpi4py_comms and _mpi4py_comms[key][1]._h is not None:
        return _mpi4py_comms[key][1]
    comm = Comm.from_mpi4py(mpi_comm)
    _mpi4py_comms[key] = (mpi_comm, comm)
    return comm


class _Layer:
    """One sn_syncbn_t (for one dtype, layout and configuration) and tensors over its state."""

    _close_order = 0

    def __init__(self, comm, c, eps, momentum, affine, track, layout, dtype, check_consistency,
                 layer_id=-1):
        lib = L.lib()
        cfg = lib.sn_syncbn_default_config(c)
        cfg.layer_id = layer_id
        cfg.eps = eps
        cfg.momentum = L.MOMENTUM_CUMULATIVE if momentum is None else momentum
        cfg.affine, cfg.track_running_stats = int(affine), int(track)
        cfg.layout, cfg.dtype = layout, dtype
        cfg.check_consistency = int(check_consistency)
        h = ctypes.c_void_p()
        L.check(lib.sn_syncbn_create(ctypes.byref(h), ctypes.byref(cfg),
                                     comm.handle if comm is not None else None))
        self._h, self.comm, self.c, self.seq = h, comm, c, 0
        p = L.SyncBNParams()
        L.check(lib.sn_syncbn_params(h, ctypes.byref(p)))

        def view(pointer, n, ctype, dtype):
            if not pointer:
                return None
            addr = ctypes.cast(pointer, ctypes.c_void_p).value
            return torch.frombuffer((ctype * n).from_address(addr), dtype=dtype)

        f = (ctypes.c_float, torch.float32)
        self.weight, self.bias = view(p.weight, c, *f), view(p.bias, c, *f)
        self.grad_weight, self.grad_bias = view(p.grad_weight, c, *f), view(p.grad_bias, c, *f)
        self.running_mean, self.running_var = view(p.running_mean, c, *f), view(p.running_var, c, *f)
        self.nbt = view(p.num_batches_tracked, 1, ctypes.c_int64, torch.int64)
        _live.add(self)

    def check(self, st):
        if self.comm is not None:
            self.comm.check(st)
        else:
            L.check(st)

    def load(self, weight, bias, state):
        """The module's parameters and running statistics into the layer (f32 copies, every
        call: a broadcast or a write through .data changes them without a trace)."""
        with torch.no_grad():
            if self.weight is not None:
                self.weight.copy_(weight.detach() if weight is not None else 1.0)
                self.bias.copy_(bias.detach() if bias is not None else 0.0)
            if self.running_mean is not None:
                self.running_mean.copy_(state.running_mean)
                self.running_var.copy_(state.running_var)
                self.nbt.copy_(state.num_batches_tracked.reshape(1))

    def store(self, state):
        """The layer's running statistics back into the module's buffers."""
        if self.running_mean is not None:
            with torch.no_grad():
                state.running_mean.copy_(self.running_mean)
                state.running_var.copy_(self.running_var)
                state.num_batches_tracked.copy_(self.nbt.reshape(state.num_batches_tracked.shape))

    def tell(self):
        """A forward that this rank cannot make (its input failed a check in Python), where the
        others are in its collectives: a forward with a size the library refuses, so that its
        consistency check tells them (SN_ERR_MISMATCH naming this rank) instead of leaving them
        to wait for the timeout. Its own error is dropped: the caller raises the Python one."""
        L.lib().sn_syncbn_forward(self._h, None, None, -1, 1, 1)

    def collectives(self):
        v = ctypes.c_int64()
        L.check(L.lib().sn_syncbn_collective_count(self._h, ctypes.byref(v)))
        return v.value

    def close(self):
        if self._h is not None:
            L.lib().sn_syncbn_destroy(self._h)
            self._h = None
        _live.discard(self)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _BatchNormFn(torch.autograd.Function):  # noqa: D101
    """y = BatchNorm(x) through a _Layer: forward and backward are sn_syncbn_forward/backward
    (one collective each when synchronized), so the layer's last forward is what a backward
    differentiates."""

    @staticmethod
    def forward(ctx, x, weight, bias, state, layer, training, nhwc):
        n, _, s = ncs(x)
        y = torch.empty_like(x)
        layer.load(weight, bias, state)
        layer.seq += 1
        layer.check(L.lib().sn_syncbn_forward(layer._h, ptr(y), ptr(x), n, s, int(training)))
        if training:
            layer.store(state)
        ctx.save_for_backward(x)
        ctx.layer, ctx.seq, ctx.ns, ctx.nhwc = layer, layer.seq, (n, s), nhwc
        ctx.needs = (weight is not None and weight.requires_grad,
                     bias is not None and bias.requires_grad)
        ctx.dtypes = (None if weight is None else weight.dtype,
                      None if bias is None else bias.dtype)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        if layer.seq != ctx.seq:
            raise RuntimeError("syncnorm.torch: a BatchNorm module was called again before the "
                               "backward of an earlier call; its backward needs that call's "
                               "statistics (call backward first, or use one module per call)")
        dy = dense(dy.to(x.dtype), ctx.nhwc)
        dx = torch.empty_like(x)
        n, s = ctx.ns
        layer.check(L.lib().sn_syncbn_backward(layer._h, ptr(dx), ptr(dy), ptr(x), n, s))
        gw = layer.grad_weight.to(ctx.dtypes[0], copy=True) if ctx.needs[0] else None
        gb = layer.grad_bias.to(ctx.dtypes[1], copy=True) if ctx.needs[1] else None
        return dx, gw, gb, None, None, None, None


class _SNBatchNorm:
    """forward() of the BatchNorm modules over the C layer. The module keeps torch's parameters
    and buffers (so state_dict, load_state_dict, DDP's buffer broadcast and .to() are torch's);
    the C layer gets copies before each call and gives the running statistics back."""

    _local = False  # True: never synchronized (BatchNorm1d/2d/3d)
    _next_id = -1

    def _sn_comm(self):
        if self._local:
            return None
        comm = getattr(self, "comm", None)
        if comm is not None:
            return comm if isinstance(comm, Comm) else comm_for_mpi4py(comm)
        if dist.is_available() and dist.is_initialized():
            return comm_for_group(self.process_group or dist.group.WORLD)
        return None  # one process without a process group: nothing to synchronize

    def _sn_layer(self, dtype, nhwc):
        comm = self._sn_comm()
        check = getattr(self, "check_consistency", True)
        # running statistics set to None after construction: batch statistics, no update (as
        # torch.nn's BatchNorm)
        track = (self.track_running_stats and self.running_mean is not None and
                 self.running_var is not None)
        key = (dtype, nhwc, float(self.eps), self.momentum, self.affine, track, check, id(comm))
        layers = self.__dict__.setdefault("_sn_layers", {})
        layer = layers.get(key)
        if layer is None or layer._h is None:
            layout = L.LAYOUT_NHWC if nhwc else L.LAYOUT_NCHW
            layer = _Layer(comm, self.num_features, float(self.eps), self.momentum, self.affine,
                           track, layout, dtype, check, self.__dict__.get("_sn_id", -1))
            layers[key] = layer
        return layer

    def _sn_new_id(self):
        """Numbers the module (constructors call it): its C layers (one per dtype and layout)
        share the id, which the consistency check compares across ranks, so a model built alike
        on every rank has the same ids whatever its modules run first."""
        _SNBatchNorm._next_id += 1
        self._sn_id = _SNBatchNorm._next_id

    def _sn_would_sync(self):
        if self._local or not self.training:
            return False
        comm = getattr(self, "comm", None)
        if comm is not None:
            return True
        return (dist.is_available() and dist.is_initialized() and
                dist.get_world_size(self.process_group or dist.group.WORLD) > 1)

    def forward(self, input):
        try:
            self._check_input_dim(input)
            dtype = sn_dtype(input)
            if input.shape[1] != self.num_features:
                raise ValueError(f"{type(self).__name__}: input has {input.shape[1]} channels, "
                                 f"the module {self.num_features}")
        except (ValueError, TypeError):
            if self._sn_would_sync():  # the other ranks are in this call's collectives
                self._sn_layer(L.DTYPE_F32, self.__dict__.get("_sn_nhwc", False)).tell()
            raise
        self._sn_last_ndim = input.dim()
        nhwc = layout_of(input)
        if nhwc is None:  # either layout reads it alike: keep the module's (one C layer)
            nhwc = self.__dict__.get("_sn_nhwc", False)
        self._sn_nhwc = nhwc
        x = dense(input, nhwc)
        layer = self._sn_layer(dtype, nhwc)
        return _BatchNormFn.apply(x, self.weight, self.bias, self, layer, self.training, nhwc)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_sn_layers", None)  # C handles: made again on the copy's first forward
        return state
