/* placeholder: work in progress */
typedef int sn_placeholder_batchnorm_t;
