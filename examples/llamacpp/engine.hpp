// The unmodified llama.cpp, through its public C API only: model and context (RAII), tokenisation with byte
// offsets, sequences as slots of one context (each its own KV stream), prefill with the statistics fairkv's
// attention scorers read (prefill_capture.hpp), batched greedy decode steps over many slots, and a slot's state as
// bytes.
//
// Batch invariance. llama.cpp's CPU kernels choose their code path by batch size: K-quant weights repacked for
// SIMD run a 4-row GEMM or a 1-row GEMV, the tiled K-quant matmul takes over from 8 rows, and flash attention
// splits one query's cells over threads from 512 cells on with a single stream. Each path sums in another order,
// so a row decoded in a batch of 16 can differ in its last bits from the same row decoded alone, and a greedy
// answer can then take another token. With `batch_invariant` the context uses one path at every batch size: no
// repacked weights, the tiled matmul forced (GGML_CPU_TILED_MM_FORCE=1, read once per process by ggml, so the
// choice is fixed for the process by the first engine), flash attention off, and per-slot KV sizes that are
// multiples of llama.cpp's 256-cell padding (a longer masked tail then only adds exact zeros). A row's logits then
// do not depend on what it is batched with (tests/llamacpp/test_sweep.cpp checks it bit for bit).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include "prefill_capture.hpp"
#include "fairkv/llamacpp/state_format.hpp"
#include "tokenizer.hpp"  // llama::byte_range, llama::encoding (the runner's segment mapping reads them)

namespace llamacpp {

struct context_options {
  int n_ctx = 4096;                  // tokens per slot (rounded up to a multiple of 256)
  int n_batch = 512;                 // tokens per llama_decode call (prefill chunk)
  int threads = 0;                   // 0: llama.cpp's default
  int flash_attn = -1;               // -1 auto, 0 off (V transposed in the cache), 1 on
  ggml_type type_k = GGML_TYPE_F16;  // a quantised type is accepted by llama.cpp and refused by the compressor
  ggml_type type_v = GGML_TYPE_F16;
  int n_slots = 1;                   // sequences held at once (llama.cpp's n_seq_max, one KV stream each)
  bool batch_invariant = false;      // every row computed as alone, whatever it is batched with (see above)
};

inline constexpr int max_slots = 256;  // LLAMA_MAX_SEQ of the pinned llama.cpp
inline constexpr int kv_padding = 256;  // llama.cpp pads the attended cells to a multiple of this

class engine;

// A sequence held in one slot of the engine's context: move-only, its cells freed when it is destroyed.
class slot {
 public:
  slot() = default;
  slot(slot&& o) noexcept : eng_(std::exchange(o.eng_, nullptr)), seq_(o.seq_), next_(o.next_) {}
  slot& operator=(slot&& o) noexcept {
    if (this != &o) {
      release();
      eng_ = std::exchange(o.eng_, nullptr), seq_ = o.seq_, next_ = o.next_;
    }
    return *this;
  }
  slot(const slot&) = delete;
  slot& operator=(const slot&) = delete;
  ~slot() { release(); }

  explicit operator bool() const { return eng_ != nullptr; }
  llama_seq_id id() const { return seq_; }
  llama_pos next_pos() const { return next_; }

