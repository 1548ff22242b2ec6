// llama.cpp's sequence state (llama_state_seq_get_data / _set_data) as bytes: a parser that checks every field
// against what this adapter knows, and a writer that emits a state holding only kept cells.
//
// The layout is llama.cpp's own (src/llama-context.cpp state_seq_get_data, src/llama-kv-cache.cpp state_write,
// state_write_meta, state_write_data), pinned to llama-cpp-python 0.3.36 (llama.cpp 0c1e570, LLAMA_STATE_SEQ_VERSION
// 3). All integers are little-endian host order, as llama.cpp writes them with memcpy:
//
//   u32 magic = 0xaf143cd8            (llama_context's io_magic; 0.3.16 had none)
//   i32 seq_id
//   u32 n_stream                      (the context's streams: 1, or n_seq_max with kv_unified = false)
//   per stream:
//     u32 cell_count                  (0 for every stream but the sequence's own: nothing else follows then)
//     per cell: i32 pos, u32 n_seq_id (= 1 for one sequence), [cell ext: i32 x, i32 y, i32 tok, M-RoPE only],
//               n_seq_id x i32 seq_id
//     u32 v_trans, u32 n_layer
//     per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes           // K rows [cells][kv_heads*hd]
//     v_trans = 0: per layer: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes   // V rows
//     v_trans = 1: per layer: i32 v_type, u32 v_el_bytes, u32 n_embd_v,
//                             n_embd_v x cell_count x v_el_bytes                   // V^T [kv_heads*hd][cells]
//
// Nothing here includes llama.h: the parser is plain byte arithmetic, so hostile input can be tested anywhere.
// Every read is bounds-checked against the buffer; every failure is a message naming the field and its offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace fairkv::llamacpp {

inline constexpr std::uint32_t state_magic = 0xaf143cd8u;  // llama_context.cpp io_magic
inline constexpr std::uint32_t state_version = 3;          // LLAMA_STATE_SEQ_VERSION of the pinned llama.h
inline constexpr std::int32_t ggml_type_f16 = 1;           // enum ggml_type: GGML_TYPE_F16

// ggml type names for messages (enum ggml_type of the pinned ggml; unknown ids print as numbers).
inline std::string ggml_type_label(std::int32_t t) {
  static constexpr const char* names[] = {"f32",  "f16",  "q4_0", "q4_1", "(4)",  "(5)",  "q5_0", "q5_1",
                                          "q8_0", "q8_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
                                          "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s",
                                          "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16"};
  if (t >= 0 && t < std::int32_t(std::size(names))) return std::string(names[t]) + " (" + std::to_string(t) + ")";
  return "type " + std::to_string(t);
}

// What the model says the state must hold; the parser refuses a state that disagrees.
struct state_expectations {
  std::uint32_t version = state_version;  // LLAMA_STATE_SEQ_VERSION of the llama.h compiled against
  std::uint32_t n_layer = 0;
  std::uint32_t n_embd_k = 0;  // kv_heads * head_dim of K (the same in every layer for Llama)
  std::uint32_t n_embd_v = 0;
  std::uint32_t n_stream = 1;  // the context's KV streams (one per sequence slot when not unified)
  bool cell_ext = false;       // M-RoPE / PLE cells carry 12 more bytes each: refused before parsing
};

// The model's side of a state: what the parser must find, and how a K row splits into heads.
struct state_shape {
  state_expectations expect;
  int n_head_kv = 0;
  int head_dim = 0;
};

struct layer_block {
  std::size_t k_offset = 0;  // first byte of the K rows in the state
  std::size_t v_offset = 0;  // first byte of the V rows (or of V^T)
};

// A parsed single-stream, single-sequence state. Offsets index the buffer that was parsed.
struct seq_state {
  std::int32_t seq_id = 0;
  std::uint32_t n_stream = 1;
  std::uint32_t stream = 0;       // the one stream holding the cells
  std::uint32_t cell_count = 0;
  std::vector<std::int32_t> pos;  // [cell_count], strictly increasing
  bool v_trans = false;
  std::uint32_t n_layer = 0, n_embd_k = 0, n_embd_v = 0;
  std::vector<layer_block> layers;  // [n_layer]
  std::size_t size = 0;             // bytes parsed (= the buffer's size)

  std::size_t k_row_bytes() const { return std::size_t(n_embd_k) * 2; }
  std::size_t v_row_bytes() const { return std::size_t(n_embd_v) * 2; }
};

