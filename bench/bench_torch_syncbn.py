"""bench_torch_syncbn.py — the forward + backward time of a BatchNorm layer in PyTorch on CPU,
per rank, with P ranks over gloo, for three layers measured in the same run:
  syncnorm   syncnorm.torch.SyncBatchNorm (statistics all-reduced through gloo)
  sn_mpi     the same over an mpi4py communicator (Open MPI's shared memory on one host)
  torch_bn   torch.nn.BatchNorm2d, no synchronization (each rank its own statistics)
  naive      a pure-PyTorch SyncBatchNorm as CPU users write it: sum, sum of squares and count
             all-reduced with torch.distributed.nn.functional.all_reduce (differentiable), the
             variance as E[x²] − E[x]², autograd through it all
Shapes [8,64,56,56], [8,256,28,28], [2,512,14,14] per rank, f32, contiguous and channels_last.
Each configuration: 3 warm-up steps, then --reps timed steps, each after a barrier; a step's
time is the slowest rank's; the median over the steps is reported, with the ratios
torch_bn/syncnorm, naive/syncnorm and torch_bn/sn_mpi (> 1: syncnorm faster). One thread per
rank (OMP_NUM_THREADS=1, torch.set_num_threads(1)); check_consistency off (one all-reduce per
forward and one per backward, as torch.nn.SyncBatchNorm).

    /usr/bin/python3 bench/bench_torch_syncbn.py --ranks 1,2,4      (launches mpirun for each)
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

SHAPES = [(8, 64, 56, 56), (8, 256, 28, 28), (2, 512, 14, 14)]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args):
    here = os.path.abspath(__file__)
    mpirun = shutil.which("mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
               # large blocks stay in glibc's heap: the layers' 6 MB outputs would otherwise
               # come from mmap in some steps and not others (page faults: 2-20 ms bimodal)
               MALLOC_MMAP_THRESHOLD_="33554432", MALLOC_TRIM_THRESHOLD_="1073741824")
    print(f"# bench_torch_syncbn: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
          f"{os.cpu_count()} CPUs; one torch thread per rank; median of {args.reps} steps")
    print("| ranks | shape | format | syncnorm ms | sn_mpi ms | torch_bn ms | naive ms | "
          "torch_bn/syncnorm | naive/syncnorm | torch_bn/sn_mpi |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    sys.stdout.flush()
    for k, p in enumerate(int(v) for v in args.ranks.split(",")):
        env["MASTER_PORT"] = str(29600 + k)
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(p), "-x",
               "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OMP_NUM_THREADS", "-x",
               "MALLOC_MMAP_THRESHOLD_", "-x", "MALLOC_TRIM_THRESHOLD_", sys.executable, here,
               "--inner", "--reps", str(args.reps)]
        for v in ("SYNCNORM_LIBRARY_DIR",):
            if v in env:
                cmd[6:6] = ["-x", v]
        subprocess.run(cmd, env=env, check=True)


def inner(args):
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    import torch.distributed.nn.functional as dnnf
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "python"))
    import syncnorm.torch as st

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)

    class NaiveSyncBN(torch.nn.BatchNorm2d):
        def forward(self, x):
            c = x.shape[1]
            count = torch.full((1,), float(x.numel() // c), dtype=x.dtype)
            stats = torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), count])
            stats = dnnf.all_reduce(stats)
            n = stats[-1]
            mean = stats[:c] / n
            var = stats[c:2 * c] / n - mean * mean
            with torch.no_grad():
                self.num_batches_tracked += 1
                self.running_mean.mul_(0.9).add_(0.1 * mean)
                self.running_var.mul_(0.9).add_(0.1 * var * n / (n - 1))
            scale = self.weight * torch.rsqrt(var + self.eps)
            shift = self.bias - mean * scale
            return x * scale.reshape(1, c, 1, 1) + shift.reshape(1, c, 1, 1)

    def step_time(layer, x, dy):
        dist.barrier()
        t0 = time.perf_counter()
        y = layer(x)
        y.backward(dy)
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    for shape in SHAPES:
        for fmt_name, fmt in (("NCHW", torch.contiguous_format),
                              ("NHWC", torch.channels_last)):
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
            x.requires_grad_(True)
            dy = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
            c = shape[1]
            layers = {"syncnorm": st.SyncBatchNorm(c, check_consistency=False),
                      "sn_mpi": st.SyncBatchNorm(c, check_consistency=False,
                                                 comm=MPI.COMM_WORLD),
                      "torch_bn": torch.nn.BatchNorm2d(c), "naive": NaiveSyncBN(c)}
            times = {k: [] for k in layers}
            for rep in range(3 + args.reps):  # interleaved, warm-up first
                for name, layer in layers.items():
                    t = step_time(layer, x, dy)
                    if rep >= 3:
                        times[name].append(t)
                    x.grad = None
            med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
            if rank == 0:
                print(f"| {size} | {list(shape)} | {fmt_name} | {med['syncnorm']:.2f} | "
                      f"{med['sn_mpi']:.2f} | {med['torch_bn']:.2f} | {med['naive']:.2f} | "
                      f"{med['torch_bn'] / med['syncnorm']:.2f} | "
                      f"{med['naive'] / med['syncnorm']:.2f} | "
                      f"{med['torch_bn'] / med['sn_mpi']:.2f} |", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = parse()
    inner(a) if a.inner else launch(a)
