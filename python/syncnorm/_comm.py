"""syncnorm.Comm: a communicator of the C library (sn_comm_t) from Python."""
import atexit
import ctypes
import weakref

from . import _lib as L

__all__ = ["Comm"]

_TYPES = {0: ctypes.c_float, 1: ctypes.c_double, 2: ctypes.c_int64}
_OPS = {0: "sum", 1: "max"}
_live = weakref.WeakSet()  # Comm and layer wrappers, closed at exit before MPI is finalized


def _close_all():
    # layers before communicators (a layer must not outlive its communicator)
    for obj in sorted(list(_live), key=lambda o: o._close_order):
        obj.close()


atexit.register(_close_all)


class Comm:
    """A group of ranks that all-reduce together (the C library's sn_comm_t).

    Make one with ``Comm.self_()`` (one rank), ``Comm.from_mpi4py(comm)`` (an mpi4py
    communicator: Debian's python3-mpi4py and libsyncnorm_mpi use the same Open MPI), or
    ``Comm.from_callback(rank, size, allreduce)``; ``syncnorm.torch`` makes one over a
    torch.distributed process group. The semantics (timeouts, SN_COMM_CHECK, errors) are those of
    include/syncnorm_dist.h. ``close()`` frees it (also at exit); layers using it must be closed
    first.
    """

    _close_order = 1

    def __init__(self, handle, keep=None):
        self._h = handle
        self._keep = keep  # objects the C side refers to (a callback), kept alive with it
        self._callback_error = None
        _live.add(self)

    @classmethod
    def self_(cls):
        """A world of one rank (sn_comm_create_self)."""
        h = ctypes.c_void_p()
        L.check(L.lib().sn_comm_create_self(ctypes.byref(h)))
        return cls(h)

    @classmethod
    def from_mpi4py(cls, comm):
        """A communicator over an mpi4py intracommunicator (collective over it: every rank
        calls this). The C side duplicates it (sn_comm_create_mpi), handed over by its Fortran
        handle, so no MPI type crosses the boundary."""
        h = ctypes.c_void_p()
        L.check(L.lib_mpi().sn_comm_create_mpi_fortran(ctypes.byref(h), comm.py2f()))
        return cls(h, keep=comm)

    @classmethod
    def from_callback(cls, rank, size, allreduce):
        """A communicator whose all-reduces call ``allreduce(buf, op, timeout_s)``: buf a ctypes
        array (float32, float64 or int64; it supports the buffer protocol) to reduce in place
        over the group, op "sum" or "max", timeout_s the communicator's timeout (0: none).
        It must leave bitwise identical results on every rank. An exception it raises breaks the
        communicator; the call that made the all-reduce raises SyncnormError from it
        (SyncnormTimeoutError where it was a TimeoutError or its message says "timed out")."""
        holder = {}

        def trampoline(user, buf, count, type_, op, timeout_s):
            try:
                arr = (_TYPES[type_] * count).from_address(buf)
                allreduce(arr, _OPS[op], timeout_s)
                return L.SN_OK
            except BaseException as e:  # noqa: B902 - reported through the status
                comm = holder.get("comm")
                if comm is not None:
                    comm._callback_error = e
                timeout = isinstance(e, TimeoutError) or "timed out" in str(e).lower()
                return L.SN_ERR_TIMEOUT if timeout else L.SN_ERR_COMM

        fn = L.ALLREDUCE_FN(trampoline)
        h = ctypes.c_void_p()
        L.check(L.lib().sn_comm_create_callback(ctypes.byref(h), rank, size, fn, None))
        comm = cls(h, keep=(fn, allreduce))
        holder["comm"] = comm
        return comm

    @property
    def handle(self):
        """The sn_comm_t * (a ctypes.c_void_p); raises if closed."""
        if self._h is None:
            raise ValueError("syncnorm.Comm is closed")
        return self._h

    def check(self, st):
        """Raises for a failed status st, chained to the exception a callback raised."""
        cause, self._callback_error = self._callback_error, None
        L.check(st, cause)

    @property
    def rank(self):
        v = ctypes.c_int()
        L.check(L.lib().sn_comm_rank(self.handle, ctypes.byref(v)))
        return v.value

    @property
    def size(self):
        v = ctypes.c_int()
        L.check(L.lib().sn_comm_size(self.handle, ctypes.byref(v)))
        return v.value

    @property
    def backend(self):
        """"self", "callback", "mpi" or "nccl"."""
        return L.lib().sn_comm_backend(self.handle).decode()

    def set_timeout(self, seconds):
        """Seconds a collective may wait for the other ranks (0: forever); see
        sn_comm_set_timeout. Local."""
        L.check(L.lib().sn_comm_set_timeout(self.handle, float(seconds)))

    def allreduce_sum(self, buf):
        """In-place sum over the ranks of a writable float32 or float64 buffer (a numpy array,
        array.array, ...). Collective."""
        mv = memoryview(buf).cast("B")
        fmt = memoryview(buf).format
        dtype = {"f": L.DTYPE_F32, "d": L.DTYPE_F64}.get(fmt)
        if dtype is None:
            raise TypeError(f"allreduce_sum: float32 or float64 buffer expected, got '{fmt}'")
        size = 4 if dtype == L.DTYPE_F32 else 8
        arr = (ctypes.c_char * len(mv)).from_buffer(mv) if len(mv) else None
        self.check(L.lib().sn_comm_allreduce_sum(self.handle, arr, len(mv) // size, dtype))

    def close(self):
        """Frees the communicator (sn_comm_destroy; for "mpi" collective, as MPI_Comm_free).
        Closing twice is a no-op."""
        if self._h is not None:
            L.lib().sn_comm_destroy(self._h)
            self._h = None
        self._keep = None  # the callback and what it holds (a process group) can go
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._h is None:
            return "syncnorm.Comm(closed)"
        return f"syncnorm.Comm({self.backend}, rank {self.rank} of {self.size})"
