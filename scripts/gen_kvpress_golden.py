#!/usr/bin/env python3
"""Generate golden reference values for fairkv's scorers from the installed kvpress (PyPI).

Every score in the output is produced by kvpress's own ``score()`` method and every kept set by the
same ``topk`` that ``ScorerPress.compress`` runs (checked against ``compress`` itself), on small
deterministic float32 inputs. An independent float64 numpy implementation of each formula is
asserted to agree, so the file also documents the semantics (see docs/kvpress-semantics.md).

Usage (see scripts/requirements-golden.txt for the versions this was generated with):
    python scripts/gen_kvpress_golden.py --out tests/data/kvpress_golden.txt

The output is plain text that C++ can read with operator>>; the format is described in the header
that this script writes into the file.
"""

import argparse
import math
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

import kvpress
from kvpress import KnormPress, ObservedAttentionPress, SnapKVPress, StreamingLLMPress, TOVAPress

try:  # kvpress >= 0.5.5: n_kept = max(1, int(L * (1 - ratio)))
    from kvpress.utils import compute_n_kept
except ImportError:  # older kvpress: plain int(L * (1 - ratio))

    def compute_n_kept(k_len, compression_ratio):
        return int(k_len * (1 - compression_ratio))


BASE_SEED = 20250601
KERNEL_SIZE = 5
N_SINK = 4

# Independent float64 recomputation must agree with kvpress (float32) to this, relative to the
# largest |score| of the case; elementwise relative agreement is checked more loosely because
# tiny attention probabilities carry float32 exp() error.
REF_TOL_SCALED = 1e-6
REF_TOL_ELEMENT = 1e-4


@dataclass
class Case:
    press: str  # knorm | streaming_llm | snapkv | tova | observed_attention
    source: str  # keys | queries | attentions
    kv_heads: int
    groups: int
    tokens: int
    head_dim: int
    ratio: float
    window: int = 0
    variant: str = ""  # "" | wide (scores spread over orders of magnitude) | rope (real RoPE on queries)

    @property
    def q_heads(self):
        return self.kv_heads * self.groups

    @property
    def name(self):
        w = f"_w{self.window}" if self.press == "snapkv" else ""
        v = f"_{self.variant}" if self.variant else ""
        return (f"{self.press}_{self.source}{w}_h{self.kv_heads}g{self.groups}_L{self.tokens}"
                f"_d{self.head_dim}_r{self.ratio}{v}")


def build_cases():
    c = []
    # K-norm: keys only. r=0.9 with L=100 is the n_kept rounding trap: 100 * (1 - 0.9) = 9.999... -> 9.
    for h, g, L, d, r, v in [(1, 1, 24, 8, 0.5, ""), (2, 3, 37, 16, 0.25, ""), (3, 1, 100, 8, 0.7, ""),
                             (2, 1, 150, 16, 0.5, "wide"), (3, 3, 37, 8, 0.7, ""), (1, 1, 100, 8, 0.9, "")]:
        c.append(Case("knorm", "keys", h, g, L, d, r, 0, v))
    # StreamingLLM: L=5 (n_kept < n_sink, so the sinks tie) is an edge case.
    for h, g, L, d, r in [(1, 1, 24, 8, 0.5), (3, 1, 37, 8, 0.7), (2, 3, 100, 16, 0.25), (1, 1, 150, 8, 0.9),
                          (2, 1, 5, 8, 0.7)]:
        c.append(Case("streaming_llm", "keys", h, g, L, d, r))
    # SnapKV from the window's queries (kvpress computes the window attention itself).
    for w, h, g, L, d, r, v in [(16, 1, 1, 24, 8, 0.5, ""), (16, 2, 3, 37, 16, 0.25, ""),
                                (16, 3, 3, 100, 8, 0.7, ""), (16, 2, 1, 150, 16, 0.5, ""),
                                (64, 2, 3, 100, 8, 0.5, ""), (64, 1, 3, 150, 16, 0.7, ""),
                                (64, 3, 1, 65, 8, 0.25, ""),  # L just above the window
                                (16, 2, 1, 17, 8, 0.25, ""),  # L just above the window
                                (16, 1, 3, 22, 8, 0.25, ""),  # n_kept == window exactly
                                (16, 2, 3, 100, 16, 0.5, "wide"), (16, 2, 3, 37, 16, 0.5, "rope")]:
        c.append(Case("snapkv", "queries", h, g, L, d, r, w, v))
    # SnapKV from full attention weights.
    for w, h, g, L, d, r, v in [(16, 1, 1, 24, 8, 0.5, ""), (16, 2, 3, 37, 16, 0.25, ""),
                                (16, 2, 1, 100, 8, 0.7, ""), (64, 1, 3, 100, 8, 0.5, ""),
                                (64, 1, 1, 65, 8, 0.25, ""), (16, 1, 1, 100, 8, 0.5, "wide")]:
        c.append(Case("snapkv", "attentions", h, g, L, d, r, w, v))
    # TOVA (window 1 internally).
    for h, g, L, d, r, v in [(1, 1, 24, 8, 0.5, ""), (2, 3, 37, 16, 0.25, ""), (3, 3, 100, 8, 0.7, ""),
                             (2, 1, 150, 16, 0.5, ""), (1, 3, 100, 8, 0.5, "wide"), (2, 3, 37, 16, 0.5, "rope")]:
        c.append(Case("tova", "queries", h, g, L, d, r, 1, v))
    for h, g, L, d, r, v in [(1, 1, 24, 8, 0.5, ""), (2, 3, 37, 16, 0.25, ""), (3, 1, 37, 8, 0.7, ""),
                             (2, 1, 100, 16, 0.5, ""), (1, 1, 100, 8, 0.5, "wide")]:
        c.append(Case("tova", "attentions", h, g, L, d, r, 1, v))
    # Observed attention (H2O).
    for h, g, L, d, r, v in [(1, 1, 24, 8, 0.5, ""), (2, 3, 37, 16, 0.25, ""), (3, 1, 37, 8, 0.7, ""),
                             (1, 1, 100, 8, 0.7, ""), (1, 1, 150, 16, 0.5, ""), (1, 1, 100, 8, 0.5, "wide")]:
        c.append(Case("observed_attention", "attentions", h, g, L, d, r, 0, v))
    return c


