/*
 * statcheck.h — the two modes of syncnorm-statcheck: the self test under mpirun (statcheck.c)
 * and the comparison of the checkpoints a job's ranks saved (statcheck_compare.c). Not installed.
 */
#ifndef SN_STATCHECK_H
#define SN_STATCHECK_H

/* `syncnorm-statcheck --compare [--tol T] [--params] FILE|DIR|GLOB...` with argv[0] the first
 * argument after the program's name. Returns the exit status: 0 all agree, 1 some differ, 2 bad
 * input. */
int statcheck_compare(int argc, char **argv);

#endif /* SN_STATCHECK_H */
