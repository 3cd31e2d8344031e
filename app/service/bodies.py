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
from app.schemas.insight import ROLLOUT_RESIDUAL, SIMILAR_HEADS
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


# gzip level of a small JSON answer that every first view fetches (app/compact.py compress_json).
SMALL_JSON_LEVEL = 6


def gzipped_json_of(make_body: Callable[[Computed], Any]) -> Encoder:
    """An `Encoder`: json_of's bytes gzipped, for a small answer the cache keeps as it is sent."""
    encode = json_of(make_body)
    return lambda computed, abandoned: compact.compress_json(
        encode(computed, abandoned), level=SMALL_JSON_LEVEL
    )


def _hsa1(header: dict[str, Any], attentions: torch.Tensor, scheme: str, bits: int = 8) -> bytes:
    # numpy and zlib release the GIL for nearly all of this.
    return compact.compress(compact.encode(header, attentions, scheme=scheme, bits=bits))


def _hsa1_sections(
    header: dict[str, Any], sections: list[tuple[str, torch.Tensor]], scheme: str, bits: int = 8
) -> bytes:
    return compact.compress(compact.encode_sections(header, sections, scheme=scheme, bits=bits))


# -- attention -------------------------------------------------------------------------------------


def attention_body(view: Computed) -> dict[str, Any]:
    body = {**view.header(), "attention": Floats(view.attentions)}  # 6 decimals (float64 first)
    if view.row_norms is not None:
        body["row_norms"] = Floats(view.row_norms)
    if view.seq2seq is not None:
        body["decoder_attentions"] = Floats(view.seq2seq.decoder_attentions)
        body["cross_attentions"] = Floats(view.seq2seq.cross_attentions)
    return body


def head_body(view: Computed, layer: int, head: int, *, kind: str = "encoder") -> dict[str, Any]:
    one = view.of_kind(kind)
    one.check_head(layer, head)
    # An encoder-decoder's head says which attention it is, and cross attention's keys are the source.
    seq2seq = {"kind": kind, "key_tokens": one.key_tokens or one.tokens} if view.seq2seq is not None else {}
    return {
        "model": one.model,
        "tokens": one.tokens,
        **seq2seq,
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact, so this is the model's full precision.
        "attention": Floats(one.head(layer, head), decimals=None),
        **_norm_fields(one, layer, head),
    }


def _norm_fields(view: Computed, layer: int, head: int) -> dict[str, Any]:
    """A head's `weighting` and (norm, token level) its rows' totals, in full float32."""
    if view.weighting == "weight":
        return {}
    fields: dict[str, Any] = {"weighting": view.weighting}
    if view.row_norms is not None:
        fields["row_norms"] = Floats(view.row_norms[layer, head], decimals=None)
    return fields


def encode_compact(view: Computed, _abandoned: threading.Event, *, scheme: str, bits: str = "8") -> bytes:
    # "auto" goes by n (an encoder-decoder's source tokens), as the page's byte budget does.
    chosen = compact.auto_bits(view.n) if bits == "auto" else int(bits)
    if view.seq2seq is not None:
        return _hsa1_sections(view.header(), view.sections(), scheme, chosen)
    # The maps where the model left them: a device's are quantized there, and only the bytes come over.
    return _hsa1(view.header(), view.maps, scheme, chosen)


def encode_head_compact(
    view: Computed, _abandoned: threading.Event, *, layer: int, head: int, kind: str = "encoder"
) -> bytes:
    one = view.of_kind(kind)
    one.check_head(layer, head)
    header = {**view.header(), "layers": 1, "heads": 1, "layer": layer, "head": head}
    if one.row_norms is not None:  # n float32 totals: small beside the head's n² values
        header["row_norms"] = one.row_norms[layer, head].tolist()
    values = one.head(layer, head)[None, None]  # [1, 1, rows, cols]
    if view.seq2seq is not None:  # one section, of the kind asked for
        return _hsa1_sections({**header, "kind": kind}, [(kind, values)], "float32-shuffled")
    return _hsa1(header, values, "float32-shuffled")


# -- insight ---------------------------------------------------------------------------------------


def _summary(view: Computed) -> dict[str, Any]:
    """The fields the insight answers open with (an encoder-decoder's kind, and cross attention's keys)."""
    summary = {"model": view.model, "tokens": view.tokens, "n": view.n}
    if view.kind != "encoder":
        summary["kind"] = view.kind
    if view.key_tokens is not None:
        summary["key_tokens"] = view.key_tokens
    return summary


def analysis_body(view: Computed, *, words: bool, kind: str = "encoder") -> dict[str, Any]:
    view = view.of_kind(kind)
    layers, heads = view.layers, view.heads
    if view.key_tokens is not None:  # cross attention: target queries, source keys
        stats = analysis.cross_stats(
            view.attentions, view.key_tokens, key_special=view.key_special, query_special=view.special
        )
        labels, descriptions = analysis.cross_labels(stats), analysis.CROSS_STAT_DESCRIPTIONS
        keys: tuple[str, ...] = analysis.CROSS_SIMILARITY_STATS
    else:
        stats = analysis.head_stats(view.attentions, view.tokens, special=view.special, causal=view.causal)
        chance = analysis.head_chance(view.tokens, causal=view.causal)
        labels, descriptions = analysis.head_labels(stats, chance=chance), analysis.STAT_DESCRIPTIONS
        keys = analysis.SIMILARITY_STATS
    k = min(SIMILAR_HEADS, layers * heads - 1)
    # Statistics and distances to 6 decimals, as every JSON answer: the full float repr doubled the bytes.
    similar = [
        [
            [
                [ly, hd, round(float(d), 6)]
                for ly, hd, d in analysis.similar_heads(stats, layer, head, k=k, keys=keys)
            ]
            if k > 0
            else []
            for head in range(heads)
        ]
        for layer in range(layers)
    ]
    thresholds = {
        "pointer": analysis.POINTER_THRESHOLD,
        "broad": analysis.BROAD_THRESHOLD,
        "local": analysis.LOCAL_THRESHOLD,
    }
    if view.key_tokens is None:
        thresholds["induction"] = analysis.DETECTION_THRESHOLD
        thresholds["induction_margin"] = analysis.DETECTION_MARGIN
    if view.key_tokens is not None:
        thresholds["alignment_min_keys"] = analysis.ALIGNMENT_MIN_KEYS
    return {
        **_summary(view),
        "layers": layers,
        "heads": heads,
        "words": words,
        "stats": {name: Floats(value) for name, value in stats.items()},
        "stat_descriptions": {name: descriptions[name] for name in stats},
        "labels": labels,
        "thresholds": thresholds,
        "similar": similar,
    }