 private:
  friend class engine;
  slot(engine* e, llama_seq_id s) : eng_(e), seq_(s) {}
  void release();
  engine* eng_ = nullptr;
  llama_seq_id seq_ = -1;
  llama_pos next_ = 0;  // the position of the next token fed
};

// Generation stops on any end-of-generation token of the vocabulary (<|im_end|>, <|endoftext|>, eos).
struct stop_tokens {
  const llama_vocab* vocab = nullptr;
  bool contains(int32_t id) const { return llama_vocab_is_eog(vocab, id); }
};

// A loaded GGUF (llama.cpp's llama_model) and its vocabulary: shape, tokenisation with byte offsets, rendering.
class model {
 public:
  // batch_invariant: load without repacked weights (they switch between GEMV and GEMM by batch size).
  model(const std::string& path, bool batch_invariant) : batch_invariant_(batch_invariant) {
    fix_kernels(batch_invariant);
    static const bool backend_ready = [] {
      llama_log_set([](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) std::fputs(text, stderr);
      }, nullptr);
      llama_backend_init();
      return true;
    }();
    (void)backend_ready;
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = !batch_invariant;
    model_.reset(llama_model_load_from_file(path.c_str(), mp));
    if (!model_) throw std::runtime_error("llama.cpp could not load '" + path + "'");
    vocab_ = llama_model_get_vocab(model_.get());
    n_layer_ = llama_model_n_layer(model_.get());
    n_head_ = llama_model_n_head(model_.get());
    n_head_kv_ = llama_model_n_head_kv(model_.get());
    head_dim_ = llama_model_n_embd(model_.get()) / n_head_;
    const std::string arch = meta("general.architecture");
    check_positive_hparams(path, arch);
    if (const std::string kl = meta(arch + ".attention.key_length"); !kl.empty()) head_dim_ = std::atoi(kl.c_str());
    scale_ = 1.0f / std::sqrt(float(head_dim_));
    if (const std::string sc = meta(arch + ".attention.scale"); !sc.empty()) scale_ = std::strtof(sc.c_str(), nullptr);
  }

