"""Fair and whitelisted eviction for kvpress (HF transformers), computed by fairkv's C++ library.

Wrap any kvpress ``ScorerPress`` (KnormPress, StreamingLLMPress, SnapKVPress, TOVAPress, ObservedAttentionPress,
ExpectedAttentionPress, ...): the press scores, fairkv allocates the budget (fair shares per segment, whitelisted
and sink tokens forced), selects and compacts.

>>> from kvpress import SnapKVPress
>>> from fairkv.kvpress import FairPress, WhitelistPress
>>> press = FairPress(SnapKVPress(compression_ratio=0.5, window_size=16), segments=[(3, 40), (40, 90)])
>>> both = WhitelistPress(press, whitelist=[3, 4, 5])      # fair and whitelisted together

Use it like any press: ``with press(model): model(input_ids, past_key_values=cache)``, or
``pipeline("kv-press-text-generation", ...)(context, question=..., press=press)``; ``pipeline_segments`` maps
``[[seg:NAME]]`` markers (or character spans) of the pipeline's context to the token spans the press needs.

Scoring is segment-local for the attention presses (SnapKV, TOVA, ObservedAttention and their subclasses), as in
the paper: each segment is scored by the press as if it were the whole context (its own hidden states, keys,
positions and attention block); tokens outside every segment keep the press's scores over the whole context.
Other presses score the whole context once (for K-norm that is the same thing). ``segment_local`` overrides this.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from kvpress import BasePress, ScorerPress
from kvpress.presses.observed_attention_press import ObservedAttentionPress
from kvpress.presses.snapkv_press import SnapKVPress
from kvpress.presses.tova_press import TOVAPress

import fairkv

__all__ = ["FairKVPress", "FairPress", "WhitelistPress", "strip_markers", "token_spans", "pipeline_segments"]

logger = logging.getLogger(__name__)

#: Presses scored segment by segment by default: those whose statistic is attention among the context's tokens.
SEGMENT_LOCAL_PRESSES: Tuple[type, ...] = (SnapKVPress, TOVAPress, ObservedAttentionPress)


@dataclass
class FairKVPress(BasePress):
    """A kvpress press whose scores come from ``press`` and whose eviction is fairkv's.

    Args:
        press: the kvpress ``ScorerPress`` that scores the tokens.
        segments: ``(begin, end)`` token spans of the context (e.g. a system prompt's instructions).
        whitelist: token positions of the context that are always kept.
        allocator: a fairkv allocator name; default from what is given (``fair``, ``fair_with_whitelist``,
            ``whitelist``, or ``uniform``, which keeps exactly what the wrapped press keeps).
        selector: ``per_head`` or ``union_heads`` (kvpress caches are rectangular: every head must keep the same
            number of tokens, so ``head_adaptive`` is refused).
        compression_ratio: the fraction evicted; default the wrapped press's.
        budget: tokens to keep per head instead of a ratio.
        sinks: leading tokens the segment-aware allocators always keep (fairkv's default 4).
        boundary: tokens kept at each end of every segment.
        segment_local: score each segment on its own; default for SnapKV, TOVA and ObservedAttention presses.
        record: keep every layer's plan in ``plans`` (layer index -> ``fairkv.Plan``) for inspection.
    """

    press: ScorerPress = None  # type: ignore[assignment]
    segments: Optional[Sequence[Tuple[int, int]]] = None
    whitelist: Optional[Sequence[int]] = None
    allocator: Optional[str] = None
    selector: str = "per_head"
    compression_ratio: Optional[float] = None
    budget: Optional[int] = None
    sinks: Optional[int] = None
    boundary: int = 0
    segment_local: Optional[bool] = None
    record: bool = False
    plans: Dict[int, fairkv.Plan] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        # A fairkv press around another one merges into one (e.g. WhitelistPress(FairPress(p, segments=...))).
        if isinstance(self.press, FairKVPress):
            inner = self.press
            for name in ("segments", "whitelist", "allocator", "compression_ratio", "budget", "sinks",
                         "segment_local"):
                if getattr(self, name) is None:
                    setattr(self, name, getattr(inner, name))
            self.boundary = self.boundary or inner.boundary
            self.record = self.record or inner.record
            if self.selector == "per_head":
                self.selector = inner.selector
            self.press = inner.press
        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"press must be a kvpress ScorerPress (it provides score()), not {type(self.press).__name__}")
        if self.selector == "head_adaptive":
            raise ValueError("selector 'head_adaptive' keeps a different number of tokens per head, which a kvpress "
                             "(rectangular) cache cannot hold; use 'per_head' or 'union_heads'")
        if self.segments is not None:
            self.segments = [(int(b), int(e)) for b, e in self.segments]
        if self.whitelist is not None:
            self.whitelist = [int(t) for t in self.whitelist]

    @property
    def ratio(self) -> float:
        return self.press.compression_ratio if self.compression_ratio is None else self.compression_ratio

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def _local(self) -> bool:
        if self.segment_local is not None:
            return self.segment_local
        return isinstance(self.press, SEGMENT_LOCAL_PRESSES)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """The wrapped press's scores, segment-local where configured (see the module's documentation)."""
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        if not self.segments or not self._local():
            return scores
        scores = scores.clone()
        for begin, end in self.segments:
            local_kwargs = dict(kwargs)
            if kwargs.get("position_embeddings") is not None:
                local_kwargs["position_embeddings"] = tuple(t[:, begin:end] for t in kwargs["position_embeddings"])
            block = attentions[..., begin:end, begin:end] if attentions is not None else None
            try:
                local = self.press.score(module, hidden_states[:, begin:end], keys[:, :, begin:end],
                                         values[:, :, begin:end], block, local_kwargs)
            except AssertionError as e:  # e.g. SnapKV: a segment no longer than its window
                logger.warning("fairkv: %s cannot score segment [%d, %d) on its own (%s); it keeps the press's "
                               "scores over the whole context", type(self.press).__name__, begin, end, e)
                continue
            scores[:, :, begin:end] = local
        return scores

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.budget is None and self.ratio == 0:
            return keys, values  # kvpress's ScorerPress does the same: nothing scored, nothing moved
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        # The scores are the press's scratch (not the cache): one float32 host copy is what the library reads.
        host_scores = scores.detach().to(device="cpu", dtype=torch.float32)
        plan = fairkv.plan(scores=host_scores, selector=self.selector, allocator=self.allocator,
                           segments=self.segments, whitelist=self.whitelist,
                           ratio=None if self.budget is not None else self.ratio, budget=self.budget,
                           sinks=self.sinks, boundary=self.boundary)
        counts = plan.counts
        n = int(counts.min())
        if int(counts.max()) != n:
            raise ValueError("fairkv: the plan keeps different numbers of tokens per head, which a kvpress cache "
                             "cannot hold")
        if self.record:
            self.plans[module.layer_idx] = plan
        if keys.device.type == "cpu" and not keys.requires_grad:
            # In place over the cache's own tensors, then the kept prefix.
            fairkv.compact(plan, keys, values)
            return keys[:, :, :n].contiguous(), values[:, :, :n].contiguous()
        # Elsewhere (e.g. CUDA tensors) the plan's indices drive one gather, as kvpress's own compress does.
        index = torch.from_numpy(plan.indices[:, :, :n].astype("int64")).to(keys.device)
        index = index.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, index).contiguous(), values.gather(2, index).contiguous()


@dataclass
class FairPress(FairKVPress):
    """Fair eviction: every segment keeps the same fraction of its tokens (``segments`` required)."""

    def __post_init__(self):
        super().__post_init__()
        if not self.segments:
            raise ValueError("FairPress needs segments: (begin, end) token spans of the context")


@dataclass
class WhitelistPress(FairKVPress):
    """Whitelisting: the ``whitelist`` token positions are always kept and use up budget."""

    def __post_init__(self):
        super().__post_init__()
        if self.whitelist is None:
            raise ValueError("WhitelistPress needs a whitelist: token positions of the context")


_MARKER = re.compile(r"\[\[seg:([^\]]*)\]\]")


def strip_markers(text: str) -> Tuple[str, Dict[str, Tuple[int, int]]]:
    """Removes ``[[seg:NAME]]`` markers (the runner's syntax) and returns the text and each segment's character
    span in it. A segment runs from its marker to the next one (or the end); text before the first marker
    belongs to no segment. Names must be non-empty and distinct."""
    out: List[str] = []
    spans: Dict[str, Tuple[int, int]] = {}
    pos, length, current = 0, 0, None
    for m in _MARKER.finditer(text):
        out.append(text[pos:m.start()])
        length += m.start() - pos
        if current is not None:
            spans[current] = (spans[current][0], length)
        name = m.group(1)
        if not name:
            raise ValueError("a [[seg:]] marker without a name")
        if name in spans:
            raise ValueError(f"two segments are named '{name}'")
        spans[name] = (length, length)
        current = name
        pos = m.end()
    out.append(text[pos:])
    length += len(text) - pos
    if current is not None:
        spans[current] = (spans[current][0], length)
    if "[[seg:" in "".join(out):
        raise ValueError("an unterminated [[seg: marker")
    return "".join(out), spans


def token_spans(tokenizer, text: str, char_spans: Sequence[Tuple[int, int]],
                add_special_tokens: bool = False) -> List[Tuple[int, int]]:
    """Maps character spans of ``text`` to token spans of ``tokenizer(text)`` (a fast HF tokenizer).

    A token belongs to the span that holds its first character other than leading whitespace (HF's trimmed
    offsets: the token " Never" after a marker placed before "Never" is the segment's; a token of whitespace
    only, e.g. a line break, goes by its first character), so a token straddling a boundary otherwise goes to
    the earlier span, as in fairkv's runner. A span left without a token of its own is an error."""
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    starts = []
    for s, e in enc["offset_mapping"]:
        first = s
        while first < e and text[first].isspace():
            first += 1
        starts.append(None if s == e else first if first < e else s)  # zero-width (special) tokens: no span
    out = []
    for begin, end in char_spans:
        toks = [i for i, s in enumerate(starts) if s is not None and begin <= s < end]
        if not toks:
            raise ValueError(f"characters [{begin}, {end}) hold no token of their own")
        out.append((toks[0], toks[-1] + 1))
    return out


def pipeline_segments(tokenizer, context: str, char_spans: Optional[Dict[str, Tuple[int, int]]] = None
                      ) -> Tuple[str, Dict[str, Tuple[int, int]]]:
    """Token spans of a kvpress pipeline's context.

    ``context`` is what you pass to the pipeline, with ``[[seg:NAME]]`` markers (or give ``char_spans`` of the
    plain context instead). Returns the context without markers (pass that to the pipeline) and each segment's
    token span in the sequence the pipeline prefills: its chat template applied as kvpress 0.5 does, tokenized
    without special tokens."""
    if char_spans is None:
        context, char_spans = strip_markers(context)
    if tokenizer.chat_template is None:
        prefix = getattr(tokenizer, "bos_token", "") or ""
        templated = prefix + context
    else:
        separator = "#" * (len(context) + 10)
        templated = tokenizer.apply_chat_template([{"role": "user", "content": context + separator}],
                                                  add_generation_prompt=True, tokenize=False)
        templated = templated.split(separator)[0]
    start = templated.rfind(context)
    if start < 0:
        raise ValueError("the chat template changed the context's text; give token spans directly")
    names = list(char_spans)
    spans = token_spans(tokenizer, templated, [(start + char_spans[n][0], start + char_spans[n][1]) for n in names])
    return context, dict(zip(names, spans))
