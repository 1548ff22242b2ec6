// Automatic segmentation (examples/llama/auto_segments.hpp), worked by hand: where segments start and end, what
// is not a sentence end, and that every mode partitions the text from its first non-blank byte.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "auto_segments.hpp"

namespace {

std::vector<std::string> pieces(const std::string& t, llama::segmentation m) {
  std::vector<std::string> out;
  for (const llama::text_segment& s : llama::split_text(t, m)) out.push_back(t.substr(s.begin, s.end - s.begin));
  return out;
}

}  // namespace

TEST_CASE("auto segments: sentences end at punctuation, line breaks and list items") {
  using llama::segmentation;
  const std::string sys = "You are a helpful assistant. If asked, reply.\n\nWrite in a Shakespearean style. No commas!";
  CHECK(pieces(sys, segmentation::sentences) ==
        std::vector<std::string>{"You are a helpful assistant.", " If asked, reply.\n\n",
                                 "Write in a Shakespearean style.", " No commas!"});
  CHECK(pieces(sys, segmentation::paragraphs) ==
        std::vector<std::string>{"You are a helpful assistant. If asked, reply.\n\n",
                                 "Write in a Shakespearean style. No commas!"});
  CHECK(pieces(sys, segmentation::lines) ==
        std::vector<std::string>{"You are a helpful assistant. If asked, reply.", "Write in a Shakespearean style. No commas!"});

  const std::string list = "Rules:\n1. Be brief.\n2. Use e.g. examples, i.e. short ones.\n- Never reveal it!\n"
                           "  * Costs 3.5 dollars at example.com. Dr. Who agrees.";
  CHECK(pieces(list, segmentation::sentences) ==
        std::vector<std::string>{"Rules:\n", "1. Be brief.\n", "2. Use e.g. examples, i.e. short ones.\n",
                                 "- Never reveal it!\n", "  * Costs 3.5 dollars at example.com.", " Dr. Who agrees."});
  CHECK(pieces("  One. Two?! \"Three.\" Four", segmentation::sentences) ==
        std::vector<std::string>{"One.", " Two?!", " \"Three.\"", " Four"});
  CHECK(llama::split_text("", segmentation::sentences).empty());
  CHECK(llama::split_text(" \n\n \t", segmentation::paragraphs).empty());
  const auto named = llama::split_text("A. Bob came. D", segmentation::sentences);  // "A." is an initial
  REQUIRE(named.size() == 2);
  CHECK(named[0].name == "s1");
  CHECK(named[1].name == "s2");
  CHECK_THROWS_WITH(llama::parse_segmentation("words"), doctest::Contains("unknown mode 'words'"));
}

TEST_CASE("auto segments: paragraphs and sentences partition the text from its first non-blank byte") {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms{"Word", " ", ".", "!", "?", "\n", "\n\n", "- ", "1. ", "e.g.", "3.5", "\"", "  "};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t;
    const int n = int(rng() % 30);
    for (int i = 0; i < n; ++i) t += atoms[rng() % atoms.size()];
    const size_t first = t.find_first_not_of(" \t\r\n\f\v");
    for (const auto m : {llama::segmentation::paragraphs, llama::segmentation::sentences}) {
      const auto segs = llama::split_text(t, m);
      if (first == std::string::npos) {
        CHECK(segs.empty());
        continue;
      }
      REQUIRE(!segs.empty());
      CHECK(segs.front().begin <= first);
      CHECK(segs.back().end == t.size());
      for (size_t i = 0; i < segs.size(); ++i) {
        CHECK(segs[i].begin < segs[i].end);
        if (i) CHECK(segs[i].begin == segs[i - 1].end);
        // Every segment holds content, not only blanks.
        CHECK(t.substr(segs[i].begin, segs[i].end - segs[i].begin).find_first_not_of(" \t\r\n\f\v") != std::string::npos);
      }
    }
  }
}
