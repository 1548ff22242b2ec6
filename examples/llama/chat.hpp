// ChatML template of SmolLM2-Instruct, split by turn: the runner prefills (and compresses) the system turn
// before any user turn exists, so the two are built and tokenized separately.
//
//   <|im_start|>system\n{system}<|im_end|>\n            <- system_turn()
//   <|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n   <- user_turn()
//
// Tokenizing the turns separately gives the same ids as tokenizing their concatenation, because every turn
// starts with the special token <|im_start|>, which always ends a fragment (tested in test_tokenizer.cpp).
// Like HF's apply_chat_template followed by tokenization, special-token text inside a message is parsed as
// special tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "tokenizer.hpp"

namespace llama::chat {

inline constexpr std::string_view im_start = "<|im_start|>";
inline constexpr std::string_view im_end = "<|im_end|>";

// "<|im_start|>{role}\n{content}<|im_end|>\n"
inline std::string turn(std::string_view role, std::string_view content) {
  std::string s;
  s.reserve(im_start.size() + role.size() + content.size() + im_end.size() + 2);
  s.append(im_start).append(role).append("\n").append(content).append(im_end).append("\n");
  return s;
}
inline std::string generation_prompt() { return std::string(im_start) + "assistant\n"; }

inline std::string system_turn(std::string_view system) { return turn("system", system); }
// The user turn followed by the assistant header that the answer continues.
inline std::string user_turn(std::string_view user) { return turn("user", user) + generation_prompt(); }
inline std::string prompt(std::string_view system, std::string_view user) { return system_turn(system) + user_turn(user); }

// Byte offset of the message content inside turn(role, ...).
inline size_t content_offset(std::string_view role) { return im_start.size() + role.size() + 1; }

// A tokenized turn and where its message content lies, in bytes of `text` and in tokens.
struct encoded_turn {
  std::string text;                         // the full turn text
  encoding tokens;                          // ids + byte offsets into `text`
  byte_range content;                       // bytes of the message content in `text`
  size_t content_first = 0, content_last = 0;  // tokens [first, last) overlapping the content
};

// Tok: anything with encode_with_offsets(text, parse_special) -> encoding (the runner's tokenizer, or llama.cpp's
// through examples/llamacpp/engine.hpp).
template <class Tok>
encoded_turn encode_turn(const Tok& tok, std::string_view role, std::string_view content,
                         bool add_generation_prompt = false) {
  encoded_turn t;
  t.text = turn(role, content);
  if (add_generation_prompt) t.text += generation_prompt();
  t.tokens = tok.encode_with_offsets(t.text, /*parse_special=*/true);
  t.content = {content_offset(role), content_offset(role) + content.size()};
  std::tie(t.content_first, t.content_last) = tokens_overlapping(t.tokens.offsets, t.content.begin, t.content.end);
  return t;
}
template <class Tok>
encoded_turn encode_system_turn(const Tok& tok, std::string_view system) {
  return encode_turn(tok, "system", system, false);
}
template <class Tok>
encoded_turn encode_user_turn(const Tok& tok, std::string_view user) {
  return encode_turn(tok, "user", user, true);
}

// Generation stops on <|im_end|> or on the vocabulary's eos (for SmolLM2 both are id 2).
struct stop_tokens {
  int32_t im_end = -1;
  int32_t eos = -1;
  explicit stop_tokens(const tokenizer& tok) : im_end(tok.token_id(chat::im_end)), eos(tok.eos()) {}
  bool contains(int32_t id) const { return id >= 0 && (id == im_end || id == eos); }
};

}  // namespace llama::chat
