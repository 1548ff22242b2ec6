// Forward pass against the transformers reference (scripts/gen_llama_reference.py -> tests/data/
// llama_reference.txt): logits of the first positions within a bound, and 32 identical greedy tokens.
// The bound is justified in docs/llama-runner.md ("Accuracy").
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "forward.hpp"
#include "gguf_test_writer.hpp"
#include "model.hpp"

namespace {

struct ref_prompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  std::map<int, std::vector<std::pair<int32_t, float>>> logits;  // step -> (id, logit)
};

std::vector<ref_prompt> load_reference() {
  std::ifstream in(std::string(FAIRKV_TEST_DATA_DIR) + "/llama_reference.txt");
  REQUIRE_MESSAGE(in.good(), "missing tests/data/llama_reference.txt (python3 scripts/gen_llama_reference.py)");
  std::vector<ref_prompt> out;
  std::string line;
  auto at = [&](int i) -> ref_prompt& {
    if (int(out.size()) <= i) out.resize(size_t(i) + 1);
    return out[size_t(i)];
  };
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string tag;
    s >> tag;
    int i = 0, n = 0;
    if (tag == "ids" || tag == "greedy") {
      s >> i >> n;
      auto& v = tag == "ids" ? at(i).ids : at(i).greedy;
      v.resize(size_t(n));
      for (auto& x : v) s >> x;
      REQUIRE(!s.fail());
    } else if (tag == "logits") {
      int step = 0;
      s >> i >> step >> n;
      auto& v = at(i).logits[step];
      for (int k = 0; k < n; ++k) {
        std::string kv;
        s >> kv;
        const auto colon = kv.find(':');
        REQUIRE(colon != std::string::npos);
        v.emplace_back(int32_t(std::stoi(kv.substr(0, colon))), std::stof(kv.substr(colon + 1)));
      }
      REQUIRE(!s.fail());
    }
  }
  REQUIRE(!out.empty());
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

struct run_result {
  double max_diff = 0;     // over every reference logit of every checked step
  int greedy_match = 0;    // leading greedy tokens equal to the reference
  int n_prompts = 0;
};

// Runs every reference prompt: teacher-forced on the reference greedy tokens, so the logits compared at step s
// are always those after the same s tokens; the greedy check compares our argmax with the reference token.
run_result run_reference(const llama::model& m, const std::vector<ref_prompt>& ref, llama::forward_options opt) {
  run_result r;
  llama::engine eng(m, 512, opt);
  for (const ref_prompt& p : ref) {
    eng.reset();
    std::vector<float> logits = eng.feed(p.ids);
    bool all_equal = true;
    for (size_t step = 0; step < p.greedy.size(); ++step) {
      if (auto it = p.logits.find(int(step)); it != p.logits.end())
        for (const auto& [id, val] : it->second)
          r.max_diff = std::max(r.max_diff, double(std::fabs(logits[size_t(id)] - val)));
      const int32_t mine = argmax(logits);
      if (mine != p.greedy[step]) {
        if (all_equal)
          MESSAGE("prompt " << r.n_prompts << ": greedy step " << step << " gives " << mine << ", reference "
                            << p.greedy[step]);
        all_equal = false;
      }
      if (all_equal) ++r.greedy_match;
      const int32_t next = p.greedy[step];
      logits = eng.feed(std::span<const int32_t>(&next, 1));
    }
    ++r.n_prompts;
  }
  return r;
}

}  // namespace

TEST_CASE("forward: logits and 32 greedy tokens match transformers on SmolLM2-135M-Instruct") {
  const std::string path = llama::test::default_model_path();
  if (llama::test::skip_without_model(path, "forward reference test")) return;
  REQUIRE_MESSAGE(!path.empty(), "FAIRKV_REQUIRE_MODEL is set but the model was not found (scripts/find_model.sh)");
  const auto ref = load_reference();
  const llama::model m = llama::model::load(path);
  CHECK(m.tied_embeddings());
  CHECK(m.hp().n_layers == 30);

  int expected_tokens = 0;
  for (const auto& p : ref) expected_tokens += int(p.greedy.size());
  REQUIRE(expected_tokens == 32 * int(ref.size()));

  SUBCASE("default (exact) path: float activations, weight blocks expanded on the fly") {
    const run_result r = run_reference(m, ref, {.threads = 2});
    MESSAGE("exact path: max |logit - reference| = " << r.max_diff << ", greedy tokens equal "
                                                     << r.greedy_match << "/" << expected_tokens);
    CHECK(r.greedy_match == expected_tokens);
    CHECK(r.max_diff < 2e-3);
  }
  SUBCASE("prefill batch 1 (decode kernels only) matches too") {
    const run_result r = run_reference(m, ref, {.threads = 2, .batch = 1});
    MESSAGE("exact path, batch 1: max |logit - reference| = " << r.max_diff << ", greedy tokens equal "
                                                              << r.greedy_match << "/" << expected_tokens);
    CHECK(r.greedy_match == expected_tokens);
    CHECK(r.max_diff < 2e-3);
  }
  SUBCASE("optional fast path: 8-bit activations (llama.cpp's scheme) is close but not exact") {
    const run_result r = run_reference(m, ref, {.threads = 2, .q8_activations = true});
    MESSAGE("q8 activations: max |logit - reference| = " << r.max_diff << ", greedy tokens equal "
                                                         << r.greedy_match << "/" << expected_tokens
                                                         << " (informational: not required to match)");
    CHECK(r.max_diff < 3.0);
    CHECK(r.greedy_match >= 8);
  }
}

