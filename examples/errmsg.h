/*
 * errmsg.h — the one way the training program's building blocks report a problem: a message
 * written into the caller's buffer, and −1 returned.
 */
#ifndef SN_EXAMPLES_ERRMSG_H
#define SN_EXAMPLES_ERRMSG_H

#include <stddef.h>

/* Writes the printf-style message into err (truncated to errlen bytes, NUL-terminated; nothing
 * when err is NULL or errlen is 0) and returns −1, so that `return ex_fail(err, errlen, ...);`
 * reports and fails in one statement. */
int ex_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* SN_EXAMPLES_ERRMSG_H */