# ---------------------------------------------------------------- stand-in attention module

class StandInAttention(nn.Module):
    """The attributes kvpress reads from a Llama-like attention layer, and nothing else.

    q_proj is the identity, so the per-head queries are exactly the hidden states viewed as
    [L, Hq, D]; with cos = 1, sin = 0 RoPE is the identity too (unless real RoPE is passed).
    """

    def __init__(self, q_heads, kv_heads, head_dim):
        super().__init__()
        self.config = SimpleNamespace(num_attention_heads=q_heads, num_key_value_heads=kv_heads)
        self.head_dim = head_dim
        self.layer_idx = 0
        hidden = q_heads * head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.eye(hidden))


def rope_cos_sin(positions, head_dim, theta=10000.0):
    """Llama-style cos/sin tables [L, D] (rotate_half layout), float32."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = np.outer(positions.astype(np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def rotate_half_np(x):
    d = x.shape[-1] // 2
    return np.concatenate([-x[..., d:], x[..., :d]], axis=-1)


# ---------------------------------------------------------------- independent numpy reference (float64)

def np_causal_attention(q, k_rep, q_pos0):
    """q: [Hq, Lq, D] at absolute positions q_pos0.., k_rep: [Hq, L, D] -> softmax weights [Hq, Lq, L]."""
    d = q.shape[-1]
    logits = q.astype(np.float64) @ k_rep.astype(np.float64).transpose(0, 2, 1) / math.sqrt(d)
    lq, L = logits.shape[1], logits.shape[2]
    pos = q_pos0 + np.arange(lq)[:, None]
    logits = np.where(np.arange(L)[None, :] > pos, -np.inf, logits)
    logits -= logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


def np_snapkv(window_attn, kv_heads, window, kernel=KERNEL_SIZE):
    """window_attn: [Hq, w, L - w] -> scores [H, L]."""
    hq = window_attn.shape[0]
    s = window_attn.mean(axis=1)  # [Hq, L - w]
    pad = kernel // 2
    sp = np.pad(s, ((0, 0), (pad, pad)))  # zero padding, counted in the divisor
    pooled = np.stack([sp[:, j:j + kernel].sum(axis=1) / kernel for j in range(s.shape[1])], axis=1)
    grouped = pooled.reshape(kv_heads, hq // kv_heads, -1).mean(axis=1)  # [H, L - w]
    fill = grouped.max() + 1.0
    return np.concatenate([grouped, np.full((kv_heads, window), fill)], axis=1)


def np_tova(last_row, kv_heads):
    """last_row: [Hq, L - 1] attention of the last query -> scores [H, L]."""
    s = last_row.mean(axis=0)  # [L - 1]
    s = np.concatenate([s, [s.max() + 1.0]])
    return np.tile(s, (kv_heads, 1))


def np_observed(attn, kv_heads):
    """attn: [Hq, L, L] -> scores [H, L]."""
    hq, L, _ = attn.shape
    s = attn.sum(axis=1) / np.arange(L, 0, -1, dtype=np.float64)
    return s.reshape(kv_heads, hq // kv_heads, L).mean(axis=1)


def check_close(what, got, ref):
    got = np.asarray(got, dtype=np.float64)
    scale = np.abs(ref).max()
    err = np.abs(got - ref)
    if err.max() > REF_TOL_SCALED * scale:
        raise AssertionError(f"{what}: max abs err {err.max():.3g} > {REF_TOL_SCALED} * {scale:.3g}")
    big = np.abs(ref) > 1e-30
    rel = (err[big] / np.abs(ref[big])).max() if big.any() else 0.0
    if rel > REF_TOL_ELEMENT:
        raise AssertionError(f"{what}: max elementwise rel err {rel:.3g} > {REF_TOL_ELEMENT}")
    return err.max() / scale, rel


# ---------------------------------------------------------------- one case

def make_inputs(case, rng):
    h, hq, L, d = case.kv_heads, case.q_heads, case.tokens, case.head_dim
    keys = rng.standard_normal((h, L, d)).astype(np.float32)  # [H, L, D]
    queries = rng.standard_normal((hq, L, d)).astype(np.float32)  # [Hq, L, D] (all positions)
    if case.variant == "wide":
        if case.press == "knorm":
            # Per-token key scale over four orders of magnitude.
            keys *= (10.0 ** rng.uniform(-2, 2, size=(h, L, 1))).astype(np.float32)
        else:
            # Peaky softmax: logits of a few tens, probabilities spanning many decades.
            keys *= np.where(rng.uniform(size=(h, L, 1)) < 0.2, 3.0, 1.0).astype(np.float32)
            queries *= np.float32(4.0)
        keys = keys.astype(np.float32)
        queries = queries.astype(np.float32)
    return keys, queries


def run_case(case, index):
    rng = np.random.default_rng(BASE_SEED + index)
    h, g, hq, L, d = case.kv_heads, case.groups, case.q_heads, case.tokens, case.head_dim
    w = case.window
    keys_np, queries_np = make_inputs(case, rng)
    keys_rep = np.repeat(keys_np, g, axis=0)  # [Hq, L, D]; q head i uses kv head i // g

    module = StandInAttention(hq, h, d)
    keys = torch.from_numpy(keys_np)[None]  # [1, H, L, D]
    # Values carry each token's index in channel 0, so compress() reveals which tokens it kept.
    values_np = np.zeros((h, L, d), dtype=np.float32)
    values_np[:, :, 0] = np.arange(L, dtype=np.float32)
    values = torch.from_numpy(values_np)[None]  # [1, H, L, D]

    # Hidden states [1, L, Hq*D]: NaN everywhere kvpress must not look; the last rows hold queries.
    hidden_np = np.full((L, hq * d), np.nan, dtype=np.float32)
    if case.variant == "rope":
        cos_np, sin_np = rope_cos_sin(np.arange(L), d)  # [L, D]
    else:
        cos_np, sin_np = np.ones((L, d), np.float32), np.zeros((L, d), np.float32)

    rec_queries = np.zeros((0,), np.float32)
    attn_np = None
    lq = 0
    if case.source == "queries":
        lq = w
        pre = queries_np[:, L - lq:, :]  # [Hq, Lq, D] pre-RoPE
        hidden_np[L - lq:, :] = pre.transpose(1, 0, 2).reshape(lq, hq * d)
        # Post-RoPE queries, with kvpress's float32 formula q*cos + rotate_half(q)*sin.
        post = (pre * cos_np[None, L - lq:] + rotate_half_np(pre) * sin_np[None, L - lq:]).astype(np.float32)
        rec_queries = post  # [Hq, Lq, D]
    elif case.source == "attentions":
        lq = L
        attn_np = np_causal_attention(queries_np, keys_rep, 0).astype(np.float32)  # [Hq, L, L]
        # The full queries are recorded too ([Hq, L, D]) so a backend can check its query path.
        rec_queries = queries_np
        # Hidden states for the cross-check of kvpress's own query path on the same data.
        hidden_np[:, :] = queries_np.transpose(1, 0, 2).reshape(L, hq * d)
    hidden = torch.from_numpy(hidden_np)[None]
    kwargs = {"position_embeddings": (torch.from_numpy(cos_np)[None], torch.from_numpy(sin_np)[None])}
    attentions = torch.from_numpy(attn_np)[None] if attn_np is not None else None

    if case.press == "knorm":
        press = KnormPress(compression_ratio=case.ratio)
    elif case.press == "streaming_llm":
        press = StreamingLLMPress(compression_ratio=case.ratio, n_sink=N_SINK)
    elif case.press == "snapkv":
        press = SnapKVPress(compression_ratio=case.ratio, window_size=w, kernel_size=KERNEL_SIZE)
    elif case.press == "tova":
        press = TOVAPress(compression_ratio=case.ratio)
    elif case.press == "observed_attention":
        press = ObservedAttentionPress(compression_ratio=case.ratio)
    else:
        raise ValueError(case.press)

    with torch.no_grad():
        if case.source == "queries":
            # The stand-in really yields the queries we placed (identity projection).
            got_q = kvpress.utils.get_prerope_query_states(module, hidden[:, -lq:])[0].numpy()
            assert np.array_equal(got_q, queries_np[:, L - lq:, :]), "stand-in module query extraction"
        scores_t = press.score(module, hidden, keys, values, attentions, kwargs)  # [1, H, L]
        assert scores_t.shape == (1, h, L) and scores_t.dtype == torch.float32, (scores_t.shape, scores_t.dtype)
        scores = scores_t[0].numpy().copy()  # [H, L]
        assert np.isfinite(scores).all()

        n_kept = compute_n_kept(L, case.ratio)
        topk = scores_t.topk(n_kept, dim=-1).indices[0].numpy()  # [H, n_kept], kvpress's order
        _, kept_vals = press.compress(module, hidden, keys, values, attentions, kwargs)
        from_compress = kept_vals[0, :, :, 0].numpy().astype(np.int64)  # [H, n_kept]
        assert np.array_equal(from_compress, topk), "compress() kept a different set than score().topk"
        kept = np.sort(topk, axis=1)

        # Cross-check: kvpress's query path on the same queries gives the attention path's scores.
        if case.source == "attentions" and case.press in ("snapkv", "tova"):
            via_q = press.score(module, hidden, keys, values, None, kwargs)[0].numpy()
            check_close(f"{case.name}: query path vs attention path", via_q, scores.astype(np.float64))

    # Independent float64 recomputation from exactly the recorded float32 inputs.
    if case.press == "knorm":
        ref = -np.sqrt((keys_np.astype(np.float64) ** 2).sum(axis=-1))
    elif case.press == "streaming_llm":
        ref = np.ones((h, L))
        ref[:, N_SINK:N_SINK + (L - int(L * (1 - case.ratio)))] = 0.0
    elif case.press == "snapkv":
        if case.source == "queries":
            wa = np_causal_attention(rec_queries, keys_rep, L - w)[:, :, :L - w]
        else:
            wa = attn_np.astype(np.float64)[:, L - w:, :L - w]
        ref = np_snapkv(wa, h, w)
    elif case.press == "tova":
        if case.source == "queries":
            row = np_causal_attention(rec_queries, keys_rep, L - 1)[:, 0, :L - 1]
        else:
            row = attn_np.astype(np.float64)[:, L - 1, :L - 1]
        ref = np_tova(row, h)
    else:
        ref = np_observed(attn_np.astype(np.float64), h)
    scaled_err, rel_err = check_close(case.name, scores, ref)

    ties = 0
    if n_kept < L:
        desc = -np.sort(-scores, axis=1)
        ties = int(np.any(desc[:, n_kept - 1] == desc[:, n_kept]))

    return dict(keys=keys_np, queries=rec_queries, attentions=attn_np, scores=scores, kept=kept,
                n_kept=n_kept, ties=ties, scaled_err=scaled_err, rel_err=rel_err, lq=lq)


# ---------------------------------------------------------------- output

def fmt_float(x):
    s = str(np.float32(x))  # shortest string that round-trips the float32
    if s in ("nan", "inf", "-inf"):
        raise ValueError(f"non-finite value {s}")
    assert np.float32(s) == np.float32(x)
    return s


def write_block(out, tag, arr, per_line=16, is_int=False):
    flat = [] if arr is None else np.asarray(arr).reshape(-1)
    out.write(f"{tag} {len(flat)}\n")
    for i in range(0, len(flat), per_line):
        chunk = flat[i:i + per_line]
        out.write(" ".join(str(int(v)) if is_int else fmt_float(v) for v in chunk) + "\n")


HEADER = """\
# fairkv golden reference values, produced by kvpress's own score() / ScorerPress.compress.
# Generated by: python scripts/gen_kvpress_golden.py --out tests/data/kvpress_golden.txt
# kvpress {kvpress} | torch {torch} | transformers {transformers} | numpy {numpy} | seed base {seed}
# Semantics: docs/kvpress-semantics.md. All tensors are float32, batch 1, row-major.
# Format of one case:
#   case <name> press <p> source <keys|queries|attentions> ratio <r> window <w> kv_heads <H> q_heads <Hq>
#        tokens <L> head_dim <D> n_kept <k> ties <0|1>          (all on one line)
#   keys <H*L*D>        [H, L, D] cached (post-RoPE) keys
#   queries <n>         [Hq, Lq, D], Lq = n / (Hq*D): post-RoPE queries of the LAST Lq tokens.
#                       source queries: the window (Lq = window; tova: Lq = 1). source attentions: all
#                       L queries the attentions were computed from (Lq = L). keys-only presses: 0.
#   attentions <n>      [Hq, L, L] full causal softmax attention fed to kvpress, or 0
#   scores <H*L>        [H, L] output of kvpress score()
#   kept <H*n_kept>     [H, n_kept] kept token indices of kvpress's topk, each row sorted ascending
#   end
# q head i belongs to kv head i / (Hq/H). window: snapkv window size, 1 for tova, 0 otherwise.
# ties 1: for some head the n_kept-th and (n_kept+1)-th largest scores are equal (kept set not unique).
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/kvpress_golden.txt")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # reduction order independent of the machine's core count

    import transformers
    cases = build_cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    with open(args.out, "w") as out:
        out.write(HEADER.format(kvpress=kvpress_version(), torch=torch.__version__,
                                transformers=transformers.__version__, numpy=np.__version__, seed=BASE_SEED))
        for i, case in enumerate(cases):
            r = run_case(case, i)
            out.write(f"case {case.name} press {case.press} source {case.source} ratio {case.ratio!r} "
                      f"window {case.window} kv_heads {case.kv_heads} q_heads {case.q_heads} "
                      f"tokens {case.tokens} head_dim {case.head_dim} n_kept {r['n_kept']} ties {r['ties']}\n")
            write_block(out, "keys", r["keys"], per_line=case.head_dim)
            write_block(out, "queries", r["queries"], per_line=case.head_dim)
            write_block(out, "attentions", r["attentions"], per_line=16)
            write_block(out, "scores", r["scores"], per_line=10)
            write_block(out, "kept", r["kept"], per_line=32, is_int=True)
            out.write("end\n")
            print(f"{case.name:55s} n_kept {r['n_kept']:3d} ties {r['ties']}  "
                  f"err/max {r['scaled_err']:.1e}  rel {r['rel_err']:.1e}", file=sys.stderr)
    assert validate(args.out) == len(cases)
    print(f"wrote {len(cases)} cases to {args.out} (re-read and validated)", file=sys.stderr)


