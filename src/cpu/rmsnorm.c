/* placeholder: work in progress */
typedef int sn_placeholder_rmsnorm_t;
