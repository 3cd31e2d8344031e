"""Texts of an exact token count for a tokenizer, made of one short list of words: what extract.py,
extract_device.py and smollm2.py attend to, and the words long.py's word-level tokenizer knows.
"""

from __future__ import annotations

WORDS = "the quick brown fox jumps over the lazy dog while attention heads watch every token".split()


def words_text(count: int, *, salt: int = 0) -> str:
    """The first `count` words of WORDS repeated, starting `salt` words in."""
    shift = salt % len(WORDS)
    return " ".join(((WORDS[shift:] + WORDS[:shift]) * (count // len(WORDS) + 1))[:count])


def text_of(n: int, tokenizer, *, salt: int = 0) -> str:
    """A text the tokenizer turns into exactly n tokens, its special tokens included (`salt` rotates the
    words: another text of the same length)."""
    count = n - len(tokenizer("")["input_ids"])  # the words, one token each where the vocabulary allows
    tried: set[int] = set()
    while count > 0 and count not in tried:
        tried.add(count)
        text = words_text(count, salt=salt)
        got = len(tokenizer(text)["input_ids"])
        if got == n:
            return text
        count += n - got
    raise ValueError(f"no text of exactly {n} tokens")
