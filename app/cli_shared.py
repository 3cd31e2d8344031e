"""What the commands that run a model without the server share (app.corpus_cli, app.snapshot.cli): the
model named as the server names it, and argparse's integer options."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from app.service.offers import Offer, default_model, find_models
from app.settings import Settings

__all__ = ["at_least", "offered"]


def offered(given: str | None, settings: Settings) -> tuple[str, dict[str, Offer]]:
    """(the model's name: `given`, else the server's default; every model the server offers), after the
    sources are scanned as the server scans them; ValueError when that name's entry is one the server
    refuses (a folder's or store's entry that is not a model), with the reason it gives."""
    name = given or default_model(settings)
    offers = find_models(settings)
    if (offer := offers.get(name)) is not None and offer.refused is not None:
        raise ValueError(f"model {name!r} cannot be loaded: {offer.refused}")
    return name, offers


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum`, else an error argparse shows with the
    option's name ("argument --batch: '0' must be at least 1")."""

    def whole_number(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
        return number

    return whole_number
