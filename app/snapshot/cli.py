"""`headscope snapshot`: one run as a self-contained `.html` file, with no server. The model is named as
the server names it (the same sources and names, app/service/offers.py: the registry's loaders), the
input attended as the service attends it, and the file built by app.snapshot.build."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pydantic

import mha
from app.cli_shared import at_least, offered
from app.settings import Settings
from app.snapshot.html import DEFAULT_MAX_BYTES, build
from mha.networks import DEFAULT_NEW_TOKENS

__all__ = ["add_parser", "run_snapshot"]


def add_parser(sub: Any) -> None:
    snapshot = sub.add_parser(
        "snapshot",
        help="one run as a self-contained .html file that opens offline (docs/snapshots.md)",
        description="Run MODEL on TEXT with no server and write the page of that run as one .html file: "
        "every head, the head detail, token lines and statistics, opening from disk with no network.",
    )
    snapshot.add_argument(
        "--model",
        default=None,
        help="a model the server offers, by its name (HEADSCOPE_MODELS, HEADSCOPE_MODELS_DIR, the stores, "
        f"the embedded {mha.DEFAULT_MODEL_NAME}; default: HEADSCOPE_DEFAULT_MODEL, else the embedded)",
    )
    snapshot.add_argument("--text", required=True, help="the text (a decoder's prompt, a source sentence)")
    snapshot.add_argument("--pair", default=None, help="a second text, read as a pair")
    snapshot.add_argument("--target", default=None, help="an encoder-decoder's target (blank: it writes one)")
    snapshot.add_argument(
        "--max-new-tokens",
        type=at_least(0),
        default=None,
        help="a decoder continues the text by up to N tokens",
    )
    snapshot.add_argument(
        "--chat", action="store_true", help="the text as a user's turn of the chat template"
    )
    snapshot.add_argument(
        "--weighting",
        choices=("weight", "norm"),
        default="weight",
        help="the weights (default) or weight × value norm shares, what each head moves",
    )
    snapshot.add_argument(
        "--max-bytes",
        type=at_least(0),
        default=DEFAULT_MAX_BYTES,
        help=f"the file's size limit (default {DEFAULT_MAX_BYTES:,}: 32 MiB); past it the grid is pooled",
    )
    snapshot.add_argument("-o", "--output", required=True, type=Path, help="the .html file to write")


def _model(name: str | None, settings: Settings) -> mha.AttentionModel:
    """The model the server would serve under `name`, loaded by its own loader; ValueError otherwise."""
    wanted, offers = offered(name, settings)
    offer = offers.get(wanted)
    if offer is None:
        raise ValueError(f"unknown model {wanted!r}; the server offers: {', '.join(sorted(offers))}")
    return offer.loader()


def _attend(model: mha.AttentionModel, args: argparse.Namespace, settings: Settings) -> mha.AttentionResult:
    """The input attended as the service attends it (forwards.py): its token limit, an encoder-decoder
    writing its own target by up to the service's default, the value norms for weighting "norm"."""
    limit = settings.max_new_tokens
    new_tokens = args.max_new_tokens
    if new_tokens is not None and new_tokens > limit:
        raise ValueError(
            f"--max-new-tokens ({new_tokens}) is over the limit ({limit}, HEADSCOPE_MAX_NEW_TOKENS)"
        )
    if model.info.seq2seq and new_tokens is None:
        new_tokens = min(DEFAULT_NEW_TOKENS, limit)
    return model.attend(
        args.text,
        args.pair,
        max_tokens=settings.tokens_for(model.info.max_tokens),
        target=args.target or None,
        hidden_state=False,
        max_new_tokens=new_tokens or None,
        chat=args.chat,
        norms=args.weighting == "norm",
    )


def run_snapshot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The `snapshot` command: one line on stderr and exit status 2 for anything the user can fix."""
    try:
        settings = Settings()
        if not args.text.strip():
            raise ValueError("--text is blank: there is nothing to look at")
        model = _model(args.model, settings)
        result = _attend(model, args, settings)
        text = args.text if args.chat else None  # a chat result's texts are the template's rendering
        built = build(result, model=model, max_bytes=args.max_bytes, text=text, chat=args.chat)
        args.output.write_text(built.html, encoding="utf-8")
    except (
        ValueError,
        RuntimeError,
        OSError,
        mha.InputError,
        mha.CheckpointError,
        pydantic.ValidationError,
    ) as error:
        parser.exit(2, f"headscope snapshot: error: {' '.join(str(error).split())}\n")
    exact = (
        f"{len(built.exact)} of them exact" if built.pooled is None else f"pooled to {built.pooled} blocks"
    )
    sys.stderr.write(
        f"headscope snapshot: {built.heads} heads, {exact}, {built.bytes / 2**20:.1f} MiB -> {args.output}\n"
    )