namespace detail {

class reader {
 public:
  explicit reader(std::span<const std::uint8_t> b) : b_(b) {}
  std::size_t offset() const { return at_; }
  std::size_t left() const { return b_.size() - at_; }
  // Reads a T, or names the field the state was cut inside (`field` is only called then: the happy path
  // builds no strings).
  template <class T, class Field>
  bool read(T& v, Field&& field, std::string& err) {
    if (left() < sizeof(T)) {
      err = "state cut at byte " + std::to_string(at_) + " of " + std::to_string(b_.size()) + " inside " +
            std::string(field()) + " (needs " + std::to_string(sizeof(T)) + " bytes, " + std::to_string(left()) +
            " left)";
      return false;
    }
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  // Skips `count` items of `item_bytes`, refusing a count that runs past the end (computed without overflow).
  template <class Field>
  bool skip(std::uint64_t count, std::uint64_t item_bytes, Field&& field, std::string& err) {
    if (item_bytes != 0 && count > left() / item_bytes) {
      err = "state cut at byte " + std::to_string(at_) + " of " + std::to_string(b_.size()) + " inside " +
            std::string(field()) + " (needs " + std::to_string(count) + " x " + std::to_string(item_bytes) +
            " bytes, " + std::to_string(left()) + " left)";
      return false;
    }
    at_ += std::size_t(count * item_bytes);
    return true;
  }

 private:
  std::span<const std::uint8_t> b_;
  std::size_t at_ = 0;
};

inline bool check_f16(std::int32_t type, const char* which, std::uint32_t layer, std::string& err) {
  if (type == ggml_type_f16) return true;
  err = "layer " + std::to_string(layer) + ": " + which + " cache type " + ggml_type_label(type) +
        (type > 1 && type != 30 ? " is quantised" : " is not f16") +
        "; fairkv compresses f16 K/V caches only (create the context with type_k = type_v = F16)";
  return false;
}

}  // namespace detail

// Parses `bytes` into `out`. Returns "" on success, else what is wrong (and `out` is unspecified).
[[nodiscard]] inline std::string parse_seq_state(std::span<const std::uint8_t> bytes, const state_expectations& want,
                                                 seq_state& out) {
  out = seq_state{};
  std::string err;
  if (want.version != state_version)
    return "llama.h declares sequence-state version " + std::to_string(want.version) + "; this parser knows version " +
           std::to_string(state_version) + " only (llama-cpp-python 0.3.36): refusing to guess the layout";
  if (want.cell_ext)
    return "the cache stores per-cell extensions (M-RoPE 2D positions or per-layer n-gram embeddings); "
           "fairkv supports 1D RoPE models only";
  detail::reader r(bytes);
  std::uint32_t magic = 0, n_stream = 0;
  if (!r.read(magic, [] { return "the magic"; }, err)) return err;
  if (magic != state_magic) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "state magic 0x%08x is not llama.cpp's sequence-state magic 0x%08x", magic,
                  state_magic);
    return buf;
  }
  if (!r.read(out.seq_id, [] { return "the sequence id"; }, err)) return err;
  if (!r.read(n_stream, [] { return "the stream count"; }, err)) return err;
  if (n_stream != want.n_stream)
    return "the state holds " + std::to_string(n_stream) + " streams, the context " + std::to_string(want.n_stream);
  out.n_stream = n_stream;
  // One sequence's state: every stream but its own is written as an empty count.
  bool found = false;
  for (std::uint32_t s = 0; s < n_stream && !found; ++s) {
    if (!r.read(out.cell_count, [s] { return "the cell count of stream " + std::to_string(s); }, err)) return err;
    if (out.cell_count != 0) found = true, out.stream = s;
  }
  if (!found) return "the state holds no cells (nothing was prefilled in this sequence)";
  // 12 bytes per cell at least (pos, n_seq_id, one seq_id): a count the buffer cannot hold is refused before
  // anything is allocated for it.
  if (out.cell_count > r.left() / 12)
    return "cell count " + std::to_string(out.cell_count) + " needs at least " +
           std::to_string(std::uint64_t(out.cell_count) * 12) + " bytes of cell metadata, only " +
           std::to_string(r.left()) + " left";
  out.pos.resize(out.cell_count);
  for (std::uint32_t i = 0; i < out.cell_count; ++i) {
    auto cell_name = [i] { return "cell " + std::to_string(i); };
    auto cell = [&](const char* what) { return cell_name() + " " + what; };
    std::uint32_t n_seq = 0;
    std::int32_t seq = 0;
    if (!r.read(out.pos[i], [&] { return cell("position"); }, err) ||
        !r.read(n_seq, [&] { return cell("sequence count"); }, err))
      return err;
    if (n_seq != 1)
      return cell_name() + ": " + std::to_string(n_seq) + " sequence ids (a single-sequence state has exactly 1)";
    if (!r.read(seq, [&] { return cell("sequence id"); }, err)) return err;
    if (seq != out.seq_id)
      return cell_name() + ": sequence id " + std::to_string(seq) + " differs from the state's " +
             std::to_string(out.seq_id);
    if (out.pos[i] < 0) return cell_name() + ": negative position " + std::to_string(out.pos[i]);
    if (i > 0 && out.pos[i] <= out.pos[i - 1])
      return cell_name() + ": position " + std::to_string(out.pos[i]) + " does not follow " +
             std::to_string(out.pos[i - 1]) +
             " (cells are expected in increasing position order)";
  }
  std::uint32_t v_trans = 0;
  if (!r.read(v_trans, [] { return "v_trans"; }, err) || !r.read(out.n_layer, [] { return "the layer count"; }, err))
    return err;
  if (v_trans > 1) return "v_trans is " + std::to_string(v_trans) + " (expected 0 or 1)";
  out.v_trans = v_trans == 1;
  if (out.n_layer != want.n_layer)
    return "the state has " + std::to_string(out.n_layer) + " layers, the model " + std::to_string(want.n_layer);
  out.n_embd_k = want.n_embd_k;
  out.n_embd_v = want.n_embd_v;
  out.layers.resize(out.n_layer);
  for (std::uint32_t l = 0; l < out.n_layer; ++l) {
    auto layer_name = [l] { return "layer " + std::to_string(l); };
    auto layer = [&](const char* what) { return layer_name() + " " + what; };
    std::int32_t type = 0;
    std::uint64_t row = 0;
    if (!r.read(type, [&] { return layer("K type"); }, err) || !detail::check_f16(type, "K", l, err)) return err;
    if (!r.read(row, [&] { return layer("K row size"); }, err)) return err;
    if (row != out.k_row_bytes())
      return layer_name() + ": K row size " + std::to_string(row) + " bytes, expected " +
             std::to_string(out.k_row_bytes()) +
             " (f16 x " + std::to_string(want.n_embd_k) + ")";
    out.layers[l].k_offset = r.offset();
    if (!r.skip(out.cell_count, row, [&] { return layer("K rows"); }, err)) return err;
  }
  for (std::uint32_t l = 0; l < out.n_layer; ++l) {
    auto layer_name = [l] { return "layer " + std::to_string(l); };
    auto layer = [&](const char* what) { return layer_name() + " " + what; };
    std::int32_t type = 0;
    if (!r.read(type, [&] { return layer("V type"); }, err) || !detail::check_f16(type, "V", l, err)) return err;
    if (!out.v_trans) {
      std::uint64_t row = 0;
      if (!r.read(row, [&] { return layer("V row size"); }, err)) return err;
      if (row != out.v_row_bytes())
        return layer_name() + ": V row size " + std::to_string(row) + " bytes, expected " +
               std::to_string(out.v_row_bytes());
      out.layers[l].v_offset = r.offset();
      if (!r.skip(out.cell_count, row, [&] { return layer("V rows"); }, err)) return err;
    } else {
      std::uint32_t el = 0, n_embd = 0;
      if (!r.read(el, [&] { return layer("V element size"); }, err) ||
          !r.read(n_embd, [&] { return layer("V embedding size"); }, err))
        return err;
      if (el != 2) return layer_name() + ": V element size " + std::to_string(el) + " bytes, expected 2 (f16)";
      if (n_embd != want.n_embd_v)
        return layer_name() + ": V embedding size " + std::to_string(n_embd) + ", expected " +
               std::to_string(want.n_embd_v);
      out.layers[l].v_offset = r.offset();
      if (!r.skip(std::uint64_t(n_embd) * out.cell_count, el, [&] { return layer("transposed V"); }, err)) return err;
    }
  }
  for (std::uint32_t s = out.stream + 1; s < n_stream; ++s) {
    std::uint32_t count = 0;
    if (!r.read(count, [s] { return "the cell count of stream " + std::to_string(s); }, err)) return err;
    if (count != 0)
      return "streams " + std::to_string(out.stream) + " and " + std::to_string(s) +
             " both hold cells; a sequence's state has one stream of cells";
  }
  if (r.left() != 0)
    return std::to_string(r.left()) + " unexpected bytes after the last layer (at byte " + std::to_string(r.offset()) +
           ")";
  out.size = bytes.size();
  return "";
}

