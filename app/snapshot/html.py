"""One run as one self-contained `.html` file: the page's own template (app/templates/index.html, in the
Jinja environment the server renders it with) in snapshot mode, its CSS, plotly.js and its modules
(linked by bundle.py) inline, and the answers its first view and head detail ask for (answers.py) in a
JSON data block that api.js answers from. A Content-Security-Policy comes first in <head>: the file's
inline scripts by hash, no network at all. plotly.js is carried as a text block that the page runs, as an
inline script of the same text, once the grid is painted (app/static/js/plotly-ready.js): the grid needs no
Plotly, and evaluating 1.5 MB of script first would hold every thumbnail back.

Budget: every head at 8 bits; the selected head's exact float32 values; then the other heads' (nearest
first) while the data stays within BYTES_PER_VALUE bytes per attention value, the whole file always
within `max_bytes`. Past `max_bytes` even for the 8-bit grid, the grid is pooled as a long prompt's
overview is, and the page says so.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import importlib.metadata
import json
import os
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict, Unpack

import mha
from app import page
from app.schemas import snapshot as snapshot_schema
from app.service import FLOW_MAX_TOKENS, Computed
from app.snapshot import answers
from app.snapshot.bundle import bundle

FORMAT = 1  # the data block's layout (app/static/js/carried.js reads it)
BYTES_PER_VALUE = 1.2  # the data's bound per attention value (all kinds), exact heads included
DEFAULT_MAX_BYTES = snapshot_schema.DEFAULT_MAX_BYTES  # the route's default and bounds live with its schema
POOLED_SIZES = (128, 64, 32, 16, 8)  # blocks a side tried, largest first, when the 8-bit grid is too big
MARGIN = 4096  # bytes kept for the notes the final render adds to the measured page
# Policy of every snapshot: nothing but its own inline scripts (by hash, filled in), no request of any kind.
CSP = (
    "default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob:; "
    "connect-src 'none'; font-src 'none'; base-uri 'none'; form-action 'none'"
)


@dataclass(frozen=True)
class Snapshot:
    """A built file and what it holds. `asset_bytes`: what every snapshot has (plotly.js, the script, the
    CSS, the page's markup); `data_bytes`: the two data blocks (the run's answers and state)."""

    html: str
    asset_bytes: int
    data_bytes: int
    values: int  # attention values of every kind
    heads: int  # heads of every kind
    exact: tuple[tuple[str, int, int], ...]  # (kind, layer, head) carried at float32, in order
    pooled: int | None = None  # blocks a side of a pooled grid; None: every token
    answers: tuple[str, ...] = field(default=())  # the carried answers' keys

    @property
    def bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    @property
    def bytes_per_value(self) -> float:
        """The data's bytes per attention value (the assets are counted apart)."""
        return self.data_bytes / self.values


def _escaped(script: str) -> str:
    """An inline script's text that cannot end its element or open an HTML comment: "<" before "/script"
    or "!--" as \\x3C, which every JS context that can hold it (string, template, regex) reads as "<"."""
    for ending in ("</script", "</SCRIPT", "<!--"):
        script = script.replace(ending, "\\x3C" + ending[1:])
    return script


def _hash(script: str) -> str:
    """The CSP source of an inline script: the SHA-256 of its exact text."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


@lru_cache(maxsize=1)
def assets() -> dict[str, str]:
    """The page's files as a snapshot holds them, read (and linked) once per process."""
    svg = page.FAVICON.read_bytes()
    return {
        "plotly": _escaped(page.PLOTLY_JS.read_text(encoding="utf-8")),
        "script": _escaped(bundle().script),
        "css": page.CSS.read_text(encoding="utf-8").replace("</style", "<\\/style"),
        "favicon": "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii"),
    }


def asset_sizes() -> dict[str, int]:
    """Bytes of each fixed asset every snapshot carries (docs/snapshots.md states them)."""
    return {name: len(text.encode("utf-8")) for name, text in assets().items()}


