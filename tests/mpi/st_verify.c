/*
 * st_verify.c — loads a safetensors file with the library's validating loader and says whether
 * it is complete: "ok tensors=N step=S" (S: the I64 scalar "trainer.step" of a syncnorm-train
 * checkpoint, -1 if absent), exit 0; otherwise "invalid: STATUS: detail", exit 1. Used by
 * train_kill_check.sh to show that the checkpoint on disk after a crash loads.
 * Usage: st_verify FILE
 */
#include <stdio.h>
#include <string.h>

#include "syncnorm_dist.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: st_verify FILE\n");
    return 2;
  }
  sn_safetensors_t *f = NULL;
  sn_status_t st = sn_safetensors_load(&f, argv[1]);
  if (st != SN_OK) {
    printf("invalid: %s: %s\n", sn_status_string(st), sn_last_error());
    return 1;
  }
  int64_t step = -1;
  sn_tensor_t t;
  if (sn_safetensors_get(f, &t, "trainer.step") == SN_OK && t.is_i64 && t.ndim == 0)
    memcpy(&step, t.data, sizeof step);
  printf("ok tensors=%lld step=%lld\n", (long long)sn_safetensors_count(f), (long long)step);
  sn_safetensors_free(f);
  return 0;
}
