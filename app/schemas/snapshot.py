"""The snapshot's schema (POST /api/snapshot, app/routes/snapshot.py): one input as the attention routes
take it, the head the file opens on, and the file's size limit with its bounds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from app.schemas.attention import KindRequest
from app.schemas.common import WHOLE, Index

MIB = 2**20
DEFAULT_MAX_BYTES = 32 * MIB  # the file's limit unless asked otherwise (headscope snapshot's too)
# Below this no snapshot fits: every file carries the page's fixed assets (plotly.js, the linked modules,
# the CSS and markup: 1.88 MB, docs/snapshots.md), and tests/app/test_snapshot_api.py holds them under it.
MIN_MAX_BYTES = 2 * MIB
# Above this the server would build, hold and cache a file that no page needs (MiniLM at its 512 tokens
# takes 24 MB): one request may not make it spend more.
MAX_MAX_BYTES = 64 * MIB

MaxBytes = Annotated[int, Field(strict=True, ge=MIN_MAX_BYTES, le=MAX_MAX_BYTES), WHOLE]


def _head_kind(value: Any) -> str:
    # A string can only be an aggregate's name; anything else is read as an index, and refused as one.
    return "aggregate" if isinstance(value, str) else "index"


# A head index, or the name of a layer's aggregate as the page's state has it ("mean"). Tagged, so that a
# refusal names what was expected of its kind of value ("head.index: ... greater than or equal to 0").
Head = Annotated[
    Annotated[Index, Tag("index")] | Annotated[Literal["mean"], Tag("aggregate")],
    Discriminator(_head_kind),
]


class SnapshotRequest(KindRequest):
    """One input, as /api/attention/head takes it, and what the file is to hold."""

    layer: Index = Field(default=0, description="The layer the file opens on, below the model's `layers`.")
    head: Head = Field(
        default=0,
        description="The head the file opens on, below the model's `heads`, or \"mean\": the layer's mean "
        "of all heads, as the page's grid has it.",
    )
    max_bytes: MaxBytes = Field(
        default=DEFAULT_MAX_BYTES,
        description=f"The file's size limit in bytes, from {MIN_MAX_BYTES:,} (2 MiB: the page's own assets "
        f"take 1.9 MB of every file) to {MAX_MAX_BYTES:,} (64 MiB). Past it even for every head at 8 bits, "
        "the grid is pooled (as a long prompt's overview) and the file says so; an encoder-decoder's run "
        "that does not fit, or a limit below what the run's file needs at all, is refused (422).",
    )
