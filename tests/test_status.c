/*
 * test_status.c — status strings, the thread-local error message, version and dtype sizes.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

START_TEST(test_status_strings) {
  /* every code has its own name, SN_OK is 0, unknown values are named as such */
  ck_assert_int_eq(SN_OK, 0);
  ck_assert_str_eq(sn_status_string(SN_OK), "SN_OK");
  for (int a = 1; a <= SN_ERR_INTERNAL; a++) {
    const char *na = sn_status_string((sn_status_t)a);
    ck_assert_msg(strncmp(na, "SN_ERR_", 7) == 0 && strcmp(na, "SN_ERR_UNKNOWN") != 0,
                  "status %d has no name (%s)", a, na);
    for (int b = 0; b < a; b++)
      ck_assert_msg(strcmp(na, sn_status_string((sn_status_t)b)) != 0, "status %d and %d share %s", a, b, na);
  }
  ck_assert_str_eq(sn_status_string((sn_status_t)999), "SN_ERR_UNKNOWN");
  ck_assert_str_eq(sn_status_string((sn_status_t)-1), "SN_ERR_UNKNOWN");
}
END_TEST

START_TEST(test_dtype_size_and_version) {
  ck_assert_int_eq(sn_dtype_size(SN_DTYPE_F32), 4);
  ck_assert_int_eq(sn_dtype_size(SN_DTYPE_BF16), 2);
  ck_assert_int_eq(sn_dtype_size(SN_DTYPE_F16), 2);
  ck_assert_int_eq(sn_dtype_size(SN_DTYPE_F64), 8);
  ck_assert_int_eq(sn_dtype_size((sn_dtype_t)77), 0);
  const char *v = sn_version();
  int major, minor, patch;
  ck_assert_int_eq(sscanf(v, "%d.%d.%d", &major, &minor, &patch), 3);
}
END_TEST

static void *fail_in_thread(void *arg) {
  (void)arg;
  float y[4];
  const float x[4] = {1, 2, 3, 4};
  sn_status_t st = sn_rmsnorm_fwd(y, NULL, x, NULL, 1, 4, -1.0f, SN_DTYPE_F32);
  return (void *)(intptr_t)(st == SN_ERR_INVALID_EPS && strstr(sn_last_error(), "eps") != NULL);
}

START_TEST(test_last_error_thread_local) {
  float y[4];
  const float x[4] = {1, 2, 3, 4};
  ck_assert_int_eq(sn_rmsnorm_fwd(y, NULL, x, NULL, 1, 0, 1e-5f, SN_DTYPE_F32), SN_ERR_INVALID_SIZE);
  char mine[512];
  snprintf(mine, sizeof mine, "%s", sn_last_error());
  ck_assert_msg(strstr(mine, "sn_rmsnorm_fwd") && strstr(mine, "d must be"), "message: %s", mine);
  pthread_t t;
  void *ok = NULL;
  ck_assert_int_eq(pthread_create(&t, NULL, fail_in_thread, NULL), 0);
  ck_assert_int_eq(pthread_join(t, &ok), 0);
  ck_assert_msg(ok != NULL, "the other thread did not see its own eps message");
  ck_assert_str_eq(sn_last_error(), mine); /* untouched by the other thread's failure */
  /* a successful call leaves the message as it was */
  ck_assert_int_eq(sn_rmsnorm_fwd(y, NULL, x, NULL, 1, 4, 1e-5f, SN_DTYPE_F32), SN_OK);
  ck_assert_str_eq(sn_last_error(), mine);
}
END_TEST

int main(void) {
  Suite *s = suite_create("status");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_status_strings);
  tcase_add_test(tc, test_dtype_size_and_version);
  tcase_add_test(tc, test_last_error_thread_local);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