  llama_model* get() const { return model_.get(); }
  const llama_vocab* vocab() const { return vocab_; }
  bool batch_invariant() const { return batch_invariant_; }
  int n_layer() const { return n_layer_; }
  int n_head() const { return n_head_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  float attention_scale() const { return scale_; }
  int n_vocab() const { return llama_vocab_n_tokens(vocab_); }
  int n_ctx_train() const { return llama_model_n_ctx_train(model_.get()); }
  bool mrope() const {
    const llama_rope_type r = llama_model_rope_type(model_.get());
    return r == LLAMA_ROPE_TYPE_MROPE || r == LLAMA_ROPE_TYPE_IMROPE || r == LLAMA_ROPE_TYPE_VISION;
  }
  stop_tokens stops() const { return {vocab_}; }

  // Tokens of `text` (special-token text parsed when parse_special, no BOS added: the chat template spells every
  // token) and the byte range of each, from the pieces llama.cpp renders; they must concatenate back to the text.
  llama::encoding encode_with_offsets(std::string_view text, bool parse_special = true) const {
    llama::encoding e;
    const int n = -llama_tokenize(vocab_, text.data(), int32_t(text.size()), nullptr, 0, false, parse_special);
    e.ids.resize(size_t(n > 0 ? n : 0));
    if (n > 0 && llama_tokenize(vocab_, text.data(), int32_t(text.size()), e.ids.data(), n, false, parse_special) != n)
      throw std::runtime_error("llama_tokenize failed");
    size_t at = 0;
    for (llama_token id : e.ids) {
      const std::string p = piece(id, parse_special);
      if (text.compare(at, p.size(), p) != 0)
        throw std::runtime_error("token pieces do not reproduce the text at byte " + std::to_string(at) +
                                 " (cannot map segments to tokens)");
      e.offsets.push_back({at, at + p.size()});
      at += p.size();
    }
    if (at != text.size()) throw std::runtime_error("token pieces cover " + std::to_string(at) + " of " +
                                                    std::to_string(text.size()) + " bytes");
    return e;
  }
  llama::encoding tokenize(std::string_view text) const { return encode_with_offsets(text, true); }
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const {
    return encode_with_offsets(text, parse_special).ids;
  }
  std::string piece(llama_token id, bool special) const {
    char buf[256];
    const int n = llama_token_to_piece(vocab_, id, buf, sizeof buf, 0, special);
    if (n < 0) {
      std::string big(size_t(-n), '\0');
      llama_token_to_piece(vocab_, id, big.data(), -n, 0, special);
      return big;
    }
    return std::string(buf, size_t(n));
  }
  std::string detokenize(const std::vector<llama_token>& ids) const {
    std::string s;
    for (llama_token t : ids) s += piece(t, false);
    return s;
  }


 private:
  // llama.cpp loads a GGUF whose norm epsilon or RoPE base is negative, NaN or infinite, then aborts in a
  // GGML_ASSERT at the first decode (or computes NaN): refuse it by name at load, as fairkv-llama does. Read with
  // gguf itself, not llama_model_meta_val_str, whose 6 decimals would print an epsilon of 1e-7 as 0.
  static void check_positive_hparams(const std::string& path, const std::string& arch) {
    const gguf_init_params gp{/*no_alloc=*/true, /*ctx=*/nullptr};
    const std::unique_ptr<gguf_context, decltype(&gguf_free)> g(gguf_init_from_file(path.c_str(), gp), &gguf_free);
    if (!g) throw std::runtime_error("'" + path + "': gguf could not read the metadata llama.cpp loaded");
    for (const char* k : {".attention.layer_norm_rms_epsilon", ".attention.layer_norm_epsilon", ".rope.freq_base",
                          ".attention.scale"}) {
      const std::string key = arch + k;
      const int64_t id = gguf_find_key(g.get(), key.c_str());
      if (id < 0) continue;
      const gguf_type t = gguf_get_kv_type(g.get(), id);
      if (t != GGUF_TYPE_FLOAT32 && t != GGUF_TYPE_FLOAT64) continue;  // llama.cpp refuses other types itself
      const double x = t == GGUF_TYPE_FLOAT32 ? double(gguf_get_val_f32(g.get(), id)) : gguf_get_val_f64(g.get(), id);
      if (!std::isfinite(x) || !(x > 0))
        throw std::runtime_error("'" + path + "': " + key + " = " + std::to_string(x) +
                                 " must be a positive finite number");
    }
  }
  std::string meta(const std::string& key) const {
    char buf[256];
    const int n = llama_model_meta_val_str(model_.get(), key.c_str(), buf, sizeof buf);
    return n > 0 && n < int(sizeof buf) ? std::string(buf, size_t(n)) : std::string();
  }

  // ggml reads GGML_CPU_TILED_MM_FORCE once per process, at the first small matmul: the first model of the process
  // fixes the choice, and a model asking for the other one afterwards is refused rather than silently served.
  static void fix_kernels(bool batch_invariant) {
    static std::optional<bool> fixed;
    const char* env = std::getenv("GGML_CPU_TILED_MM_FORCE");
    const bool forced = env != nullptr && std::atoi(env) == 1;
    if (!fixed) {
      if (batch_invariant && !forced) ::setenv("GGML_CPU_TILED_MM_FORCE", "1", 1);
      fixed = batch_invariant || forced;
      return;
    }
    if (batch_invariant && !*fixed)
      throw std::runtime_error("batch-invariant decoding must be chosen by the first llama.cpp model of the process "
                               "(ggml fixes its matmul kernels once): start the process with GGML_CPU_TILED_MM_FORCE=1");
  }

  struct model_free { void operator()(llama_model* m) const { llama_model_free(m); } };
  std::unique_ptr<llama_model, model_free> model_;
  const llama_vocab* vocab_ = nullptr;
  bool batch_invariant_ = false;
  int n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0;
  float scale_ = 1.0f;
};

class engine {
 public:
  // A context of o.n_slots slots over a model loaded for it (o.batch_invariant decides how), or over `m`.
  engine(const std::string& model_path, const context_options& o)
      : engine(std::make_shared<const model>(model_path, o.batch_invariant), o) {}
  engine(std::shared_ptr<const model> m, const context_options& o) : opt_(o), model_(std::move(m)) {
    if (!model_) throw std::logic_error("llamacpp::engine: no model");
    if (o.n_slots < 1 || o.n_slots > max_slots)
      throw std::runtime_error("llama.cpp context: " + std::to_string(o.n_slots) + " slots, expected [1, " +
                               std::to_string(max_slots) + "]");
    if (o.batch_invariant && !model_->batch_invariant())
      throw std::logic_error("llamacpp::engine: a batch-invariant context needs a model loaded for it");
    if (o.batch_invariant && o.flash_attn == 1)
      throw std::runtime_error("batch-invariant decoding needs flash attention off (its single-stream path splits "
                               "long rows over threads)");
    capture_.init(n_layer(), n_head(), n_head_kv(), head_dim(), model_->attention_scale());
    slot_cells_ = round_up(std::max(o.n_ctx, 1), kv_padding);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(slot_cells_) * uint32_t(o.n_slots);
    cp.n_batch = cp.n_ubatch = uint32_t(o.n_batch);
    cp.n_seq_max = uint32_t(o.n_slots);
    cp.kv_unified = false;  // one stream per slot: a slot's cells are laid out as if it were alone
    if (o.threads > 0) cp.n_threads = cp.n_threads_batch = o.threads;
    const int fa = o.batch_invariant ? 0 : o.flash_attn;
    cp.flash_attn_type = fa < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                                : (fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED);
    cp.type_k = o.type_k;
    cp.type_v = o.type_v;
    cp.cb_eval = &prefill_capture::callback;
    cp.cb_eval_user_data = &capture_;
    cp.no_perf = true;
    ctx_.reset(llama_init_from_model(model_->get(), cp));
    if (!ctx_) {
      std::string why = "llama.cpp could not create a context (" + std::to_string(o.n_slots) + " slots of " +
                        std::to_string(slot_cells_) + " cells)";
      if (o.type_v != GGML_TYPE_F16 && o.type_v != GGML_TYPE_F32 && fa != 1)
        why += ": a quantised V cache needs flash attention (--flash-attn on)";
      throw std::runtime_error(why);
    }
    for (int s = o.n_slots - 1; s >= 0; --s) free_.push_back(s);
  }

