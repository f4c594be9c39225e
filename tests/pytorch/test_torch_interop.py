"""SyncBatchNorm (one process) against Debian's PyTorch, and checkpoints both ways.

Usage: /usr/bin/python3 test_torch_interop.py BN_DRIVER WORKDIR
For each case the same inputs go to torch.nn.BatchNorm (float64, so PyTorch's own f32 rounding
is not what we measure) and to bn_driver (our layer in f32). Compared: y and dx of several
training steps and of an eval step (frozen backward), dgamma/dbeta, running_mean/running_var
after every step, num_batches_tracked. Then a checkpoint written by the library is loaded by
torch.nn.BatchNorm2d.load_state_dict, and one written from PyTorch is loaded by the library.
Exits non-zero on the first mismatch.
"""
import os
import subprocess
import sys

import numpy as np
import torch

import st

# f32 results vs the float64 PyTorch reference: a few f32 roundings per value (~1e-7 relative);
# normwise 1e-6 is the library's own forward bound.
RTOL_OUT = 1e-6
# running stats: f32 state updated once per step from fp64 statistics; after k steps the f32
# rounding of each update accumulates to ~k ulp.
RTOL_STATS = 2e-6

driver, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
torch.manual_seed(0)
rng = np.random.default_rng(1)
failures = []


