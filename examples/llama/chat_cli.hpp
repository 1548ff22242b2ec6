// `fairkv-llama chat`: a multi-turn conversation under a fixed token budget (chat_session.hpp), scripted
// (--script turns.jsonl) or interactive (one user turn per stdin line until EOF). Parsed and validated completely
// before the model loads, with the one-shot CLI's strict number parsing and file checks (cli.hpp); every message
// names the option.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "chat_session.hpp"
#include "cli.hpp"
#include "json.hpp"
#include "model.hpp"
#include "model_path.hpp"
#include "tokenizer.hpp"

namespace llama::chat_cli {

struct script_turn {
  std::string user;
  std::string name;
};

struct args {
  chat_request req;
  std::string model_path;
  std::string system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  std::vector<script_turn> script;  // empty: interactive
  bool scripted = false;
  forward_options forward;
  std::string json_path;
  bool quiet = false;
  bool help = false;
};

// One line of a script: a JSON object with a string "user" and an optional string "name", nothing else.
// A small strict reader (strings with the standard escapes, \u with surrogate pairs); throws a message without
// the option or line, which the caller adds.
inline script_turn parse_script_line(std::string_view s) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  };
  auto expect = [&](char c) {
    ws();
    if (i >= s.size() || s[i] != c) throw std::runtime_error(std::string("expected '") + c + "'");
    ++i;
  };
  auto hex4 = [&]() -> uint32_t {
    if (i + 4 > s.size()) throw std::runtime_error("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i++];
      v = v * 16 + uint32_t(c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                     : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                            : throw std::runtime_error("bad \\u escape"));
    }
    return v;
  };
  auto put_utf8 = [](std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
    else if (cp < 0x10000)
      out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    else
      out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F)), out += char(0x80 | ((cp >> 6) & 0x3F)),
          out += char(0x80 | (cp & 0x3F));
  };
  auto string = [&]() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) throw std::runtime_error("unterminated string");
      const char c = s[i++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) throw std::runtime_error("unterminated escape");
      switch (const char e = s[i++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i + 1 < s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            i += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) throw std::runtime_error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xD800 && cp < 0xE000) {
            throw std::runtime_error("lone surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: throw std::runtime_error(std::string("bad escape '\\") + e + "'");
      }
    }
  };
  script_turn t;
  std::set<std::string> keys;
  expect('{');
  ws();
  if (i < s.size() && s[i] == '}') throw std::runtime_error("no \"user\" field");
  while (true) {
    const std::string key = string();
    expect(':');
    if (!keys.insert(key).second) throw std::runtime_error("field \"" + key + "\" given twice");
    if (key == "user") t.user = string();
    else if (key == "name") t.name = string();
    else throw std::runtime_error("unknown field \"" + key + "\" (user, name)");
    ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    expect('}');
    break;
  }
  ws();
  if (i != s.size()) throw std::runtime_error("trailing text after the object");
  if (!keys.count("user")) throw std::runtime_error("no \"user\" field");
  return t;
}

