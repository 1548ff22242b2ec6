// The decode scheduler: greedy decoding of many independent turns in lockstep. Every step feeds the next token
// of every active turn through one engine::decode call; at most max_batch turns are active, and a finished
// answer frees its place for the next turn (continuous batching). engine::decode gives every row exactly the
// arithmetic of a one-sequence step, so an answer never depends on what it was batched with.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <span>
#include <utility>
#include <vector>

#include "chat.hpp"
#include "console.hpp"
#include "forward.hpp"

namespace llama {

// A turn ready to decode: its prompt already fed. Seq: the engine's sequence (fairkv-llama's `sequence`, a
// llama.cpp slot).
template <class Seq>
struct basic_decode_turn {
  size_t id = 0;               // the caller's name for the turn
  Seq seq;                     // its cache, ending with the prompt
  std::vector<float> logits;   // [n_vocab] after the prompt's last token
};
using decode_turn = basic_decode_turn<sequence>;

// What a turn produced.
struct decoded_turn {
  size_t id = 0;
  std::vector<int32_t> tokens;  // the answer, without its stop token
  int fed = 0;                  // tokens fed by decode steps (an answer's last token is never fed)
  double decode_ms = 0;         // its share of the steps it took part in: each step's time / its turns
};

struct decode_limits {
  int max_new_tokens = 128;  // answer tokens at most
  int max_batch = 64;        // turns decoded together at most
};

// admit() -> std::optional<basic_decode_turn<Seq>>: the next turn, nullopt when none is left; it is called only
// when a place is free, so it may create each turn's cache lazily. finish(decoded_turn&&) receives every answer as
// it completes. observe(id, logits) sees every distribution a turn picks from (its stop pick included), before
// the pick (teacher-forced scoring's reference, scoring.hpp). Engine: n_vocab() and decode(Seq* rows, tokens) ->
// [rows][n_vocab] logits; Stops: contains(id).
template <class Engine, class Stops, class Admit, class Finish, class Observe>
void decode_greedy(Engine& eng, const Stops& stops, decode_limits limits, const progress& prog, Admit&& admit,
                   Finish&& finish, Observe&& observe) {
  using turn_t = typename std::invoke_result_t<Admit&>::value_type;
  using seq_t = decltype(turn_t::seq);
  struct active_turn {
    turn_t turn;
    std::vector<int32_t> out;
    int fed = 0;
    double decode_ms = 0;
  };
  // Heap-allocated so the sequence pointers handed to engine::decode stay valid while others are erased.
  std::vector<std::unique_ptr<active_turn>> active;
  const size_t n_vocab = size_t(eng.n_vocab());
  const auto t0 = std::chrono::steady_clock::now();
  int decoded = 0;
  std::vector<seq_t*> step_seqs;
  std::vector<int32_t> step_tokens;
  std::vector<active_turn*> step_turns;
  for (;;) {
    while (int(active.size()) < limits.max_batch) {
      std::optional<turn_t> next = admit();
      if (!next) break;
      active.push_back(std::make_unique<active_turn>(active_turn{std::move(*next), {}, 0, 0.0}));
    }
    if (active.empty()) break;

    // Each turn picks its next token; a turn that stops, or reaches max_new_tokens (whose next logits would not
    // be used), finishes without taking part in the step.
    step_seqs.clear(), step_tokens.clear(), step_turns.clear();
    for (auto it = active.begin(); it != active.end();) {
      active_turn& a = **it;
      bool done = limits.max_new_tokens == 0;
      if (!done) {
        const std::vector<float>& logits = a.turn.logits;
        observe(a.turn.id, std::span<const float>(logits));
        const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (stops.contains(next)) {
          done = true;
        } else {
          a.out.push_back(next);
          done = int(a.out.size()) == limits.max_new_tokens;
          if (!done) {
            step_seqs.push_back(&a.turn.seq);
            step_tokens.push_back(next);
            step_turns.push_back(&a);
          }
        }
      }
      if (done) {
        finish(decoded_turn{a.turn.id, std::move(a.out), a.fed, a.decode_ms});
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    if (step_seqs.empty()) continue;

    const auto ts = std::chrono::steady_clock::now();
    const std::vector<float> logits = eng.decode(step_seqs, step_tokens);  // [step_turns][n_vocab]
    const double share = ms_since(ts) / double(step_turns.size());
    for (size_t i = 0; i < step_turns.size(); ++i) {
      active_turn& a = *step_turns[i];
      a.turn.logits.assign(logits.begin() + std::ptrdiff_t(i * n_vocab), logits.begin() + std::ptrdiff_t((i + 1) * n_vocab));
      a.decode_ms += share;
      ++a.fed;
    }
    decoded += int(step_turns.size());
    if (decoded % 64 < int(step_turns.size())) prog.update("decode", decoded, 0, ms_since(t0) / 1000.0, false);
  }
  prog.update("decode", decoded, 0, ms_since(t0) / 1000.0, true);
}

template <class Engine, class Stops, class Admit, class Finish>
void decode_greedy(Engine& eng, const Stops& stops, decode_limits limits, const progress& prog, Admit&& admit,
                   Finish&& finish) {
  decode_greedy(eng, stops, limits, prog, std::forward<Admit>(admit), std::forward<Finish>(finish),
                [](size_t, std::span<const float>) {});
}

}  // namespace llama
