"""`headscope corpus`: the arguments, the model's name resolved as the service resolves it, the progress
display; the job itself is mha.corpus.run."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import IO, Any

import mha
import mha.corpus
from app.cli_shared import at_least, offered
from app.settings import Settings

__all__ = ["Progress", "add_parser", "resolve_model", "run_corpus"]

_positive = at_least(1)  # a count of texts, records, tokens or characters: one at least
LOG_EVERY = 10.0  # seconds between plain progress lines when stderr is not a terminal


def add_parser(sub: Any) -> None:
    corpus = sub.add_parser(
        "corpus",
        help="every head's statistics over a corpus file (docs/corpus-runs.md)",
        description="Run head_stats over every text of INPUT (.txt, .jsonl, .csv, .parquet) and write "
        "per_text, per_head and examples Parquet files, errors.jsonl and run.json into --out.",
    )
    corpus.add_argument("input", type=Path, help="the corpus file")
    corpus.add_argument(
        "--model",
        default=None,
        help="a name the service registers (HEADSCOPE_MODELS, HEADSCOPE_MODELS_DIR, the embedded "
        f"{mha.DEFAULT_MODEL_NAME}) or a checkpoint directory (default: HEADSCOPE_DEFAULT_MODEL, else the "
        "embedded)",
    )
    corpus.add_argument("--out", required=True, type=Path, help="the run's folder (made, or resumed)")
    corpus.add_argument("--engine", choices=mha.corpus.ENGINES, default="local", help="default local")
    corpus.add_argument("--batch", type=_positive, default=32, help="texts per forward (default 32)")
    corpus.add_argument("--words", action="store_true", help="word-level maps instead of tokens")
    corpus.add_argument(
        "--weighting",
        choices=mha.corpus.WEIGHTINGS,
        default="weight",
        help="what the statistics read: the attention weights (default) or weight × value norm shares, "
        "what each head moves (the page's Weight × value norm)",
    )
    corpus.add_argument("--shard-size", type=_positive, default=1000, help="records per shard (default 1000)")
    corpus.add_argument("--max-tokens", type=_positive, default=512, help="tokens per text (default 512)")
    corpus.add_argument(
        "--max-chars",
        type=_positive,
        default=mha.corpus.MAX_CHARS,
        help="characters per text and pair, cut as read and flagged truncated "
        f"(default {mha.corpus.MAX_CHARS:,})",
    )
    corpus.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N, mps (HEADSCOPE_DEVICE)")
    corpus.add_argument("--num-gpus", type=float, default=None, help="Ray: GPUs a worker (default 1 if any)")


def resolve_model(given: str | None, settings: Settings) -> tuple[str | None, str]:
    """(what load_pretrained takes, the run's model name): a registered name first (operator entries over
    scanned ones over the embedded models over the stores', as the service orders them), then a checkpoint
    directory; ValueError for anything else, and for a folder's or store's entry that is not a model, the
    reason the service gives for it."""
    name, offers = offered(given, settings)
    registered = {known: found.path for known, found in offers.items() if found.path is not None}
    if name in registered:  # even the embedded model's name: the service serves the operator's under it
        return str(registered[name]), name
    if name == mha.DEFAULT_MODEL_NAME:
        return None, name
    if Path(name).is_dir():
        return name, Path(name).resolve().name
    known = ", ".join(sorted({mha.DEFAULT_MODEL_NAME, *registered}))
    raise ValueError(f"model {name!r} is neither a registered name ({known}) nor a checkpoint directory")


class Progress:
    """A tqdm bar (texts/s, ETA) on a terminal; elsewhere a plain line every LOG_EVERY seconds and at the
    end."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.bar: Any = None
        self.started = 0.0
        self.first: int | None = None  # records done at the first call (a resumed run starts above 0)
        self.last_line = 0.0

    def __call__(self, done: int, total: int) -> None:
        if self.stream.isatty():
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="text", file=self.stream, dynamic_ncols=True)
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if self.first is None:
            self.first, self.started = done, now
        elif done < total and now - self.last_line < LOG_EVERY:
            return
        self.last_line = now
        rate = (done - self.first) / max(now - self.started, 1e-9)
        eta = f", ETA {_duration((total - done) / rate)}" if rate > 0 and done < total else ""
        percent = 100 * done / total if total else 100.0
        self.stream.write(f"corpus: {done}/{total} records ({percent:.0f}%), {rate:.1f} texts/s{eta}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def run_corpus(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The `corpus` command: one line on stderr and exit status 2 for anything the user can fix."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings()
    progress = Progress()
    try:
        model, name = resolve_model(args.model, settings)
        options = {
            key: getattr(args, key)
            for key in ("engine", "batch", "words", "weighting", "shard_size", "max_tokens", "max_chars")
        }
        device = args.device or settings.device
        summary = mha.corpus.run(
            args.input,
            model,
            args.out,
            device=device,
            progress=progress,
            name=name,
            num_gpus=args.num_gpus,
            **options,
        )
    except (ValueError, RuntimeError) as error:  # bad input, settings, model or a missing Ray
        progress.close()
        parser.exit(2, f"headscope corpus: error: {' '.join(str(error).split())}\n")
    progress.close()
    counts = summary["counts"]
    sys.stderr.write(
        f"headscope corpus: {counts['texts']} texts, {counts['errors']} bad records, "
        f"{counts['truncated']} truncated -> {args.out}\n"
    )
