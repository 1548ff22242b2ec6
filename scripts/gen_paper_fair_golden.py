#!/usr/bin/env python3
"""Golden kept sets for fairkv's "paper mode" of fair eviction: the two-span fair presses of
"The Pitfalls of KV Cache Compression" (Chen et al., 2025), re-expressed on kvpress 0.5.5 (PyPI).

The paper's code (CC BY 4.0) ships five presses, {knorm,snapkv,tova,observed_attention,streamingllm}
_fair_eviction_press.py, that subclass kvpress presses and split the system turn into two adjacent
spans (defense and system prompt, either order). This script writes its own subclasses of kvpress
0.5.5's KnormPress / SnapKVPress / TOVAPress / ObservedAttentionPress / StreamingLLMPress with the
same formulas (see FORMULAS below), checks them against an independent float64 numpy implementation,
checks that their compress() keeps the sets written to the file, and writes the file.

Inputs: random post-RoPE queries/keys (deterministic seed), and the post-RoPE queries/keys of two layers
of SmolLM2-135M-Instruct on a defended IFEval system turn (defense first, and flipped), dumped by the
repository's own Llama runner through scripts/dump_layer_qk.cpp (compiled here with g++). Attention
weights are the float32 causal softmax that transformers' eager attention computes from them (its own
eager_attention_forward is called), which is what the paper's presses received.

Usage (see scripts/requirements-golden.txt for the environment; nothing is fetched at run time, the model
must already be installed: `bash scripts/find_model.sh` prints its path):
    python scripts/gen_paper_fair_golden.py --out tests/data/paper_fair_golden.txt

FORMULAS (L = system-turn tokens; spans [b, e); "earlier" = whichever span comes first, widened to
[0, earlier_end); "later" widened to [later_start, L)):
  selection (all but StreamingLLM): n_kept = int(L * (1 - ratio)); k_e = n_kept * earlier_end // L;
      k_l = n_kept - k_e; torch.topk inside each widened span.
  knorm: -||k||.
  snapkv: w_e = min(window // 2, earlier_end), w_l = min(window - w_e, L - later_start); a widened span's
      window is its last w tokens, its voted keys the span's tokens before the window; score = full causal
      attention (queries in the window, keys voted on; not renormalised), mean over window queries,
      avg_pool1d(kernel, padding kernel // 2, stride 1, zero padding counted), mean over the GQA group;
      window tokens = the span's max score (per kv head), 1.0 if the span has no voted key.
  tova: anchors earlier_end - 1 and L - 1; keys [widened start, anchor) score the anchor's attention row
      averaged over ALL query heads (same for every kv head); anchor = the span's max (1.0 if none).
  observed_attention: attention of (query in the ORIGINAL later span, key in the ORIGINAL earlier span)
      zeroed; column sums / count, count = max(1, earlier_end - k) for k in the original earlier span,
      max(1, L - k) otherwise; mean over the GQA group.
  streaming_llm: 0, then torch.linspace(0.1, 0.9, n) over [n_sink, earlier_end) and over [later_start, L),
      then 1.0 on [0, n_sink); kvpress's plain global topk (ScorerPress.compress).
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from kvpress import KnormPress, ObservedAttentionPress, SnapKVPress, StreamingLLMPress, TOVAPress
from transformers.models.llama.modeling_llama import eager_attention_forward

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from gen_kvpress_golden import (StandInAttention, check_close, kvpress_version,  # noqa: E402
                                np_causal_attention, write_block)
from tools.pitfalls import data as pitfalls_data, segments as pitfalls_segments  # noqa: E402

BASE_SEED = 20251107
KERNEL_SIZE = 5
N_SINK = 4
REAL_WINDOW = 16  # the paper's SnapKV window
REAL_LAYERS = (0, 15)
REAL_RATIOS = (0.3, 0.5, 0.7)
REAL_IFEVAL_KEY = 1001  # the first item of sys_ifeval.jsonl
REAL_DIGITS = 5  # significant digits kept of the real keys/queries (the golden is computed from the rounded values)
# A kept set is "ambiguous" when the k-th and (k+1)-th largest scores of a top-k group differ by at most
# this much relative to the group's largest |score| (torch.topk breaks such ties arbitrarily).
AMBIGUOUS_REL = 1e-6
SCORERS = ("knorm", "streaming_llm", "snapkv", "tova", "observed_attention")


# ---------------------------------------------------------------- the paper's fair presses on kvpress 0.5.5

@dataclass
class _TwoSpans:
    """The two adjacent spans of the paper's fair presses: defense and system prompt, [begin, end)."""

    defense_span: tuple[int, int] | None = None
    sys_instr_span: tuple[int, int] | None = None

    def spans(self, L):
        """(earlier_begin, earlier_end, later_begin, later_end) of the ORIGINAL spans, validated."""
        assert self.defense_span is not None and self.sys_instr_span is not None, "spans not set"
        (d0, d1), (s0, s1) = self.defense_span, self.sys_instr_span
        assert 0 <= d0 <= d1 <= L and 0 <= s0 <= s1 <= L, (self.defense_span, self.sys_instr_span, L)
        if d1 == s0:
            return d0, d1, s0, s1
        assert s1 == d0, "spans must be adjacent"
        return s0, s1, d0, d1

    def attention_inputs(self, keys, attentions):
        """(B, H, L, spans(L)) for the scorers that read the eager attention weights."""
        assert attentions is not None, "the paper's attention scorers read the eager attention weights"
        B, H, L, _ = keys.shape
        return B, H, L, self.spans(L)


