// Teacher-forced scoring: the next-token distributions of a cache along a given token sequence, without
// generation. Many forced sequences run in lockstep through engine::decode (as scheduler.hpp's greedy decoding
// does), and engine::decode gives every row the arithmetic of a one-sequence step, so a forced sequence's logits
// are bit-identical to those greedy decoding saw along the same tokens from the same cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "console.hpp"
#include "forward.hpp"

namespace llama {

// log softmax of one row of logits: the log-sum-exp accumulated in double, each value rounded to float. Greedy
// decoding and forced scoring call this same function on bit-identical logits, so their values are identical.
inline void log_softmax(std::span<const float> logits, std::vector<float>& out) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(double(x) - double(mx));
  const double lse = double(mx) + std::log(sum);
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(double(logits[i]) - lse);
}

// log softmax(logits)[id] (the same value log_softmax gives at id).
inline double log_softmax_at(std::span<const float> logits, int32_t id) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(double(x) - double(mx));
  return double(float(double(logits[size_t(id)]) - (double(mx) + std::log(sum))));
}

// KL(p || q) in nats from two rows of log-probabilities, summed in double; exactly 0 when the rows are equal.
inline double kl_divergence(std::span<const float> log_p, std::span<const float> log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i)
    if (log_p[i] != log_q[i]) kl += std::exp(double(log_p[i])) * (double(log_p[i]) - double(log_q[i]));
  return kl;
}

// A sequence to score: its prompt already fed. Distribution i (i = 0 .. n_dists-1) is the one after the prompt
// and targets[0..i); it scores targets[i] (when i < targets.size()) and is compared with reference[i] (when a
// reference is given). Only targets[0 .. n_dists-2] are fed, so n_dists may be targets.size() + 1 (the
// distribution after the last target: where greedy decoding picked its stop token).
template <class Seq>
struct basic_forced_turn {
  size_t id = 0;
  Seq seq;                                            // cache ending with the prompt
  std::vector<float> logits;                          // [n_vocab] after the prompt's last token
  std::vector<int32_t> targets;                       // tokens forced, in order
  int n_dists = 0;                                    // distributions evaluated, in [1, targets.size() + 1]
  const std::vector<std::vector<float>>* reference = nullptr;  // [>= n_dists][n_vocab] log-probs, or none
};
using forced_turn = basic_forced_turn<sequence>;

struct forced_result {
  size_t id = 0;
  std::vector<double> logprobs;  // [min(n_dists, targets)] log p(targets[i] | ...)
  std::vector<double> kl;        // [n_dists] KL(reference[i] || distribution i), when a reference was given
  int fed = 0;                   // tokens fed by decode steps
};

// admit() -> std::optional<basic_forced_turn<Seq>> (nullopt when none is left; called only when a place is free);
// finish(forced_result&&) receives each result as its last distribution is scored. Engine: as decode_greedy's.
template <class Engine, class Admit, class Finish>
void score_forced(Engine& eng, int max_batch, const progress& prog, Admit&& admit, Finish&& finish) {
  using turn_t = typename std::invoke_result_t<Admit&>::value_type;
  using seq_t = decltype(turn_t::seq);
  struct active_turn {
    turn_t turn;
    forced_result res;
    int step = 0;
  };
  std::vector<std::unique_ptr<active_turn>> active;  // heap-allocated: the sequence pointers stay valid
  const size_t n_vocab = size_t(eng.n_vocab());
  const auto t0 = std::chrono::steady_clock::now();
  int fed = 0;
  std::vector<float> log_q;  // [n_vocab]
  std::vector<seq_t*> step_seqs;
  std::vector<int32_t> step_tokens;
  std::vector<active_turn*> step_turns;
  for (;;) {
    while (int(active.size()) < max_batch) {
      std::optional<turn_t> next = admit();
      if (!next) break;
      turn_t& t = *next;
      if (t.n_dists < 1 || size_t(t.n_dists) > t.targets.size() + 1 ||
          (t.reference && t.reference->size() < size_t(t.n_dists)))
        throw std::logic_error("score_forced: n_dists out of range");
      auto a = std::make_unique<active_turn>();
      a->res.id = t.id;
      a->turn = std::move(t);
      active.push_back(std::move(a));
    }
    if (active.empty()) break;

    step_seqs.clear(), step_tokens.clear(), step_turns.clear();
    for (auto it = active.begin(); it != active.end();) {
      active_turn& a = **it;
      const std::span<const float> logits(a.turn.logits);
      const size_t i = size_t(a.step);
      if (a.turn.reference) {
        log_softmax(logits, log_q);
        a.res.kl.push_back(kl_divergence((*a.turn.reference)[i], log_q));
        if (i < a.turn.targets.size()) a.res.logprobs.push_back(double(log_q[size_t(a.turn.targets[i])]));
      } else if (i < a.turn.targets.size()) {
        a.res.logprobs.push_back(log_softmax_at(logits, a.turn.targets[i]));
      }
      if (++a.step == a.turn.n_dists) {
        finish(std::move(a.res));
        it = active.erase(it);
        continue;
      }
      step_seqs.push_back(&a.turn.seq);
      step_tokens.push_back(a.turn.targets[i]);
      step_turns.push_back(&a);
      ++it;
    }
    if (step_seqs.empty()) continue;
    const std::vector<float> logits = eng.decode(step_seqs, step_tokens);  // [step_turns][n_vocab]
    for (size_t k = 0; k < step_turns.size(); ++k) {
      active_turn& a = *step_turns[k];
      a.turn.logits.assign(logits.begin() + std::ptrdiff_t(k * n_vocab), logits.begin() + std::ptrdiff_t((k + 1) * n_vocab));
      ++a.res.fed;
    }
    fed += int(step_turns.size());
    if (fed % 64 < int(step_turns.size())) prog.update("score", fed, 0, ms_since(t0) / 1000.0, false);
  }
  prog.update("score", fed, 0, ms_since(t0) / 1000.0, true);
}

}  // namespace llama