TEST_CASE("forward: batched prefill equals token-by-token decoding") {
  const std::string path = llama::test::default_model_path();
  if (llama::test::skip_without_model(path, "prefill/decode consistency test")) return;
  const auto ref = load_reference();
  const llama::model m = llama::model::load(path);
  const auto& ids = ref.front().ids;
  // The two differ only in float summation order (GEMM on expanded tiles vs fused block dots).
  llama::engine batched(m, 256, {.threads = 2, .batch = 16});
  llama::engine single(m, 256, {.threads = 2, .batch = 1});
  const auto a = batched.feed(ids, /*all_logits=*/true);
  const auto b = single.feed(ids, true);
  REQUIRE(a.size() == b.size());
  double md = 0;
  for (size_t i = 0; i < a.size(); ++i) md = std::max(md, double(std::fabs(a[i] - b[i])));
  MESSAGE("max |batched - sequential| over " << ids.size() << " positions: " << md);
  CHECK(md < 1e-3);
  CHECK(batched.n_past() == int(ids.size()));
  CHECK(batched.cache().layer(0).len[0] == int(ids.size()));
}

TEST_CASE("forward: ragged per-head lengths: each KV head attends to exactly its own rows") {
  const std::string path = llama::test::default_model_path();
  if (llama::test::skip_without_model(path, "ragged attention test")) return;
  const auto ref = load_reference();
  const llama::model m = llama::model::load(path);
  const auto& ids = ref.front().ids;
  const int n = int(ids.size());
  // Evict different tokens from different heads (head h drops h tokens from the middle), then poison every row
  // beyond each head's length: a read past `len` would turn the logits into NaN or change them.
  auto run = [&](float poison, std::vector<int32_t>* lens_out) {
    llama::engine eng(m, 128, {.threads = 2});
    eng.feed(ids);
    llama::kv_cache& c = eng.cache();
    for (int l = 0; l < c.n_layers(); ++l) {
      for (int h = 0; h < c.n_kv_heads(); ++h) {
        int w = 0;
        for (int t = 0; t < n; ++t) {
          if (t >= 10 && t < 10 + h + l % 2) continue;  // dropped
          std::copy_n(c.k_row(l, h, t), c.head_dim(), c.k_row(l, h, w));
          std::copy_n(c.v_row(l, h, t), c.head_dim(), c.v_row(l, h, w));
          ++w;
        }
        c.layer(l).len[size_t(h)] = w;
        for (int t = w; t < c.capacity(); ++t) {
          std::fill_n(c.k_row(l, h, t), c.head_dim(), poison);
          std::fill_n(c.v_row(l, h, t), c.head_dim(), poison);
        }
      }
    }
    if (lens_out) *lens_out = c.layer(1).len;
    const int32_t next = ref.front().greedy[0];
    std::vector<float> out = eng.feed(std::span<const int32_t>(&next, 1));
    // The new token went to each head's own end, not to a common position.
    if (lens_out) lens_out->insert(lens_out->end(), c.layer(1).len.begin(), c.layer(1).len.end());
    return out;
  };
  std::vector<int32_t> lens;
  const auto a = run(std::numeric_limits<float>::quiet_NaN(), &lens);
  const auto b = run(1e30f, nullptr);
  REQUIRE(lens.size() == 6);
  CHECK(lens[0] == n - 1);  // layer 1: head h dropped h + 1 tokens
  CHECK(lens[1] == n - 2);
  CHECK(lens[2] == n - 3);
  CHECK(lens[3] == n);      // +1 after the decode step, each at its own end
  CHECK(lens[5] == n - 2);
  bool finite = true;
  double md = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    finite = finite && std::isfinite(a[i]) && std::isfinite(b[i]);
    md = std::max(md, double(std::fabs(a[i] - b[i])));
  }
  CHECK(finite);
  CHECK(md == 0.0);
}

