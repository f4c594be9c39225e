"""train_torch.py — the Fashion-MNIST CNN of syncnorm-train in PyTorch: DistributedDataParallel
over gloo with syncnorm's CPU SyncBatchNorm (syncnorm.torch), or torch.nn.BatchNorm2d with
--no-sync-bn.

    mpirun -np 4 /usr/bin/python3 examples/train_torch.py            (rank, size from Open MPI)
    torchrun --nproc_per_node 4 examples/train_torch.py              (or from torchrun)
    /usr/bin/python3 examples/train_torch.py --help

The recipe is syncnorm-train's: conv3x3(1→32) → BatchNorm → ReLU → maxpool → conv3x3(32→64) →
BatchNorm → ReLU → maxpool → linear(3136→10); every rank builds the same model from --seed and
takes its slice of each global batch (--batch images per rank; an epoch's last incomplete global
batch is dropped); SGD with momentum 0.9, weight decay 5e-4 on conv/linear weights, learning
rate with cosine decay from --lr to 0 over all steps; pixels standardized with the training
set's mean and standard deviation. Rank 0 prints progress and writes --out/model.pt
(model.state_dict(), torch.nn BatchNorm keys: torch.load + load_state_dict read it, with
syncnorm or without) and --out/metrics.csv. Needs syncnorm's libraries (PYTHONPATH=python with a
build in build-release/, or an installed syncnorm).
"""
import argparse
import csv
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import syncnorm.torch as st  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="images per rank per step (default 8)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the four IDX .gz files (Debian's dataset-fashion-mnist)")
    p.add_argument("--out", default="runs/torch", help="where rank 0 writes its results")
    p.add_argument("--no-sync-bn", action="store_true",
                   help="torch.nn.BatchNorm2d (per-rank statistics) instead of SyncBatchNorm")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--train-subset", type=int, default=0, help="first N training images only")
    p.add_argument("--test-subset", type=int, default=0, help="first N test images only")
    p.add_argument("--print-every", type=float, default=5.0, help="seconds between progress lines")
    return p.parse_args()


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim not in (1, 3):
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(args):
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    xtr, ytr, xte, yte = (read_idx(os.path.join(args.data, n)) for n in names)
    pixels = xtr.astype(np.float64) / 255.0  # mean, std of the whole training set
    mean, std = float(pixels.mean()), float(pixels.std())
    if args.train_subset:
        xtr, ytr = xtr[:args.train_subset], ytr[:args.train_subset]
    if args.test_subset:
        xte, yte = xte[:args.test_subset], yte[:args.test_subset]

    def prep(x):
        return torch.from_numpy(((x.astype(np.float32) / 255.0 - mean) / std)[:, None])

    return (prep(xtr), torch.from_numpy(ytr.astype(np.int64)), prep(xte),
            torch.from_numpy(yte.astype(np.int64)), mean, std)


def model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 10))


