/* placeholder: work in progress */
typedef int sn_placeholder_syncbn_t;
