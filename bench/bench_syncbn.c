/*
 * bench_syncbn.c — the per-layer cost of synchronizing BatchNorm statistics.
 *
 *   mpirun -np P bench_syncbn [--reps R] [--threads T]
 *
 * For C ∈ {64, 256, 1024} channels and per-rank batches of 2 and 8 images of 56×56 (NCHW f32),
 * times one SyncBatchNorm forward+backward over MPI_COMM_WORLD against the same layer with
 * comm == NULL (local BatchNorm on each rank's batch), medians over R repetitions, every rank
 * starting together after a barrier. Also counts the collectives a forward and a backward issue
 * (must be 1 and 1; 0 and 0 with one rank, which has nothing to synchronize) and the cost of
 * the optional checks (check_consistency, check_finite).
 * Rank 0 prints one line per configuration:
 *   P C n local_ms sync_ms overhead_ms ratio coll_fwd coll_bwd consistency_ms finite_ms
 */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_mpi.h"

static int rank = 0, nranks = 1;

#define CHECK(call)                                                                       \
  do {                                                                                    \
    sn_status_t st_ = (call);                                                             \
    if (st_ != SN_OK) {                                                                   \
      fprintf(stderr, "bench_syncbn: rank %d: %s: %s\n", rank, #call, sn_last_error());   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                       \
    }                                                                                     \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median over reps of the slowest rank's time for one forward+backward. */
static double time_layer(sn_syncbn_t *bn, float *y, float *dx, const float *x, const float *dy,
                         int64_t n, int64_t s, int reps) {
  double *t = malloc((size_t)reps * sizeof *t);
  for (int r = -3; r < reps; r++) { /* 3 warm-up repetitions */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    CHECK(sn_syncbn_forward(bn, y, x, n, s, 1));
    CHECK(sn_syncbn_backward(bn, dx, dy, x, n, s));
    double dt = MPI_Wtime() - t0, slowest;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r >= 0) t[r] = slowest;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  double med = t[reps / 2];
  free(t);
  return med * 1e3;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int reps = 50, threads = 1;
  static const struct option opts[] = {
      {"reps", 1, 0, 'r'}, {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  static const char usage[] = "usage: mpirun -np P bench_syncbn [--reps R] [--threads T]\n";
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (c == 'r') reps = atoi(optarg);
    else if (c == 't') threads = atoi(optarg);
    else {
      if (rank == 0) fputs(usage, c == 'h' ? stdout : stderr);
      MPI_Finalize();
      return c == 'h' ? 0 : 2;
    }
  }
  if (reps < 1) reps = 1;
  if (threads < 1) threads = 1;
  omp_set_num_threads(threads);
  sn_comm_t *world = NULL;
  CHECK(sn_comm_create_mpi(&world, MPI_COMM_WORLD));
  if (rank == 0) {
    printf("# SyncBatchNorm forward+backward, NCHW f32, 56x56, %d ranks, %d thread(s)/rank, median of %d\n",
           nranks, threads, reps);
    printf("%2s %5s %2s %9s %9s %11s %6s %8s %8s %14s %9s\n", "P", "C", "n", "local_ms", "sync_ms",
           "overhead_ms", "ratio", "coll_fwd", "coll_bwd", "consistency_ms", "finite_ms");
  }
  static const int64_t channels[] = {64, 256, 1024}, batches[] = {2, 8};
  const int64_t S = 56 * 56;
  for (int ci = 0; ci < 3; ci++)
    for (int bi = 0; bi < 2; bi++) {
      const int64_t C = channels[ci], n = batches[bi], count = n * C * S;
      float *x = malloc((size_t)count * 4), *dy = malloc((size_t)count * 4);
      float *y = malloc((size_t)count * 4), *dx = malloc((size_t)count * 4);
      for (int64_t i = 0; i < count; i++) {
        x[i] = (float)((i * 7919 + rank * 13) % 1000) * 1e-3f - 0.3f;
        dy[i] = (float)((i * 104729 + rank) % 997) * 1e-3f - 0.5f;
      }
      sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
      cfg.check_consistency = 0;
      sn_syncbn_t *local = NULL, *sync = NULL, *checked = NULL, *finite = NULL;
      CHECK(sn_syncbn_create(&local, &cfg, NULL));
      CHECK(sn_syncbn_create(&sync, &cfg, world));
      cfg.check_consistency = 1;
      CHECK(sn_syncbn_create(&checked, &cfg, world));
      cfg.check_consistency = 0;
      cfg.check_finite = 1;
      CHECK(sn_syncbn_create(&finite, &cfg, world));
      double t_local = time_layer(local, y, dx, x, dy, n, S, reps);
      int64_t c0, c1, c2;
      CHECK(sn_syncbn_collective_count(sync, &c0));
      CHECK(sn_syncbn_forward(sync, y, x, n, S, 1));
      CHECK(sn_syncbn_collective_count(sync, &c1));
      CHECK(sn_syncbn_backward(sync, dx, dy, x, n, S));
      CHECK(sn_syncbn_collective_count(sync, &c2));
      double t_sync = time_layer(sync, y, dx, x, dy, n, S, reps);
      double t_checked = time_layer(checked, y, dx, x, dy, n, S, reps);
      double t_finite = time_layer(finite, y, dx, x, dy, n, S, reps);
      if (rank == 0)
        printf("%2d %5lld %2lld %9.3f %9.3f %11.3f %6.2f %8lld %8lld %14.3f %9.3f\n", nranks,
               (long long)C, (long long)n, t_local, t_sync, t_sync - t_local, t_sync / t_local,
               (long long)(c1 - c0), (long long)(c2 - c1), t_checked - t_sync, t_finite - t_sync);
      sn_syncbn_destroy(local), sn_syncbn_destroy(sync), sn_syncbn_destroy(checked), sn_syncbn_destroy(finite);
      free(x), free(dy), free(y), free(dx);
    }
  sn_comm_destroy(world);
  MPI_Finalize();
  return 0;
}