def _encoder_only(view: Computed, kind: str, what: str) -> Computed:
    if kind != "encoder":
        raise InvalidInputError(
            f'{what} runs across the encoder\'s layers only (kind "encoder"); kind {kind!r} is not a stack '
            "of self-attention that rolls out from input to output"
        )
    return view.of_kind(kind)


def rollout_body(view: Computed, *, kind: str = "encoder") -> dict[str, Any]:
    view = _encoder_only(view, kind, "attention rollout")
    per_layer = analysis.rollout_per_layer(view.attentions, residual=ROLLOUT_RESIDUAL)
    return {
        **_summary(view),
        "layers": view.layers,
        "residual": ROLLOUT_RESIDUAL,
        "rollout": Floats(per_layer[-1]),
        "per_layer": Floats(per_layer),
    }


def encode_rollout_compact(
    view: Computed, _abandoned: threading.Event, *, scheme: str, kind: str = "encoder"
) -> bytes:
    view = _encoder_only(view, kind, "attention rollout")
    per_layer = analysis.rollout_per_layer(view.attentions, residual=ROLLOUT_RESIDUAL)  # [L, n, n]
    header = {**view.header(), "heads": 1, "residual": ROLLOUT_RESIDUAL}
    return _hsa1(header, per_layer.unsqueeze(1), scheme)  # [L, 1, n, n]


def flow_body(view: Computed, *, max_tokens: int, kind: str = "encoder") -> dict[str, Any]:
    view = _encoder_only(view, kind, "attention flow")
    # One max-flow run gives both forms: the raw values and the rows normalised as the paper publishes them.
    flow = analysis.attention_flow(view.attentions, max_tokens=max_tokens, residual=ROLLOUT_RESIDUAL)
    return {
        **_summary(view),
        "flow": Floats(flow),
        "flow_normalized": Floats(analysis.normalize_flow(flow.double()).float()),
    }


# -- compare ---------------------------------------------------------------------------------------


def _pairs(view_a: Computed, view_b: Computed) -> list[tuple[int, int]]:
    if view_a.key_tokens is not None:  # cross attention: the same shape (checked), position by position
        return [(i, i) for i in range(view_a.n)]
    pairs = analysis.align_tokens(view_a.tokens, view_b.tokens, include_replaced=True)
    if not pairs:
        raise InvalidInputError(
            "a and b share no aligned token to compare; with two tokenizers, compare words (words: true)"
        )
    return pairs


def _compared(a: torch.Tensor, b: torch.Tensor, pairs: list[tuple[int, int]], *, cross: bool) -> Any:
    """compare_aligned's result; cross attention's maps (one shape) compared as they are, all kept."""
    if not cross:
        return analysis.compare_aligned(a, b, pairs)
    js_rows = analysis.js_divergence(a, b)
    kept = torch.ones(a.shape[:2], dtype=a.dtype)
    return analysis.AlignedComparison(
        difference=a - b, js_rows=js_rows, js=js_rows.mean(-1), a=a, b=b, kept_a=kept, kept_b=kept
    )


def _sides(view_a: Computed, view_b: Computed) -> dict[str, Any]:
    sides: dict[str, Any] = {
        "a": {"model": view_a.model, "tokens": view_a.tokens},
        "b": {"model": view_b.model, "tokens": view_b.tokens},
    }
    if view_a.kind != "encoder":
        sides["kind"] = view_a.kind
    return sides


def compare_body(view_a: Computed, view_b: Computed) -> dict[str, Any]:
    pairs = _pairs(view_a, view_b)
    cross = view_a.key_tokens is not None
    # One layer at a time: the restricted maps of a 512-token input are ~75 MB per copy for all layers.
    scores, kept_a, kept_b = [], [], []
    for layer in range(view_a.layers):
        one = slice(layer, layer + 1)
        result = _compared(view_a.attentions[one], view_b.attentions[one], pairs, cross=cross)
        scores.append(result.js[0])
        kept_a.append(result.kept_a[0])
        kept_b.append(result.kept_b[0])
    return {
        **_sides(view_a, view_b),
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
    cross = view_a.key_tokens is not None
    result = _compared(view_a.attentions[one], view_b.attentions[one], pairs, cross=cross)
    return {
        "tokens": [view_a.tokens[i] for i, _ in pairs],
        **({"kind": view_a.kind, "key_tokens": view_a.key_tokens} if cross else {}),
        "layer": layer,
        "head": head,
        # float32 -> Python float is exact: full precision, as /api/attention/head.
        "a": Floats(result.a[0, 0], decimals=None),
        "b": Floats(result.b[0, 0], decimals=None),
        "diff": Floats(result.difference[0, 0], decimals=None),
    }
