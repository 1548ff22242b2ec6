"""fairkv: fair and safe KV-cache eviction, from Python.

The same C++ library as the engines use (a compiled module, no logic of its own in Python), over numpy arrays and
torch CPU tensors of float32, float16 or bfloat16, with any strides and without a copy:

>>> import numpy as np, fairkv
>>> keys = np.random.default_rng(0).standard_normal((1, 2, 64, 8), dtype=np.float32)
>>> values = keys.copy()
>>> plan = fairkv.plan(keys, segments=[(0, 20), (20, 64)], ratio=0.5)   # fair eviction with K-norm scores
>>> plan.counts.tolist()
[[32, 32]]
>>> fairkv.compact(plan, keys, values)   # in place: row (b, h) now holds its kept tokens first

`fairkv.kvpress` wraps kvpress's presses (FairPress, WhitelistPress) for HF transformers models.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple

from ._fairkv import Error, Plan
from . import _fairkv

__all__ = ["Error", "Plan", "plan", "compact", "attention_kernel_isa", "SCORERS", "SELECTORS", "ALLOCATORS"]

#: Names accepted for ``scorer``, ``selector`` and ``allocator``: the C++ library's registry of built-ins
#: (include/fairkv/registry.hpp), in its order.
SCORERS: Tuple[str, ...] = _fairkv.SCORERS
SELECTORS: Tuple[str, ...] = _fairkv.SELECTORS
ALLOCATORS: Tuple[str, ...] = _fairkv.ALLOCATORS


def plan(
    keys: Any = None,
    *,
    queries: Any = None,
    scores: Any = None,
    scorer: Optional[str] = None,
    selector: str = "per_head",
    allocator: Optional[str] = None,
    segments: Optional[Iterable[Tuple[int, int]]] = None,
    whitelist: Optional[Iterable[int]] = None,
    priorities: Optional[Iterable[Tuple[float, float]]] = None,
    remainder_priority: Optional[Tuple[float, float]] = None,
    ratio: Optional[float] = None,
    budget: Optional[int] = None,
    window: int = 64,
    kernel: int = 5,
    n_sink: int = 4,
    sinks: Optional[int] = None,
    boundary: int = 0,
    debias_lambda: float = 1.0,
    alpha_safeguard: float = 0.2,
    scale: float = 0.0,
    seed: int = 0,
) -> Plan:
    """Plans the eviction of one layer: which tokens every (batch, KV head) row keeps.

    Arrays are read where they are (numpy arrays, torch CPU tensors, anything exporting DLPack or the buffer
    protocol); they are never copied or converted, so a dtype other than float32/float16/bfloat16 is an error.
    The GIL is released while the library plans.

    Args:
        keys: the layer's cached keys ``[batch, kv_heads, tokens, head_dim]`` (post-RoPE, as cached). Required
            unless ``scores`` are given.
        queries: for the attention scorers (snapkv, tova, h2o): post-RoPE queries of the last positions,
            ``[batch, q_heads, q_tokens, head_dim]``, in the keys' dtype (q_heads a multiple of kv_heads).
        scores: your own importance scores ``[batch, kv_heads, tokens]``, float32, higher = keep (e.g. any kvpress
            press's ``score()``). Given without ``scorer``, the scorer is ``"external"``. Segment-local scoring is
            then yours to do (``fairkv.kvpress.FairPress`` does it for kvpress presses).
        scorer: one of ``SCORERS``; default ``"knorm"``, or ``"external"`` when ``scores`` are given.
        selector: one of ``SELECTORS``.
        allocator: one of ``ALLOCATORS``. Default: ``"prioritized"`` with priorities, ``"fair"`` with segments,
            ``"fair_with_whitelist"`` with segments and a whitelist, ``"whitelist"`` with a whitelist alone, else
            ``"uniform"``.
        segments: ``(begin, end)`` token ranges (e.g. a system prompt's instructions), disjoint, any order. Under
            fair eviction every segment keeps the same fraction of its tokens; text outside every segment is one
            more group.
        whitelist: token positions always kept; they count against the budget.
        priorities: for ``allocator="prioritized"`` (and only it, which needs them): one ``(weight, floor)`` per
            segment, in the order of ``segments``. A segment keeps a fraction of its tokens proportional to its weight
            (weight 0: only after every weighted segment is whole), and never less than ``floor`` (a fraction in
            [0, 1]) of them.
        remainder_priority: ``(weight, floor)`` of the tokens outside every segment (default ``(1, 0)``).
        ratio: the fraction of tokens to evict, in [0, 1): a sequence of L tokens keeps
            ``max(1, floor(L * (1 - ratio)))`` per head (kvpress's rule). Give exactly one of ratio and budget.
        budget: the number of tokens to keep per head (a sequence shorter than it keeps everything).
        window, kernel: SnapKV's observation window and pooling kernel (kvpress's defaults; the paper uses 16).
        n_sink: StreamingLLM's sink tokens.
        sinks: leading tokens the segment-aware allocators always keep (default 4; 0 for ``fair_paper``).
        boundary: tokens kept at each end of every segment.
        debias_lambda: the ``debias`` allocator's strength.
        alpha_safeguard: the ``head_adaptive`` selector's per-head floor.
        scale: the attention scorers' softmax scale (0: ``1 / sqrt(head_dim)``).
        seed: the ``random`` scorer's seed, in [0, 2**32): the same seed gives the same plan.

    Returns:
        A :class:`Plan` (``indices``, ``counts``, ``lengths``, ``kept(b, h)``).

    Raises:
        fairkv.Error: a ``ValueError`` with the library's message (``.status`` names its status) for any request
            the library refuses: shapes, strides, ranges, budgets, names.
    """
    return _fairkv.plan(
        keys, queries=queries, scores=scores, scorer=scorer, selector=selector, allocator=allocator,
        segments=segments, whitelist=whitelist, priorities=priorities, remainder_priority=remainder_priority,
        ratio=ratio, budget=budget, window=window, kernel=kernel,
        n_sink=n_sink, sinks=sinks, boundary=boundary, debias_lambda=debias_lambda,
        alpha_safeguard=alpha_safeguard, scale=scale, seed=seed)


def compact(plan: Plan, keys: Any, values: Any) -> None:
    """Compacts a layer's keys and values in place, as the plan says.

    Afterwards row (b, h) holds its kept tokens, in their original order, in positions ``[0, plan.counts[b, h])``;
    what lies beyond is unspecified (an engine shortens its cache there; with equal counts per head, e.g. the
    ``per_head`` selector, ``keys[:, :, :n]`` is the compacted cache). Keys and values must be writable, in one
    dtype, with the plan's batch and heads and exactly the tokens it was made for (``plan.lengths``); they may have
    any strides (e.g. views into a larger cache) but must not overlap each other. Tensors that require grad are
    refused (autograd would not see the write; pass ``.detach()``, which shares the memory). The GIL is released
    while the library moves the rows.

    A plan is applied once: compacting again with it would move already-compacted rows, so a second call is
    refused (``plan.applied`` says whether it has been). To apply one selection to several copies of a cache,
    plan once per copy.

    Raises:
        fairkv.Error: for a plan that does not fit the arrays or was already applied, read-only or overlapping
            arrays, tensors that require grad, or a dtype mismatch; nothing was written then.
    """
    _fairkv.compact(plan, keys, values)


def attention_kernel_isa() -> str:
    """The instruction set the attention scorers (snapkv, tova, h2o from queries) run in this process.

    ``"avx512"`` or ``"avx2"`` where the CPU has them, whatever flags built the module; otherwise the build's own
    vector extension (``"sse2"`` for a default x86-64 build). The environment variable ``FAIRKV_CPU_ISA``
    (``avx512``, ``avx2`` or ``none``; any other value means ``none``), read once per process, caps it.
    """
    return _fairkv.attention_kernel_isa()
