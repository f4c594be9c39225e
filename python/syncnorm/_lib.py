"""ctypes bindings of libsyncnorm (and, on demand, libsyncnorm_mpi): loading, prototypes, errors.

The libraries are looked for, in this order:
  1. the directory named by SYNCNORM_LIBRARY_DIR;
  2. the install prefix the package was installed with (``cmake --install``: _install.py);
  3. the build trees of a source checkout next to this package (PYTHONPATH=python):
     build-release/, build/, build-test/ at the repository root (the first that has them).
"""
import ctypes
import os

__all__ = ["lib", "lib_mpi", "check", "SyncnormError", "library_dir"]

# sn_status_t values (include/syncnorm.h)
SN_OK = 0
SN_ERR_NULL_POINTER = 1
SN_ERR_INVALID_SIZE = 2
SN_ERR_OVERFLOW = 3
SN_ERR_INVALID_EPS = 4
SN_ERR_INVALID_GROUPS = 5
SN_ERR_INVALID_DTYPE = 6
SN_ERR_INVALID_LAYOUT = 7
SN_ERR_INSUFFICIENT_COUNT = 8
SN_ERR_INVALID_ARGUMENT = 9
SN_ERR_ALLOC = 10
SN_ERR_MISMATCH = 11
SN_ERR_COMM = 12
SN_ERR_TIMEOUT = 13
SN_ERR_NONFINITE = 14
SN_ERR_IO = 15
SN_ERR_FORMAT = 16
SN_ERR_NOT_FOUND = 17
SN_ERR_UNSUPPORTED = 18
SN_ERR_INVALID_HANDLE = 19

# sn_dtype_t, sn_layout_t
DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_F64 = 0, 1, 2, 3
LAYOUT_NCHW, LAYOUT_NHWC = 0, 1
MOMENTUM_CUMULATIVE = -1.0


