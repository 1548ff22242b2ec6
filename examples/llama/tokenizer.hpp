// Byte-level BPE tokenizer (GPT-2 family) built from a GGUF file's tokenizer.ggml.* metadata.
//
// Pipeline, as in HF tokenizers and llama.cpp:
//   1. special tokens (control / user-defined entries of the vocabulary, e.g. <|im_start|>) are cut out as whole
//      pieces, leftmost-longest, when parse_special is true;
//   2. each remaining fragment is pre-tokenized: for tokenizer.ggml.pre = "smollm" (and the StarCoder family that
//      shares it) every \p{N} code point is first isolated, then the GPT-2 regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      splits each stretch ("gpt2" uses the regex alone; "llama-bpe" / "qwen2" use the Llama-3 regex, see
//      llama3_match). The regexes are matched by hand (std::regex has no Unicode classes) with the class table
//      of unicode_table.hpp, and checked against Python's `regex` module on random strings in the tests;
//   3. each pre-token's bytes are mapped to the GPT-2 "byte to unicode" alphabet and merged by merge rank.
// Invalid UTF-8 is accepted: each invalid byte counts as one code point of the "other" class, so encode never
// fails. A byte whose single-byte symbol is not in the vocabulary (SmolLM2 lacks 21: 0x04, 0x06, 0x13, 0x14,
// 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF) is dropped when no merge covers it, as HF tokenizers and
// llama.cpp do; so decode(encode(s)) == s for valid UTF-8 without those bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf.hpp"
#include "unicode_table.hpp"

namespace llama {

struct byte_range {
  size_t begin = 0, end = 0;  // [begin, end) in bytes of the encoded text
  friend bool operator==(const byte_range&, const byte_range&) = default;
};

// encode() plus where each token came from: offsets[i] is the byte range of ids[i] in the input text.
struct encoding {
  std::vector<int32_t> ids;
  std::vector<byte_range> offsets;
};

namespace unicode {

enum class cp_class : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

inline cp_class classify(uint32_t cp) noexcept {
  if (cp < 0x80) {  // fast path: ASCII
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return cp_class::space;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return cp_class::letter;
    if (cp >= '0' && cp <= '9') return cp_class::number;
    return cp_class::other;
  }
  for (const class_range& r : white_space_ranges)
    if (cp >= r.first && cp <= r.last) return cp_class::space;
  const class_range* lo = std::begin(letter_number_ranges);
  const class_range* hi = std::end(letter_number_ranges);
  // first range whose last >= cp
  const class_range* it = std::lower_bound(lo, hi, cp, [](const class_range& r, uint32_t c) { return r.last < c; });
  if (it != hi && it->first <= cp) return static_cast<cp_class>(it->cls);
  return cp_class::other;
}

// Length in bytes of the UTF-8 sequence starting at s[i] and its code point; an invalid or truncated sequence
// yields length 1 and an invalid code point (0x110000, class "other").
inline size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  auto c = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  cp = 0x110000;
  if (b0 < 0x80) { cp = b0; return 1; }
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) { cp = ((b0 & 0x1Fu) << 6) | c(1); return 2; }
  if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    uint32_t v = ((b0 & 0x0Fu) << 12) | (c(1) << 6) | c(2);
    if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) { cp = v; return 3; }
    return 1;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    uint32_t v = ((b0 & 0x07u) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
    if (v >= 0x10000 && v <= 0x10FFFF) { cp = v; return 4; }
    return 1;
  }
  return 1;
}

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace unicode

namespace detail {

// The text split into code points with their class: the pre-tokenizer works on this.
struct cp_seq {
  std::vector<uint32_t> byte_pos;            // [n + 1] byte offset of each code point (+ the end)
  std::vector<unicode::cp_class> cls;        // [n]
  std::vector<uint32_t> cp;                  // [n]
  size_t size() const { return cls.size(); }
};

inline cp_seq split_code_points(std::string_view s, size_t base) {
  cp_seq q;
  q.byte_pos.reserve(s.size() + 1);
  q.cls.reserve(s.size());
  q.cp.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = unicode::decode_utf8(s, i, cp);
    q.byte_pos.push_back(static_cast<uint32_t>(base + i));
    q.cls.push_back(cp > 0x10FFFF ? unicode::cp_class::other : unicode::classify(cp));
    q.cp.push_back(cp);
    i += n;
  }
  q.byte_pos.push_back(static_cast<uint32_t>(base + s.size()));
  return q;
}

