// The C consumer's program (../consumer_c/main.c) compiled as C++: the public header from C++.
#include "../consumer_c/main.c"
