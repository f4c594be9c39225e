/*
 * fault_inject_mpi.c — a SyncBatchNorm training loop over MPI_COMM_WORLD in which one rank fails
 * on purpose, so that tests/mpi/fault_check.sh (and scripts/multihost-check.sh) can show that
 * the whole job ends, with a non-zero exit, in bounded time.
 *
 * Faults (--fault), injected on rank --rank at its --at-th all-reduce (counted by an MPI
 * profiling-interface wrapper around MPI_Iallreduce, the call the library's "mpi" backend makes):
 *   kill-inside   the rank posts its part of the all-reduce, then raises SIGKILL on itself: it dies
 *                 in the middle of a SyncBatchNorm collective (Open MPI must notice and end the job)
 *   kill-before   SIGKILL right before the all-reduce is posted
 *   hang-inside   the rank posts its part, then sleeps (a rank stuck inside a collective)
 *   hang-before   the rank stops calling: it sleeps instead of posting (a rank stuck elsewhere,
 *                 or one that skipped the call); the others must fail with SN_ERR_TIMEOUT
 *   exit-before   the rank calls _exit(1) without MPI_Finalize (a crash that is not a signal)
 *   none          no fault (with --pid-dir: a driver kills a rank from outside, at any moment)
 * A hung rank sleeps at most HANG_MAX_S, then exits 4 by itself: the program always stops.
 *
 * Every other rank reports the first failing call and its detection time, waits ABORT_GRACE_S so
 * the other survivors can report theirs too, then calls MPI_Abort (exit 3), as a real program
 * would (examples/train_cnn.c does the same). Lines are machine-readable for the driver:
 *   FAULT rank=R kind=K collective=N t=<unix time>
 *   DETECTED rank=R status=SN_ERR_... waited=<s> t=<unix time> msg=...
 *   PID rank=R pid=P            (with --pid-dir: also written to DIR/rank<R>.pid)
 *   DONE rank=R steps=N          (the loop ended without a fault)
 *
 * Usage: mpirun -np P fault_inject_mpi [--fault F] [--rank R] [--at N] [--steps N]
 *        [--max-s S] [--timeout S] [--pid-dir DIR]
 * --steps 0 loops until --max-s seconds have passed (default 120). --timeout sets the
 * communicator's timeout (default: SN_COMM_TIMEOUT_S, else the library's 1800 s).
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "syncnorm_mpi.h"

/* A hung rank gives up after this long, so the program stops even if nobody kills it: longer
 * than any test's failure bound (30 s) plus the communicator timeouts used (≤ 20 s). */
#define HANG_MAX_S 300
/* Survivors wait this long between reporting and MPI_Abort, so that every survivor (they time
 * out within milliseconds of each other) prints its report before the abort tears the job down;
 * it adds to the measured time to job end. */
#define ABORT_GRACE_S 2.0
/* Layer size: small enough that a step is ~1 ms, so the fault comes quickly. */
#define FI_C 8
#define FI_S 16
#define FI_N 4

static int g_rank = -1, g_fault_rank = -1;
static long g_at = 0, g_calls = 0;
static const char *g_fault = "none";

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void announce(const char *kind) {
  printf("FAULT rank=%d kind=%s collective=%ld t=%.3f\n", g_rank, kind, g_calls, wall_now());
  fflush(stdout);
}

static void hang(void) {
  sleep_s(HANG_MAX_S);
  fprintf(stderr, "rank %d: hung for %d s and nobody ended the job: exiting 4\n", g_rank,
          HANG_MAX_S);
  _exit(4);
}

/* The profiling-interface wrapper: the library's MPI_Iallreduce calls land here. */
int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm comm, MPI_Request *request) {
  const int armed = g_rank == g_fault_rank && ++g_calls == g_at;
  if (armed && strcmp(g_fault, "kill-before") == 0) announce(g_fault), raise(SIGKILL);
  if (armed && strcmp(g_fault, "hang-before") == 0) announce(g_fault), hang();
  if (armed && strcmp(g_fault, "exit-before") == 0) announce(g_fault), _exit(1);
  int rc = PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  if (armed && strcmp(g_fault, "kill-inside") == 0) announce(g_fault), raise(SIGKILL);
  if (armed && strcmp(g_fault, "hang-inside") == 0) announce(g_fault), hang();
  return rc;
}

static void usage(void) {
  fprintf(stderr, "usage: fault_inject_mpi [--fault none|kill-inside|kill-before|hang-inside|"
                  "hang-before|exit-before] [--rank R] [--at N] [--steps N] [--max-s S] "
                  "[--timeout S] [--pid-dir DIR]\n");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long steps = 0;
  double max_s = 120.0, timeout = -1.0;
  const char *pid_dir = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      usage();
      return 2;
    }
    i++;
    if (strcmp(a, "--fault") == 0) g_fault = v;
    else if (strcmp(a, "--rank") == 0) g_fault_rank = atoi(v);
    else if (strcmp(a, "--at") == 0) g_at = atol(v);
    else if (strcmp(a, "--steps") == 0) steps = atol(v);
    else if (strcmp(a, "--max-s") == 0) max_s = atof(v);
    else if (strcmp(a, "--timeout") == 0) timeout = atof(v);
    else if (strcmp(a, "--pid-dir") == 0) pid_dir = v;
    else {
      usage();
      return 2;
    }
  }
  if (strcmp(g_fault, "none") != 0 && (g_fault_rank < 0 || g_fault_rank >= size || g_at < 1)) {
    if (g_rank == 0) fprintf(stderr, "fault_inject_mpi: --fault needs --rank in [0, P) and --at >= 1\n");
    MPI_Finalize();
    return 2;
  }
  printf("PID rank=%d pid=%ld\n", g_rank, (long)getpid());
  fflush(stdout);
  if (pid_dir != NULL) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.pid", pid_dir, g_rank);
    FILE *f = fopen(path, "w");
    if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
  }

  sn_comm_t *comm = NULL;
  sn_syncbn_t *bn = NULL;
  sn_status_t st = sn_comm_create_mpi(&comm, MPI_COMM_WORLD);
  if (st == SN_OK && timeout >= 0.0) st = sn_comm_set_timeout(comm, timeout);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(FI_C);
  cfg.check_consistency = 1;
  snprintf(cfg.name, sizeof cfg.name, "fault_bn");
  if (st == SN_OK) st = sn_syncbn_create(&bn, &cfg, comm);
  float x[FI_N * FI_C * FI_S], y[FI_N * FI_C * FI_S], dx[FI_N * FI_C * FI_S];
  const double t_start = wall_now();
  long step = 0;
  for (; st == SN_OK && (steps > 0 ? step < steps : wall_now() - t_start < max_s); step++) {
    for (int i = 0; i < FI_N * FI_C * FI_S; i++)
      x[i] = (float)((i * 7 + step * 13 + g_rank * 5) % 17) * 0.25f;
    const double t0 = wall_now();
    st = sn_syncbn_forward(bn, y, x, FI_N, FI_S, 1);
    if (st == SN_OK) st = sn_syncbn_backward(bn, dx, y, x, FI_N, FI_S);
    if (st != SN_OK) {
      const double t1 = wall_now();
      printf("DETECTED rank=%d step=%ld status=%s waited=%.3f t=%.3f msg=%s\n", g_rank, step,
             sn_status_string(st), t1 - t0, t1, sn_last_error());
      fflush(stdout);
    }
  }
  if (st != SN_OK) {
    sleep_s(ABORT_GRACE_S);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  printf("DONE rank=%d steps=%ld\n", g_rank, step);
  fflush(stdout);
  sn_syncbn_destroy(bn);
  sn_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
