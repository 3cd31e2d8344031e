"""The answers, built from a `Computed` view: pure functions a worker thread runs (no I/O, no state).

`*_body` builds a JSON body (with `Floats` for the arrays, app/encoders.py writes them); `encode_*` builds
the bytes of a binary (HSA1) answer, gzipped once here so the cache keeps what is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from app import compact, encoders
from app.encoders import Floats
from app.errors import InvalidInputError
from app.schemas import ROLLOUT_RESIDUAL, SIMILAR_HEADS
from app.service.computed import Computed
from mha import analysis
from mha.errors import Cancelled

Encoder = Callable[[Computed, threading.Event], bytes]


def encode_pieces(make_body: Callable[[], Any], abandoned: threading.Event | None = None) -> bytes:
    """Worker thread: build an answer's body and encode it piece by piece, stopping when abandoned."""
    body = make_body()
    parts = []
    for piece in encoders.pieces(body):
        if abandoned is not None and abandoned.is_set():
            raise Cancelled("encoding cancelled: nobody waits for this answer any more")
        parts.append(piece)
    return b"".join(parts)


def json_of(make_body: Callable[[Computed], Any]) -> Encoder:
    """An `Encoder`: the JSON of make_body(computed), in pieces."""
    return lambda computed, abandoned: encode_pieces(partial(make_body, computed), abandoned)


def _hsa1(header: dict[str, Any], attentions: torch.Tensor, scheme: str) -> bytes:
    # numpy and zlib release the GIL for nearly all of this.
    return compact.compress(compact.encode(header, attentions, scheme=scheme))


# -- attention -------------------------------------------------------------------------------------


def attention_body(view: Computed) -> dict[str, Any]:
    return {**view.header(), "attention": Floats(view.attentions)}  # 6 decimals (float64 first)


def head_body(view: Computed, layer: int, head: int) -> dict[str, Any]:
    view.check_head(layer, head)
    return {
        "model": view.model,
        "tokens": view.tokens,
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact, so this is the model's full precision.
        "attention": Floats(view.attentions[layer, head], decimals=None),
    }


def encode_compact(view: Computed, _abandoned: threading.Event, *, scheme: str) -> bytes:
    return _hsa1(view.header(), view.attentions, scheme)


def encode_head_compact(view: Computed, _abandoned: threading.Event, *, layer: int, head: int) -> bytes:
    view.check_head(layer, head)
    header = {**view.header(), "layers": 1, "heads": 1, "layer": layer, "head": head}
    one = view.attentions[layer : layer + 1, head : head + 1]  # [1, 1, n, n]
    return _hsa1(header, one, "float32-shuffled")


# -- insight ---------------------------------------------------------------------------------------


def _summary(view: Computed) -> dict[str, Any]:
    """The fields the insight answers open with."""
    return {"model": view.model, "tokens": view.tokens, "n": view.n}


def analysis_body(view: Computed, *, words: bool) -> dict[str, Any]:
    layers, heads = view.layers, view.heads
    stats = analysis.head_stats(view.attentions, view.tokens, special=view.special, causal=view.causal)
    k = min(SIMILAR_HEADS, layers * heads - 1)
    # Statistics and distances to 6 decimals, as every JSON answer: the full float repr doubled the bytes.
    similar = [
        [
            [[ly, hd, round(float(d), 6)] for ly, hd, d in analysis.similar_heads(stats, layer, head, k=k)]
            if k > 0
            else []
            for head in range(heads)
        ]
        for layer in range(layers)
    ]
    return {
        **_summary(view),
        "layers": layers,
        "heads": heads,
        "words": words,
        "stats": {name: Floats(value) for name, value in stats.items()},
        "stat_descriptions": {name: analysis.STAT_DESCRIPTIONS[name] for name in stats},
        "labels": analysis.head_labels(stats),
        "thresholds": {
            "pointer": analysis.POINTER_THRESHOLD,
            "broad": analysis.BROAD_THRESHOLD,
            "local": analysis.LOCAL_THRESHOLD,
        },
        "similar": similar,
    }


def rollout_body(view: Computed) -> dict[str, Any]:
    per_layer = analysis.rollout_per_layer(view.attentions, residual=ROLLOUT_RESIDUAL)
    return {
        **_summary(view),
        "layers": view.layers,
        "residual": ROLLOUT_RESIDUAL,
        "rollout": Floats(per_layer[-1]),
        "per_layer": Floats(per_layer),
    }


def encode_rollout_compact(view: Computed, _abandoned: threading.Event, *, scheme: str) -> bytes:
    per_layer = analysis.rollout_per_layer(view.attentions, residual=ROLLOUT_RESIDUAL)  # [L, n, n]
    header = {**view.header(), "heads": 1, "residual": ROLLOUT_RESIDUAL}
    return _hsa1(header, per_layer.unsqueeze(1), scheme)  # [L, 1, n, n]


def flow_body(view: Computed, *, max_tokens: int) -> dict[str, Any]:
    # One max-flow run gives both forms: the raw values and the rows normalised as the paper publishes them.
    flow = analysis.attention_flow(view.attentions, max_tokens=max_tokens, residual=ROLLOUT_RESIDUAL)
    return {
        **_summary(view),
        "flow": Floats(flow),
        "flow_normalized": Floats(analysis.normalize_flow(flow.double()).float()),
    }


# -- compare ---------------------------------------------------------------------------------------


def _pairs(view_a: Computed, view_b: Computed) -> list[tuple[int, int]]:
    pairs = analysis.align_tokens(view_a.tokens, view_b.tokens, include_replaced=True)
    if not pairs:
        raise InvalidInputError(
            "a and b share no aligned token to compare; with two tokenizers, compare words (words: true)"
        )
    return pairs


def compare_body(view_a: Computed, view_b: Computed) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    # One layer at a time: the restricted maps of a 512-token input are ~75 MB per copy for all layers.
    scores, kept_a, kept_b = [], [], []
    for layer in range(view_a.layers):
        result = analysis.compare_aligned(
            view_a.attentions[layer : layer + 1], view_b.attentions[layer : layer + 1], pairs
        )
        scores.append(result.js[0])
        kept_a.append(result.kept_a[0])
        kept_b.append(result.kept_b[0])
    return {
        "a": {"model": view_a.model, "tokens": view_a.tokens},
        "b": {"model": view_b.model, "tokens": view_b.tokens},
        "pairs": [list(pair) for pair in pairs],
        "tokens": [view_a.tokens[i] for i, _ in pairs],
        "layers": view_a.layers,
        "heads": view_a.heads,
        "score": torch.stack(scores).tolist(),
        "kept_a": torch.stack(kept_a).tolist(),
        "kept_b": torch.stack(kept_b).tolist(),
    }


def compare_head_body(view_a: Computed, view_b: Computed, layer: int, head: int) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    one = (slice(layer, layer + 1), slice(head, head + 1))
    result = analysis.compare_aligned(view_a.attentions[one], view_b.attentions[one], pairs)
    return {
        "tokens": [view_a.tokens[i] for i, _ in pairs],
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact: full precision, as /api/attention/head.
        "a": Floats(result.a[0, 0], decimals=None),
        "b": Floats(result.b[0, 0], decimals=None),
        "diff": Floats(result.difference[0, 0], decimals=None),
    }