TEST_CASE("forward: a batched decode step gives every sequence the logits it gets alone, bit for bit") {
  const std::string path = llama::test::default_model_path();
  if (llama::test::skip_without_model(path, "batched decode test")) return;
  const auto ref = load_reference();
  REQUIRE(ref.size() >= 2);
  const llama::model m = llama::model::load(path);
  llama::engine eng(m, 0, {.threads = 2});
  // Seven sequences: two prompts, forks of them at other lengths, and one with ragged heads (head h of
  // layer l lost h + l % 2 tokens), so the batch mixes lengths, positions and per-head counts; 7 is not a
  // multiple of the rows a weight block is shared by, so both kernels run.
  std::vector<llama::sequence> seqs;
  for (const auto& p : {ref[0], ref[1]}) {
    llama::sequence s = eng.make_sequence(128);
    eng.feed(s, p.ids);
    seqs.push_back(s);
    llama::sequence shorter = eng.make_sequence(128);
    eng.feed(shorter, std::span<const int32_t>(p.ids).first(p.ids.size() / 2));
    seqs.push_back(shorter);
  }
  seqs.push_back(seqs[0]);
  seqs.push_back(seqs[2]);
  {
    llama::sequence r = seqs[0];
    for (int l = 0; l < r.cache.n_layers(); ++l)
      for (int h = 0; h < r.cache.n_kv_heads(); ++h) {
        const int drop = h + l % 2, len = r.cache.layer(l).len[size_t(h)];
        for (int t = 3; t + drop < len; ++t) {
          std::copy_n(r.cache.k_row(l, h, t + drop), r.cache.head_dim(), r.cache.k_row(l, h, t));
          std::copy_n(r.cache.v_row(l, h, t + drop), r.cache.head_dim(), r.cache.v_row(l, h, t));
        }
        r.cache.layer(l).len[size_t(h)] = len - drop;
      }
    seqs.push_back(r);
  }
  std::vector<llama::sequence> alone = seqs;
  std::vector<llama::sequence*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  const int V = eng.hp().n_vocab;
  std::vector<int32_t> tokens(seqs.size());
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(100 + 37 * i);
  size_t mismatches = 0;
  for (int step = 0; step < 6; ++step) {
    const std::vector<float> batch = eng.decode(ptrs, tokens);
    REQUIRE(batch.size() == seqs.size() * size_t(V));
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::vector<float> one = eng.feed(alone[i], std::span<const int32_t>(&tokens[i], 1));
      if (std::memcmp(one.data(), batch.data() + i * size_t(V), size_t(V) * sizeof(float)) != 0) ++mismatches;
      CHECK(seqs[i].n_past == alone[i].n_past);
      CHECK(seqs[i].cache.lengths() == alone[i].cache.lengths());
      // The next input: this sequence's greedy token.
      tokens[i] = int32_t(std::max_element(one.begin(), one.end()) - one.begin());
    }
  }
  CHECK(mismatches == 0);

  SUBCASE("invalid batches are refused before anything is appended") {
    const auto lens = seqs[0].cache.lengths();
    std::vector<llama::sequence*> twice{&seqs[0], &seqs[0]};
    const std::vector<int32_t> two{1, 2};
    CHECK_THROWS_WITH(eng.decode(twice, two), doctest::Contains("appears twice"));
    CHECK_THROWS_WITH(eng.decode(std::span<llama::sequence* const>(ptrs).first(2), std::span<const int32_t>(two).first(1)),
                      doctest::Contains("one token per sequence"));
    const std::vector<int32_t> bad{1, V};
    std::vector<llama::sequence*> pair{&seqs[0], &seqs[1]};
    CHECK_THROWS_WITH(eng.decode(pair, bad), doctest::Contains("outside the vocabulary"));
    llama::sequence full = eng.make_sequence(int(ref[0].ids.size()));
    eng.feed(full, ref[0].ids);
    std::vector<llama::sequence*> with_full{&seqs[0], &full};
    CHECK_THROWS_WITH(eng.decode(with_full, two), doctest::Contains("KV cache full"));
    CHECK(seqs[0].cache.lengths() == lens);
  }
}
