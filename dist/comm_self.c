/*
 * comm_self.c — the "self" backend: a world of one rank. All-reduces are the identity.
 */
#include <stddef.h>

#include "comm_internal.h"

static sn_status_t self_allreduce(sn_comm_t *comm, void *buf, int64_t count, sn_red_type_t type,
                                  sn_red_op_t op) {
  (void)comm, (void)buf, (void)count, (void)type, (void)op;
  return SN_OK; /* one rank: the reduction of one value is itself */
}

static sn_status_t self_split(sn_comm_t *comm, int color, int key, sn_comm_t **sub);

static void self_destroy(sn_comm_t *comm) { (void)comm; }

static const sn_comm_ops_t self_ops = {"self", 0, self_allreduce, self_split, self_destroy,
                                       NULL, NULL};

static sn_status_t self_split(sn_comm_t *comm, int color, int key, sn_comm_t **sub) {
  (void)comm, (void)key;
  if (color < 0) {
    *sub = NULL;
    return SN_OK;
  }
  return sn__comm_new(sub, &self_ops, 0, 1, NULL);
}

sn_status_t sn_comm_create_self(sn_comm_t **comm) {
  SN_TRY(sn__check_ptr("sn_comm_create_self", "comm", comm));
  double timeout_s;
  int check;
  SN_TRY(sn__comm_env_timeout("sn_comm_create_self", &timeout_s));
  SN_TRY(sn__comm_env_check("sn_comm_create_self", &check));
  SN_TRY(sn__comm_new(comm, &self_ops, 0, 1, NULL));
  /* both unused by "self" (it never waits, and one rank cannot disagree), kept for split */
  (*comm)->timeout_s = timeout_s;
  (*comm)->check = check;
  return SN_OK;
}
