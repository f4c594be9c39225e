/* placeholder: work in progress */
typedef int sn_placeholder_comm_mpi_t;
