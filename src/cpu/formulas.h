/*
 * formulas.h — the per-element formulas of the CPU normalization maps, each written once.
 *
 * Every path of a kernel expands these: f32 vectors, bf16 read in pairs (sn__pf vectors), the
 * element-by-element tails, and the fp64 recomputations (with lo = 0: x − 0 is x). A change to a
 * formula is one edit here (and one in the CUDA kernel of the same name, src/cuda/). Arguments
 * are floating values or GCC vectors (sn__pf, sn__vf; a scalar operand of a vector operation is
 * broadcast), with C's usual conversions (a float operand of a double x is widened); in SN_ROW_*
 * the operands of both branches of each ?: have x's type. Each argument is evaluated at most
 * once, and one a flag switches off is not evaluated at all (gamma may be NULL there). The
 * order of the operations is part of the formula: the tests check that bf16 rows give the bits
 * of their f32 copy, which holds because both expand the same expression.
 *
 * The mean arrives as hi + lo (hi = f32(mean), lo = f32(mean − hi)): (x − hi) is exact for x near
 * the mean (Sterbenz), so |mean| ≫ σ loses nothing.
 */
#ifndef SN_FORMULAS_H
#define SN_FORMULAS_H

/* LayerNorm (centre) and RMSNorm (not): x̂ = ((x − hi) − lo)·s, or x·s; s = rstd. */
#define SN_ROW_XHAT(x, hi, lo, s, centre) ((centre) ? (((x) - (hi)) - (lo)) * (s) : (x) * (s))

/* Their output from x̂: y = x̂·gamma + beta, the factor and the term only where has_g, has_b
 * (constants after inlining). Torch's layer_norm and rms_norm. */
#define SN_ROW_Y(xhat, g, b, has_g, has_b) \
  ((has_b) ? ((has_g) ? (xhat) * (g) : (xhat)) + (b) : ((has_g) ? (xhat) * (g) : (xhat)))

/* BatchNorm and GroupNorm forward, per channel: y = ((x − hi) − lo)·a + b, the centre m = hi + lo
 * and the factors a, b computed once per channel (sn__chan_k_set, norm_kernels.h). */
#define SN_CHAN_Y(x, hi, lo, a, b) ((((x) - (hi)) - (lo)) * (a) + (b))

/* Their backward, per channel: dx = (dy·a − b) − ((x − hi) − lo)·e, with the channel's a, b, e
 * from its reduced sums (sn__chan_k_set). */
#define SN_CHAN_DX(dy, x, hi, lo, a, b, e) (((dy) * (a) - (b)) - (((x) - (hi)) - (lo)) * (e))

/* LayerNorm backward from the saved mean m and rstd s: x̂ = (x − m)·s (pass A's sums), then
 * x̂' = x̂ − c with c = mean(x̂), which has mean 0 even where the saved f32 mean is off by half an
 * ulp, and dx = s·((g − mean(g)) − x̂'·mean(g·x̂')), g = dy·gamma (Torch's layer_norm backward). */
#define SN_LN_XHAT(x, m, s) (((x) - (m)) * (s))
#define SN_LN_XHAT_C(x, m, s, c) (SN_LN_XHAT(x, m, s) - (c))
#define SN_LN_DX(g, xh, s, mg, mgx) ((s) * (((g) - (mg)) - (xh) * (mgx)))

/* RMSNorm backward: x̂ = x·s, dx = s·g − x̂·e with e = s²·mean(g·x), g = dy·gamma. */
#define SN_RMS_XHAT(x, s) ((x) * (s))
#define SN_RMS_DX(g, xh, s, e) ((s) * (g) - (xh) * (e))

#endif /* SN_FORMULAS_H */
