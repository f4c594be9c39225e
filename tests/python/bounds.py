"""The library's stated accuracy bounds, as checks on numpy float64 arrays."""
import numpy as np
import torch

# f32 outputs against a float64 reference: a few f32 roundings per element (~1e-7 relative),
# normwise; the library's f32 forward bound (tests/testutil.h TU_RTOL_F32_FWD).
RTOL_F32 = 1e-6
# f32 gradients (dx, dgamma, dbeta): sums of products rounded to f32 once more
RTOL_F32_BWD = 2e-6
# bf16/f16 backward outputs, normwise: half an ulp of relative rounding plus f32 arithmetic
# (tests/testutil.c tu_rtol_half_bwd)
RTOL_HALF_BWD = {torch.bfloat16: 2.0 ** -8 + 1e-6, torch.float16: 2.0 ** -11 + 1e-6}
# bits of precision (with the implicit bit) and the smallest normal exponent of each format
_FORMATS = {torch.bfloat16: (8, -126), torch.float16: (11, -14)}
# bf16/f16 forward outputs of every kernel, the project's bound (tests/testutil.h
# TU_LOWP_SCALE_TOL): |y − y_exact| ≤ max(1 ulp of y_exact, LOWP_SCALE_TOL·(|x̂·γ| + |β|)). The
# second term is what f32 arithmetic in the affine map meets (a few f32 roundings of its terms and
# the f32 statistics' error times |x̂·γ|): where β cancels x̂·γ, 1 ulp of y is out of its reach.
LOWP_SCALE_TOL = 2.0 ** -16


# Smallest norm a normwise error is taken relative to: a result that is 0 in exact arithmetic
# (dγ of a row of one element) comes out of the float64 reference as rounding residue (1e-14).
NORM_FLOOR = 1e-6


def normwise(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), NORM_FLOOR)


def ulp(y, dtype):
    """One ulp of the exact value y in `dtype` (bf16 or f16): the subnormal spacing below the
    normal range, so also for y = 0."""
    bits, emin = _FORMATS[dtype]
    a = np.abs(np.asarray(y, np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.where(a > 0, np.maximum(e, emin), emin)
    return np.exp2(e - (bits - 1))


def check_half_forward(got, exact, xhat_gamma_abs, beta_abs, dtype, what):
    """The bf16/f16 forward bound of every kernel:
    |y − y_exact| ≤ max(1 ulp of y_exact, LOWP_SCALE_TOL·(|x̂·γ| + |β|)), with x̂ the exact
    normalized value; |x̂·γ| and |β| broadcast against y. A NaN y_exact wants a NaN."""
    got = np.asarray(got, np.float64)
    exact = np.asarray(exact, np.float64)
    scale = np.broadcast_to(np.abs(xhat_gamma_abs) + np.abs(beta_abs), exact.shape)
    bound = np.maximum(ulp(exact, dtype), LOWP_SCALE_TOL * scale)
    err = np.where(np.isnan(exact) & np.isnan(got), 0.0, np.abs(got - exact))
    bad = ~(err <= bound)
    if bad.any():
        ratio = np.where(bad, np.nan_to_num(err / bound, nan=np.inf), 0.0)
        i = np.unravel_index(np.argmax(ratio), ratio.shape)
        raise AssertionError(
            f"{what} ({dtype}): {bad.sum()} of {bad.size} outside |y − exact| ≤ max(1 ulp, "
            f"2^-16·(|x̂·γ| + |β|)); worst element {tuple(int(k) for k in i)} = {got[i]!r}, "
            f"exact {exact[i]!r}, scale {scale[i]:.6g}, allowed {bound[i]:.3g} "
            f"({ratio[i]:.3g} times that)")


def check_rel(got, want, rtol, what):
    e = normwise(got, want)
    assert np.all(np.isfinite(np.asarray(got, np.float64))), f"{what}: non-finite values"
    assert e <= rtol, f"{what}: normwise relative error {e:.3e} > {rtol:.1e}"