def data_block(data: Any) -> str:
    """JSON for a <script type="application/json"> block: "<" as \\u003c, so no "</script" or "<!--"."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _version() -> str:
    try:
        return importlib.metadata.version("headscope")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


@dataclass(frozen=True)
class Asked:
    """What the run was asked, as the page's form holds it: the text as typed, its pair, an
    encoder-decoder's target (None: the model wrote one), the chat template, a decoder's tokens to
    write (what it wrote: a continuation's `generated`), and words (a view merged to words)."""

    text: str
    pair: str | None = None
    target: str | None = None
    chat: bool = False
    new_tokens: int = 0
    words: bool = False
    probe: tuple[int, int] | None = None  # the head probe's (seed, length): its first sequence, not a text

    @classmethod
    def of(cls, result: mha.AttentionResult, *, text: str | None = None, chat: bool = False) -> Asked:
        """What `result` was asked: its texts (or `text`, a chat run's as typed) and what it wrote."""
        if isinstance(result, mha.Seq2SeqResult):  # its target is its own sentence, never "continued"
            return cls(
                result.texts[0] if text is None else text, result.texts[1], result.target or None, chat
            )
        typed = result.texts[0] if text is None else text
        return cls(typed, result.texts[1], None, chat, result.generated)


@dataclass(frozen=True)
class Run:
    """The run as the page states it: the input its requests send and its view state."""

    input: dict[str, Any]
    state: dict[str, Any]


def _run(asked: Asked, name: str, kind: str, selected: tuple[int, int | str], *, weighting: str) -> Run:
    pair, target = asked.pair or None, asked.target or None
    written = min(asked.new_tokens, answers.PAGE_MAX_NEW_TOKENS)
    given: dict[str, Any] = {"text": asked.text, "text_pair": pair, "model": name, "max_new_tokens": written}
    given |= {"chat": asked.chat, "target": target, "words": asked.words, "weighting": weighting}
    state = {"text": asked.text, "pair": pair or "", "model": name, "layer": selected[0], "head": selected[1]}
    state |= {"weighting": weighting, "newTokens": written, "chat": asked.chat, "target": target or ""}
    state |= {"words": asked.words, "kind": kind}
    if asked.probe is not None:  # the page runs the probe's input again, as a link with input=probe does
        given["probe"] = {"seed": asked.probe[0], "length": asked.probe[1]}
        state |= {"input": "probe", "seed": asked.probe[0]}
    return Run(given, state)


def rerun_line(name: str) -> str:
    """How to get what needs a server, said once on the page and on each control it hides."""
    model = shlex.quote(name)
    return (
        f"To run another text: headscope serve, then open http://127.0.0.1:8000/ (model {name}); or "
        f'headscope snapshot --model {model} --text "…" -o view.html.'
    )


@lru_cache(maxsize=1)
def _policy() -> str:
    """The file's Content-Security-Policy: the same two scripts in every snapshot, hashed once. plotly.js
    is carried as text, not run as parsed: its hash lets plotly-ready.js run that exact text later."""
    files = assets()
    return CSP.format(hashes=" ".join(_hash(files[script]) for script in ("plotly", "script")))


def _render(info: mha.ModelInfo, run: Run, carried: dict[str, Any], banner: dict[str, Any]) -> str:
    files = assets()
    data = page.page_data(
        answers.model_list(info),
        max_tokens=info.max_tokens,
        max_new_tokens=answers.PAGE_MAX_NEW_TOKENS,
        flow_max_tokens=FLOW_MAX_TOKENS,
    )
    snapshot = {
        "csp": _policy(),
        "css": files["css"],
        "favicon": files["favicon"],
        "data": data_block(carried),
        "plotly": files["plotly"],
        "script": files["script"],
        **banner,
    }
    template = page.environment().get_template("index.html")
    return template.render(data=data, snapshot=snapshot, static_prefix="", plotly_url="")


def _data_bytes(html: str) -> int:
    """Bytes of the file's two data blocks (its initial state and its carried answers)."""
    total = 0
    for block in ('id="initial-state">', 'id="headscope-snapshot">'):
        start = html.index(block) + len(block)
        total += len(html[start : html.index("</script>", start)].encode("utf-8"))
    return total


def _cost(key: str, answer: dict[str, Any]) -> int:
    """Bytes one more answer adds to the data block: its "key": value and a comma."""
    return len(data_block({key: answer}).encode("utf-8")) - 1


def _pooled(
    view: answers.Computed, info: mha.ModelInfo, room: int
) -> tuple[dict[str, dict[str, Any]], int, int]:
    """The largest pooled grid (POOLED_SIZES) whose answers fit `room` bytes: (answers, size, their cost)."""
    smallest = None
    for size in (s for s in POOLED_SIZES if s < view.n):
        grid, _ = answers.pooled_answers(view, info, size)
        cost = sum(_cost(key, answer) for key, answer in grid.items())
        if cost <= room:
            return grid, size, cost
        smallest = (size, cost)
    said = f"; pooled to {smallest[0]} × {smallest[0]} it takes {smallest[1]:,}" if smallest else ""
    raise ValueError(
        f"max_bytes is too small for this run: {room:,} bytes are left for its data after the page's own "
        f"assets, and every head of its {view.n} tokens at 8 bits does not fit{said}; raise max_bytes"
    )


def _notes(view: answers.Computed, snapshot: dict[str, Any], max_bytes: int) -> tuple[list[str], str]:
    """The banner's notes on what the file carries, and the head detail's for a head it lacks exactly."""
    exact, heads, pooled = len(snapshot["exact"]), snapshot["heads"], snapshot["pooled"]
    if pooled is not None:
        block = -(-view.n // pooled)
        blocks = f"{pooled} × {pooled} blocks of up to {block} tokens"
        note = (
            f"Every head is pooled to {blocks} (max, so a lone spike stays visible): its {view.n} tokens at "
            f"8 bits would not fit this file's limit of {max_bytes:,} bytes (--max-bytes). Hover reads a "
            "block's largest value; the statistics are of every token."
        )
        return [note], f"this snapshot's grid is pooled to {blocks} (max)"
    if exact == heads:
        return ["Every head is carried with its exact float32 values."], ""
    note = (
        f"Exact float32 values for {exact} of its {heads} heads (the selected head first, then its "
        "neighbours in the grid); the others show their 8-bit values, within ±1/510, as the page's first "
        "view does."
    )
    return [note], f"this snapshot carries exact values for {exact} of its {heads} heads"


def _about(view: answers.Computed, info: mha.ModelInfo) -> str:
    kinds = "" if view.seq2seq is None else f", {len(view.seq2seq.target_tokens)} target tokens"
    norm = ", as weight × value norm shares" if view.weighting == "norm" else ""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return (
        f"{info.name} on {view.n} tokens{kinds}{norm}, saved {today} by headscope {_version()}. It needs no "
        "server and makes no request: everything it shows is in this file."
    )


class Options(TypedDict, total=False):
    """build's keyword options, which snapshot_html and save_html pass on unchanged (defaults: build's)."""

    model: mha.AttentionModel | None
    name: str | None
    max_bytes: int
    selected: tuple[int, int] | None
    text: str | None
    chat: bool


def build(
    result: mha.AttentionResult,
    *,
    model: mha.AttentionModel | None = None,
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    selected: tuple[int, int] | None = None,
    text: str | None = None,
    chat: bool = False,
) -> Snapshot:
    """The snapshot of `result` (any `attend` result; snapshot_html's options) and what it holds."""
    info = answers.describe(result, model, name, chat=chat)
    view = answers.view_of(result, info)
    asked = Asked.of(result, text=text, chat=chat)
    return build_view(view, info, asked, max_bytes=max_bytes, selected=selected)


def build_view(
    view: Computed,
    info: mha.ModelInfo,
    asked: Asked,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    selected: tuple[int, int | str] | None = None,
    kind: str | None = None,
    flow_max_tokens: int = FLOW_MAX_TOKENS,
) -> Snapshot:
    """The snapshot of a view as the service keeps it (app/service/computed.py: the route's way in, from
    its cached view; merged to words when `asked.words`) of a model of `info`, asked `asked`. It opens on
    `selected` (a head, or an aggregate's name as the page's state has it: "mean") of `kind` (default: an
    encoder-decoder's cross attention, else "encoder"); attention flow up to `flow_max_tokens`."""
    if view.kind != "encoder":
        raise ValueError(f"a snapshot is of a model's whole view, not of its {view.kind} attention alone")
    kind = kind or ("cross" if view.seq2seq is not None else "encoder")
    if kind not in answers.kinds_of(view):
        raise ValueError(f"kind {kind!r}: {info.name!r} has only {', '.join(answers.kinds_of(view))}")
    chosen = selected or (0, 0)
    # An aggregate opens as itself; the exact heads nearest it start from its layer's head 0.
    anchor = (chosen[0], chosen[1] if isinstance(chosen[1], int) else 0)
    answers.check_selected(view, kind, anchor)
    run = _run(asked, info.name, kind, chosen, weighting=view.weighting)
    carried: dict[str, Any] = {"format": FORMAT, "input": run.input, "state": run.state}
    carried |= {"rerun": rerun_line(info.name), "exact_note": "", "answers": {}}
    banner = {"about": _about(view, info), "rerun": carried["rerun"], "notes": []}
    empty = _render(info, run, carried, banner)
    data = _data_bytes(empty)
    asset_bytes = len(empty.encode("utf-8")) - data
    room = max_bytes - asset_bytes - MARGIN
    fixed = answers.fixed_answers(view, info, flow_max_tokens=flow_max_tokens, words=asked.words)
    data += sum(_cost(key, answer) for key, answer in fixed.items())
    if room < data:
        least = data + asset_bytes + MARGIN
        raise ValueError(
            f"max_bytes ({max_bytes:,}) is below what any snapshot of this run needs ({least:,})"
        )
    grid, pooled = answers.grid_answers(view), None
    cost = sum(_cost(key, answer) for key, answer in grid.items())
    if data + cost > room:
        grid, pooled, cost = _pooled(view, info, room - data)
    carried["answers"] = {**fixed, **grid}
    data += cost
    exact: list[tuple[str, int, int]] = []
    limit = min(int(BYTES_PER_VALUE * answers.values_of(view)), room)
    order = answers.exact_order(view, kind, *anchor) if pooled is None else []
    for key, answer in answers.exact_answers(view, order):
        # The selected head's exact values whenever they fit the file (one head: what the detail opens
        # with); the others while the data stays within BYTES_PER_VALUE a value.
        if data + (cost := _cost(key, answer)) > (room if not exact else limit):
            break
        carried["answers"][key] = answer
        data += cost
        exact.append(tuple(key.split(":")[1:]))  # type: ignore[arg-type]
    heads = sum(view.of_kind(k).layers * view.of_kind(k).heads for k in answers.kinds_of(view))
    held = {"exact": exact, "heads": heads, "pooled": pooled}
    banner["notes"], carried["exact_note"] = _notes(view, held, max_bytes)
    html = _render(info, run, carried, banner)
    data = _data_bytes(html)
    return Snapshot(
        html=html,
        asset_bytes=len(html.encode("utf-8")) - data,
        data_bytes=data,
        values=answers.values_of(view),
        heads=heads,
        exact=tuple((k, int(ly), int(hd)) for k, ly, hd in exact),
        pooled=pooled,
        answers=tuple(carried["answers"]),
    )


def snapshot_html(result: mha.AttentionResult, **options: Unpack[Options]) -> str:
    """One self-contained `.html` file of `result` (anything `AttentionModel.attend` returns: a text, a
    pair, a continuation, a chat prompt, `norms=True`, an encoder-decoder's three kinds), opening with no
    server and no network.

    `model` supplies what the result lacks (its name, family, grouped heads, limits); `name` overrides the
    model name shown; `selected` is the (layer, head) it opens on (an encoder-decoder's: of its cross
    attention); the file stays within `max_bytes` (every head at 8 bits, exact float32 heads as the budget
    allows, the selected first; past it the grid is pooled, and says so). A chat run (`chat=True`) shows
    `text`, the text as typed: its result's `texts` hold the template's rendering."""
    return build(result, **options).html


def save_html(result: mha.AttentionResult, path: str | os.PathLike[str], **options: Unpack[Options]) -> Path:
    """snapshot_html(result, ...) written to `path` (UTF-8); returns the path."""
    html = snapshot_html(result, **options)
    target = Path(path)
    target.write_text(html, encoding="utf-8")
    return target
