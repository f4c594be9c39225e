/* A program built against an installed syncnorm (tests/install/check_install.sh): LayerNorm of
 * one row [2000, 2001, 2002, 2003], the example, must give ±1.341635 and ±0.447212. */
#include <math.h>
#include <stdio.h>

#include <syncnorm.h>

int main(void) {
  const float x[4] = {2000.0f, 2001.0f, 2002.0f, 2003.0f};
  const double want[4] = {-1.341635, -0.447212, 0.447212, 1.341635};
  float y[4], mean, rstd;
  const sn_status_t st = sn_layernorm_fwd(y, &mean, &rstd, x, NULL, NULL, 1, 4, 1e-5f,
                                          SN_DTYPE_F32);
  if (st != SN_OK) {
    fprintf(stderr, "sn_layernorm_fwd: %s: %s\n", sn_status_string(st), sn_last_error());
    return 1;
  }
  for (int i = 0; i < 4; i++)
    if (!(fabs(y[i] - want[i]) <= 1e-5)) {
      fprintf(stderr, "y[%d] = %.7f, want %.6f\n", i, (double)y[i], want[i]);
      return 1;
    }
  printf("consumer: ok (syncnorm %s)\n", sn_version());
  return 0;
}