// The script's turns; blank lines are skipped. Throws naming --script, the file and the line.
inline std::vector<script_turn> read_script(std::string_view option, const std::string& path) {
  const std::string text = cli::read_text_file(option, path);
  std::vector<script_turn> out;
  size_t line_no = 0, pos = 0;
  while (pos <= text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string_view line(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
    ++line_no;
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      try {
        out.push_back(parse_script_line(line));
      } catch (const std::runtime_error& e) {
        cli::fail(option, "'" + path + "' line " + std::to_string(line_no) + ": " + e.what());
      }
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (out.empty()) cli::fail(option, "'" + path + "' has no turn");
  return out;
}

struct option {
  const char* name;
  const char* arg;
  const char* help;
  void (*apply)(args& a, std::string_view name, const std::string& value);
};

inline constexpr int max_budget = 1 << 20;

inline const std::vector<option>& options() {
  using cli::fail;
  static const std::string policy_help = scorer_choices(" | ") + "   (default knorm)";
  static const std::vector<option> table = {
      {"--model", "PATH|NAME", "GGUF model file or name: smollm2 (the default, $FAIRKV_MODEL), qwen1.5b",
       [](args& a, std::string_view n, const std::string& v) { a.model_path = cli::parse_model(n, v); }},
      {"--system", "TEXT", "system prompt; [[seg:NAME]] markers name segments (else --segments finds them)",
       [](args& a, std::string_view, const std::string& v) { a.system = v; }},
      {"--system-file", "FILE", "read the system prompt from FILE",
       [](args& a, std::string_view n, const std::string& v) {
         std::string text = cli::read_text_file(n, v);
         while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
         if (text.empty()) fail(n, "'" + v + "' is empty");
         a.system = std::move(text);
       }},
      {"--script", "FILE", "turns.jsonl: one {\"user\": \"...\"} per line (optional \"name\"); without it, one\n"
                           "user turn per stdin line until EOF",
       [](args& a, std::string_view n, const std::string& v) {
         a.script = read_script(n, v);
         a.scripted = true;
       }},
      {"--budget", "N", "tokens per KV head kept at most, in [1, 1048576] (required): the cache grows up to it;\n"
                        "at most the model's llama.context_length and what fits the available memory",
       [](args& a, std::string_view n, const std::string& v) { a.req.budget = cli::parse_int(n, v, 1, max_budget); }},
      {"--ratio", "R", "refused: chat keeps a token budget, not a ratio",
       [](args&, std::string_view n, const std::string&) {
         fail(n, "chat keeps a token budget (--budget); a ratio together with a budget is refused");
       }},
      {"--policy", "NAME", policy_help.c_str(),
       [](args& a, std::string_view n, const std::string& v) {
         a.req.compress.policy = cli::parse_name(n, v, policy_name_error);
         if (v == "none") fail(n, "'none' cannot keep a budget; chat needs an eviction policy");
       }},
      {"--selector", "NAME", "per_head | union_heads   (default per_head; head_adaptive is refused)",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.compress.selector = cli::parse_name(n, v, selector_name_error);
         if (a.req.compress.selector == "head_adaptive")
           fail(n, "head_adaptive is refused in chat: its ragged per-head lengths would need a per-head keep target");
       }},
      {"--window", "W", "SnapKV observation window, in [1, 1048576] (default 64; clamped to the cache)",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.compress.window = cli::parse_int(n, v, 1, max_token_count);
       }},
      {"--fair", "", "fair eviction over the system segments and every user / assistant turn",
       [](args& a, std::string_view, const std::string&) { a.req.compress.fair = true; }},
      {"--system-floor", "F", "under --fair: every system segment keeps at least this fraction of its tokens, in\n"
                              "[0, 1] (fairkv's prioritized allocator; default 0)",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.system_floor = float(cli::parse_fraction(n, v, 0.0, 1.0));
       }},
      {"--turn-decay", "D", "under --fair: a turn's weight is D^age (age 0: the last turn), the system's 1, so older\n"
                            "turns age out first; in [0, 1] (prioritized allocator; default 1: plain fair)",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.turn_decay = float(cli::parse_fraction(n, v, 0.0, 1.0));
       }},
      {"--sinks", "N", "attention-sink tokens always kept under --fair, in [0, 1024] (default 4)",
       [](args& a, std::string_view n, const std::string& v) { a.req.compress.sinks = cli::parse_int(n, v, 0, max_sinks); }},
      {"--boundary", "K", "first and last K tokens of every segment kept under --fair, in [0, 1024]",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.compress.boundary = cli::parse_int(n, v, 0, max_boundary);
       }},
      {"--segments", "MODE", "markers | lines | paragraphs | sentences: the system prompt's segments (default:\n"
                             "its [[seg:]] markers if any, else sentences)",
       [](args& a, std::string_view n, const std::string& v) {
         try {
           (void)parse_segmentation(v);
         } catch (const std::runtime_error&) {
           fail(n, "unknown mode '" + v + "' (markers, lines, paragraphs, sentences)");
         }
         a.req.compress.segmentation = v;
       }},
      {"--whitelist", "PHRASE", "force-keep every token of each occurrence of PHRASE in the system prompt",
       [](args& a, std::string_view n, const std::string& v) {
         if (v.empty()) fail(n, "empty phrase");
         a.req.whitelist.push_back(v);
       }},
      {"--allow-long-context", "", "a budget beyond llama.context_length, and turns whose positions pass it, run\n"
                                   "with a warning instead of being refused",
       [](args& a, std::string_view, const std::string&) { a.req.allow_long_context = true; }},
      {"--max-new-tokens", "N", "answer tokens per turn at most, in [0, 1048576] (default 128)",
       [](args& a, std::string_view n, const std::string& v) {
         a.req.max_new_tokens = cli::parse_int(n, v, 0, max_token_count);
       }},
      {"--threads", "N", "in [1, 4 x hardware threads] (default: the hardware threads)",
       [](args& a, std::string_view n, const std::string& v) { a.forward.threads = cli::parse_threads(n, v); }},
      {"--json", "FILE", "write the per-turn report",
       [](args& a, std::string_view n, const std::string& v) {
         cli::check_output_path(n, v);
         a.json_path = v;
       }},
      {"--quiet", "", "no per-turn lines on stderr (warnings still print)",
       [](args& a, std::string_view, const std::string&) { a.quiet = true; }},
  };
  return table;
}