namespace detail {

// The writer of write_seq_state(_in_place): from the parsed `src` in `in` to `out`, which may be `in` itself. Every
// section of the result starts at or before the same section of the source (cells are only dropped), and data moves
// with memmove, so writing over the source never reads a byte it has already overwritten.
inline std::size_t put_seq_state(std::uint8_t* out, const std::uint8_t* in, const seq_state& src,
                                 std::uint32_t kept) {
  const std::size_t k_bytes = std::size_t(kept) * src.k_row_bytes(), v_bytes = std::size_t(kept) * src.v_row_bytes();
  std::size_t at = 0;
  auto put = [out, &at](const void* p, std::size_t n) {
    std::memmove(out + at, p, n);
    at += n;
  };
  const std::uint32_t one = 1, zero = 0, v_trans = src.v_trans ? 1 : 0;
  const std::int32_t f16 = ggml_type_f16;
  put(&state_magic, 4);
  put(&src.seq_id, 4);
  put(&src.n_stream, 4);
  for (std::uint32_t s = 0; s < src.stream; ++s) put(&zero, 4);
  put(&kept, 4);
  const std::int32_t first = src.pos.back() - std::int32_t(kept) + 1;
  for (std::uint32_t i = 0; i < kept; ++i) {
    const std::int32_t pos = first + std::int32_t(i);
    put(&pos, 4);
    put(&one, 4);  // n_seq_id
    put(&src.seq_id, 4);
  }
  put(&v_trans, 4);
  put(&src.n_layer, 4);
  for (const layer_block& l : src.layers) {
    const std::uint64_t row = src.k_row_bytes();
    put(&f16, 4);
    put(&row, 8);
    put(in + l.k_offset, k_bytes);
  }
  for (const layer_block& l : src.layers) {
    put(&f16, 4);
    if (!src.v_trans) {
      const std::uint64_t row = src.v_row_bytes();
      put(&row, 8);
      put(in + l.v_offset, v_bytes);
    } else {
      const std::uint32_t el = 2;
      put(&el, 4);
      put(&src.n_embd_v, 4);
      for (std::uint32_t j = 0; j < src.n_embd_v; ++j)
        put(in + l.v_offset + std::size_t(j) * src.cell_count * 2, std::size_t(kept) * 2);
    }
  }
  for (std::uint32_t s = src.stream + 1; s < src.n_stream; ++s) put(&zero, 4);
  return at;
}

// The exact size of the state of `kept` cells: header 12, a count per stream, cells 12 each, 8, per layer 12 + rows
// twice.
inline std::size_t seq_state_size(const seq_state& src, std::uint32_t kept) {
  return 12 + 4 * std::size_t(src.n_stream) + std::size_t(kept) * 12 + 8 +
         std::size_t(src.n_layer) * (24 + std::size_t(kept) * (src.k_row_bytes() + src.v_row_bytes()));
}

}  // namespace detail

// The state of `src` (parsed from `bytes`) with only its first `kept` cells of every layer: the K rows [0, kept),
// the V rows [0, kept) (or, transposed, the first `kept` entries of every V^T row), at positions last - kept + 1
// .. last (last = src's last position): llama.cpp wants the next token at last + 1, and RoPE of the cached keys is
// inside K already, so nothing else moves. fairkv's compaction has already moved every kept row to the front of its
// layer's block in `bytes`.
[[nodiscard]] inline std::vector<std::uint8_t> write_seq_state(std::span<const std::uint8_t> bytes,
                                                               const seq_state& src, std::uint32_t kept) {
  std::vector<std::uint8_t> out(detail::seq_state_size(src, kept));
  detail::put_seq_state(out.data(), bytes.data(), src, kept);
  return out;
}

// The same state written over `bytes` itself, which then holds it (and only it): no second buffer, so a long
// sequence's round trip holds one state rather than two. `src` (parsed from these bytes) must not be read after.
inline void write_seq_state_in_place(std::vector<std::uint8_t>& bytes, const seq_state& src, std::uint32_t kept) {
  bytes.resize(detail::put_seq_state(bytes.data(), bytes.data(), src, kept));
}

}  // namespace fairkv::llamacpp
