// Dumps the post-RoPE keys and queries of a few layers of the Llama runner's system-turn prefill, for
// scripts/gen_paper_fair_golden.py (real-cache cases of tests/data/paper_fair_golden.txt). Not part of the build.
//
//   g++ -O2 -std=c++20 -pthread -I include -I examples/llama -I /usr/include/eigen3 \
//       scripts/dump_layer_qk.cpp -o dump_layer_qk
//   dump_layer_qk MODEL.gguf SYSTEM.txt OUT_DIR LAYER [LAYER...]
//
// SYSTEM.txt is the system message with `[[seg:NAME]]` markers (as the runner's --system takes it). The runner's
// own parse_system_segments / chat::encode_system_turn / engine::feed (with query capture) are used, so the
// tokens, segments, keys and queries are those that fairkv-llama scores.
// OUT_DIR gets meta.txt (dimensions, token ids, segment token ranges) and, per layer l, raw little-endian float32
// files k<l>.f32 [n_kv_heads, tokens, head_dim] and q<l>.f32 [n_heads, tokens, head_dim].
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runner.hpp"

namespace {

void write_f32(const std::string& path, const float* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(float)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf SYSTEM.txt OUT_DIR LAYER [LAYER...]\n", argv[0]);
    return 2;
  }
  const std::string model_path = argv[1], out_dir = argv[3];
  std::ifstream sf(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << sf.rdbuf();
  if (!sf) throw std::runtime_error(std::string("cannot read ") + argv[2]);

  const llama::model m = llama::model::load(model_path);
  const llama::tokenizer tok = llama::tokenizer::from_gguf(m.file());
  const llama::hparams& hp = m.hp();
  const llama::parsed_system ps = llama::parse_system_segments(ss.str());
  const llama::chat::encoded_turn sys = llama::chat::encode_system_turn(tok, ps.text);
  const int n = int(sys.tokens.ids.size());

  llama::engine eng(m, 0, llama::forward_options{});
  llama::sequence seq = eng.make_sequence(n);
  eng.feed(seq, sys.tokens.ids, /*all_logits=*/false, /*capture_queries=*/true);

  std::ofstream meta(out_dir + "/meta.txt");
  meta << "tokens " << n << " q_heads " << hp.n_heads << " kv_heads " << hp.n_kv_heads << " head_dim "
       << hp.head_dim << "\nids";
  for (int32_t id : sys.tokens.ids) meta << ' ' << id;
  meta << '\n';
  // Segment token ranges as run_configs() maps them: the tokens overlapping the segment's bytes, a token
  // straddling two segments going to the earlier one.
  int prev_end = 0;
  for (const llama::text_segment& s : ps.segments) {
    const size_t off = sys.content.begin;
    auto [first, last] = llama::tokens_overlapping(sys.tokens.offsets, off + s.begin, off + s.end);
    const int b = std::max(int(first), prev_end), e = int(last);
    if (e <= b) continue;
    meta << "segment " << s.name << ' ' << b << ' ' << e << '\n';
    prev_end = e;
  }
  for (int i = 4; i < argc; ++i) {
    const int l = std::stoi(argv[i]);
    if (l < 0 || l >= hp.n_layers) throw std::runtime_error("layer out of range: " + std::to_string(l));
    const llama::kv_layer& cl = seq.cache.layer(l);
    // The cache's capacity is n, so its [n_kv_heads, capacity, head_dim] keys are exactly [n_kv_heads, n, hd].
    write_f32(out_dir + "/k" + std::to_string(l) + ".f32", cl.k.data(), size_t(hp.n_kv_heads) * n * hp.head_dim);
    write_f32(out_dir + "/q" + std::to_string(l) + ".f32", cl.sys_q.data(), cl.sys_q.size());
    meta << "layer " << l << '\n';
  }
  if (!meta) throw std::runtime_error("cannot write " + out_dir + "/meta.txt");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dump_layer_qk: %s\n", e.what());
  return 1;
}
