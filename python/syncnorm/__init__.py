"""syncnorm: normalization layers for data-parallel training (LayerNorm, RMSNorm, BatchNorm,
GroupNorm, SyncBatchNorm), through ctypes over the C library libsyncnorm.

``import syncnorm`` needs neither torch nor mpi4py. It gives the library's version, its errors
and communicators (``Comm``); ``syncnorm.torch`` has the PyTorch modules (it needs torch).

Errors from the library are raised as SyncnormError (a RuntimeError; SyncnormValueError, also a
ValueError, for bad arguments and a batch of one value per channel; SyncnormTimeoutError, also a
TimeoutError), carrying ``status_name`` and the library's message.
"""
from ._lib import (SyncnormError, SyncnormTimeoutError, SyncnormValueError, library_dir)
from ._comm import Comm

__all__ = ["Comm", "SyncnormError", "SyncnormValueError", "SyncnormTimeoutError", "version",
           "library_dir"]


def version():
    """The version of the loaded libsyncnorm ("0.3.0")."""
    from ._lib import lib
    return lib().sn_version().decode()
