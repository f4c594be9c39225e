/* placeholder: work in progress */
typedef int sn_placeholder_fold_t;
