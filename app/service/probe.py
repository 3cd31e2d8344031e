"""The head atlas: `HeadProbes` runs a model's head probe (model.probe_heads: a seeded random sequence
repeated once, every head scored by TransformerLens's previous-token, duplicate-token and induction patterns)
on the model's workers and answers it as NDJSON: a progress line after each chunk of sequences (the probe
runs as few batched forwards as keep a layer's maps within mha's PROBE_MAPS_BYTES: one for the default
probe of every bundled model), then the result (`ProbeDone`).

The result's line is cached in the service's LRU by (model, seed, sequences, length), and identical requests
in flight share one probe (the service's `cached`: Flights); each client streaming it hears its progress
from the next chunk on. When every client has hung up, the probe stops before its next layer. What the
request cannot be (an unknown model, a length past the model's limit) is refused before the stream begins,
as a plain 4xx.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from functools import partial
from typing import get_args

import torch

import mha
from app.schemas.probe import ProbeDone, ProbeKind, ProbeRequest
from app.service.cached_lines import CachedLines
from app.service.flights import settled
from app.service.parts import Parts
from app.service.probe_size import check_probe_length

# (registered model name, seed, sequences, length): what a probe depends on.
Source = tuple[str, int, int, int]


def _grid(values: torch.Tensor) -> list[list[float | None]]:
    # float32 -> the Python floats they equal; NaN (no row had a pattern key) -> None, JSON's null
    return [[None if math.isnan(v) else v for v in row] for row in values.tolist()]


def done_line(name: str, model: mha.AttentionModel, source: Source, probe: mha.HeadProbe) -> bytes:
    """The probe as the stream's last line (encoding thread)."""
    _, seed, sequences, length = source
    kinds: list[ProbeKind] = list(get_args(ProbeKind))  # mha.analysis.KINDS, in the page's order
    first = probe.token_ids[0].tolist()
    done = ProbeDone(
        model=name,
        seed=seed,
        sequences=sequences,
        length=length,
        layers=int(probe.scores[kinds[0]].shape[0]),
        heads=int(probe.scores[kinds[0]].shape[1]),
        kind=probe.kind,
        kinds=kinds,
        scores={kind: _grid(probe.scores[kind]) for kind in kinds},
        chance={kind: _grid(probe.chance[kind]) for kind in kinds},
        spread={kind: _grid(probe.spread[kind]) for kind in kinds},
        labels=probe.labels,  # type: ignore[arg-type]  # mha's kinds: str, the schema's a Literal
        threshold=probe.threshold,
        margin=probe.margin,
        tokens=probe.tokens,
        token_ids=first,
        byte_level=model.info.byte_level,
        causal=model.info.causal,
    )
    return done.model_dump_json().encode() + b"\n"


class HeadProbes:
    """The service's head probes (module docstring), run on the model's workers by a CachedLines of the
    service's parts."""

    def __init__(self, parts: Parts, *, key: Callable[[Source], Hashable]) -> None:
        self._work = CachedLines(
            parts,
            key=key,
            event=lambda done, chunks: {"event": "progress", "done": done, "chunks": chunks},
            what="the head probe",
            failed="probing the heads failed on the server (logged)",
        )

    async def stream(self, request: ProbeRequest) -> AsyncIterator[bytes]:
        """NDJSON lines: {"event": "progress", "done": d, "chunks": c} after each chunk of sequences, then
        the result, or {"event": "error", "detail": ...}.
        Errors found before the work (unknown model, a length past the model's limit) are raised here."""
        name = self._work.models.resolve(request.model)
        model = await self._work.models.model(name)  # loaded on a loader thread; at once once loaded
        check_probe_length(model, request.length, max_tokens=self._work.settings.max_tokens, name=name)
        source: Source = (name, request.seed, request.sequences, request.length)
        key = self._work.key(source)
        return self._work.events(key, partial(self._compute, source, key), hit=self._work.get(key))

    async def _compute(self, source: Source, key: Hashable, abandoned: threading.Event) -> bytes:
        name, seed, sequences, length = source
        report = self._work.progress.reporter(key)

        def work(model: mha.AttentionModel) -> tuple[mha.AttentionModel, mha.HeadProbe]:
            with torch.inference_mode():
                probe = model.probe_heads(
                    seed=seed,
                    sequences=sequences,
                    length=length,
                    cancel=abandoned.is_set,  # asked before each layer: stop once nobody waits
                    progress=report,  # after each chunk
                )
            return model, probe

        model, probe = await settled(self._work.submit(name, work, abandoned))
        body: bytes = await self._work.off_loop(done_line, name, model, source, probe)
        return body