inline std::string usage() {
  return cli::format_usage("usage: fairkv-llama chat --budget N [options]   (multi-turn under a token budget)\n",
                           options());
}

// argv[0] is "chat".
inline args parse(int argc, const char* const* argv) {
  args a;
  a.req.compress.policy = "knorm";
  std::set<std::string, std::less<>> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
      return a;
    }
    const option* o = nullptr;
    for (const option& c : options())
      if (s == c.name) o = &c;
    if (!o) throw std::runtime_error("chat: unknown option '" + std::string(s) + "' (see chat --help)");
    if (s != "--whitelist" && !seen.insert(std::string(s)).second) cli::fail(s, "given twice");
    std::string value;
    if (*o->arg) {
      if (i + 1 >= argc) cli::fail(s, "needs a value (" + std::string(o->arg) + ")");
      value = argv[++i];
    }
    o->apply(a, s, value);
  }
  if (seen.count("--system") && seen.count("--system-file"))
    throw std::runtime_error("--system and --system-file: give one of them");
  if (!seen.count("--budget")) throw std::runtime_error("--budget: required (tokens per KV head kept at most)");
  for (const char* o : {"--sinks", "--boundary", "--system-floor", "--turn-decay"})
    if (!a.req.compress.fair && seen.count(o)) throw std::runtime_error(std::string(o) + ": needs --fair");
  check_chat_request(a.req);
  return a;
}

