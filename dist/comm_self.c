/* placeholder: work in progress */
typedef int sn_placeholder_comm_self_t;
