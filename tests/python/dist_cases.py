"""Multi-rank cases of syncnorm.torch, run by test_dist.py under mpirun:
    mpirun -np P python3 dist_cases.py CASE BACKEND
CASE: equivalence, ddp, mismatch; BACKEND: gloo (torch.distributed, rank and size from Open
MPI's environment, MASTER_ADDR/MASTER_PORT given) or mpi4py. Every rank checks its own results
and exits non-zero on the first failure (the message says which rank and what)."""
import os
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(here)), "python"))

import syncnorm  # noqa: E402
import syncnorm.torch as st  # noqa: E402
from bounds import RTOL_F32, RTOL_F32_BWD, check_rel  # noqa: E402

torch.set_num_threads(1)
case, backend = sys.argv[1], sys.argv[2]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
if backend == "gloo":
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=size)
    KW = {}

    def allsum(t):
        dist.all_reduce(t)
        return t

    def gather_bytes(t):
        out = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(out, t)
        return out
else:
    from mpi4py import MPI
    KW = {"comm": MPI.COMM_WORLD}

    def allsum(t):
        a = t.numpy()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
        return t

    def gather_bytes(t):
        return [torch.from_numpy(a) for a in MPI.COMM_WORLD.allgather(t.numpy())]


def fail(msg):
    print(f"rank {rank}: FAIL: {msg}", flush=True)
    sys.stdout.flush()
    os._exit(1)


def slices(n_per_rank):
    """[start, stop) of each rank's rows in the global batch."""
    starts = np.concatenate([[0], np.cumsum(n_per_rank)])
    return int(starts[rank]), int(starts[rank + 1])


def equivalence():
    """SyncBatchNorm on P ranks (uneven batches; one empty rank where P >= 3) equals
    torch.nn.BatchNorm on the concatenated batch in one process (float64): y, dx, dγ/dβ summed
    over the ranks, running statistics and num_batches_tracked over SGD steps; the running
    statistics bitwise identical on every rank; one collective per forward and per backward
    without check_consistency."""
    C, H, W, lr = 5, 3, 4, 0.1
    n_per_rank = [3 + r for r in range(size)]
    if size >= 3:
        n_per_rank[1] = 0
    lo, hi = slices(n_per_rank)
    for momentum in (0.1, None):
        for fmt in (torch.contiguous_format, torch.channels_last):
            for check in (True, False):
                ours = st.SyncBatchNorm(C, momentum=momentum, check_consistency=check, **KW)
                ref = torch.nn.BatchNorm2d(C, momentum=momentum).double()
                g = torch.Generator().manual_seed(5)
                with torch.no_grad():
                    w0 = 1.0 + torch.rand(C, generator=g)
                    ours.weight.copy_(w0), ref.weight.copy_(w0)
                for step in range(3):
                    x = (4.0 + 2.0 * torch.randn(sum(n_per_rank), C, H, W, generator=g))
                    dy = torch.randn(x.shape, generator=g)
                    xr = x.double().requires_grad_(True)
                    yr = ref(xr)
                    yr.backward(dy.double())
                    xo = x[lo:hi].float().contiguous(memory_format=fmt).requires_grad_(True)
                    y = ours(xo)
                    y.backward(dy[lo:hi].float().contiguous(memory_format=fmt))
                    what = f"momentum {momentum} {fmt} check {check} step {step}"
                    if hi > lo:
                        check_rel(y.detach().numpy(), yr[lo:hi].detach().numpy(), RTOL_F32,
                                  "y " + what)
                        check_rel(xo.grad.numpy(), xr.grad[lo:hi].numpy(), RTOL_F32_BWD,
                                  "dx " + what)
                    gw, gb = allsum(ours.weight.grad.clone()), allsum(ours.bias.grad.clone())
                    check_rel(gw.numpy(), ref.weight.grad.numpy(), RTOL_F32_BWD * 10,
                              "dweight " + what)
                    check_rel(gb.numpy(), ref.bias.grad.numpy(), RTOL_F32_BWD * 10, "dbias " + what)
                    check_rel(ours.running_mean.numpy(), ref.running_mean.numpy(), RTOL_F32_BWD,
                              "running_mean " + what)
                    check_rel(ours.running_var.numpy(), ref.running_var.numpy(), RTOL_F32_BWD,
                              "running_var " + what)
                    if int(ours.num_batches_tracked) != step + 1:
                        fail(f"num_batches_tracked {int(ours.num_batches_tracked)} " + what)
                    for name in ("running_mean", "running_var"):
                        mine = getattr(ours, name)
                        if any(not torch.equal(o, mine) for o in gather_bytes(mine.clone())):
                            fail(f"{name} differs across ranks: " + what)
                    with torch.no_grad():  # one SGD step, alike on both
                        for p, q, gsum in ((ours.weight, ref.weight, gw),
                                           (ours.bias, ref.bias, gb)):
                            p -= lr * gsum
                            q -= lr * q.grad
                            q.grad = None
                        ours.weight.grad = ours.bias.grad = None
                (layer,) = ours._sn_layers.values()
                per_step = 4 if check else 2
                if size > 1 and layer.collectives() != 3 * per_step:
                    fail(f"{layer.collectives()} collectives in 3 steps, want {3 * per_step}")
    # eval mode makes no collective
    ours.eval()
    before = layer.collectives()
    ours(torch.randn(2, C, H, W))
    if layer.collectives() != before:
        fail("eval mode made a collective")