inline std::string to_json(const chat_turn_report& t, const std::vector<segment_info>& segs) {
  auto ints = [](const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::string kept = "{";
  for (size_t i = 0; i < segs.size(); ++i)
    kept += (i ? ", " : "") + json::quote(segs[i].name) + ": " + json::number(t.system_kept[i]);
  kept += "}";
  return "{\"turn\": " + std::to_string(t.index) + ", \"name\": " + json::quote(t.name) +
         ", \"user\": " + json::quote(t.user) + ", \"answer\": " + json::quote(t.answer) +
         ", \"user_tokens\": " + std::to_string(t.user_tokens) + ", \"answer_tokens\": " +
         std::to_string(t.answer_tokens) + ", \"compressed\": " + (t.compressed ? "true" : "false") +
         ", \"compress_ms\": " + json::number(t.compress_ms) + ", \"compress_target\": " +
         std::to_string(t.compress_target) + ", \"cache_before\": " + std::to_string(t.cache_before) +
         ", \"cache_min\": " + ints(t.cache_min) + ", \"cache_max\": " + ints(t.cache_max) +
         ", \"system_kept\": " + kept + ", \"system_cached\": " + json::number(t.system_cached) +
         ", \"shifts\": " + std::to_string(t.shifts) + ", \"discarded\": " + std::to_string(t.discarded) +
         ", \"state_bytes\": " + std::to_string(t.state_bytes) + ", \"round_trip_ms\": " +
         json::number(t.round_trip_ms) + ", \"prefill_ms\": " + json::number(t.prefill_ms) +
         ", \"decode_ms\": " + json::number(t.decode_ms) + ", \"decode_tps\": " + json::number(t.decode_tps) +
         ", \"rss_bytes\": " + std::to_string(t.rss_bytes) + ", \"n_past\": " + std::to_string(t.n_past) +
         ", \"capacity\": " + std::to_string(t.capacity) + ", \"warning\": " + json::quote(t.warning) + "}";
}

inline void print_turn_line(const chat_turn_report& t, const std::vector<segment_info>& segs) {
  int lo = t.cache_min.empty() ? 0 : t.cache_min[0], hi = 0;
  for (int v : t.cache_min) lo = std::min(lo, v);
  for (int v : t.cache_max) hi = std::max(hi, v);
  std::string kept;
  for (size_t i = 0; i < segs.size(); ++i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s=%.3f", segs[i].name.c_str(), t.system_kept[i]);
    kept += buf;
  }
  std::fprintf(stderr,
               "[turn %d] user %d + answer %d tokens; %s cache %d..%d tokens; decode %.1f tok/s; RSS %.1f MiB;"
               " system kept:%s\n",
               t.index, t.user_tokens, t.answer_tokens,
               t.compressed ? ("compressed " + std::to_string(t.cache_before) + "->" + std::to_string(t.compress_target) +
                               " in " + std::to_string(int(t.compress_ms)) + " ms,")
                                  .c_str()
               : t.shifts > 0 ? ("context shifted " + std::to_string(t.shifts) + "x, " + std::to_string(t.discarded) +
                                 " tokens dropped,")
                                    .c_str()
                              : "no compression,",
               lo, hi, t.decode_tps, double(t.rss_bytes) / (1024.0 * 1024.0), kept.c_str());
}

// A turn that was refused (llama::turn_too_long): nothing of the conversation changed.
inline std::string refused_json(const std::string& user, const std::string& name, const std::string& why) {
  return "{\"refused\": " + json::quote(why) + ", \"name\": " + json::quote(name) + ", \"user\": " +
         json::quote(user) + "}";
}

// The conversation of a chat session (fairkv-llama's, or fairkv-llamacpp's over llama.cpp): the script's turns, or
// one per stdin line until EOF; each answer on stdout, a line per turn on stderr, the report in --json (written
// also when a turn fails, with the turns that ran). A turn the session refuses (turn_too_long: nothing changed) is
// reported and skipped, and the conversation goes on. header_json: the report's first fields, before the
// options' ("key": value, ... with a trailing comma, or empty).
template <class Session>
int converse(const args& a, Session& session, const char* program, const std::string& header_json = "") {
  for (const std::string& w : session.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  std::vector<std::string> lines;
  auto one = [&](const std::string& user, const std::string& name) {
    chat_turn_report t;
    try {
      t = session.turn(user, name);
    } catch (const turn_too_long& e) {
      std::fprintf(stderr, "%s: %s; turn skipped, the conversation goes on\n", program, e.what());
      lines.push_back(refused_json(user, name, e.what()));
      return;
    }
    if (!t.warning.empty()) std::fprintf(stderr, "warning: %s\n", t.warning.c_str());
    if (!a.quiet) print_turn_line(t, session.system_segments());
    if (a.scripted) std::printf("> %s\n", user.c_str());
    std::printf("%s\n", t.answer.c_str());
    std::fflush(stdout);
    lines.push_back(to_json(t, session.system_segments()));
  };
  auto write = [&] {
    if (a.json_path.empty()) return;
    std::string segs = "[";
    const auto& ss = session.system_segments();
    for (size_t i = 0; i < ss.size(); ++i)
      segs += std::string(i ? ", " : "") + "{\"name\": " + json::quote(ss[i].name) + ", \"begin\": " +
              std::to_string(ss[i].begin) + ", \"end\": " + std::to_string(ss[i].end) + "}";
    segs += "]";
    std::string doc = "{" + header_json + "\"budget\": " + std::to_string(a.req.budget) + ", \"policy\": " +
                      json::quote(a.req.compress.policy) + ", \"fair\": " + (a.req.compress.fair ? "true" : "false") +
                      ", \"system_floor\": " + json::number(a.req.system_floor) + ", \"turn_decay\": " +
                      json::number(a.req.turn_decay) + ", \"selector\": " + json::quote(a.req.compress.selector) +
                      ", \"whitelist\": " + json::quote_list(a.req.whitelist) + ", \"max_new_tokens\": " +
                      std::to_string(a.req.max_new_tokens) + ", \"system_tokens\": " +
                      std::to_string(session.system_tokens()) + ", \"system_segments\": " + segs +
                      ", \"warnings\": " + json::quote_list(session.warnings()) + ", \"peak_rss_bytes\": " +
                      std::to_string(peak_resident_bytes()) + ", \"turns\": [\n";
    for (size_t i = 0; i < lines.size(); ++i) doc += (i ? ",\n" : "") + lines[i];
    doc += "\n]}\n";
    std::ofstream out(a.json_path, std::ios::binary);
    if (!(out << doc) || !out.flush()) throw std::runtime_error("--json: cannot write '" + a.json_path + "'");
  };
  try {
    if (a.scripted) {
      for (const script_turn& t : a.script) one(t.user, t.name);
    } else {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) one(line, "");
      }
    }
  } catch (...) {
    write();  // the turns that ran are reported
    throw;
  }
  write();
  return 0;
}

// Runs the conversation on fairkv-llama's own engine; returns the exit status.
inline int run(args a) {
  if (a.model_path.empty()) a.model_path = resolve_model("");
  const model m = model::load(a.model_path);
  const tokenizer tok = tokenizer::from_gguf(m.file());
  engine eng(m, 1, a.forward);  // the engine's own sequence is unused: the session has its own
  chat_session session(eng, tok, a.req, a.system);
  if (!a.quiet)
    std::fprintf(stderr, "chat: %d system tokens, budget %d, policy %s%s, %zu system segments\n",
                 session.system_tokens(), a.req.budget, a.req.compress.policy.c_str(), a.req.compress.fair ? " (fair)" : "",
                 session.system_segments().size());
  return converse(a, session, "fairkv-llama chat");
}

}  // namespace llama::chat_cli