class SyncnormError(RuntimeError):
    """A syncnorm call failed: ``status`` (int), ``status_name`` ("SN_ERR_MISMATCH") and
    ``message`` (the library's sn_last_error(), naming the call and what was wrong)."""

    def __init__(self, status, status_name, message):
        super().__init__(f"{status_name}: {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


class SyncnormValueError(SyncnormError, ValueError):
    """A bad argument or state (sizes, eps, dtype, a batch of one value per channel, ...)."""


class SyncnormTimeoutError(SyncnormError, TimeoutError):
    """A collective did not complete within the communicator's timeout."""


_VALUE_ERRORS = {SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW, SN_ERR_INVALID_EPS,
                 SN_ERR_INVALID_GROUPS, SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_LAYOUT,
                 SN_ERR_INSUFFICIENT_COUNT, SN_ERR_INVALID_ARGUMENT, SN_ERR_NONFINITE}

_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("SYNCNORM_LIBRARY_DIR")
    if env:
        return [env]
    dirs = []
    try:
        from . import _install  # written by cmake --install
        dirs.append(os.path.normpath(os.path.join(_here, _install.LIBDIR_FROM_PACKAGE)))
    except ImportError:
        pass
    root = os.path.dirname(os.path.dirname(_here))  # python/syncnorm -> repository root
    dirs += [os.path.join(root, b) for b in ("build-release", "build", "build-test")]
    return dirs


def library_dir():
    """The directory the libraries are loaded from (see the module docstring)."""
    tried = _candidates()
    for d in tried:
        if os.path.exists(os.path.join(d, "libsyncnorm.so")):
            return d
    raise OSError("syncnorm: libsyncnorm.so not found in " + ", ".join(tried) +
                  "; build it (cmake --build build-release) or set SYNCNORM_LIBRARY_DIR")


_libs = {}

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_float_p = ctypes.POINTER(ctypes.c_float)
c_double_p = ctypes.POINTER(ctypes.c_double)
vp = ctypes.c_void_p
i64 = ctypes.c_int64
f32 = ctypes.c_float
status = ctypes.c_int


class SyncBNConfig(ctypes.Structure):
    """sn_syncbn_config_t (include/syncnorm_dist.h)."""
    _fields_ = [("num_features", ctypes.c_int64), ("eps", ctypes.c_float),
                ("momentum", ctypes.c_float), ("affine", ctypes.c_int),
                ("track_running_stats", ctypes.c_int), ("layout", ctypes.c_int),
                ("dtype", ctypes.c_int), ("check_consistency", ctypes.c_int),
                ("check_finite", ctypes.c_int), ("device_memory", ctypes.c_int),
                ("layer_id", ctypes.c_int64), ("name", ctypes.c_char * 48)]


class SyncBNParams(ctypes.Structure):
    """sn_syncbn_params_t."""
    _fields_ = [("weight", c_float_p), ("bias", c_float_p), ("grad_weight", c_float_p),
                ("grad_bias", c_float_p), ("running_mean", c_float_p),
                ("running_var", c_float_p), ("num_batches_tracked", c_int64_p),
                ("num_features", ctypes.c_int64)]


# sn_comm_allreduce_fn: (user, buf, count, type, op, timeout_s) -> sn_status_t
ALLREDUCE_FN = ctypes.CFUNCTYPE(status, vp, vp, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                ctypes.c_double)

_PROTOTYPES = {
    "sn_status_string": (ctypes.c_char_p, [status]),
    "sn_last_error": (ctypes.c_char_p, []),
    "sn_version": (ctypes.c_char_p, []),
    # kernels (include/syncnorm.h)
    "sn_layernorm_fwd": (status, [vp, vp, vp, vp, vp, vp, i64, i64, f32, ctypes.c_int]),
    "sn_layernorm_bwd": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, ctypes.c_int]),
    "sn_add_layernorm_fwd": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, f32,
                                      ctypes.c_int]),
    "sn_rmsnorm_fwd": (status, [vp, vp, vp, vp, i64, i64, f32, ctypes.c_int]),
    "sn_rmsnorm_bwd": (status, [vp, vp, vp, vp, vp, vp, i64, i64, ctypes.c_int]),
    "sn_add_rmsnorm_fwd": (status, [vp, vp, vp, vp, vp, vp, i64, i64, f32, ctypes.c_int]),
    "sn_batchnorm_fwd": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, f32,
                                  ctypes.c_int, ctypes.c_int]),
    "sn_batchnorm_update_running": (status, [vp, vp, vp, vp, vp, i64, i64, f32]),
    "sn_batchnorm_infer": (status, [vp, vp, vp, vp, vp, vp, i64, i64, i64, f32, ctypes.c_int,
                                    ctypes.c_int]),
    "sn_batchnorm_bwd": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, ctypes.c_int,
                                  ctypes.c_int]),
    "sn_batchnorm_bwd_apply": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i64,
                                        ctypes.c_int, ctypes.c_int]),
    "sn_groupnorm_fwd": (status, [vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, f32, ctypes.c_int,
                                  ctypes.c_int]),
    "sn_groupnorm_bwd": (status, [vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i64,
                                  ctypes.c_int, ctypes.c_int]),
    "sn_fold_batchnorm": (status, [vp, vp, vp, vp, vp, vp, i64, i64, f32]),
    # communicators, SyncBatchNorm, checkpoints (include/syncnorm_dist.h)
    "sn_comm_create_self": (status, [ctypes.POINTER(vp)]),
    "sn_comm_create_callback": (status, [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int,
                                         ALLREDUCE_FN, vp]),
    "sn_comm_rank": (status, [vp, ctypes.POINTER(ctypes.c_int)]),
    "sn_comm_size": (status, [vp, ctypes.POINTER(ctypes.c_int)]),
    "sn_comm_backend": (ctypes.c_char_p, [vp]),
    "sn_comm_allreduce_sum": (status, [vp, vp, i64, ctypes.c_int]),
    "sn_comm_all_identical": (status, [vp, ctypes.POINTER(ctypes.c_int), vp, i64]),
    "sn_comm_set_timeout": (status, [vp, ctypes.c_double]),
    "sn_comm_destroy": (None, [vp]),
    "sn_syncbn_default_config": (SyncBNConfig, [i64]),
    "sn_syncbn_create": (status, [ctypes.POINTER(vp), ctypes.POINTER(SyncBNConfig), vp]),
    "sn_syncbn_forward": (status, [vp, vp, vp, i64, i64, ctypes.c_int]),
    "sn_syncbn_backward": (status, [vp, vp, vp, vp, i64, i64]),
    "sn_syncbn_params": (status, [vp, ctypes.POINTER(SyncBNParams)]),
    "sn_syncbn_collective_count": (status, [vp, c_int64_p]),
    "sn_syncbn_destroy": (None, [vp]),
}


def _declare(lib, table):
    for name, (res, args) in table.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def lib():
    """libsyncnorm as a ctypes.CDLL, loaded once, with its prototypes declared."""
    if "core" not in _libs:
        d = library_dir()
        core = ctypes.CDLL(os.path.join(d, "libsyncnorm.so"))
        _declare(core, _PROTOTYPES)
        _libs["core"] = core
        _libs["dir"] = d
    return _libs["core"]


def lib_mpi():
    """libsyncnorm_mpi (the Open MPI communicator), loaded once. MPI must already be loaded
    and initialized by the caller (mpi4py does both on import)."""
    if "mpi" not in _libs:
        lib()
        path = os.path.join(_libs["dir"], "libsyncnorm_mpi.so")
        if not os.path.exists(path):
            raise OSError(f"syncnorm: {path} not found: this build of syncnorm has no MPI "
                          "communicator (configure with -DSN_WITH_MPI=ON)")
        mpi = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        mpi.sn_comm_create_mpi_fortran.restype = status
        mpi.sn_comm_create_mpi_fortran.argtypes = [ctypes.POINTER(vp), ctypes.c_int64]
        _libs["mpi"] = mpi
    return _libs["mpi"]


def error(st, cause=None):
    """The exception for status st, with the calling thread's sn_last_error()."""
    core = lib()
    name = core.sn_status_string(st).decode()
    message = core.sn_last_error().decode(errors="replace")
    cls = (SyncnormValueError if st in _VALUE_ERRORS else
           SyncnormTimeoutError if st == SN_ERR_TIMEOUT else SyncnormError)
    err = cls(st, name, message)
    err.__cause__ = cause
    return err


def check(st, cause=None):
    """Raises the exception for a failed status; returns None for SN_OK."""
    if st != SN_OK:
        raise error(st, cause)
