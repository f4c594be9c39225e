/* placeholder: work in progress */
typedef int sn_placeholder_checkpoint_t;