def check(name, got, want, rtol, scale=None):
    """normwise ||got - want|| <= rtol * scale, scale = ||want|| unless given."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        failures.append(f"{name}: shape {got.shape} != {want.shape}")
        return
    if scale is None:
        scale = np.linalg.norm(want)
    err = np.linalg.norm(got - want) / max(scale, 1e-300)
    if not np.all(np.isfinite(got)) or err > rtol:
        failures.append(f"{name}: normwise relative error {err:.3e} > {rtol:.1e}")


def run_case(tag, C, shapes, momentum, affine, track, layout="nchw", mean=0.0, std=1.0,
             inputs=None):
    """shapes: list of (N, S) per training step; the eval step uses the last shape."""
    steps = len(shapes)
    torch_mom = None if momentum is None else momentum
    bn = torch.nn.BatchNorm1d(C, momentum=torch_mom, affine=affine,
                              track_running_stats=track).double()
    tensors = {"config": np.array([C, -1.0 if momentum is None else momentum, 1e-5,
                                   0 if layout == "nchw" else 1, steps, int(affine), int(track)],
                                  dtype=np.float64)}
    if affine:
        w = (0.5 + rng.random(C)).astype(np.float32)
        b = rng.standard_normal(C).astype(np.float32)
        with torch.no_grad():
            bn.weight.copy_(torch.from_numpy(w.astype(np.float64)))
            bn.bias.copy_(torch.from_numpy(b.astype(np.float64)))
        tensors["weight"], tensors["bias"] = w, b
    xs, dys = [], []
    for t, (n, s) in enumerate(shapes + [shapes[-1]]):
        if inputs is not None:
            x = inputs[t].astype(np.float32)
        else:
            x = (mean + std * rng.standard_normal((n, C, s))).astype(np.float32)
        dy = rng.standard_normal(x.shape).astype(np.float32)
        xs.append(x), dys.append(dy)
        lay = (lambda a: a) if layout == "nchw" else (lambda a: np.ascontiguousarray(a.transpose(0, 2, 1)))
        key = "eval" if t == steps else str(t)
        tensors[f"x_{key}" if t == steps else f"x.{key}"] = lay(x)
        tensors[f"dy_{key}" if t == steps else f"dy.{key}"] = lay(dy)
    inp, outp, ckpt = (os.path.join(work, f"{tag}.{k}.safetensors") for k in ("in", "out", "ckpt"))
    st.save(inp, tensors)
    subprocess.run([driver, "run", inp, outp, ckpt], check=True)
    out = st.load(outp)
    unlay = (lambda a: a) if layout == "nchw" else (lambda a: a.transpose(0, 2, 1))
    for t in range(steps + 1):
        eval_step = t == steps
        bn.train(not eval_step)
        x = torch.from_numpy(xs[t].astype(np.float64)).requires_grad_(True)
        y = bn(x)
        y.backward(torch.from_numpy(dys[t].astype(np.float64)))
        key = "_eval" if eval_step else f".{t}"
        check(f"{tag} y{key}", unlay(out[f"y{key}"]), y.detach().numpy(), RTOL_OUT)
        # dx = γ·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)) cancels to O(eps/var) for 2 values per
        # channel, so its error is measured against the size of its terms, ||γ·rstd·dy||.
        xd = xs[t].astype(np.float64)
        if eval_step and track:
            rstd = 1.0 / np.sqrt(bn.running_var.numpy() + 1e-5)
        else:
            rstd = 1.0 / np.sqrt(xd.var(axis=(0, 2)) + 1e-5)
        gamma = bn.weight.detach().numpy() if affine else np.ones(C)
        terms = np.linalg.norm(dys[t] * (gamma * rstd)[None, :, None])
        check(f"{tag} dx{key}", unlay(out[f"dx{key}"]), x.grad.numpy(), RTOL_OUT, scale=terms)
        if not eval_step and affine:
            check(f"{tag} grad_weight{key}", out[f"grad_weight{key}"], bn.weight.grad.numpy(), RTOL_OUT)
            check(f"{tag} grad_bias{key}", out[f"grad_bias{key}"], bn.bias.grad.numpy(), RTOL_OUT)
            bn.weight.grad = None
            bn.bias.grad = None
        if not eval_step and track:
            check(f"{tag} running_mean{key}", out[f"running_mean{key}"], bn.running_mean.numpy(), RTOL_STATS)
            check(f"{tag} running_var{key}", out[f"running_var{key}"], bn.running_var.numpy(), RTOL_STATS)
    return bn, ckpt


# Several steps, momentum 0.1 and cumulative (momentum=None), NCHW and NHWC, uneven batches.
shapes = [(4, 9), (2, 9), (7, 9), (3, 9)]
run_case("m01_nchw", 5, shapes, 0.1, True, True)
run_case("mNone_nchw", 5, shapes, None, True, True)
run_case("m01_nhwc", 6, shapes, 0.1, True, True, layout="nhwc")
run_case("mNone_nhwc_noaffine", 3, shapes, None, False, True, layout="nhwc")
run_case("notrack", 4, shapes, 0.1, True, False)
run_case("large_mean", 3, shapes, 0.1, True, True, mean=1e4, std=1e-2)
run_case("tiny_batch", 2, [(2, 1), (1, 2), (3, 1)], 0.3, True, True)
# An empty batch counts in num_batches_tracked (torch's module forward adds 1 before it
# normalizes), so momentum None weighs the next batch by 1/3, not 1/2.
run_case("mNone_empty", 3, [(4, 9), (0, 9), (3, 9)], None, True, True)
run_case("m01_empty_nhwc", 3, [(0, 5), (2, 5)], 0.1, True, True, layout="nhwc")

# The example: BatchNorm1d(3, momentum=1.0) on [[1,2,0],[3,3,1],[3,4,3]].
example = np.array([[1, 2, 0], [3, 3, 1], [3, 4, 3]], dtype=np.float32).reshape(3, 3, 1)
bn_ex, ckpt_ex = run_case("issue_example", 3, [(3, 1)], 1.0, True, True, inputs=[example, example])
check("issue example running_mean", bn_ex.running_mean.numpy(), [7 / 3, 3.0, 4 / 3], 1e-12)
check("issue example running_var", bn_ex.running_var.numpy(), [4 / 3, 1.0, 7 / 3], 1e-12)

# Checkpoint written by the library, loaded by PyTorch (strict: exactly BatchNorm2d's keys).
bn_torch, ckpt = run_case("ckpt", 4, shapes, 0.1, True, True)
state = st.load(ckpt)
model = torch.nn.BatchNorm2d(4)
missing = model.load_state_dict({k[3:]: torch.from_numpy(v) for k, v in state.items()}, strict=True)
for k in ("weight", "bias", "running_mean", "running_var"):
    got = getattr(model, k).detach().numpy()
    if not np.array_equal(got, state[f"bn.{k}"]):
        failures.append(f"checkpoint -> torch: {k} changed on load")
    check(f"checkpoint {k} vs PyTorch's own training", got, getattr(bn_torch, k).detach().numpy(),
          RTOL_STATS)
if int(model.num_batches_tracked) != len(shapes) or state["bn.num_batches_tracked"].shape != ():
    failures.append(f"checkpoint num_batches_tracked {state['bn.num_batches_tracked']} (want scalar {len(shapes)})")

# Checkpoint written from PyTorch (after its own training), loaded by the library and saved back.
m2 = torch.nn.BatchNorm2d(6)
with torch.no_grad():
    m2.weight.uniform_(0.5, 1.5)
    m2.bias.uniform_(-1, 1)
m2.train()
for _ in range(3):
    m2(torch.randn(4, 6, 5, 5) * 3 + 2)
torch_state = {f"bn.{k}": v.detach().numpy() for k, v in m2.state_dict().items()}
src, dst = os.path.join(work, "from_torch.safetensors"), os.path.join(work, "back.safetensors")
st.save(src, torch_state)
subprocess.run([driver, "roundtrip", src, dst, "6"], check=True)
back = st.load(dst)
for k, v in torch_state.items():
    if k not in back or back[k].dtype != v.dtype or not np.array_equal(back[k], v.reshape(back[k].shape)):
        failures.append(f"torch -> library -> file: {k} differs")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PyTorch interop: all cases match")
