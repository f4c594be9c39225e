"""``import syncnorm`` needs neither torch nor mpi4py; errors carry the library's message."""
import importlib
import os
import subprocess
import sys

import pytest

import syncnorm


def test_import_without_torch_or_mpi4py():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['mpi4py'] = None; "
            "import syncnorm; c = syncnorm.Comm.self_(); print(syncnorm.version(), c.size); "
            "c.close()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [syncnorm.version(), "1"]
    importlib.import_module("syncnorm.torch")  # with torch available, the torch part imports


def test_errors_carry_status_and_message():
    with pytest.raises(syncnorm.SyncnormValueError) as e:
        syncnorm.Comm.from_callback(5, 2, lambda *a: None)
    assert e.value.status_name == "SN_ERR_INVALID_ARGUMENT"
    assert "sn_comm_create_callback: need 0 <= rank < size" in e.value.message
    assert isinstance(e.value, ValueError) and isinstance(e.value, syncnorm.SyncnormError)


def test_callback_failure_is_chained():
    def broken(buf, op, timeout):
        raise ConnectionError("peer went away")

    c = syncnorm.Comm.from_callback(0, 2, broken)
    import array
    a = array.array("d", [1.0])
    with pytest.raises(syncnorm.SyncnormError) as e:
        c.allreduce_sum(a)
    assert e.value.status_name == "SN_ERR_COMM"
    assert isinstance(e.value.__cause__, ConnectionError)
    c.close()
    c.close()


def test_library_dir():
    assert os.path.exists(os.path.join(syncnorm.library_dir(), "libsyncnorm.so"))
