"""What a snapshot carries: the answers of the routes the page's first view and head detail ask for, made
from one `attend` result by the service's own builders (app/service/bodies.py and app/compact.py; a pooled
grid by the trace overview's header, app/service/traces.py), keyed as the page's transport finds them
(app/static/js/carried.js: route, then kind, layer and head).

Each answer is what the server would send: an HSA1 buffer or JSON, gzipped as the server gzips it, then
base64 (`{"gzip": ..., "type": ...}`); small JSON as itself (`{"json": ...}`); a refusal as the server's
status and detail (`{"status", "detail"}`).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch

import mha
from app import compact
from app.errors import InvalidInputError
from app.schemas.attention import ModelEntry, ModelList, ModelSource
from app.schemas.trace import TraceTokens
from app.service import bodies
from app.service.computed import KINDS, Computed, from_result, weigh_by_norm
from app.service.model_access import loaded_fields
from app.service.traces import pooled_header
from mha.trace import Pool, Pooled, edges

SCHEME = "abs-uint8-key-major"  # the page's (api.js COMPACT_SCHEME); 8 bits whatever the page's `bits`
HSA1 = compact.MEDIA_TYPE
JSON = "application/json"
# The page offers continuations of up to this many tokens (app/static/js/state.js MAX_NEW_TOKENS): the form
# shows a run's count at most this, and asks with it.
PAGE_MAX_NEW_TOKENS = 32
SOURCE = ModelSource(id="snapshot", label="This snapshot")  # the model menu's one group
_UNUSED = threading.Event()  # the builders' "abandoned" flag: nobody abandons a snapshot


def describe(
    result: mha.AttentionResult, model: mha.AttentionModel | None, name: str | None, *, chat: bool
) -> mha.ModelInfo:
    """The model's info: `model`'s own, else what the result's tensors say (its shape; causal when every
    head's upper triangle is zero; byte-level when a token spells a space as "Ġ"), named `name`."""
    if model is not None:
        info = model.info
        return replace(info, name=name or info.name, chat_template=info.chat_template or chat)
    layers, heads, n = result.attentions.shape[0], result.attentions.shape[1], result.n
    upper = torch.triu(result.attentions, diagonal=1)
    seq2seq = isinstance(result, mha.Seq2SeqResult)
    causal = not seq2seq and n > 1 and not bool(upper.any())
    info = mha.ModelInfo(
        name=name or "model",
        family="unknown",
        layers=layers,
        heads=heads,
        kv_heads=heads,  # the tensors cannot say which heads share keys
        max_tokens=n,
        causal=causal,
        pretrained=True,
        device="cpu",
        dtype="float32",
        chat_template=chat,
        byte_level=any("Ġ" in token for token in result.tokens),
        architecture="decoder" if causal else "encoder",
    )
    if not isinstance(result, mha.Seq2SeqResult):
        return info
    decoder = result.decoder_attentions
    return replace(
        info,
        architecture="encoder-decoder",
        decoder_layers=int(decoder.shape[0]),
        decoder_heads=int(decoder.shape[1]),
        decoder_max_tokens=result.m,
    )


def view_of(result: mha.AttentionResult, info: mha.ModelInfo) -> Computed:
    """The service's view of the result: weight × value norm shares when it was attended with norms=True
    (the run used them), else its weights."""
    view = from_result(info.name, info, result)
    return weigh_by_norm(view) if result.norms is not None else view


def values_of(view: Computed) -> int:
    """Attention values of every kind: L·H·rows·cols summed over the encoder, decoder and cross maps."""
    kinds = [view.maps] if view.seq2seq is None else [maps for _, maps in view.sections()]
    return sum(maps.numel() for maps in kinds)


def kinds_of(view: Computed) -> tuple[str, ...]:
    return KINDS if view.seq2seq is not None else ("encoder",)


def _gzip(data: bytes, media_type: str) -> dict[str, Any]:
    return {"gzip": base64.b64encode(data).decode("ascii"), "type": media_type}


def _refusal(error: Exception, status: int = 422) -> dict[str, Any]:
    return {"status": status, "detail": str(error)}


def model_list(info: mha.ModelInfo) -> ModelList:
    """GET /api/models of the snapshot: its one model, loaded (the page needs nothing loaded later)."""
    entry = ModelEntry(
        name=info.name,
        **loaded_fields(info),
        trace_max_tokens=info.max_tokens,
        loaded=True,
        error=None,
        source=SOURCE.id,
        state="loaded",
    )
    return ModelList(default=info.name, models=[entry], sources=[SOURCE])


