/* placeholder: work in progress */
typedef int sn_placeholder_groupnorm_t;
