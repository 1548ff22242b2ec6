"""Harness that reproduces "The Pitfalls of KV Cache Compression" (Chen et al., 2025) with fairkv-llama.

Modules: data (evaluation files), segments (system turns with [[seg:NAME]] markers), runner (one
fairkv-llama invocation), metrics (ROUGE-L leakage, refusal, IFEval), harness (the resumable sweep), jsonl
(the one JSONL reader and writer), aggregate (JSONL -> tables), plots (PNG figures), cli
(`python3 -m tools.pitfalls run|report`).
"""
