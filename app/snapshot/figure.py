"""One head of an `attend` result as a plotly figure, `figure(result, layer, head)`, drawn as the page's head
detail draws it (app/static/js/heatmap-figure.js, whose names the helpers here keep): query tokens down, key
tokens across, numeric axes with the tokens as tick text (so two identical tokens stay two cells), the
page's colour scale read from app/static/js/colors.js itself (one source), its hover ("the → cat: 0.734";
cross-attention's "query 'Das' (1) → key 'The' (0): 0.734"; "share 0.412 · ‖α f‖ 1.37" by weight × value
norm), masked cells as gaps over a grey hatch, a pair's segment boundary and the tokens a model wrote.

The figure holds the exact float32 values (z is the head itself): the page's detail once its exact head
came. heatmap_figure.py draws it; plotly is imported when a figure is made, not with app.snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import mha
from app.snapshot.heatmap_figure import HeadSpec, build_figure
from app.snapshot.looks import BYTE_LEVEL_MARKS, display_token
from mha import analysis

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["KINDS", "WEIGHTINGS", "figure"]

KINDS = ("encoder", "decoder", "cross")  # an encoder-decoder's attentions (seq2seq.js); the page opens cross
WEIGHTINGS = ("weight", "norm")  # weighting.js: the weights α, or weight × value norm shares
KIND_LABELS = {  # seq2seq.js
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention",
    "cross": "Cross-attention",
}
AXIS_NAMES = {  # seq2seq.js axisNames; None: a model of one attention
    None: ("query (attending)", "key (attended to)"),
    "encoder": ("source token (query)", "source token (key)"),
    "decoder": ("target token (query)", "target token (key)"),
    "cross": ("target token (query)", "source token (key)"),
}
WRITTEN_MARK = "✎ "  # decoder.js markWritten


def figure(
    result: mha.AttentionResult,
    layer: int,
    head: int,
    *,
    kind: str | None = None,
    weighting: str | None = None,
    model: mha.AttentionModel | None = None,
    name: str | None = None,
) -> go.Figure:
    """Head `head` of layer `layer` of `result` (what AttentionModel.attend returns) as a plotly Figure, as
    the page's head detail shows it; style and save it as any figure (fig.update_layout, fig.write_html,
    fig.show()).

    kind: an encoder-decoder's attention, "encoder", "decoder" or "cross" (None: "cross", as the page opens
    it); a result of one attention takes None. weighting: "weight" (None) or "norm", each row's shares of
    α_ij ‖f_h(x_j)‖ (attend(..., norms=True)). model: the model that made `result`, for what the result does
    not hold: its name in the title, a byte-level tokenizer's marks ("Ġ" shown as "␣"), a causal mask, KV
    groups. Without it a result is causal when every head's upper triangle is exactly 0 (mha's causal
    models give exact zeros there), and byte-level when a token holds Ġ, Ċ or ĉ. name: the title's model
    name. Bad layer, head, kind or weighting raise ValueError naming the values and the valid ones."""
    seq2seq = isinstance(result, mha.Seq2SeqResult)
    kind = _kind(kind, seq2seq)
    norm = _weighting(weighting) == "norm"
    chosen = _head(result, layer, head, kind=kind, norm=norm, model=model)
    who = name if name is not None else (model.info.name if model is not None else "")
    label = _label(layer, head, kind=kind, norm=norm, model=model)
    title = f"{who} · {label}" if who else label
    return build_figure(chosen, title=title, axis_names=AXIS_NAMES[kind], norm=norm)


def _label(layer: int, head: int, *, kind: str | None, norm: bool, model: mha.AttentionModel | None) -> str:
    """What the page's detail title calls the selection (detail.js detailLabel, labels.js selectionLabel):
    "Cross-attention, layer 1, head 2", "L3 H5 · kv 1" where query heads share key/value heads."""
    info = model.info if model is not None else None
    grouped = info is not None and kind in (None, "encoder") and 0 < info.kv_heads < info.heads
    if info is not None and grouped and info.heads % info.kv_heads == 0:
        selection = f"L{layer} H{head} · kv {head // (info.heads // info.kv_heads)}"
    else:
        selection = f"layer {layer}, head {head}"
    prefix = f"{KIND_LABELS[kind]}, " if kind else ""
    return f"{prefix}{selection}{' · weight × norm' if norm else ''}"


def _kind(kind: str | None, seq2seq: bool) -> str | None:
    if not seq2seq:
        if kind is not None:
            raise ValueError(
                f"kind {kind!r} is for an encoder-decoder's result ({', '.join(KINDS)}); this result has one "
                "attention: leave kind out (None)"
            )
        return None
    if kind is None:
        return "cross"
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of an encoder-decoder's: {', '.join(KINDS)}")
    return kind


def _weighting(weighting: str | None) -> str:
    if weighting is None:
        return "weight"
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)} (None: weight)")
    return weighting


def _index(what: str, value: object, count: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {value!r}: {where} has {what}s 0..{count - 1}")
    if not 0 <= value < count:
        raise ValueError(f"{what} {value} is out of range: {where} has {what}s 0..{count - 1}")
    return value


def _head(
    result: mha.AttentionResult,
    layer: int,
    head: int,
    *,
    kind: str | None,
    norm: bool,
    model: mha.AttentionModel | None,
) -> HeadSpec:
    """The values and tokens of the selection, checked."""
    queries, keys = result.tokens, result.tokens
    attentions, norms = result.attentions, result.norms
    if isinstance(result, mha.Seq2SeqResult) and kind == "decoder":
        queries = keys = result.target_tokens
        attentions, norms = result.decoder_attentions, result.decoder_norms
    elif isinstance(result, mha.Seq2SeqResult) and kind == "cross":  # target rows, source columns
        queries, attentions, norms = result.target_tokens, result.cross_attentions, result.cross_norms
    where = "this result" + (f"'s {kind} attention" if kind else "")
    layers, heads = attentions.shape[:2]
    layer, head = _index("layer", layer, layers, where), _index("head", head, heads, where)
    values = attentions[layer, head].to("cpu", torch.float32)
    sizes = None
    if norm:
        if norms is None:
            raise ValueError("weighting 'norm' needs the value norms: attend the text with norms=True")
        maps = analysis.weight_norm_map(attentions[layer : layer + 1], norms[layer : layer + 1])
        shares, _totals = analysis.row_shares(maps)
        # A cell's size ‖α f‖ is the map's cell itself: its share × its row's total, as the page's cellSizes
        values, sizes = shares[0, head].to("cpu", torch.float32), maps[0, head].to("cpu", torch.float32)
    if kind is None:
        causal = model.info.causal if model is not None else _looks_causal(result.attentions)
    else:
        causal = kind == "decoder"
    byte_level = model.info.byte_level if model is not None else _looks_byte_level([*queries, *keys])
    written = 0 if kind else result.generated
    return HeadSpec(
        values=values,
        sizes=sizes,
        queries=_mark_written([display_token(t, byte_level=byte_level) for t in queries], written),
        keys=_mark_written(
            [display_token(t, byte_level=byte_level) for t in keys], 0 if kind == "cross" else written
        ),
        rect=kind == "cross",
        causal=causal,
        boundary=-1 if kind else (result.segments.index(1) if 1 in result.segments else -1),
        written=written,
    )


def _looks_causal(attentions: torch.Tensor) -> bool:
    """Every head's upper triangle exactly 0: a causal model's (a bidirectional softmax is 0 there only by
    underflow, never over a whole triangle)."""
    return attentions.shape[-1] > 1 and not bool(torch.triu(attentions, diagonal=1).any())


def _looks_byte_level(tokens: list[str]) -> bool:
    return any(mark in token for token in tokens for mark, _ in BYTE_LEVEL_MARKS[:3])


def _mark_written(tokens: list[str], written: int) -> list[str]:
    prompt = len(tokens) - written
    return [f"{WRITTEN_MARK}{token}" if i >= prompt else token for i, token in enumerate(tokens)]
