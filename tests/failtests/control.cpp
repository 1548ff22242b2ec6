// Positive control for the failtests: the same command line compiles a valid policy.
#include "fairkv/fairkv.hpp"
fairkv::policy<fairkv::scorers::snapkv<16>, fairkv::selectors::per_head, fairkv::allocators::fair_with_whitelist> p;
int main() { return 0; }
