// What teacher-forced scoring reports for one (configuration, user turn): the log-probabilities of a given
// continuation (--continuation), of the greedy answer as it was decoded, and, in reference mode (--reference),
// KL(reference || this configuration) of the next-token distributions along the reference's greedy answer.
// scoring.hpp computes them; report.hpp writes them into each turn of --json.
#pragma once

#include <string>
#include <vector>

#include "json.hpp"

namespace llama {

struct turn_scores {
  // The greedy answer: sum over its picks of log softmax(logits)[pick], recorded while decoding (the stop token
  // included when the answer stopped on one). Only for turns that were decoded greedily.
  bool answered = false;
  double answer_logprob = 0;
  int answer_picks = 0;                       // picks summed: answer tokens, + 1 when it stopped on a stop token
  // --continuation: log p(token_i | prompt, continuation_<i) under this configuration's cache.
  bool continuation_scored = false;
  std::vector<double> continuation_logprobs;  // [continuation tokens]
  double continuation_logprob = 0;            // their sum
  // --reference: along the reference configuration's greedy answer (its picks, the stop pick included).
  bool reference_scored = false;
  std::vector<double> kl_per_token;           // [reference picks] KL(reference || this), nats
  double kl_mean = 0;                         // their mean
  double reference_logprob = 0;               // log p(the reference's picks, stop included) under this one
};

// The fields a scored turn adds to its JSON object (empty when nothing was scored), each starting with ", ".
inline std::string scores_json(const turn_scores& s) {
  using json::number;
  auto list = [](const std::vector<double>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + number(v[i]);
    return out + "]";
  };
  std::string out;
  if (s.answered)
    out += ", \"answer_logprob\": " + number(s.answer_logprob) + ", \"answer_picks\": " + std::to_string(s.answer_picks);
  if (s.continuation_scored)
    out += ", \"continuation_logprob\": " + number(s.continuation_logprob) +
           ", \"continuation_logprobs\": " + list(s.continuation_logprobs);
  if (s.reference_scored)
    out += ", \"kl_mean\": " + number(s.kl_mean) + ", \"kl_per_token\": " + list(s.kl_per_token) +
           ", \"reference_logprob\": " + number(s.reference_logprob);
  return out;
}

}  // namespace llama
