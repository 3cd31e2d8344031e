"""The head probe's one bound on `length` for a model, under the service's cap: /api/probe's and the probe
input's (`InputText.probe`) alike. May import: mha's public names, app.errors."""

from __future__ import annotations

import mha
from app.errors import InvalidInputError
from mha.model import probe_max_length


def check_probe_length(
    model: mha.AttentionModel, length: int, *, max_tokens: int, name: str | None = None
) -> None:
    """422 for a `length` past mha's bound for the model (its decoder's limit for an encoder-decoder), or
    past HEADSCOPE_MAX_TOKENS (`max_tokens`); `name`: the registered name to say (else the model's own)."""
    name = name or model.info.name
    most = min(probe_max_length(model), (max_tokens - 1) // 2)
    if length > most:
        raise InvalidInputError(
            f"length ({length}) is over {most} for {name!r}: each probe row is the start token "
            f"and the draw twice (2·length + 1 tokens), and it reads at most {2 * most + 1} tokens "
            "(the model's limit, or HEADSCOPE_MAX_TOKENS)"
        )