def ddp():
    """DistributedDataParallel (gloo) with convert_sync_batchnorm for three SGD steps equals one
    process on the global batch with torch.nn's BatchNorm."""
    torch.manual_seed(0)

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                   torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(4 * 6 * 6, 3), torch.nn.BatchNorm1d(3))

    ref = model()
    ours = st.convert_sync_batchnorm(model())
    ours.load_state_dict(ref.state_dict())
    ddp_model = torch.nn.parallel.DistributedDataParallel(ours)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    per = 4
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(per * size, 1, 6, 6, generator=g)
        target = torch.randint(0, 3, (per * size,), generator=g)
        opt_ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), target).backward()
        opt_ref.step()
        opt.zero_grad()
        lo, hi = rank * per, (rank + 1) * per
        torch.nn.functional.cross_entropy(ddp_model(x[lo:hi]), target[lo:hi]).backward()
        opt.step()
    for (name, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        if a.dtype == torch.int64:
            if not torch.equal(a, b):
                fail(f"{name}: {b} vs {a}")
        else:
            check_rel(b.numpy(), a.numpy(), 1e-5, f"{name} after 3 DDP steps")


def mismatch():
    """A different num_features on one rank raises on every rank (no hang)."""
    c = 4 if rank == 0 else 5
    bn = st.SyncBatchNorm(c, **KW)
    try:
        bn(torch.randn(3, c, 2, 2))
    except syncnorm.SyncnormError as e:
        if e.status_name != "SN_ERR_MISMATCH" or "num_features" not in e.message:
            fail(f"unexpected error: {e}")
        return
    fail("no error")


def check():
    """syncnorm.torch.check_equivalence over the process group: identical after SyncBatchNorm
    training; one ulp in one channel of rank 1's running_var, rank 0's num_batches_tracked, and a
    layer only rank 2 has are found and named, on every rank."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
              torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4)]
    model = st.convert_sync_batchnorm(torch.nn.Sequential(*layers))
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        model(torch.randn(3, 2, 6, 6, generator=g)).sum().backward()
    r = st.check_equivalence(model, verbose=rank == 0)
    if not r["ok"] or not r["4"]["running_var"]["identical"]:
        fail(f"not identical after training: {r}")
    with torch.no_grad():
        if rank == 1:
            v = model[4].running_var
            v[2] = torch.nextafter(v[2], torch.tensor(float("inf")))
        if rank == 0:
            model[1].num_batches_tracked += 1
    r = st.check_equivalence(model, verbose=rank == 0)
    rv, nbt = r["4"]["running_var"], r["1"]["num_batches_tracked"]
    if r["ok"] or rv["ranks_differ"] != [1] or rv["worst_channel"] != 2 or rv["max_abs"] <= 0:
        fail(f"one ulp on rank 1 not found: {rv}")
    if nbt["ranks_differ"] != [0] or not r["4"]["running_mean"]["identical"]:
        fail(f"num_batches_tracked of rank 0 not found: {r}")
    if rank == 2:
        model.add_module("5", torch.nn.BatchNorm1d(3))
    r = st.check_equivalence(model, verbose=False)
    if r["5"]["missing_on"] != [0, 1] or r["ok"]:
        fail(f"a layer of rank 2 only not found: {r.get('5')}")


def python_checks():
    """A rank whose input fails the module's checks in Python (channels, dtype) raises that
    error; the others raise SN_ERR_MISMATCH naming it at once, not after the timeout. A module
    only one rank runs first (in eval mode: no collective) keeps the layer ids aligned."""
    import time
    for bad in ("channels", "dtype"):
        bn = st.SyncBatchNorm(4, **KW)
        x = torch.randn(3, 4, 2, 2)
        if rank == 1:
            x = torch.randn(3, 5, 2, 2) if bad == "channels" else x.double()
        t0 = time.time()
        try:
            bn(x)
            fail(f"{bad}: no error")
        except syncnorm.SyncnormError as e:
            if rank == 1 or e.status_name != "SN_ERR_MISMATCH" or "rank 1" not in e.message:
                fail(f"{bad}: {e}")
        except (ValueError, TypeError) as e:
            if rank != 1:
                fail(f"{bad}: {e}")
        if time.time() - t0 > 20:
            fail(f"{bad}: the error took {time.time() - t0:.0f} s")
    a, b = st.SyncBatchNorm(4, **KW), st.SyncBatchNorm(4, **KW)
    if rank == 0:  # b first, alone, in eval mode
        b.eval()
        b(torch.randn(2, 4, 3, 3))
        b.train()
    x = torch.randn(2, 4, 3, 3)
    b(a(x)).sum().backward()


{"equivalence": equivalence, "ddp": ddp, "mismatch": mismatch, "check": check,
 "python_checks": python_checks}[case]()
print(f"rank {rank}: {case} {backend}: ok", flush=True)
if backend == "gloo":
    dist.barrier()
    dist.destroy_process_group()
