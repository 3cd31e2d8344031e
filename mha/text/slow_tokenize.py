"""Encoding with a Python ("slow") SentencePiece tokenizer, which has no offsets, sequence or word ids:
Marian's, the one family whose transformers tokenizer has no tokenizers-library version.

The ids are the tokenizer's own (its pieces, then its template: Marian appends </s>), so the model is fed
exactly what transformers feeds it. What a fast tokenizer would also report is rebuilt from the pieces:
each piece ("▁" marking a space) is found in the text from where the previous one ended, which gives its
character span; a piece starting with "▁" starts a new word. A piece the text does not spell as such
(the tokenizer's normalisation changed a character, an unknown piece) gets the characters between the
pieces around it (empty when there are none).
"""

from __future__ import annotations

from typing import Any

from mha.errors import NoRoomError

__all__ = ["SPACE", "align_pieces", "encode_slow"]

SPACE = "▁"  # SentencePiece's mark of a space before a piece


def align_pieces(text: str, pieces: list[str]) -> tuple[list[tuple[int, int]], list[int]]:
    """(character span, word index) of each piece of `text`, as module's docstring says."""
    spans: list[tuple[int, int]] = []
    words: list[int] = []
    cursor, word = 0, -1
    pending: int | None = None  # a piece the text did not spell, owed the characters skipped after it
    for piece in pieces:
        if piece.startswith(SPACE) or word < 0:
            word += 1
        words.append(word)
        core = piece.replace(SPACE, " ").strip()
        start = text.find(core, cursor) if core else -1
        # A match at the cursor (past spaces only) is this piece's; after an unspelled piece, the text
        # it stood for comes first.
        if core and start >= 0 and (pending is not None or not text[cursor:start].strip()):
            if pending is not None:
                gap = text[cursor:start]
                first = cursor + len(gap) - len(gap.lstrip())
                spans[pending] = (first, first + len(gap.strip()))
                pending = None
            spans.append((start, start + len(core)))
            cursor = start + len(core)
        else:
            spans.append((cursor, cursor))
            pending = len(spans) - 1 if pending is None else pending
    return spans, words


def encode_slow(
    tokenizer: Any, text: str, text_pair: str | None, limit: int, *, target: bool
) -> tuple[list[int], list[int | None], list[tuple[int, int]], list[int | None], bool]:
    """(ids, sources, offsets, word ids, truncated) of `text` (and its pair, or as a target) cut to
    `limit` tokens with the template's included: the longer text loses its last tokens first, as
    transformers' longest_first truncation does."""
    key = "text_target" if target else "text"
    given = [t for t in (text, text_pair) if t is not None]
    parts = [tokenizer(**{key: t}, add_special_tokens=False)["input_ids"] for t in given]
    lengths = [len(p) for p in parts]
    room = limit - tokenizer.num_special_tokens_to_add(pair=len(parts) == 2)
    truncated = sum(lengths) > room
    while sum(lengths) > room:
        longer = max(range(len(lengths)), key=lambda i: (lengths[i], -i))
        if lengths[longer] == 0:
            raise NoRoomError(limit, pair=len(parts) == 2)
        lengths[longer] -= 1
    parts = [p[:n] for p, n in zip(parts, lengths, strict=True)]
    ids = [int(i) for i in tokenizer.build_inputs_with_special_tokens(*parts)]
    added = tokenizer.get_special_tokens_mask(*parts)  # 1 where the template put a token
    per_part = [
        align_pieces(t, tokenizer.convert_ids_to_tokens(p)) for t, p in zip(given, parts, strict=True)
    ]
    sources: list[int | None] = []
    offsets: list[tuple[int, int]] = []
    word_ids: list[int | None] = []
    taken = [0] * len(parts)
    source = 0
    for is_added in added:
        if is_added:
            sources.append(None)
            offsets.append((0, 0))
            word_ids.append(None)
            continue
        while taken[source] == len(parts[source]):
            source += 1  # the first text's pieces are all placed: the pair's follow
        spans, words = per_part[source]
        sources.append(source)
        offsets.append(spans[taken[source]])
        word_ids.append(words[taken[source]])
        taken[source] += 1
    return ids, sources, offsets, word_ids, truncated