// Length (in code points) of the GPT-2 regex match at code point i of [i, end). Always >= 1.
inline size_t gpt2_match(const cp_seq& q, size_t i, size_t end) {
  using unicode::cp_class;
  auto cls = [&](size_t k) { return q.cls[k]; };
  auto run = [&](size_t k, auto pred) {
    while (k < end && pred(cls(k))) ++k;
    return k;
  };
  const uint32_t c0 = q.cp[i];
  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2)
  if (c0 == '\'' && i + 1 < end) {
    const uint32_t c1 = q.cp[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (i + 2 < end) {
      const uint32_t c2 = q.cp[i + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }
  // ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: the optional prefix is U+0020 only.
  const size_t j = (c0 == ' ' && i + 1 < end) ? i + 1 : i;
  const cp_class cj = cls(j);
  if (j < end && cj != cp_class::space) {
    if (cj == cp_class::letter) return run(j, [](cp_class c) { return c == cp_class::letter; }) - i;
    if (cj == cp_class::number) return run(j, [](cp_class c) { return c == cp_class::number; }) - i;
    return run(j, [](cp_class c) { return c == cp_class::other; }) - i;
  }
  // \s+(?!\S) then \s+: a whitespace run, minus its last code point when a non-space follows (that one then
  // starts the next match, typically as the optional space of ` ?\p{L}+`).
  const size_t k = run(i, [](cp_class c) { return c == cp_class::space; });
  if (k == end || k - i == 1) return k - i;
  return k - i - 1;
}

// Length (in code points) of the Llama-3 regex match at code point i of [i, end). Always >= 1.
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with D = 3 (Llama 3) or 1 (Qwen2). The case-insensitive contractions are matched for ASCII letters only (the
// regex engines would also fold e.g. U+017F LATIN SMALL LETTER LONG S to 's').
inline size_t llama3_match(const cp_seq& q, size_t i, size_t end, size_t max_digits) {
  using unicode::cp_class;
  auto cls = [&](size_t k) { return q.cls[k]; };
  auto lower = [&](size_t k) { const uint32_t c = q.cp[k]; return c >= 'A' && c <= 'Z' ? c + 32 : c; };
  auto is_nl = [&](size_t k) { return q.cp[k] == '\r' || q.cp[k] == '\n'; };
  auto run = [&](size_t k, auto pred) {
    while (k < end && pred(k)) ++k;
    return k;
  };
  auto letters = [&](size_t k) { return run(k, [&](size_t x) { return cls(x) == cp_class::letter; }); };
  if (q.cp[i] == '\'' && i + 1 < end) {
    const uint32_t c1 = lower(i + 1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (i + 2 < end) {
      const uint32_t c2 = lower(i + 2);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }
  const cp_class c0 = cls(i);
  if (c0 == cp_class::letter) return letters(i) - i;
  if (c0 != cp_class::number && !is_nl(i) && i + 1 < end && cls(i + 1) == cp_class::letter) return letters(i + 1) - i;
  if (c0 == cp_class::number) {
    size_t k = i;
    while (k < end && k - i < max_digits && cls(k) == cp_class::number) ++k;
    return k - i;
  }
  const size_t j = (q.cp[i] == ' ' && i + 1 < end) ? i + 1 : i;
  if (cls(j) == cp_class::other) {
    const size_t k = run(j, [&](size_t x) { return cls(x) == cp_class::other; });
    return run(k, is_nl) - i;
  }
  // Whitespace: up to the last \r or \n of the run if it has one, else as in GPT-2.
  const size_t k = run(i, [&](size_t x) { return cls(x) == cp_class::space; });
  for (size_t p = k; p > i; --p)
    if (is_nl(p - 1)) return p - i;
  if (k == end || k - i == 1) return k - i;
  return k - i - 1;
}

// GPT-2's reversible byte -> printable code point mapping.
struct byte_alphabet {
  uint32_t to_cp[256];
  int16_t from_cp[324];  // inverse, for code points < 324 (all images are < 324); -1 = not a byte image
  byte_alphabet() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t{-1});
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
  static const byte_alphabet& get() {
    static const byte_alphabet a;
    return a;
  }
};

}  // namespace detail

class tokenizer {
 public:
  enum class pre_kind { gpt2, digits_then_gpt2, llama3, qwen2 };

  static tokenizer from_gguf(const gguf::file& f) {
    tokenizer t;
    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2")
      throw std::runtime_error("tokenizer: tokenizer.ggml.model '" + model +
                               "' is not supported (only byte-level BPE, 'gpt2')");
    t.pre_name_ = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
    // llama.cpp groups these names with the same two-step split; the others below use the plain GPT-2 regex.
    static const char* digits_family[] = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"};
    static const char* gpt2_family[] = {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"};
    static const char* llama3_family[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "smaug-bpe", "dbrx"};
    static const char* qwen2_family[] = {"qwen2", "deepseek-r1-qwen"};
    auto in = [&](const auto& family) {
      return std::find(std::begin(family), std::end(family), t.pre_name_) != std::end(family);
    };
    if (in(digits_family))
      t.pre_ = pre_kind::digits_then_gpt2;
    else if (in(gpt2_family))
      t.pre_ = pre_kind::gpt2;
    else if (in(llama3_family))
      t.pre_ = pre_kind::llama3;
    else if (in(qwen2_family))
      t.pre_ = pre_kind::qwen2;
    else
      throw std::runtime_error("tokenizer: pre-tokenizer '" + t.pre_name_ +
                               "' is not supported (supported: the GPT-2 regex alone ('gpt2') or after isolating "
                               "digits ('smollm', 'starcoder'), and the Llama-3 / Qwen2 regex ('llama-bpe', 'qwen2'))");

    t.tokens_ = f.get_string_array("tokenizer.ggml.tokens");
    if (t.tokens_.empty() || t.tokens_.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      throw std::runtime_error("tokenizer: bad vocabulary size " + std::to_string(t.tokens_.size()));
    const size_t n = t.tokens_.size();
    t.types_ = f.has("tokenizer.ggml.token_type") ? f.get_i32_array("tokenizer.ggml.token_type")
                                                  : std::vector<int32_t>(n, token_type_normal);
    if (t.types_.size() != n)
      throw std::runtime_error("tokenizer: token_type has " + std::to_string(t.types_.size()) + " entries for " +
                               std::to_string(n) + " tokens");
    t.index_.reserve(n * 2);
    for (size_t id = 0; id < n; ++id) t.index_.emplace(t.tokens_[id], static_cast<int32_t>(id));  // first wins

    const std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
    t.merge_rank_.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
      // "left right": byte-level symbols never contain U+0020 (the space byte maps to U+0120), so the first
      // space separates the pair.
      if (merges[r].find(' ') == std::string::npos)
        throw std::runtime_error("tokenizer: merge " + std::to_string(r) + " has no space: '" + merges[r] + "'");
      t.merge_rank_.emplace(merges[r], static_cast<int32_t>(r));
    }

    // Whole-piece tokens: control (3) and user-defined (4) entries.
    for (size_t id = 0; id < n; ++id)
      if ((t.types_[id] == token_type_control || t.types_[id] == token_type_user_defined) && !t.tokens_[id].empty())
        t.specials_.push_back(static_cast<int32_t>(id));
    std::stable_sort(t.specials_.begin(), t.specials_.end(),
                     [&](int32_t a, int32_t b) { return t.tokens_[a].size() > t.tokens_[b].size(); });

    auto id_or = [&](const char* key, int32_t fallback) {
      if (!f.has(key)) return fallback;
      const uint32_t v = f.get_u32(key);
      if (v >= n) throw std::runtime_error(std::string("tokenizer: ") + key + " = " + std::to_string(v) + " is out of range");
      return static_cast<int32_t>(v);
    };
    t.bos_ = id_or("tokenizer.ggml.bos_token_id", -1);
    t.eos_ = id_or("tokenizer.ggml.eos_token_id", -1);
    t.unk_ = id_or("tokenizer.ggml.unknown_token_id", -1);
    t.add_bos_ = f.has("tokenizer.ggml.add_bos_token") && f.get_bool("tokenizer.ggml.add_bos_token");

    // Byte fallback: every byte's single-symbol token (-1 when absent), used if a merged symbol is not in the
    // vocabulary.
    const auto& alpha = detail::byte_alphabet::get();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, alpha.to_cp[b]);
      auto it = t.index_.find(s);
      t.byte_token_[b] = it == t.index_.end() ? -1 : it->second;
    }
    return t;
  }

  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const {
    return encode_with_offsets(text, parse_special).ids;
  }

  encoding encode_with_offsets(std::string_view text, bool parse_special = true) const {
    encoding out;
    size_t frag_begin = 0;
    size_t i = 0;
    while (i < text.size()) {
      const int32_t sp = parse_special ? special_at(text, i) : -1;
      if (sp < 0) {
        ++i;
        continue;
      }
      encode_fragment(text.substr(frag_begin, i - frag_begin), frag_begin, out);
      const size_t len = tokens_[sp].size();
      out.ids.push_back(sp);
      out.offsets.push_back({i, i + len});
      i += len;
      frag_begin = i;
    }
    encode_fragment(text.substr(frag_begin), frag_begin, out);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) append_token_text(out, id);
    return out;
  }

  // The bytes one token stands for (special tokens: their text).
  std::string token_text(int32_t id) const {
    std::string out;
    append_token_text(out, id);
    return out;
  }

  int32_t bos() const { return bos_; }
  // Whether the model expects BOS first (tokenizer.ggml.add_bos_token; false when absent). encode() never adds it.
  bool add_bos() const { return add_bos_; }
  int32_t eos() const { return eos_; }
  int32_t token_id(std::string_view piece) const {
    auto it = index_.find(std::string(piece));
    return it == index_.end() ? -1 : it->second;
  }
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  bool is_special(int32_t id) const {
    return id >= 0 && id < vocab_size() &&
           (types_[id] == token_type_control || types_[id] == token_type_user_defined);
  }
  const std::string& pre_tokenizer_name() const { return pre_name_; }
  pre_kind pre_tokenizer() const { return pre_; }

  // The pre-tokenizer alone (no BPE), as byte ranges of `text`: exposed for tests and debugging.
  std::vector<byte_range> pre_tokenize(std::string_view text, size_t base = 0) const {
    std::vector<byte_range> out;
    const detail::cp_seq q = detail::split_code_points(text, base);
    auto split_gpt2 = [&](size_t b, size_t e) {
      for (size_t i = b; i < e;) {
        const size_t m = detail::gpt2_match(q, i, e);
        out.push_back({q.byte_pos[i], q.byte_pos[i + m]});
        i += m;
      }
    };
    if (pre_ == pre_kind::gpt2) {
      split_gpt2(0, q.size());
      return out;
    }
    if (pre_ == pre_kind::llama3 || pre_ == pre_kind::qwen2) {
      const size_t max_digits = pre_ == pre_kind::llama3 ? 3 : 1;
      for (size_t i = 0; i < q.size();) {
        const size_t m = detail::llama3_match(q, i, q.size(), max_digits);
        out.push_back({q.byte_pos[i], q.byte_pos[i + m]});
        i += m;
      }
      return out;
    }
    size_t start = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      if (q.cls[i] != unicode::cp_class::number) continue;
      split_gpt2(start, i);
      out.push_back({q.byte_pos[i], q.byte_pos[i + 1]});
      start = i + 1;
    }
    split_gpt2(start, q.size());
    return out;
  }

  static constexpr int32_t token_type_normal = 1;
  static constexpr int32_t token_type_control = 3;
  static constexpr int32_t token_type_user_defined = 4;

 private:
  tokenizer() = default;

  size_t checked(int32_t id) const {
    if (id < 0 || id >= vocab_size()) throw std::out_of_range("tokenizer: token id " + std::to_string(id) + " out of range");
    return static_cast<size_t>(id);
  }

  int32_t special_at(std::string_view text, size_t i) const {
    // specials_ is sorted by length, longest first: the first hit is the longest one.
    for (int32_t id : specials_) {
      const std::string& s = tokens_[id];
      if (text.size() - i >= s.size() && text[i] == s[0] && text.compare(i, s.size(), s) == 0) return id;
    }
    return -1;
  }

  void append_token_text(std::string& out, int32_t id) const {
    const std::string& piece = tokens_[checked(id)];
    if (is_special(id)) {
      out += piece;
      return;
    }
    const auto& alpha = detail::byte_alphabet::get();
    for (size_t i = 0; i < piece.size();) {
      uint32_t cp;
      const size_t n = unicode::decode_utf8(piece, i, cp);
      if (cp < 324 && alpha.from_cp[cp] >= 0) out += static_cast<char>(alpha.from_cp[cp]);
      else out.append(piece, i, n);  // not a byte image (should not occur in a byte-level vocabulary)
      i += n;
    }
  }

  void encode_fragment(std::string_view frag, size_t base, encoding& out) const {
    if (frag.empty()) return;
    for (const byte_range& r : pre_tokenize(frag, base)) bpe(frag.substr(r.begin - base, r.end - r.begin), r.begin, out);
  }

  // BPE of one pre-token: symbols start as single bytes (in the byte alphabet); repeatedly merge the adjacent
  // pair with the lowest rank, leftmost first, like HF tokenizers and llama.cpp. A heap of candidate pairs over a
  // linked list of symbols keeps this O(n log n), so a pathological pre-token (a long run of punctuation) is cheap.
  void bpe(std::string_view word, size_t base, encoding& out) const {
    const auto& alpha = detail::byte_alphabet::get();
    struct symbol {
      std::string text;        // in the byte alphabet
      size_t begin, end;       // bytes of `word`
      int prev, next;          // neighbours in the list, -1 at the ends
    };
    std::vector<symbol> syms;  // [n_bytes] (merged-away entries stay, unlinked, with empty text)
    syms.reserve(word.size());
    for (size_t b = 0; b < word.size(); ++b) {
      const auto byte = static_cast<unsigned char>(word[b]);
      // A byte without a token is dropped before merging (as HF tokenizers does with no unk token), so its
      // neighbours become adjacent.
      if (byte_token_[byte] < 0) continue;
      symbol sym{{}, b, b + 1, static_cast<int>(syms.size()) - 1, static_cast<int>(syms.size()) + 1};
      unicode::append_utf8(sym.text, alpha.to_cp[byte]);
      syms.push_back(std::move(sym));
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    if (pre_ == pre_kind::llama3 && syms.size() > 1) {
      // Llama 3 vocabularies set ignore_merges (HF) / llama.cpp does the same: a pre-token that is itself a
      // vocabulary entry is emitted whole, even where the merges would not build it.
      std::string whole;
      for (const symbol& sym : syms) whole += sym.text;
      if (auto it = index_.find(whole); it != index_.end() && syms.size() == word.size()) {
        out.ids.push_back(it->second);
        out.offsets.push_back({base, base + word.size()});
        return;
      }
    }

    struct candidate {
      int32_t rank;
      size_t pos;              // byte offset of the left symbol: ties go to the leftmost pair
      int left, right;
      size_t left_len, right_len;  // text sizes when pushed: a mismatch later means the entry is stale
      bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<candidate> heap;
    std::string key;
    auto push = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      key.assign(syms[l].text).append(1, ' ').append(syms[r].text);
      auto it = merge_rank_.find(key);
      if (it == merge_rank_.end()) return;
      heap.push_back({it->second, syms[l].begin, l, r, syms[l].text.size(), syms[r].text.size()});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    };
    for (int k = 0; k + 1 < static_cast<int>(syms.size()); ++k) push(k, k + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const candidate c = heap.back();
      heap.pop_back();
      symbol& l = syms[c.left];
      symbol& r = syms[c.right];
      if (l.next != c.right || l.text.size() != c.left_len || r.text.size() != c.right_len) continue;  // stale
      l.text += r.text;
      l.end = r.end;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = c.left;
      r.text.clear();
      r.prev = r.next = -1;
      push(l.prev, c.left);
      push(c.left, l.next);
    }
    for (int k = 0; k >= 0; k = syms[k].next) {
      const symbol& sym = syms[k];
      auto it = index_.find(sym.text);
      if (it != index_.end()) {
        out.ids.push_back(it->second);
        out.offsets.push_back({base + sym.begin, base + sym.end});
        continue;
      }
      for (size_t b = sym.begin; b < sym.end; ++b) {  // not in the vocabulary: one token per byte, if it has one
        const int32_t id = byte_token_[static_cast<unsigned char>(word[b])];
        if (id < 0) continue;
        out.ids.push_back(id);
        out.offsets.push_back({base + b, base + b + 1});
      }
    }
  }

  std::string pre_name_;
  pre_kind pre_ = pre_kind::gpt2;
  std::vector<std::string> tokens_;                    // [vocab] pieces in the byte alphabet
  std::vector<int32_t> types_;                         // [vocab] llama.cpp token types
  std::unordered_map<std::string, int32_t> index_;     // piece -> id
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  std::vector<int32_t> specials_;                      // ids, longest text first
  int32_t byte_token_[256] = {};
  bool add_bos_ = false;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;  // unk is read for completeness; byte-level BPE never needs it
};

// Tokens [first, last) whose byte ranges overlap [begin, end): maps a piece of the text (a segment) to tokens.
inline std::pair<size_t, size_t> tokens_overlapping(std::span<const byte_range> offsets, size_t begin, size_t end) {
  size_t first = 0;
  while (first < offsets.size() && offsets[first].end <= begin) ++first;
  size_t last = first;
  while (last < offsets.size() && offsets[last].begin < end) ++last;
  return {first, last};
}

}  // namespace llama
