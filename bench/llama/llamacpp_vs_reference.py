#!/usr/bin/env python3
"""How far llama.cpp (llama-cpp-python) is from the float reference in tests/data/llama_reference.txt:
max |logit diff| over the stored logits, and the greedy prefix it shares (teacher-forced). Run from the repo root."""
import numpy as np, sys, subprocess
from llama_cpp import Llama
path = subprocess.check_output(["bash","scripts/find_model.sh"],text=True).strip()
llm = Llama(model_path=path, n_threads=1, n_ctx=512, n_batch=512, verbose=False, logits_all=True)
lines = open("tests/data/llama_reference.txt").read().splitlines()
ids, greedy, logits = {}, {}, {}
for l in lines:
    p = l.split(" ")
    if p[0] == "ids": ids[int(p[1])] = list(map(int, p[3:]))
    if p[0] == "greedy": greedy[int(p[1])] = list(map(int, p[3:]))
    if p[0] == "logits": logits[(int(p[1]), int(p[2]))] = [(int(kv.split(":")[0]), float(kv.split(":")[1])) for kv in p[4:]]
for i in ids:
    llm.reset()
    seq = ids[i] + greedy[i]
    llm.eval(seq)
    sc = np.array(llm.scores[:len(seq)])
    md = 0; match = 0; ok = True
    for s in range(32):
        row = sc[len(ids[i]) - 1 + s]
        if (i, s) in logits:
            md = max(md, max(abs(row[j] - v) for j, v in logits[(i, s)]))
        if ok and int(np.argmax(row)) == greedy[i][s]: match += 1
        else: ok = False
    print(f"prompt {i}: llama.cpp max|diff| {md:.3f}, teacher-forced greedy prefix equal {match}/32, first argmax {int(np.argmax(sc[len(ids[i])-1]))} ref {greedy[i][0]}")
