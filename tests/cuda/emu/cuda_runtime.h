// The emulator's stand-in for the CUDA runtime header (see fairkv_emu.hpp).
#pragma once
#include "fairkv_emu.hpp"