  llama_context* ctx() const { return ctx_.get(); }
  const model& mdl() const { return *model_; }
  const llama_vocab* vocab() const { return model_->vocab(); }
  const context_options& options() const { return opt_; }
  int n_layer() const { return model_->n_layer(); }
  int n_head() const { return model_->n_head(); }
  int n_head_kv() const { return model_->n_head_kv(); }
  int head_dim() const { return model_->head_dim(); }
  int n_vocab() const { return model_->n_vocab(); }
  int n_ctx_train() const { return model_->n_ctx_train(); }
  int slot_cells() const { return slot_cells_; }
  // Flash attention is off in this context: llama.cpp materialises the softmax the statistics are read from.
  bool flash_attn_off() const { return opt_.batch_invariant || opt_.flash_attn == 0; }
  prefill_capture& capture() { return capture_; }
  stop_tokens stops() const { return model_->stops(); }
  llama::encoding encode_with_offsets(std::string_view text, bool parse_special = true) const {
    return model_->encode_with_offsets(text, parse_special);
  }
  llama::encoding tokenize(std::string_view text) const { return model_->tokenize(text); }
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const {
    return model_->encode(text, parse_special);
  }
  std::string detokenize(const std::vector<llama_token>& ids) const { return model_->detokenize(ids); }

  // ---- slots --------------------------------------------------------------------------------------------------
  // An empty slot; throws when all are taken (the caller sized n_slots for its batch).
  slot acquire() {
    if (free_.empty())
      throw std::logic_error("llamacpp::engine: all " + std::to_string(opt_.n_slots) + " slots are taken");
    slot s(this, free_.back());
    free_.pop_back();
    return s;
  }
  int free_slots() const { return int(free_.size()); }

  // Feeds `ids` to the slot after its last token, in chunks of n_batch; returns the logits after the last one.
  // `capture`: the statistics of prefill_capture over these tokens (the slot must be empty).
  std::vector<float> feed(slot& s, std::span<const llama_token> ids, const llama::capture_options& capture = {}) {
    check_slot(s);
    if (ids.empty()) throw std::runtime_error("llamacpp::engine::feed: no token");
    if (capture.any()) {
      if (s.next_ != 0) throw std::logic_error("llamacpp::engine::feed: statistics are captured from an empty slot");
      if ((capture.column_sums || capture.last_rows > 0 || !capture.local_regions.empty()) && !flash_attn_off())
        throw std::logic_error("llamacpp::engine::feed: attention statistics need flash attention off");
      capture_.start(capture, int(ids.size()));
    }
    batch b(std::min<size_t>(ids.size(), size_t(opt_.n_batch)));
    for (size_t i = 0; i < ids.size(); i += size_t(opt_.n_batch)) {
      const int n = int(std::min(ids.size() - i, size_t(opt_.n_batch)));
      b.b.n_tokens = n;
      for (int j = 0; j < n; ++j) b.set(j, ids[i + size_t(j)], s.next_ + j, s.seq_, i + size_t(j) + 1 == ids.size());
      decode_batch(b.b);
      s.next_ += n;
    }
    capture_.stop();
    if (!capture_.error().empty()) throw std::runtime_error("prefill statistics: " + capture_.error());
    return row_logits(-1);
  }

