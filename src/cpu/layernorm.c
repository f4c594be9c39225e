/* placeholder: work in progress */
typedef int sn_placeholder_layernorm_t;
