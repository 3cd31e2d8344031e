"""The snapshot of a served run (POST /api/snapshot, app/routes/snapshot.py: the page's "Save as HTML"),
made with the service's own parts: the view the page's run made (its forward cached, weighted by norm and
merged to words as the page asked: app/service/views.py), its model's info, and the file built by
`build_view` in the service's encoding threads, gzipped there and cached in the answers' LRU like the
compact answers; identical requests in flight share one build (the answers' flights)."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import zlib
from dataclasses import replace
from functools import lru_cache

import mha
from app import compact
from app.errors import InvalidInputError
from app.schemas.snapshot import SnapshotRequest
from app.service import FLOW_MAX_TOKENS, AttentionService, Computed, cache_key
from app.snapshot.html import Asked, assets, build_view
from mha.errors import Cancelled

MEDIA_TYPE = "text/html; charset=utf-8"
# gzip levels of the file on the wire. Its two scripts (plotly.js and the page's modules, 1.8 MB of every
# file) are deflated once per process, at the best level; the rest of each file (its data, gzipped already
# and base64: level 1 regains most of base64's third) at the fastest. A small run's file then costs ~2 ms
# to gzip instead of ~60 ms at level 1 for all of it, and takes fewer bytes (0.62 MB against 0.71).
SCRIPT_LEVEL, DATA_LEVEL = 9, 1
SCRIPTS = ("plotly", "script")  # in the order the file holds them (app/templates/base.html)
GZIP_HEADER = bytes((0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 255))  # deflate, no name, mtime 0, unknown OS
MODEL_CHARS = 80  # of the model's name in the file's name


def filename(model: str, asked: object) -> str:
    """headscope-<model>-<short>.html: the model's name in [A-Za-z0-9._-] (no path, no quote, ASCII), then
    8 hex digits of what the file holds, so two runs of one model do not take one name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:MODEL_CHARS].strip(".") or "model"
    short = hashlib.sha256(json.dumps(asked, default=str).encode("utf-8")).hexdigest()[:8]
    return f"headscope-{safe}-{short}.html"


def _deflated(data: bytes, level: int, *, last: bool) -> bytes:
    """Raw deflate of `data` on its own, ending on a byte boundary (a full flush: nothing after it refers
    back into it) or, `last`, the stream's final block: such pieces concatenate into one stream (as pigz)."""
    deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return deflate.compress(data) + deflate.flush(zlib.Z_FINISH if last else zlib.Z_FULL_FLUSH)


@lru_cache(maxsize=1)
def _scripts() -> dict[str, tuple[bytes, bytes]]:
    """Each of the file's scripts: (its UTF-8 text, its deflated piece), made once per process."""
    texts = {name: assets()[name].encode("utf-8") for name in SCRIPTS}
    return {name: (text, _deflated(text, SCRIPT_LEVEL, last=False)) for name, text in texts.items()}


def gzipped(html: str) -> bytes:
    """The file as one gzip member: its scripts' pieces deflated once (_scripts), the text around them
    deflated here; a file without them (none is) gzipped whole."""
    scripts, rest = _scripts(), html
    texts: list[bytes] = []
    pieces: list[bytes] = []
    for name in SCRIPTS:
        before, found, rest = rest.partition(assets()[name])
        if not found:
            return compact.compress_json(html.encode("utf-8"), level=DATA_LEVEL)
        texts += [before.encode("utf-8"), scripts[name][0]]
        pieces += [_deflated(texts[-2], DATA_LEVEL, last=False), scripts[name][1]]
    texts.append(rest.encode("utf-8"))
    pieces.append(_deflated(texts[-1], DATA_LEVEL, last=True))
    crc = 0
    for text in texts:
        crc = zlib.crc32(text, crc)
    size = sum(len(text) for text in texts)
    return GZIP_HEADER + b"".join(pieces) + struct.pack("<II", crc, size & 0xFFFFFFFF)


class ServedSnapshots:
    """The snapshots of the service's runs (module docstring)."""

    def __init__(self, service: AttentionService) -> None:
        self.settings = service.settings
        self._views, self._answers, self._models = service.views, service.answers, service.models
        self._off_loop, self._gunzipped_unless = service.encoders.off_loop, service.encoders.gunzipped_unless

    def filename(self, request: SnapshotRequest) -> str:
        """The file's name (Content-Disposition); an unknown model or a bad input is raised here (4xx)."""
        source = self._views.input(request)
        return filename(source[0], [source, *self._extra(request)])

    async def html(self, request: SnapshotRequest, *, gzipped: bool) -> bytes:
        """The snapshot's HTML, gzipped when `gzipped`: built once, off the loop, and cached."""
        source = self._views.input(request)

        async def compute(abandoned: threading.Event) -> bytes:
            view = await self._views.view(source, words=request.words, weighting=request.weighting)
            model = await self._models.model(source[0])
            return await self._off_loop(self._build, view, model.info, request, abandoned)

        body = await self._answers.cached(
            cache_key("snapshot.gz", source, extra=self._extra(request)), compute
        )
        return await self._gunzipped_unless(gzipped, body)

    @staticmethod
    def _extra(request: SnapshotRequest) -> tuple[object, ...]:
        """What the file depends on beside the forward's input."""
        return (
            request.words,
            request.weighting,
            request.kind,
            request.layer,
            request.head,
            request.max_bytes,
        )

    def _build(
        self, view: Computed, info: mha.ModelInfo, request: SnapshotRequest, abandoned: threading.Event
    ) -> bytes:
        """Encoding thread: the file of `view`, opened on the request's head, gzipped."""
        # The page's own refusals first (422): a kind the model lacks, a layer or head beyond it.
        view.of_kind(request.kind).check_head(request.layer, 0 if request.head == "mean" else request.head)
        # As the service read it: its name, its token limit, a chat template used.
        limit = self.settings.tokens_for(info.max_tokens)
        info = replace(
            info, name=view.model, max_tokens=limit, chat_template=info.chat_template or request.chat
        )
        asked = Asked(
            text=request.text,
            pair=request.text_pair,
            target=request.target,
            new_tokens=request.max_new_tokens or 0,
            chat=request.chat,
            words=request.words,
            probe=None if request.probe is None else (request.probe.seed, request.probe.length),
        )
        try:
            built = build_view(
                view,
                info,
                asked,
                kind=request.kind,
                selected=(request.layer, request.head),
                max_bytes=request.max_bytes,
                flow_max_tokens=self.settings.flow_max_tokens or FLOW_MAX_TOKENS,
            )
        except ValueError as exc:  # what the run needs against the request's max_bytes: the client's to fix
            raise InvalidInputError(str(exc)) from None
        if abandoned.is_set():
            raise Cancelled("snapshot cancelled: nobody waits for it any more")
        return gzipped(built.html)