def validate(path):
    """Re-read the file the way a C++ reader would (whitespace tokens) and check its invariants."""
    toks = " ".join(line for line in open(path).read().split("\n") if not line.startswith("#")).split()
    i, n_cases = 0, 0
    while i < len(toks):
        assert toks[i] == "case", toks[i]
        name = toks[i + 1]
        hdr = dict(zip(toks[i + 2:i + 22:2], toks[i + 3:i + 22:2]))
        assert list(hdr) == ["press", "source", "ratio", "window", "kv_heads", "q_heads", "tokens", "head_dim",
                             "n_kept", "ties"], (name, list(hdr))
        i += 22
        h, hq, L, d, k = (int(hdr[x]) for x in ("kv_heads", "q_heads", "tokens", "head_dim", "n_kept"))
        blocks = {}
        for tag in ("keys", "queries", "attentions", "scores", "kept"):
            assert toks[i] == tag, (name, toks[i], tag)
            n = int(toks[i + 1])
            blocks[tag] = np.array(toks[i + 2:i + 2 + n], dtype=np.float64)
            i += 2 + n
        assert toks[i] == "end", (name, toks[i])
        i += 1
        assert blocks["keys"].size == h * L * d and blocks["scores"].size == h * L, name
        assert blocks["queries"].size % (hq * d) == 0, name
        assert blocks["attentions"].size in (0, hq * L * L), name
        kept = blocks["kept"].astype(np.int64).reshape(h, k)
        assert (np.diff(kept, axis=1) > 0).all() and kept.min() >= 0 and kept.max() < L, name
        assert k == compute_n_kept(L, float(hdr["ratio"])), name
        n_cases += 1
    return n_cases


def kvpress_version():
    from importlib.metadata import version
    return version("kvpress")


if __name__ == "__main__":
    main()