def main():
    args = parse_args()
    env = os.environ
    rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", 0)))
    size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29512")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    xtr, ytr, xte, yte, mean, std = load(args)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"data: {args.data}: {len(xtr)} training images, {len(xte)} test images; standardized "
        f"with mean {mean:.4f}, std {std:.4f}")

    torch.manual_seed(args.seed)
    net = model()
    if not args.no_sync_bn:
        net = st.convert_sync_batchnorm(net)
    # SyncBatchNorm keeps the running statistics identical on every rank: nothing to broadcast
    ddp = torch.nn.parallel.DistributedDataParallel(net, broadcast_buffers=args.no_sync_bn)
    decay = [m.weight for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    other = [p for p in net.parameters() if all(p is not q for q in decay)]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4},
                           {"params": other, "weight_decay": 0.0}], lr=args.lr, momentum=0.9)
    g = args.batch * size
    steps_per_epoch = len(xtr) // g
    total = steps_per_epoch * args.epochs
    say(f"train_torch.py (syncnorm {st.__name__.split('.')[0]} {__import__('syncnorm').version()},"
        f" torch {torch.__version__}): {size} ranks × batch {args.batch} = global batch {g}, "
        f"{args.threads} thread per rank, "
        f"{'torch.nn.BatchNorm2d' if args.no_sync_bn else 'syncnorm SyncBatchNorm'}, "
        f"{steps_per_epoch} steps per epoch, {args.epochs} epochs, lr {args.lr} cosine")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        metrics = open(os.path.join(args.out, "metrics.csv"), "w", newline="")
        log = csv.writer(metrics)
        log.writerow(["epoch", "step", "loss", "lr", "test_accuracy", "images_per_s"])
    t_start = time.time()
    step, acc = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(
            args.seed * 1000 + epoch))
        ddp.train()
        t_epoch = t_print = time.time()
        seen = 0
        for i in range(steps_per_epoch):
            lr = 0.5 * args.lr * (1.0 + math.cos(math.pi * step / total))
            for group in opt.param_groups:
                group["lr"] = lr
            idx = perm[i * g + rank * args.batch:i * g + (rank + 1) * args.batch]
            loss = torch.nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            seen += g
            now = time.time()
            if now - t_print >= args.print_every:
                t_print = now
                rate = seen / (now - t_epoch)
                say(f"epoch {epoch}/{args.epochs}  step {i + 1}/{steps_per_epoch}  loss "
                    f"{loss.item():.4f}  lr {lr:.5f}  {rate:.0f} images/s  ETA "
                    f"{(total - step) * g / rate:.0f}s", flush=True)
        train_time = time.time() - t_epoch
        # evaluation in eval mode (running statistics): each rank a shard, counts all-reduced
        ddp.eval()
        counts = torch.zeros(3, dtype=torch.float64)  # correct, loss sum, images
        with torch.no_grad():
            lo, hi = rank * len(xte) // size, (rank + 1) * len(xte) // size
            for start in range(lo, hi, 500):  # in chunks: the activations of 2500 images at once
                part = slice(start, min(start + 500, hi))  # are hundreds of MB
                logits = net(xte[part])
                counts += torch.tensor([
                    float((logits.argmax(1) == yte[part]).sum()),
                    float(torch.nn.functional.cross_entropy(logits, yte[part], reduction="sum")),
                    float(len(logits))], dtype=torch.float64)
        dist.all_reduce(counts)
        acc = 100.0 * counts[0].item() / counts[2].item()
        say(f"epoch {epoch}/{args.epochs} done: test accuracy {acc:.2f}% (loss "
            f"{counts[1].item() / counts[2].item():.4f}, eval mode), epoch time "
            f"{time.time() - t_epoch:.1f} s (training {train_time:.1f} s, "
            f"{steps_per_epoch * g / train_time:.0f} images/s)", flush=True)
        if rank == 0:
            log.writerow([epoch, step, f"{loss.item():.6f}", f"{lr:.6g}", f"{acc:.2f}",
                          f"{steps_per_epoch * g / train_time:.0f}"])
            metrics.flush()
    # the running statistics are the same on every rank (SyncBatchNorm): check it
    if not args.no_sync_bn:
        mine = torch.cat([b.reshape(-1).double() for n, b in net.named_buffers()
                          if "running" in n])
        first = mine.clone()
        dist.broadcast(first, 0)
        same = torch.tensor([float(torch.equal(mine, first))])
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
        say(f"running statistics bitwise identical on all {size} ranks: "
            f"{'yes' if same.item() == 1.0 else 'NO'}")
    if rank == 0:
        metrics.close()
        path = os.path.join(args.out, "model.pt")
        torch.save(net.state_dict(), path)
        # the checkpoint, read back by plain PyTorch into the model with torch.nn's BatchNorm
        check = model()
        check.load_state_dict(torch.load(path))
        check.eval()
        with torch.no_grad():
            same = (check(xte[:256]).argmax(1) == net(xte[:256]).argmax(1)).all().item()
        say(f"test accuracy {acc:.2f}% after {step} steps ({args.epochs} epochs); wall time "
            f"{time.time() - t_start:.1f} s; {path} loads into torch.nn.BatchNorm2d: "
            f"{'yes' if same else 'NO'}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