  // One decode step of several slots: tokens[i] is appended to *slots[i]. Returns the logits [slots][n_vocab]. With
  // batch_invariant, row i is bit-identical to feed(*slots[i], {tokens[i]}) whatever the other rows are.
  std::vector<float> decode(std::span<slot* const> slots, std::span<const int32_t> tokens) {
    const size_t n = slots.size();
    if (n == 0 || tokens.size() != n)
      throw std::runtime_error("llamacpp::engine::decode: need one token per slot, got " + std::to_string(tokens.size()) +
                               " tokens for " + std::to_string(n) + " slots");
    const size_t nv = size_t(n_vocab());
    std::vector<float> logits(n * nv);
    batch b(std::min(n, size_t(opt_.n_batch)));
    for (size_t i = 0; i < n; i += size_t(opt_.n_batch)) {
      const int m = int(std::min(n - i, size_t(opt_.n_batch)));
      b.b.n_tokens = m;
      for (int j = 0; j < m; ++j) {
        slot& s = *slots[i + size_t(j)];
        check_slot(s);
        b.set(j, tokens[i + size_t(j)], s.next_, s.seq_, true);
      }
      decode_batch(b.b);
      for (int j = 0; j < m; ++j) {
        ++slots[i + size_t(j)]->next_;
        const float* p = llama_get_logits_ith(ctx_.get(), j);
        if (!p) throw std::runtime_error("llama.cpp returned no logits");
        std::copy(p, p + nv, logits.begin() + std::ptrdiff_t((i + size_t(j)) * nv));
      }
    }
    return logits;
  }

  // Drops the slot's positions [p0, inf).
  void truncate(slot& s, llama_pos p0) {
    check_slot(s);
    llama_memory_seq_rm(memory(), s.seq_, p0, -1);
    const llama_pos last = llama_memory_seq_pos_max(memory(), s.seq_);
    s.next_ = last < 0 ? 0 : last + 1;
  }

  // llama.cpp's context shift on the slot (its completion tool's, with llama_memory_seq_rm / seq_add): positions
  // [n_keep, n_keep + n_discard) removed, the later ones moved down by n_discard (llama.cpp re-rotates their keys at
  // the next decode).
  void shift(slot& s, llama_pos n_keep, llama_pos n_discard) {
    check_slot(s);
    if (n_discard <= 0) return;
    if (!llama_memory_can_shift(memory())) throw std::runtime_error("llama.cpp cannot shift this model's cache");
    llama_memory_seq_rm(memory(), s.seq_, n_keep, n_keep + n_discard);
    llama_memory_seq_add(memory(), s.seq_, n_keep + n_discard, s.next_, -n_discard);
    s.next_ -= n_discard;
  }
  bool can_shift() const { return llama_memory_can_shift(memory()); }
  // Positions the slot holds (its cells: positions are contiguous after a compaction and after a shift).
  int cells(const slot& s) const {
    check_slot(s);
    const llama_pos lo = llama_memory_seq_pos_min(memory(), s.seq_), hi = llama_memory_seq_pos_max(memory(), s.seq_);
    return hi < 0 ? 0 : int(hi - lo + 1);
  }

  // The slot's sequence state (llama_state_seq_get_data), and loading one into a slot (replacing what it held).
  std::vector<uint8_t> get_state(const slot& s) const {
    check_slot(s);
    std::vector<uint8_t> bytes(llama_state_seq_get_size(ctx_.get(), s.seq_));
    if (bytes.empty() || llama_state_seq_get_data(ctx_.get(), bytes.data(), bytes.size(), s.seq_) != bytes.size())
      throw std::runtime_error("llama_state_seq_get_data failed");
    return bytes;
  }
  // false if llama.cpp refused the state (the slot is then empty).
  bool set_state(slot& s, std::span<const uint8_t> bytes) {
    check_slot(s);
    const bool ok = llama_state_seq_set_data(ctx_.get(), bytes.data(), bytes.size(), s.seq_) == bytes.size();
    const llama_pos last = llama_memory_seq_pos_max(memory(), s.seq_);
    s.next_ = ok && last >= 0 ? last + 1 : 0;
    return ok;
  }
  // A new slot holding a copy of s.
  slot fork(const slot& s) {
    slot f = acquire();
    if (!set_state(f, get_state(s))) throw std::runtime_error("llama.cpp refused a copy of its own state");
    return f;
  }

