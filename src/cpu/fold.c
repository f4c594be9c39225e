/*
 * fold.c — folding an inference BatchNorm into the preceding conv/linear layer (the standard
 * deployment rewrite; see e.g. torch.nn.utils.fusion.fuse_conv_bn_weights).
 *
 * Per output channel c, in fp64:  k = gamma_c/√(running_var_c + eps),
 *   w[c, :] = w[c, :]·k,   b[c] = (b[c] − running_mean_c)·k + beta_c,
 * each value rounded to f32 once. w: [c_out, per_out] f32, b and the per-channel arrays [c_out].
 */
#include <math.h>

#include "cpu.h"

/* Below this many weights the fold runs on the calling thread only. */
#define FOLD_PAR_MIN 65536

sn_status_t sn_fold_batchnorm(float *w, float *b, const float *gamma, const float *beta,
                              const float *running_mean, const float *running_var, int64_t c_out,
                              int64_t per_out, float eps) {
  static const char fn[] = "sn_fold_batchnorm";
  sn__args_t args;
  const sn__fold_call_t call = {.w = w, .b = b, .gamma = gamma, .beta = beta,
                                .running_mean = running_mean, .running_var = running_var,
                                .c_out = c_out, .per_out = per_out, .eps = eps};
  SN_TRY(sn__fold_args(&args, fn, &call));
  SN_TRY(sn__check_running_var(fn, running_var, c_out));
  const int64_t total = args.rows; /* c_out·per_out weights */
#pragma omp parallel for schedule(static) if (total >= FOLD_PAR_MIN)
  for (int64_t c = 0; c < c_out; c++) {
    const double k = (gamma ? (double)gamma[c] : 1.0) / sqrt((double)running_var[c] + (double)eps);
    float *wc = w + c * per_out; /* [per_out] */
    for (int64_t i = 0; i < per_out; i++) wc[i] = (float)((double)wc[i] * k);
    b[c] = (float)(((double)b[c] - (double)running_mean[c]) * k + (beta ? (double)beta[c] : 0.0));
  }
  return SN_OK;
}