class _TwoSpanTopk:
    """compress() of the paper's fair presses: proportional quotas and top-k inside each widened span."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        L = scores.shape[-1]
        n_kept = int(L * (1 - self.compression_ratio))
        _, earlier_end, later_start, _ = self.spans(L)
        k_e = n_kept * earlier_end // L
        parts = []
        if k_e > 0:
            parts.append(scores[..., :earlier_end].topk(k_e, dim=-1).indices)
        if n_kept - k_e > 0:
            parts.append(scores[..., later_start:].topk(n_kept - k_e, dim=-1).indices + later_start)
        idx = torch.cat(parts, dim=-1).unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()


def _span_max_or_one(span_scores, like):
    """[B, H, 1]: each kv head's max over a span's scored keys, or 1.0 when it has none."""
    if span_scores.shape[-1] > 0:
        return span_scores.amax(dim=-1, keepdim=True)
    return like.new_ones(like.shape[:2] + (1,))


@dataclass
class PaperKnormPress(_TwoSpanTopk, _TwoSpans, KnormPress):
    pass  # kvpress's own -||k|| score


@dataclass
class PaperSnapKVPress(_TwoSpanTopk, _TwoSpans, SnapKVPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        B, H, L, (_, earlier_end, later_start, _) = self.attention_inputs(keys, attentions)
        groups = module.config.num_attention_heads // H
        w_e = min(self.window_size // 2, earlier_end)
        w_l = min(self.window_size - w_e, L - later_start)
        scores = keys.new_zeros((B, H, L))
        for begin, end, w in ((0, earlier_end, w_e), (later_start, L, w_l)):
            win = end - w
            voted = scores[..., begin:win]  # [B, H, 0] when the window covers the whole span
            if win > begin:
                voted = attentions[..., win:end, begin:win].mean(dim=-2)  # [B, Hq, n]
                voted = F.avg_pool1d(voted, kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1)
                voted = voted.view(B, H, groups, win - begin).mean(dim=2)
                scores[..., begin:win] = voted
            if w > 0:
                scores[..., win:end] = _span_max_or_one(voted, scores)
        return scores


@dataclass
class PaperTOVAPress(_TwoSpanTopk, _TwoSpans, TOVAPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        B, H, L, (e0, earlier_end, later_start, _) = self.attention_inputs(keys, attentions)
        scores = keys.new_zeros((B, H, L))
        for begin, anchor, protect in ((0, earlier_end - 1, earlier_end > e0), (later_start, L - 1, True)):
            row = attentions[:, :, anchor, begin:anchor].mean(dim=1, keepdim=True).expand(B, H, -1)
            scores[..., begin:anchor] = row
            if protect:
                scores[..., anchor:anchor + 1] = _span_max_or_one(row, scores)
        return scores


@dataclass
class PaperObservedAttentionPress(_TwoSpanTopk, _TwoSpans, ObservedAttentionPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        B, H, L, (e0, e1, l0, l1) = self.attention_inputs(keys, attentions)
        att = attentions
        if e1 > e0 and l1 > l0:
            keep = att.new_ones((L, L))
            keep[l0:l1, e0:e1] = 0.0  # later queries do not vote for earlier keys
            att = att * keep
        pos = torch.arange(L, dtype=att.dtype)
        count = torch.where((pos >= e0) & (pos < e1), (e1 - pos).clamp_min(1), L - pos).clamp_min(1)
        per_head = att.sum(dim=2) / count
        return per_head.view(B, H, -1, L).mean(dim=2)


@dataclass
class PaperStreamingLLMPress(_TwoSpans, StreamingLLMPress):
    # compress(): kvpress's own ScorerPress.compress (global topk), as in the paper.
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        L = hidden_states.shape[1]
        assert L > self.n_sink
        _, earlier_end, later_start, _ = self.spans(L)
        scores = torch.zeros_like(keys[..., 0])
        for begin, end in ((self.n_sink, earlier_end), (later_start, L)):
            if end <= begin:
                raise ValueError(f"empty ramp [{begin}, {end})")  # the paper's press raises here too
            scores[..., begin:end] = torch.linspace(0.1, 0.9, steps=end - begin)
        scores[..., :min(self.n_sink, L)] = 1.0
        return scores


def make_press(scorer, ratio, window, spans):
    common = dict(compression_ratio=ratio, defense_span=spans[0], sys_instr_span=spans[1])
    if scorer == "knorm":
        return PaperKnormPress(**common)
    if scorer == "streaming_llm":
        return PaperStreamingLLMPress(n_sink=N_SINK, **common)
    if scorer == "snapkv":
        return PaperSnapKVPress(window_size=window, kernel_size=KERNEL_SIZE, **common)
    if scorer == "tova":
        return PaperTOVAPress(**common)
    if scorer == "observed_attention":
        return PaperObservedAttentionPress(**common)
    raise ValueError(scorer)


# ---------------------------------------------------------------- independent float64 reference

def earlier_later(spans):
    (d0, d1), (s0, s1) = spans
    return (d0, d1, s0, s1) if d1 == s0 else (s0, s1, d0, d1)


def ref_scores(scorer, keys, attn, spans, window):
    """keys [H, L, D] float32, attn [Hq, L, L] float64 -> scores [H, L] float64, written as loops."""
    H, L, _ = keys.shape
    g = attn.shape[0] // H
    e0, e1, l0, l1 = earlier_later(spans)
    out = np.zeros((H, L))
    if scorer == "knorm":
        for h in range(H):
            for t in range(L):
                out[h, t] = -math.sqrt(sum(float(x) ** 2 for x in keys[h, t]))
    elif scorer == "streaming_llm":
        for begin, end in ((N_SINK, e1), (l0, L)):
            n = end - begin
            for i in range(n):
                out[:, begin + i] = 0.1 + 0.8 * (i / (n - 1) if n > 1 else 0.0)
        out[:, :N_SINK] = 1.0
    elif scorer == "snapkv":
        w_e = min(window // 2, e1)
        w_l = min(window - w_e, L - l0)
        pad = KERNEL_SIZE // 2
        for begin, end, w in ((0, e1, w_e), (l0, L, w_l)):
            win, n = end - w, end - w - begin
            for h in range(H):
                vals = np.zeros(n)
                for qh in range(h * g, (h + 1) * g):
                    mean_q = attn[qh, win:end, begin:win].mean(axis=0)
                    for j in range(n):
                        lo, hi = max(0, j - pad), min(n, j + pad + 1)
                        vals[j] += mean_q[lo:hi].sum() / KERNEL_SIZE / g
                out[h, begin:win] = vals
                out[h, win:end] = vals.max() if n > 0 else 1.0
    elif scorer == "tova":
        for begin, anchor in ((0, e1 - 1), (l0, L - 1)):
            row = attn[:, anchor, begin:anchor].mean(axis=0)
            out[:, begin:anchor] = row
            out[:, anchor] = row.max() if row.size else 1.0
    elif scorer == "observed_attention":
        for k in range(L):
            in_earlier = e0 <= k < e1
            voters = [q for q in range(k, L) if not (in_earlier and l0 <= q < l1)]
            count = max(1, (e1 if in_earlier else L) - k)
            for h in range(H):
                out[h, k] = sum(attn[qh, voters, k].sum() for qh in range(h * g, (h + 1) * g)) / count / g
    else:
        raise ValueError(scorer)
    return out


def topk_groups(scorer, spans, L, n_kept):
    """[(begin, end, k)]: the ranges inside which the press runs one top-k, and how many it keeps there."""
    if scorer == "streaming_llm":
        return [(0, L, n_kept)]
    _, e1, l0, _ = earlier_later(spans)
    k_e = n_kept * e1 // L
    return [(0, e1, k_e), (l0, L, n_kept - k_e)]


def boundary_ambiguous(vals, k):
    """True when the k-th and (k+1)-th largest of vals are equal or within AMBIGUOUS_REL of max |vals|."""
    if k <= 0 or k >= len(vals):
        return False
    d = np.sort(np.asarray(vals, dtype=np.float64))[::-1]
    return d[k - 1] - d[k] <= AMBIGUOUS_REL * np.abs(d).max()


def kept_by_sorting(scores, groups):
    """Kept set of one head by a stable descending sort inside each group (for unambiguous heads)."""
    kept = []
    for b, e, k in groups:
        order = np.argsort(-np.asarray(scores[b:e], dtype=np.float64), kind="stable")
        kept.extend(int(b + i) for i in order[:k])
    return sorted(kept)


# ---------------------------------------------------------------- inputs

@dataclass
class Tensor:
    name: str
    keys: np.ndarray     # [H, L, D] float32, post-RoPE
    queries: np.ndarray  # [Hq, L, D] float32, post-RoPE, all positions
    spans: tuple         # ((defense_begin, defense_end), (sys_begin, sys_end))
    attn32: np.ndarray = None  # [Hq, L, L] eager float32 attention
    attn64: np.ndarray = None  # [Hq, L, L] float64 reference attention

    @property
    def shape(self):
        H, L, D = self.keys.shape
        return H, self.queries.shape[0], L, D


@dataclass
class RandomInput:
    kv_heads: int
    groups: int
    head_dim: int
    prefix: int          # template tokens before the first span
    first: int           # length of the first span
    second: int          # length of the second span
    suffix: int          # template tokens after the second span
    defense_first: bool
    ratios: tuple
    wide: bool = False   # peaky softmax (logits of a few tens)

    @property
    def tokens(self):
        return self.prefix + self.first + self.second + self.suffix

    @property
    def name(self):
        order = "dfirst" if self.defense_first else "dlast"
        return (f"rand_h{self.kv_heads}g{self.groups}_d{self.head_dim}_L{self.tokens}_{order}"
                f"_p{self.prefix}_{self.first}_{self.second}_s{self.suffix}" + ("_wide" if self.wide else ""))


RANDOM_INPUTS = [
    RandomInput(1, 1, 8, 0, 10, 14, 0, True, (0.1, 0.4)),             # spans cover [0, L)
    RandomInput(2, 3, 16, 3, 12, 20, 2, False, (0.2, 0.5, 0.8)),      # template tokens around the spans
    RandomInput(3, 1, 8, 3, 40, 55, 2, True, (0.1, 0.4, 0.7, 0.9)),
    RandomInput(1, 3, 8, 3, 180, 115, 2, False, (0.3, 0.6, 0.9)),     # L = 300
    RandomInput(1, 3, 8, 0, 2, 30, 0, True, (0.5, 0.8)),              # earlier span of 2 tokens
    RandomInput(2, 1, 8, 3, 25, 1, 0, False, (0.3, 0.7)),             # later span of 1 token
    # L = 20, earlier span of 3 tokens; 0.8999999761581421 is the paper's "0.9" (torch.linspace(0, 0.9, 10)[9]
    # in float32): it keeps int(20 * 0.10000002) = 2 tokens where 0.9 keeps int(20 * 0.09999999999999998) = 1.
    RandomInput(1, 1, 16, 2, 3, 15, 0, False, (0.5, 0.9, 0.8999999761581421)),
    RandomInput(3, 3, 8, 3, 53, 2, 2, True, (0.5,)),                  # later span of 2 tokens
    RandomInput(1, 3, 16, 3, 45, 70, 2, True, (0.5,), wide=True),
    RandomInput(1, 1, 8, 0, 90, 60, 0, False, (0.5, 0.9)),
]


def random_tensor(spec, index):
    rng = np.random.default_rng(BASE_SEED + index)
    H, Hq, L, D = spec.kv_heads, spec.kv_heads * spec.groups, spec.tokens, spec.head_dim
    keys = rng.standard_normal((H, L, D)).astype(np.float32)
    queries = rng.standard_normal((Hq, L, D)).astype(np.float32)
    if spec.wide:
        keys = (keys * np.where(rng.uniform(size=(H, L, 1)) < 0.2, 3.0, 1.0)).astype(np.float32)
        queries = (queries * np.float32(4.0)).astype(np.float32)
    a = (spec.prefix, spec.prefix + spec.first)
    b = (a[1], a[1] + spec.second)
    spans = (a, b) if spec.defense_first else (b, a)
    return Tensor(spec.name, keys, queries, spans)


def compile_dump_tool(build_dir):
    exe = build_dir / "dump_layer_qk"
    cmd = ["g++", "-O2", "-std=c++20", "-pthread", "-I", str(REPO / "include"), "-I", str(REPO / "examples/llama"),
           "-I", "/usr/include/eigen3", str(REPO / "scripts/dump_layer_qk.cpp"), "-o", str(exe)]
    print("compiling the dump helper:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return exe


def real_system_text(defense):
    """The defended system turn of one IFEval item, marked with two segments: defense and sys (the paper's
    sys_instr_span: preamble + IFEval system message)."""
    data_dir = pitfalls_data.default_data_dir()
    item = next(i for i in pitfalls_data.load_items(data_dir) if i.key == REAL_IFEVAL_KEY)
    turn = pitfalls_segments.build_system_turn(item.system, defense, pitfalls_data.load_defenses(data_dir))
    out, prev = "", None
    for s in turn.segments:
        name = "defense" if s.name == "defense" else "sys"
        out += (pitfalls_segments.MARKER.format(name) if name != prev else "") + s.text
        prev = name
    return out


def round_significant(a, digits=REAL_DIGITS):
    """a rounded to `digits` significant decimal digits, as float32 (keeps the real tensors' text short)."""
    return np.array([float(f"{x:.{digits}g}") for x in a.reshape(-1).tolist()], np.float32).reshape(a.shape)


def real_tensors(model, build_dir):
    exe = compile_dump_tool(build_dir)
    out = []
    for defense in ("standard", "flipped"):
        d = build_dir / defense
        d.mkdir()
        (d / "system.txt").write_text(real_system_text(defense), encoding="utf-8")
        subprocess.run([str(exe), model, str(d / "system.txt"), str(d)] + [str(l) for l in REAL_LAYERS], check=True)
        meta = (d / "meta.txt").read_text().split("\n")
        head = meta[0].split()
        dims = dict(zip(head[::2], (int(x) for x in head[1::2])))
        seg = {w[1]: (int(w[2]), int(w[3])) for w in (line.split() for line in meta) if w and w[0] == "segment"}
        assert set(seg) == {"defense", "sys"}, seg
        L, Hq, H, D = dims["tokens"], dims["q_heads"], dims["kv_heads"], dims["head_dim"]
        print(f"  {defense}: {L} tokens, defense {seg['defense']}, sys {seg['sys']}", file=sys.stderr)
        for layer in REAL_LAYERS:
            k = round_significant(np.fromfile(d / f"k{layer}.f32", dtype="<f4").reshape(H, L, D))
            q = round_significant(np.fromfile(d / f"q{layer}.f32", dtype="<f4").reshape(Hq, L, D))
            order = "dfirst" if defense == "standard" else "dlast"
            out.append(Tensor(f"smollm2_{order}_layer{layer}", k, q, (seg["defense"], seg["sys"])))
    return out


def eager_attention(t):
    """transformers' own eager attention weights (float32) for post-RoPE queries/keys [B=1]."""
    H, Hq, L, D = t.shape
    module = StandInAttention(Hq, H, D).eval()
    module.num_key_value_groups = Hq // H
    q, k = torch.from_numpy(t.queries)[None], torch.from_numpy(t.keys)[None]
    mask = torch.full((L, L), torch.finfo(torch.float32).min).triu(1)[None, None]
    _, w = eager_attention_forward(module, q, k, torch.zeros_like(k), mask, scaling=D ** -0.5)
    return w[0].numpy()


# ---------------------------------------------------------------- one case

@dataclass
class Case:
    tensor: Tensor
    scorer: str
    ratio: float
    window: int = 0

    @property
    def name(self):
        w = f"_w{self.window}" if self.scorer == "snapkv" else ""
        return f"{self.scorer}{w}_{self.tensor.name}_r{self.ratio}"


def run_case(case):
    t = case.tensor
    H, Hq, L, D = t.shape
    module = StandInAttention(Hq, H, D)
    keys = torch.from_numpy(t.keys)[None]
    values_np = np.zeros((H, L, D), np.float32)
    values_np[:, :, 0] = np.arange(L)  # compress() reveals the kept tokens through channel 0
    values = torch.from_numpy(values_np)[None]
    hidden = torch.full((1, L, Hq * D), float("nan"))  # only its shape may be read
    attentions = torch.from_numpy(t.attn32)[None]
    press = make_press(case.scorer, case.ratio, case.window, t.spans)
    with torch.no_grad():
        scores_t = press.score(module, hidden, keys, values, attentions, {})
        assert scores_t.shape == (1, H, L) and scores_t.dtype == torch.float32
        scores = scores_t[0].numpy().copy()
        assert np.isfinite(scores).all()
        _, kept_vals = press.compress(module, hidden, keys, values, attentions, {})
    from_compress = kept_vals[0, :, :, 0].numpy().astype(np.int64)  # [H, n_kept]
    n_kept = int(L * (1 - case.ratio))
    assert from_compress.shape == (H, n_kept), (from_compress.shape, n_kept)
    kept = np.sort(from_compress, axis=1)
    assert (np.diff(kept, axis=1) > 0).all(), "compress() kept a token twice"

    ref = ref_scores(case.scorer, t.keys, t.attn64, t.spans, case.window)
    scaled_err, rel_err = check_close(case.name, scores, ref)

    groups = topk_groups(case.scorer, t.spans, L, n_kept)
    ambiguous = np.array([any(boundary_ambiguous(scores[h, b:e], k) for b, e, k in groups) for h in range(H)])
    for h in range(H):
        if not ambiguous[h]:
            # The float32 scores and the float64 reference both give compress()'s set.
            assert kept_by_sorting(scores[h], groups) == kept[h].tolist(), (case.name, h, "float32 sort")
            assert kept_by_sorting(ref[h], groups) == kept[h].tolist(), (case.name, h, "float64 reference")
    return dict(scores=scores, kept=kept, n_kept=n_kept, ambiguous=ambiguous.astype(np.int64),
                scaled_err=scaled_err, rel_err=rel_err)


def build_cases(tensors_random, tensors_real):
    cases = []
    for spec, t in tensors_random:
        for r in spec.ratios:
            for s in SCORERS:
                if s == "streaming_llm" and earlier_later(t.spans)[1] <= N_SINK:
                    continue  # the paper's press raises (empty ramp over [n_sink, earlier_end))
                for w in ((16, 8) if s == "snapkv" else (0,)):
                    cases.append(Case(t, s, r, w))
    for t in tensors_real:
        for r in REAL_RATIOS:
            for s in SCORERS:
                cases.append(Case(t, s, r, REAL_WINDOW if s == "snapkv" else 0))
    return cases


# ---------------------------------------------------------------- output

HEADER = """\
# fairkv golden kept sets for the paper's two-span fair presses ("The Pitfalls of KV Cache Compression",
# Chen et al. 2025), re-expressed as subclasses of kvpress's presses (formulas: scripts/gen_paper_fair_golden.py).
# Generated by: python scripts/gen_paper_fair_golden.py --out tests/data/paper_fair_golden.txt
# kvpress {kvpress} | torch {torch} | transformers {transformers} | numpy {numpy} | seed base {seed}
# Real inputs: {model}, IFEval item {ifeval_key}, layers {layers}, dumped by the repository's Llama runner
# (scripts/dump_layer_qk.cpp), rounded to {digits} significant digits: the scores below are those of the rounded
# values this file holds (the dumped bits depend on the build anyway; this file is the fixture).
# All numbers are whitespace separated (C++ operator>>); floats are float32 written to round-trip; batch 1,
# row-major; q head i belongs to kv head i / (q_heads / kv_heads). Lines starting with # are comments.
#
# A tensor block (always before the cases that name it):
#   tensor <id> kv_heads <H> q_heads <Hq> tokens <L> head_dim <D>            (one line)
#   keys <H*L*D>       [H, L, D] post-RoPE keys
#   queries <Hq*L*D>   [Hq, L, D] post-RoPE queries of ALL L positions
#   end
# The attention every attention scorer read is transformers' eager float32 causal softmax of these:
# softmax(q k^T * D^-0.5 + mask) over keys <= query position (not stored).
#
# A case:
#   case <name> tensor <id> scorer <s> window <w> kernel <k> n_sink <n> kv_heads <H> q_heads <Hq> tokens <L>
#        head_dim <D> ratio <r> defense_begin <b> defense_end <e> sys_begin <b> sys_end <e> n_kept <k>
#        (all on one line; key/value pairs)
#   scores <H*L>       [H, L] the paper's scores (float32, from the press's score())
#   kept <H*n_kept>    [H, n_kept] kept token indices of the press's compress(), each row sorted ascending
#   ambiguous <H>      per kv head: 1 if its kept set depends on a tie or near-tie at a top-k boundary (the
#                      k-th and (k+1)-th largest scores of a top-k group within {amb:g} x the group's max |score|),
#                      so torch.topk's arbitrary tie-break chose it; 0 otherwise (the set is unique)
#   end
# scorer: knorm | streaming_llm | snapkv | tova | observed_attention. window: snapkv's window, else 0;
# kernel: snapkv's pooling kernel, else 0; n_sink: streaming_llm's sinks, else 0.
# Spans are [begin, end) token ranges of the system turn, adjacent (defense_end == sys_begin or
# sys_end == defense_begin); the tokens before the first and after the second are chat template.
# n_kept = int(L * (1 - ratio)) in double precision. Top-k groups: streaming_llm one group [0, L) (n_kept);
# the others [0, earlier_end) keeping n_kept * earlier_end / L (integer division) and [later_begin, L)
# keeping the rest, where earlier = the span that comes first.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests/data/paper_fair_golden.txt"))
    ap.add_argument("--model", help="the SmolLM2-135M-Instruct GGUF (default: scripts/find_model.sh --no-install)")
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # reduction order independent of the machine's core count

    model = args.model or subprocess.run(["bash", str(REPO / "scripts/find_model.sh"), "--no-install"],
                                         check=True, capture_output=True, text=True).stdout.strip()
    random_pairs = [(spec, random_tensor(spec, i)) for i, spec in enumerate(RANDOM_INPUTS)]
    with tempfile.TemporaryDirectory(prefix="paper_fair_golden_") as tmp:
        real = real_tensors(model, Path(tmp))
    tensors = [t for _, t in random_pairs] + real
    names = [t.name for t in tensors]
    assert len(set(names)) == len(names), "duplicate tensor names"
    for t in tensors:
        t.attn32 = eager_attention(t)
        H, Hq, _, _ = t.shape
        t.attn64 = np_causal_attention(t.queries, np.repeat(t.keys, Hq // H, axis=0), 0)
        assert np.abs(t.attn32 - t.attn64).max() < 1e-5, f"{t.name}: eager attention"

    cases = build_cases(random_pairs, real)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    import transformers
    stats = {s: [0, 0, 0] for s in SCORERS}  # cases, heads, ambiguous heads
    written = set()
    with open(args.out, "w") as out:
        out.write(HEADER.format(kvpress=kvpress_version(), torch=torch.__version__,
                                transformers=transformers.__version__, numpy=np.__version__, seed=BASE_SEED,
                                model=Path(model).name, ifeval_key=REAL_IFEVAL_KEY,
                                layers=",".join(map(str, REAL_LAYERS)), digits=REAL_DIGITS,
                                amb=AMBIGUOUS_REL))
        for c in cases:
            t = c.tensor
            H, Hq, L, D = t.shape
            if t.name not in written:
                out.write(f"tensor {t.name} kv_heads {H} q_heads {Hq} tokens {L} head_dim {D}\n")
                write_block(out, "keys", t.keys, per_line=D)
                write_block(out, "queries", t.queries, per_line=D)
                out.write("end\n")
                written.add(t.name)
            r = run_case(c)
            (d0, d1), (s0, s1) = t.spans
            out.write(f"case {c.name} tensor {t.name} scorer {c.scorer} window {c.window} "
                      f"kernel {KERNEL_SIZE if c.scorer == 'snapkv' else 0} "
                      f"n_sink {N_SINK if c.scorer == 'streaming_llm' else 0} kv_heads {H} q_heads {Hq} tokens {L} "
                      f"head_dim {D} ratio {c.ratio!r} defense_begin {d0} defense_end {d1} sys_begin {s0} "
                      f"sys_end {s1} n_kept {r['n_kept']}\n")
            write_block(out, "scores", r["scores"], per_line=10)
            write_block(out, "kept", r["kept"], per_line=32, is_int=True)
            write_block(out, "ambiguous", r["ambiguous"], per_line=32, is_int=True)
            out.write("end\n")
            st = stats[c.scorer]
            st[0] += 1
            st[1] += H
            st[2] += int(r["ambiguous"].sum())
            print(f"{c.name:70s} n_kept {r['n_kept']:3d} ambiguous {''.join(map(str, r['ambiguous']))}  "
                  f"err/max {r['scaled_err']:.1e}  rel {r['rel_err']:.1e}", file=sys.stderr)
    n_tensors, n_cases = validate(args.out)
    assert (n_tensors, n_cases) == (len(tensors), len(cases))
    for s, (n, heads, amb) in stats.items():
        print(f"{s:20s} {n:4d} cases, {amb}/{heads} heads ambiguous ({amb / heads:.1%})", file=sys.stderr)
    print(f"wrote {n_tensors} tensors and {n_cases} cases to {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB, "
          f"re-read and validated) in {time.time() - t_start:.0f} s", file=sys.stderr)


def validate(path):
    """Re-read the file the way a C++ reader would (whitespace tokens) and check its invariants."""
    toks = " ".join(line for line in open(path).read().split("\n") if not line.startswith("#")).split()
    tensors, i, n_cases = {}, 0, 0

    def block(tag):
        nonlocal i
        assert toks[i] == tag, (toks[i], tag)
        n = int(toks[i + 1])
        vals = np.array(toks[i + 2:i + 2 + n], dtype=np.float64)
        i += 2 + n
        return vals

    while i < len(toks):
        kind, name = toks[i], toks[i + 1]
        if kind == "tensor":
            hdr = dict(zip(toks[i + 2:i + 10:2], toks[i + 3:i + 10:2]))
            assert list(hdr) == ["kv_heads", "q_heads", "tokens", "head_dim"], (name, list(hdr))
            i += 10
            h, hq, L, d = (int(hdr[x]) for x in ("kv_heads", "q_heads", "tokens", "head_dim"))
            assert block("keys").size == h * L * d and block("queries").size == hq * L * d, name
            tensors[name] = (h, hq, L, d)
        else:
            assert kind == "case", kind
            keys = ["tensor", "scorer", "window", "kernel", "n_sink", "kv_heads", "q_heads", "tokens", "head_dim",
                    "ratio", "defense_begin", "defense_end", "sys_begin", "sys_end", "n_kept"]
            hdr = dict(zip(toks[i + 2:i + 2 + 2 * len(keys):2], toks[i + 3:i + 2 + 2 * len(keys):2]))
            assert list(hdr) == keys, (name, list(hdr))
            i += 2 + 2 * len(keys)
            h, hq, L, d, k = (int(hdr[x]) for x in ("kv_heads", "q_heads", "tokens", "head_dim", "n_kept"))
            assert tensors[hdr["tensor"]] == (h, hq, L, d), name
            assert k == int(L * (1 - float(hdr["ratio"]))), name
            d0, d1, s0, s1 = (int(hdr[x]) for x in ("defense_begin", "defense_end", "sys_begin", "sys_end"))
            assert d1 == s0 or s1 == d0, name
            assert block("scores").size == h * L, name
            kept = block("kept").astype(np.int64).reshape(h, k)
            assert (np.diff(kept, axis=1) > 0).all() and kept.min() >= 0 and kept.max() < L, name
            assert set(block("ambiguous").astype(np.int64)) <= {0, 1}, name
            n_cases += 1
        assert toks[i] == "end", (name, toks[i])
        i += 1
    return len(tensors), n_cases


if __name__ == "__main__":
    main()
