// Must NOT compile: a selector needs `static constexpr fairkv::selection_kind kind`.
#include "fairkv/fairkv.hpp"
struct not_a_selector {};
fairkv::policy<fairkv::scorers::knorm, not_a_selector, fairkv::allocators::uniform> p;
