// The MPI consumer's program (../consumer_mpi/main.c) compiled as C++: syncnorm_mpi.h from C++.
#include "../consumer_mpi/main.c"
