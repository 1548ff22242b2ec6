#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) on the same GGUF, prompt text and thread count as fairkv_llama_bench.

  python3 bench/llama/llamacpp_bench.py [--model PATH] [--threads 2] [--prompt-tokens 256] [--decode-tokens 128]

Prefill: one llama_decode of the whole prompt (n_batch >= prompt). Decode: greedy, one token per eval.
Needs: pip install llama-cpp-python (builds llama.cpp from source). On a CPU with AMX, a default (native) build
may crash in ggml's AMX matmul (seen on the development VM): build with the CMAKE_ARGS of docs/benchmarks.md
("Runner against llama.cpp, seventh session"), which name the instruction sets and leave AMX out.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange salt, "
        "grain and cloth. Over the centuries the market grew into a town with walls, a cathedral and a university, "
        "and its scholars wrote about astronomy, medicine and law. ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama
    path = a.model or subprocess.check_output(
        ["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "find_model.sh")],
        text=True).strip()
    llm = Llama(model_path=path, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=1024, n_batch=512,
                n_ubatch=512, verbose=False)
    text = TEXT
    toks = llm.tokenize(text.encode(), add_bos=False, special=True)
    while len(toks) < a.prompt_tokens:
        text += TEXT
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
    toks = toks[:a.prompt_tokens]
    pre, dec = [], []
    for r in range(a.reps + 1):  # first run is warm-up
        llm.reset()
        llm._ctx.memory_clear(True) if hasattr(llm._ctx, "memory_clear") else None
        t0 = time.perf_counter()
        llm.eval(toks)
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(a.decode_tokens):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([nxt])
        td = time.perf_counter() - t0
        if r == 0:
            continue
        pre.append(a.prompt_tokens / tp)
        dec.append(a.decode_tokens / td)
        print(f"rep {r}: prefill {pre[-1]:.1f} tok/s, decode {dec[-1]:.1f} tok/s", file=sys.stderr)
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), {a.threads} threads: prefill {a.prompt_tokens} tokens: "
          f"{statistics.median(pre):.1f} tok/s (median of {a.reps}; best {max(pre):.1f}), decode {a.decode_tokens} "
          f"tokens: {statistics.median(dec):.1f} tok/s (median; best {max(dec):.1f})")


if __name__ == "__main__":
    main()
