"""`syncnorm-statcheck --compare` on files a job's ranks would write with
syncnorm.torch.save_state_dict: identical files pass; one ulp in one channel of one rank's
running_var, a missing layer and another num_batches_tracked are found and named; bad files are
refused with the loader's error. SYNCNORM_STATCHECK names the program (CTest sets it)."""
import os
import subprocess

import pytest
import torch

import syncnorm.torch as st

STATCHECK = os.environ.get("SYNCNORM_STATCHECK")
pytestmark = pytest.mark.skipif(not STATCHECK, reason="SYNCNORM_STATCHECK not set")


def model(extra=False):
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
              torch.nn.Conv2d(4, 4, 1), st.SyncBatchNorm(4)]
    if extra:
        layers.append(torch.nn.BatchNorm2d(4))
    m = torch.nn.Sequential(*layers)
    m(torch.randn(3, 2, 6, 6, generator=torch.Generator().manual_seed(1)))
    return m


def write_ranks(tmp_path, ranks=3, plant=None):
    """One file per rank; plant(rank, model) changes one rank's model first."""
    paths = []
    for r in range(ranks):
        m = model(extra=plant == "extra" and r == 2)
        if callable(plant):
            plant(r, m)
        p = tmp_path / f"rank{r}.safetensors"
        st.save_state_dict(m, p)
        paths.append(str(p))
    return paths


def statcheck(*args):
    r = subprocess.run([STATCHECK, "--compare", *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_identical_files_pass(tmp_path):
    paths = write_ranks(tmp_path)
    rc, out = statcheck(*paths)
    assert rc == 0, out
    assert "PASS: 2 of 2 layers agree" in out and "bitwise identical in all 3 files" in out
    rc, out = statcheck(tmp_path)  # a directory
    assert rc == 0 and "3 files" in out, out
    rc, out = statcheck(tmp_path / "rank*.safetensors")  # a glob
    assert rc == 0 and "3 files" in out, out


def test_one_ulp_in_one_channel_of_one_rank(tmp_path):
    def plant(r, m):
        if r == 1:
            with torch.no_grad():
                v = m[4].running_var
                v[2] = torch.nextafter(v[2], torch.tensor(float("inf")))

    rc, out = statcheck(*write_ranks(tmp_path, plant=plant))
    assert rc == 1, out
    line = [x for x in out.splitlines() if "running_var" in x and "DIFFERS" in x]
    assert len(line) == 1, out
    assert "channel 2" in line[0] and "1 (rank1.safetensors)" in line[0], out
    assert "layer '4'" in out and "FAIL: 1 of 2 layers differ" in out
    # within a relative tolerance it agrees
    rc, out = statcheck("--tol", "1e-6", *sorted(map(str, tmp_path.glob("*.safetensors"))))
    assert rc == 0, out


def test_missing_layer_and_num_batches_tracked(tmp_path):
    rc, out = statcheck(*write_ranks(tmp_path, plant="extra"))
    assert rc == 1 and "layer '5'" in out and "MISSING in files 0 (rank0.safetensors), 1 " \
        "(rank1.safetensors)" in out, out

    def plant(r, m):
        if r == 0:
            m[1].num_batches_tracked += 1

    rc, out = statcheck(*write_ranks(tmp_path, plant=plant))
    line = [x for x in out.splitlines() if "num_batches_tracked" in x and "DIFFERS" in x]
    assert rc == 1 and len(line) == 1 and "0 (rank0.safetensors)" in line[0], out


def test_params_compared_on_request(tmp_path):
    def plant(r, m):
        if r == 2:
            with torch.no_grad():
                m[1].weight[0] += 1.0

    paths = write_ranks(tmp_path, plant=plant)
    assert statcheck(*paths)[0] == 0
    rc, out = statcheck("--params", *paths)
    assert rc == 1 and "weight" in out and "2 (rank2.safetensors)" in out, out


def test_bad_files_refused(tmp_path):
    paths = write_ranks(tmp_path)
    data = open(paths[1], "rb").read()
    with open(paths[1], "wb") as f:
        f.write(data[:len(data) - 5])
    rc, out = statcheck(*paths)
    assert rc == 2 and "SN_ERR_FORMAT" in out and "rank1.safetensors" in out, out
    rc, out = statcheck(paths[0], tmp_path / "absent.safetensors")
    assert rc == 2 and "SN_ERR_IO" in out, out
    rc, out = statcheck(paths[0])
    assert rc == 2 and "at least two" in out, out
    rc, out = statcheck("--tol", "-1", *paths)
    assert rc == 2 and "invalid value" in out, out


def test_no_batchnorm_and_signed_zero(tmp_path):
    for r in range(2):
        st.save_state_dict({"fc.weight": torch.ones(3)}, tmp_path / f"plain{r}.safetensors")
    rc, out = statcheck(tmp_path / "plain0.safetensors", tmp_path / "plain1.safetensors")
    assert rc == 2 and "no BatchNorm layer" in out, out
    for r, z in enumerate((0.0, -0.0)):  # equal values, other bits: not bitwise identical
        st.save_state_dict({"bn.running_mean": torch.tensor([z, 1.0]),
                            "bn.running_var": torch.ones(2)}, tmp_path / f"z{r}.safetensors")
    rc, out = statcheck(tmp_path / "z0.safetensors", tmp_path / "z1.safetensors")
    assert rc == 1 and "running_mean         DIFFERS" in out, out
