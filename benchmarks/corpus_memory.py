"""Memory per record: the peak of a corpus run whose input holds one huge line, beside the same run without.

For each input format asked for, `headscope corpus` runs three times, each in a fresh subprocess on MiniLM
(the embedded default, on the CPU):
  without  TEXTS short texts (benchmarks/corpus.py's generator, 20-60 tokens each);
  cap      the same with one line of exactly MAX_CHARS characters put in their middle: what the cut leaves
           of the huge line, so the same work (one 512-token forward and its statistics);
  huge     the same with one MIB MiB line there instead.
Printed: each run's peak resident memory (ru_maxrss of that one child, from os.wait4), the median of
--repeat runs (the local engine runs T batches at once, so which batches meet moves a peak by tens of MiB
from run to run; the spread is printed too), huge / without beside the goal (issue 26: within 10 %), and
huge / cap, which isolates the line's size: a text cut at the caps costs what any text of 512 tokens
costs, whatever its length. The probe checks that the long record was cut and flagged (run.json's
counts), so each figure is of a run that did the work.

    PYTHONPATH=. .venv/bin/python benchmarks/corpus_memory.py [--texts 200] [--mib 50] [--formats txt jsonl]
        [--max-chars N] [--repeat 3]

Linux (ru_maxrss in KiB). Writes ~3 x MIB MiB of input in a temporary folder, a file at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from corpus import WORDS, write_corpus

from mha.corpus.source import MAX_CHARS

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.10  # issue 26: the run with the huge line peaks within 10 % of the run without it
BLOCK = 1 << 20  # the long text is written a MiB at a time: the probe never holds it whole
PIECE = " ".join(WORDS) + " "  # common words: ~5 characters a token, so the cut text is past 512 tokens


def long_text(chars: int) -> Iterator[str]:
    """`chars` characters of words, a block at a time."""
    block = PIECE * (BLOCK // len(PIECE) + 1)
    while chars > 0:
        yield block[: min(chars, BLOCK)]
        chars -= BLOCK


def write_input(path: Path, texts: list[str], chars: int) -> None:
    """`texts` one a line (.txt, or .jsonl objects), with a text of `chars` characters in their middle."""
    jsonl = path.suffix == ".jsonl"
    with path.open("w", encoding="utf-8") as f:
        for k, text in enumerate(texts):
            f.write((json.dumps({"text": text}) if jsonl else text) + "\n")
            if k == len(texts) // 2 and chars:
                f.write('{"text": "' if jsonl else "")
                for block in long_text(chars):
                    f.write(block)
                f.write('"}\n' if jsonl else "\n")


def peak(source: Path, out: Path, max_chars: int) -> tuple[float, dict[str, int]]:
    """(MiB of peak resident memory of `headscope corpus source`, its run.json counts)."""
    command = [sys.executable, "-m", "app.cli", "corpus", str(source), "--out", str(out), "--device", "cpu"]
    command += ["--max-chars", str(max_chars)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    errors = child.stderr.read()  # read to the end before waiting: a full pipe would block the child
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the largest of all children
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{errors.decode()[-2000:]}")
    counts = json.loads((out / "run.json").read_text(encoding="utf-8"))["counts"]
    return usage.ru_maxrss / 1024, counts


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--mib", type=int, default=50, help="MiB of the huge line")
    parser.add_argument("--formats", nargs="+", choices=("txt", "jsonl"), default=["txt", "jsonl"])
    parser.add_argument("--max-chars", type=int, default=MAX_CHARS, help="the CLI's --max-chars")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each input (their median is shown)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        f"peak RSS of the whole CLI run: {args.texts} short texts; the same with one line of "
        f"{args.max_chars:,} characters (cap); with one {args.mib} MiB line (huge)"
    )
    print(f"medians of {args.repeat} runs each; the spread (max - min) of each input's runs after the ratios")
    print(
        f"{'format':<7}{'without':>9}{'cap':>9}{'huge':>9}  {'huge/without':>12} (goal)  "
        f"{'huge/cap':>8}  spread"
    )
    with tempfile.TemporaryDirectory() as scratch:
        records = Path(scratch) / "records.jsonl"
        write_corpus(records, args.texts)
        texts = [json.loads(line)["text"] for line in records.read_text(encoding="utf-8").splitlines()]
        for kind in args.formats:
            figures, spreads = [], []
            for name, chars in (("without", 0), ("cap", args.max_chars), ("huge", args.mib << 20)):
                source = Path(scratch) / f"{name}.{kind}"
                write_input(source, texts, chars)
                runs = []
                for k in range(args.repeat):
                    mib, counts = peak(source, Path(scratch) / f"{kind}-{name}-{k}", args.max_chars)
                    if chars and counts["truncated"] != 1:
                        raise SystemExit(
                            f"{kind} {name}: the long record was not flagged truncated ({counts})"
                        )
                    runs.append(mib)
                source.unlink()
                figures.append(statistics.median(runs))
                spreads.append(f"{max(runs) - min(runs):.0f}")
            without, cap, huge = figures
            ratio = huge / without
            mark = "ok" if ratio <= GOAL else "over"
            print(
                f"{kind:<7}{without:>5.0f} MiB{cap:>5.0f} MiB{huge:>5.0f} MiB  {ratio:>12.3f} "
                f"(<= {GOAL:.2f} {mark})  {huge / cap:>8.3f}  {'/'.join(spreads)} MiB"
            )


if __name__ == "__main__":
    main()
