// fairkv/llamacpp/sequence.hpp on its own, twice (include guards), under -Wall -Wextra -Werror.
#include "fairkv/llamacpp/sequence.hpp"
#include "fairkv/llamacpp/sequence.hpp"
