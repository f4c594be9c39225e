/*
 * rownorm_bwd.c — the driver the LayerNorm and RMSNorm backwards share (layernorm_bwd.c,
 * rmsnorm.c): the argument checks, the empty batch, the long rows, the buffers, and the rows
 * shared out over the threads with the dgamma/dbeta partials summed in a fixed order. Each
 * operation passes its per-row function (ln_bwd_store, rms_bwd_store).
 *
 * Without dgamma/dbeta the rows are independent. With them, the rows are cut into the fixed
 * chunks of cpu.h; a chunk's partials are summed over its rows in order (in f32 over runs of
 * SN_PART_ROWS rows, each run then added in fp64, rownorm_bwd.h), then added to the total in
 * chunk order (an OpenMP ordered region): the result never depends on the thread count, with
 * scratch O(threads·d) rather than O(chunks·d). Chunks go round-robin, so the threads reach the
 * ordered region one after the other and hardly wait.
 */
#include <string.h>

#include "longrow.h"
#include "rownorm_bwd.h"

sn_status_t sn__rownorm_bwd_run(const char *fn, const sn__rn_bwd_t *a, sn__bwd_store_fn store) {
  const int64_t rows = a->rows, d = a->d;
  const sn_dtype_t dtype = a->dtype;
  int64_t n;
  SN_TRY(sn__rownorm_bwd_check(fn, a, &n));
  if (n == 0) { /* empty batch: the parameter gradients are zero, nothing else is written */
    SN_TRY(sn__rownorm_bwd_spans(fn, a, NULL, 0)); /* as sn__bwd_buffers's, rows = 0 */
    if (a->dgamma != NULL) memset(a->dgamma, 0, (size_t)d * sizeof *a->dgamma);
    if (a->dbeta != NULL) memset(a->dbeta, 0, (size_t)d * sizeof *a->dbeta);
    return SN_OK;
  }
  if (sn__long_row(d)) return sn__long_rows_bwd(fn, a);

  /* parts: the parameter gradients a row adds to, dgamma (and, for LayerNorm, dbeta), each [d].
   * work: [threads + 1, work_cols] fp64, rows of parts·d rounded up to whole lines: each thread's
   * partials of its current chunk, and last the running total. scratch, per_thread f32 per
   * thread (rounded up to whole lines, sn__line_stride): for bf16/f16 2·d (the rows of store),
   * then with dgamma/dbeta parts·d (the partials of up to SN_PART_ROWS rows) */
  const int64_t parts = a->rms ? 1 : 2;
  const int chunked = a->dgamma != NULL || a->dbeta != NULL;
  const int64_t chunks = sn__chunks(rows);
  const int threads = sn__team_for(chunked ? chunks : rows);
  const int64_t rows_f32 = dtype != SN_DTYPE_F32 ? 2 * d : 0;
  const int64_t per_thread =
      sn__line_stride(rows_f32 + (chunked ? parts * d : 0), sizeof(float));
  const int64_t work_cols = chunked ? sn__line_stride(parts * d, sizeof(double)) : 0;
  sn__bwd_call_t c = {a, NULL, 1.0f, 0};
  sn__bwd_bufs_t buf;
  SN_TRY(sn__bwd_buffers(fn, &buf, a, threads, work_cols, per_thread));
  c.gs = buf.gs; /* bf16: gamma in pairs (the pair kernels) */
  if (a->gamma != NULL) { /* max|gamma| (NaN skipped), for the rows' range checks */
    c.gmax = 0.0f;
    for (int64_t j = 0; j < d; j++) c.gmax = sn__max_abs(c.gmax, a->gamma[j]);
  }

  double *total = chunked ? buf.work + (int64_t)threads * work_cols : NULL; /* [parts, d] */
  if (chunked) memset(total, 0, (size_t)(parts * d) * sizeof(double));
  const int stream = c.nt = sn__stream_out(n * sn_dtype_size(dtype)); /* dx */
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = sn__thread_num();
    float *tmp = buf.scratch != NULL && rows_f32 > 0 ? buf.scratch + t * per_thread : NULL;
    if (!chunked) {
      const sn__bwd_part_t none = {NULL, NULL, NULL, NULL};
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < rows; r++) store(&c, &none, r, tmp);
    } else {
      double *p = buf.work + t * work_cols;                 /* [parts, d] fp64 */
      float *p32 = buf.scratch + t * per_thread + rows_f32; /* [parts, d] f32 */
      const sn__bwd_part_t part = {p32, parts > 1 ? p32 + d : NULL, p, parts > 1 ? p + d : NULL};
#pragma omp for ordered schedule(static, 1) nowait
      for (int64_t k = 0; k < chunks; k++) {
        memset(p, 0, (size_t)(parts * d) * sizeof(double));
        memset(p32, 0, (size_t)(parts * d) * sizeof(float));
        const int64_t r0 = sn__chunk_begin(k, rows, chunks);
        const int64_t r1 = sn__chunk_begin(k + 1, rows, chunks);
        for (int64_t r = r0; r < r1; r++) {
          store(&c, &part, r, tmp);
          if ((r - r0) % SN_PART_ROWS == SN_PART_ROWS - 1 || r + 1 == r1) {
            if (dtype == SN_DTYPE_BF16) /* p32 in pair order */
              for (int64_t j = 0; j < parts; j++) sn__flush_pairs(p + j * d, p32 + j * d, d);
            else
              sn__flush_partial(p, p32, parts * d);
          }
        }
#pragma omp ordered
        sn__add_partial(total, p, parts * d);
      }
    }
    sn__stream_fence(stream);
  }
  if (a->dgamma != NULL) sn__store_f32(a->dgamma, total, d);
  if (a->dbeta != NULL) sn__store_f32(a->dbeta, total + d, d);
  sn__free(buf.work);
  sn__free(buf.scratch);
  sn__free(buf.gs);
  return SN_OK;
}