def fixed_answers(
    view: Computed, info: mha.ModelInfo, *, flow_max_tokens: int, words: bool = False
) -> dict[str, dict[str, Any]]:
    """The answers of every snapshot, pooled or not: the models list, the statistics of each kind (of a
    view merged to words: `words`), the input's token count (the page asks it of a long text: within the
    limits, never traced), the progress stream (done at once), and attention flow where the input is
    short enough for it."""
    answers: dict[str, dict[str, Any]] = {
        "models": {"json": model_list(info).model_dump()},
        "tokens": {
            "json": TraceTokens(
                model=info.name, n=view.n, max_tokens=info.max_tokens, trace_max_tokens=info.max_tokens
            ).model_dump()
        },
        "progress": {"text": '{"event": "done"}\n', "type": "application/x-ndjson"},
    }
    for kind in kinds_of(view):
        statistics = bodies.gzipped_json_of(partial(bodies.analysis_body, words=words, kind=kind))
        answers[f"analysis:{kind}"] = _gzip(statistics(view, _UNUSED), JSON)
    if view.n <= flow_max_tokens:
        flow = bodies.json_of(partial(bodies.flow_body, max_tokens=flow_max_tokens))
        answers["flow:encoder"] = {"json": json.loads(flow(view, _UNUSED))}
    return answers


def grid_answers(view: Computed) -> dict[str, dict[str, Any]]:
    """Every head at 8 bits, the page's first view (one buffer, every kind of an encoder-decoder), and the
    rollout of its encoder."""
    grid = bodies.encode_compact(view, _UNUSED, scheme=SCHEME, bits="8")
    rollout = bodies.encode_rollout_compact(view, _UNUSED, scheme=SCHEME)
    return {"compact": _gzip(grid, HSA1), "rollout:encoder": _gzip(rollout, HSA1)}


def pooled_answers(
    view: Computed, info: mha.ModelInfo, size: int
) -> tuple[dict[str, dict[str, Any]], Pooled]:
    """The grid of a view past the byte budget: every head pooled to size x size blocks by max, as a long
    prompt's overview (mha.trace's Pool and edges; the header of app/service/traces.py), so a lone spike
    stays visible. The rollout is not carried then (it says why)."""
    if view.seq2seq is not None:
        raise ValueError("an encoder-decoder's snapshot is never pooled: raise max_bytes for its three kinds")
    cuts = edges(0, view.n, size)
    values = torch.zeros(view.layers, view.heads, size, size)
    for layer in range(view.layers):
        Pool(view.heads, cuts, cuts, "max", acc=values[layer]).add(
            view.attentions[layer], (0, view.n), (0, view.n)
        )
    pooled = Pooled(values, cuts.tolist(), cuts.tolist(), "max")
    header = pooled_header(view.model, pooled, info, tokens=view.tokens, marks=view)
    if view.weighting != "weight":
        header["weighting"] = view.weighting
    grid = compact.compress(compact.encode(header, values, scheme=SCHEME))
    why = InvalidInputError(
        f"attention rollout is not carried by this snapshot: its grid is pooled to {size} × {size} blocks to "
        "stay within its file's size; a snapshot with a larger --max-bytes carries it"
    )
    return {"compact": _gzip(grid, HSA1), "rollout:encoder": _refusal(why, 404)}, pooled


def exact_order(view: Computed, kind: str, layer: int, head: int) -> list[tuple[str, int, int]]:
    """The heads whose exact values a snapshot carries first: the selected head, then the others of its kind
    by their distance from it in the grid (the arrow keys' steps: one layer or one head), then the other
    kinds' heads the same way from their first head."""
    order = []
    for other in sorted(kinds_of(view), key=lambda k: k != kind):
        one = view.of_kind(other)
        at = (layer, head) if other == kind else (0, 0)
        heads = [(ly, hd) for ly in range(one.layers) for hd in range(one.heads)]
        heads.sort(key=lambda lh: (abs(lh[0] - at[0]) + abs(lh[1] - at[1]), lh))
        order += [(other, ly, hd) for ly, hd in heads]
    return order


def exact_answers(view: Computed, order: list[tuple[str, int, int]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, answer) of each head's exact float32 values (POST /api/attention/head/compact), in `order`,
    encoded as they are asked for."""
    for kind, layer, head in order:
        data = bodies.encode_head_compact(view, _UNUSED, layer=layer, head=head, kind=kind)
        yield f"head:{kind}:{layer}:{head}", _gzip(data, HSA1)


def check_selected(view: Computed, kind: str, selected: tuple[int, int]) -> None:
    """ValueError for a selection outside the kind's layers and heads."""
    one = view.of_kind(kind)
    layer, head = selected
    if not (0 <= layer < one.layers and 0 <= head < one.heads):
        raise ValueError(
            f"selected {selected} is outside {one.model!r}'s {one.layers} layers x {one.heads} heads"
            + ("" if kind == "encoder" else f" ({kind} attention)")
        )