  fairkv::llamacpp::state_expectations expectations() const {
    fairkv::llamacpp::state_expectations w;
    w.version = LLAMA_STATE_SEQ_VERSION;
    w.n_layer = uint32_t(n_layer());
    w.n_embd_k = w.n_embd_v = uint32_t(n_head_kv() * head_dim());
    w.n_stream = uint32_t(opt_.n_slots);
    w.cell_ext = model_->mrope();
    return w;
  }
  fairkv::llamacpp::state_shape state_shape() const { return {expectations(), n_head_kv(), head_dim()}; }

  // ---- the first slot, for callers with one sequence (tests) ------------------------------------------------
  slot& main() {
    if (!main_) main_ = acquire();
    return main_;
  }
  void feed(const std::vector<llama_token>& ids, const llama::capture_options& capture = {}) {
    main_logits_ = feed(main(), ids, capture);
  }
  std::vector<float> last_logits() const {
    if (main_logits_.empty()) throw std::runtime_error("llama.cpp returned no logits");
    return main_logits_;
  }
  static llama_token argmax(std::span<const float> logits) {
    // the lowest id among equal maxima, as the runner
    return llama_token(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Greedy answer to the already fed prompt of the first slot, up to max_new tokens or an end-of-generation token.
  std::vector<llama_token> generate(int max_new) {
    std::vector<llama_token> out;
    for (int i = 0; i < max_new; ++i) {
      const llama_token t = argmax(main_logits_);
      if (stops().contains(t)) break;
      out.push_back(t);
      if (i + 1 == max_new) break;
      feed({t});
    }
    return out;
  }
  void truncate(llama_pos p0) { truncate(main(), p0); }
  llama_pos last_pos() { return main().next_pos() - 1; }
  std::vector<uint8_t> get_state() { return get_state(main()); }
  bool set_state(const std::vector<uint8_t>& s) { return set_state(main(), s); }

 private:
  friend class slot;
  static int round_up(int n, int m) { return (n + m - 1) / m * m; }

  // A llama_batch of one sequence id per token, freed with it.
  struct batch {
    llama_batch b;
    explicit batch(size_t n) : b(llama_batch_init(int32_t(n), 0, 1)) {}
    ~batch() { llama_batch_free(b); }
    batch(const batch&) = delete;
    batch& operator=(const batch&) = delete;
    void set(int j, llama_token t, llama_pos p, llama_seq_id s, bool logits) {
      b.token[j] = t;
      b.pos[j] = p;
      b.n_seq_id[j] = 1;
      b.seq_id[j][0] = s;
      b.logits[j] = logits;
    }
  };

  void check_slot(const slot& s) const {
    if (s.eng_ != this) throw std::logic_error("llamacpp::engine: a slot of another engine, or an empty one");
  }
  void release(llama_seq_id seq) {
    llama_memory_seq_rm(memory(), seq, -1, -1);
    free_.push_back(seq);
  }
  void decode_batch(const llama_batch& b) {
    const int rc = llama_decode(ctx_.get(), b);
    if (rc != 0) {
      capture_.stop();
      throw std::runtime_error("llama_decode failed (" + std::to_string(rc) + ")");
    }
  }
  std::vector<float> row_logits(int i) const {
    const float* p = llama_get_logits_ith(ctx_.get(), i);
    if (!p) throw std::runtime_error("llama.cpp returned no logits");
    return {p, p + n_vocab()};
  }
  llama_memory_t memory() const { return llama_get_memory(ctx_.get()); }

  struct ctx_free { void operator()(llama_context* c) const { llama_free(c); } };
  context_options opt_;
  std::shared_ptr<const model> model_;
  std::unique_ptr<llama_context, ctx_free> ctx_;
  int slot_cells_ = 0;
  prefill_capture capture_;
  std::vector<llama_seq_id> free_;
  slot main_;  // declared after ctx_: released before the context is freed
  std::vector<float> main_logits_;
};

inline void slot::release() {
  if (eng_) eng_->release(seq_);
  eng_ = nullptr;
}

}  // namespace llamacpp
