// Every launch constant of the CUDA backend, in one place (CUB keeps its tuning policies apart from the
// algorithms the same way): block sizes, items per thread and the shared-memory budgets the kernels are written
// for. Changing one changes performance only; the plans stay bit-identical (the parity suite checks it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fairkv::cuda::detail {

// Element-wise kernels (position scores, head mean, attention finalisation): one token per thread.
inline constexpr int elementwise_threads = 256;

// Key scoring (score_keys.cuh): each block stages up to key_score_threads key rows in shared memory, within
// key_score_smem_bytes. A row larger than that budget is staged alone, with the device's opt-in shared memory.
inline constexpr int key_score_threads = 128;
inline constexpr int key_score_smem_bytes = 40 * 1024;

// Attention statistics and accumulation (score_attention.cuh).
inline constexpr int attention_threads = 256;

// Selection of one (sequence, group) per block for head_adaptive (select.cuh).
inline constexpr int select_threads = 512;

// Split radix selection for per_head and union (select_split.cuh): tokens of one problem per block.
inline constexpr int split_threads = 256;
inline constexpr std::int32_t split_slice = 4096;

// Emitting the keep mask as ascending indices (plan_kernels.cuh): tokens per block = threads x items.
inline constexpr int emit_threads = 256;
inline constexpr int emit_items = 16;
inline constexpr std::int32_t emit_chunk = emit_threads * emit_items;

// Compaction (compact.cuh): a chunk of K and V rows staged in shared memory, up to compact_smem_bytes.
inline constexpr int compact_threads = 256;
inline constexpr int compact_smem_bytes = 32 * 1024;

// Dynamic shared memory a launch gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr std::size_t default_dynamic_smem_bytes = 48 * 1024;

}  // namespace fairkv::cuda::detail
