"""syncnorm.torch across ranks: dist_cases.py under mpirun with 2 and 3 ranks, over gloo
(torch.distributed) and over mpi4py."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

here = os.path.dirname(os.path.abspath(__file__))
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun(np_, case, backend):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", OMPI_MCA_mpi_yield_when_idle="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_),
           "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OMP_NUM_THREADS"]
    if "SYNCNORM_LIBRARY_DIR" in env:
        cmd += ["-x", "SYNCNORM_LIBRARY_DIR"]
    cmd += [sys.executable, os.path.join(here, "dist_cases.py"), case, backend]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count(": ok") == np_, r.stdout


@pytest.mark.parametrize("backend", ["gloo", "mpi4py"])
@pytest.mark.parametrize("np_", [2, 3])
def test_equivalence(np_, backend):
    mpirun(np_, "equivalence", backend)


@pytest.mark.parametrize("backend", ["gloo", "mpi4py"])
def test_mismatch_raises_everywhere(backend):
    mpirun(3, "mismatch", backend)


@pytest.mark.parametrize("np_", [2, 3])
def test_ddp_equals_one_process(np_):
    mpirun(np_, "ddp", "gloo")


def test_check_equivalence():
    mpirun(3, "check", "gloo")


@pytest.mark.parametrize("backend", ["gloo", "mpi4py"])
def test_python_checks_told_to_the_others(backend):
    mpirun(3, "python_checks", backend)
