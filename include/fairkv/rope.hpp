// RoPE conventions, needed to re-rotate kept keys to their new positions after compaction.
#pragma once

#include <cstdint>

namespace fairkv {

enum class rope_style : std::uint8_t {
  half,         // HF / NeoX rotate_half: dimension i pairs with i + rotary_dim / 2
  interleaved,  // GGML "normal" (GGUF Llama): dimension 2i pairs with 2i + 1
};

struct rope_params {
  float theta = 10000.0f;        // base of the inverse frequencies theta^(-2i / rotary_dim)
  std::int64_t rotary_dim = 0;   // rotated leading dimensions; 0 = head_dim
  rope_style style = rope_style::half;
};

}  // namespace fairkv
