/*
 * syncnorm_mpi.h — the Open MPI communicator: libsyncnorm_mpi (CMake: syncnorm::mpi, from
 * find_package(syncnorm COMPONENTS mpi); pkg-config: syncnorm-mpi). Everything else about
 * communicators and SyncBatchNorm is in syncnorm_dist.h, which this header includes.
 */
#ifndef SYNCNORM_MPI_H
#define SYNCNORM_MPI_H

/* From C++, only MPI's C API: Open MPI's and MPICH's <mpi.h> otherwise also declare the MPI C++
 * bindings (removed from the standard in MPI-3.0), whose symbols are in a library of their own
 * (libmpi_cxx) that neither the CMake package nor pkg-config links. A program that wants the
 * bindings includes <mpi.h> itself before this header (and links them). */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "syncnorm_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Communicator over an MPI communicator. Collective over mpi_comm (it calls MPI_Comm_idup): the
 * handle owns the duplicate, with MPI_ERRORS_RETURN set on it, so an MPI failure becomes
 * SN_ERR_COMM instead of aborting. One exception: Open MPI 4.1 raises an error it finds while
 * progressing a nonblocking collective, such as ranks passing different sizes (MPI_ERR_TRUNCATE),
 * on MPI_COMM_WORLD's handler (MPI_ERRORS_ARE_FATAL unless you change it): the job ends. Set
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD too to get SN_ERR_COMM there, on the ranks that see the
 * error; the others wait for the timeout (SN_ERR_TIMEOUT). Measured with Debian 12's Open MPI
 * 4.1.4. SyncBatchNorm's check_consistency keeps its calls from getting that far.
 * MPI must be initialized, and stay so until sn_comm_destroy.
 * Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT (MPI not initialized, MPI_COMM_NULL or
 * an intercommunicator, checked before anything collective; SN_COMM_TIMEOUT_S set to a value
 * that is not a number of seconds >= 0, or SN_COMM_CHECK to another value than 0 or 1, on any
 * rank: the ranks agree on both with one MPI_Iallreduce over mpi_comm before the dup, so every
 * rank fails alike, and SN_COMM_CHECK=1 on any rank turns the call check on for all of them),
 * SN_ERR_TIMEOUT (each step, the agreement, a barrier and the dup, waits at most this rank's
 * SN_COMM_TIMEOUT_S, or the default 1800 s, for the other ranks: a rank that never arrives fails
 * the others instead of hanging them, and one arriving after they gave up fails in the barrier.
 * The step stays pending on mpi_comm, which must not be used for collectives again. With a
 * timeout shorter than the ranks take to meet, such as 1e-9, some ranks may
 * fail while others succeed; treat the error as fatal on every rank), SN_ERR_COMM,
 * SN_ERR_ALLOC. */
SN_API sn_status_t sn_comm_create_mpi(sn_comm_t **comm, MPI_Comm mpi_comm);

/* sn_comm_create_mpi of the communicator whose Fortran handle (MPI_Comm_c2f) is fortran_handle:
 * for callers without MPI's C types, such as Python (mpi4py's Comm.py2f()) through ctypes. The
 * same MPI library must be loaded in the process. Errors as sn_comm_create_mpi, plus
 * SN_ERR_INVALID_ARGUMENT for a value that is no MPI_Fint (a handle MPI_Comm_f2c does not know
 * gives MPI_COMM_NULL: SN_ERR_INVALID_ARGUMENT too). */
SN_API sn_status_t sn_comm_create_mpi_fortran(sn_comm_t **comm, int64_t fortran_handle);

#ifdef __cplusplus
}
#endif

#endif /* SYNCNORM_MPI_H */
