"""Text (and pair) -> token ids, with what display and analysis need per token: segments, special and
unknown marks, character offsets, word ids. The checkpoint's own fast tokenizer does the splitting
(templates included); `TextEncoder` adds the checks transformers leaves to the model (ids past the
embeddings, a pair on a model with one token type), segment inference for display, and pairs for tokenizers
without a pair template.

Which tokens are special: the control tokens, those the tokenizer adds or that steer the model: [CLS],
[SEP], BOS, EOS, PAD, MASK, chat-template markers (<|im_start|>, <|im_end|>, ...), typed in the text or
added by the template. Their ids are the tokenizer's named special ids (`all_special_ids`) and every token
it added as special (some, such as Llama 3's <|start_header_id|>, have no named role). [UNK] is not one:
the tokenizer writes it in place of a word it cannot spell, so it stands for that word (and keeps its word
id), as in Clark et al. 2019, whose sink statistic is the attention to [CLS] plus [SEP]. It is marked
`unknown` instead, for display. An unk token the tokenizer never writes for a word (a byte-level BPE
spells every byte: GPT-2's unk token is <|endoftext|>), or one that also plays another role (BOS, EOS,
PAD, ...), stays a control token.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from mha.errors import (
    ChatPairError,
    EmptyInputError,
    NoChatTemplateError,
    NoRoomError,
    PairNotSupportedError,
    TokenIdOutOfRangeError,
)
from mha.text.chat import render_chat
from mha.text.slow_tokenize import encode_slow

CHAT_CACHE_SIZE = 64  # rendered chats kept per model: the requests in flight, many times over

__all__ = ["Encoded", "TextEncoder", "control_ids", "display_segments", "is_byte_level", "unknown_id"]


@dataclass
class Encoded:
    """One text (or pair) as the model is fed it, one entry per token."""

    ids: list[int]
    sources: list[int | None]  # 0 from the text, 1 from the pair, None added by the template
    segments: list[int]  # for display: a template token joins the segment in front of it
    type_ids: list[int]  # the token type ids the model is fed
    special: list[bool]  # a control token (TextEncoder.special_ids), typed in the text or not; never [UNK]
    # The tokenizer's [UNK] (TextEncoder.unknown_id): a word of the text it cannot spell, so not special
    # (it has its word id); marked for display, which styles it apart.
    unknown: list[bool]
    offsets: list[tuple[int, int]]  # character spans into the segment's own text; (0, 0) for the template's
    word_ids: list[int | None]  # the tokenizer's word index; None for special tokens
    truncated: bool
    # The strings `offsets` index into: (text, text_pair) as given, or (the rendered chat template, None).
    texts: tuple[str, str | None] = ("", None)

    def __getitem__(self, keep: slice) -> Encoded:
        return Encoded(
            self.ids[keep],
            self.sources[keep],
            self.segments[keep],
            self.type_ids[keep],
            self.special[keep],
            self.unknown[keep],
            self.offsets[keep],
            self.word_ids[keep],
            self.truncated,
            self.texts,
        )

    def extended(self, new_ids: Sequence[int], encoder: TextEncoder) -> Encoded:
        """These tokens followed by `new_ids` the model wrote (marked by `encoder`): in the last segment,
        type 0, no span of the text and no word of it."""
        n = len(new_ids)
        special, unknown = encoder.marks(new_ids)
        return replace(
            self,
            ids=self.ids + list(new_ids),
            sources=self.sources + [None] * n,
            segments=self.segments + self.segments[-1:] * n,
            type_ids=self.type_ids + [0] * n,
            special=self.special + special,
            unknown=self.unknown + unknown,
            offsets=self.offsets + [(0, 0)] * n,
            word_ids=self.word_ids + [None] * n,
        )


def display_segments(sources: Sequence[int | None]) -> list[int]:
    """Segments for display: a template token joins the segment in front of it, so "[CLS] A [SEP]" and
    "<s> A </s>" are 0, and "B [SEP]" and "</s> B </s>" are 1."""
    segments, current = [], 0
    for i, source in enumerate(sources):
        if source is None:
            following = next((s for s in sources[i:] if s is not None), current)
            previous_template = i > 0 and sources[i - 1] is None
            current = following if previous_template or i == 0 else current
        else:
            current = source
        segments.append(current)
    return segments


def is_byte_level(tokenizer: Any) -> bool:
    """True when a fast tokenizer is a byte-level BPE (GPT-2, RoBERTa, Llama 3, Qwen): its pre-tokenizer or
    decoder is ByteLevel, alone or inside a Sequence, so its tokens spell the bytes of a space, newline and
    tab as "Ġ", "Ċ", "ĉ". Read from the tokenizer itself, not the family: Llama 2 is SentencePiece, Llama 3
    byte-level; a WordPiece token may hold a literal "Ġ"."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = (getattr(backend, "pre_tokenizer", None), getattr(backend, "decoder", None))
    return any(part is not None and _names_byte_level(json.loads(part.__getstate__())) for part in parts)


def _names_byte_level(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_names_byte_level(value) for value in node.values())
    return isinstance(node, list) and any(_names_byte_level(item) for item in node)


def unknown_id(tokenizer: Any) -> int | None:
    """The id `tokenizer` writes for a word it cannot spell ([UNK], <unk>); None when it writes none: its
    model names no unk token (a byte-level BPE spells every byte), or its unk token is also another role's
    (BOS, EOS, PAD, ...), so a control token."""
    unk = tokenizer.unk_token_id
    model: Any = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    if unk is None or (hasattr(model, "unk_token") and model.unk_token is None):  # Unigram's is always set
        return None
    roles = {token for role, token in tokenizer.special_tokens_map.items() if role != "unk_token"}
    return None if tokenizer.unk_token in roles else int(unk)


def control_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of `tokenizer`'s special tokens, named (`all_special_ids`) or only added as special (the
    chat markers of some tokenizers), [UNK] included: TextEncoder takes it out when it stands for a word."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return frozenset(int(i) for i in tokenizer.all_special_ids) | {
        int(i) for i, token in added.items() if token.special
    }


class TextEncoder:
    """A checkpoint's fast tokenizer for one model: text (and pair) -> Encoded, checked against the model's
    `vocab_size` and `type_vocab_size` (0: the model has no segment embeddings, so type ids are not fed).

    `pair_template=False` is for tokenizers with no pair template (GPT-2): each text is encoded alone and
    the two are joined, the longer one cut first. Safe to share between threads.
    """

    def __init__(
        self, tokenizer: Any, *, vocab_size: int, type_vocab_size: int, pair_template: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.type_vocab_size = type_vocab_size
        self.pair_template = pair_template
        # The rule is the module docstring's.
        self.unknown_id = unknown_id(tokenizer)
        self.special_ids = control_ids(tokenizer) - {self.unknown_id}
        pad = tokenizer.pad_token_id
        # GPT-2 has no pad token; any id works since padded keys are masked and padded rows dropped.
        self.pad_id: int = pad if pad is not None else 0
        # A Python SentencePiece tokenizer (Marian's) gives no offsets: mha.text.slow_tokenize rebuilds them.
        self.fast = bool(getattr(tokenizer, "is_fast", False))
        # A fast tokenizer's truncation setting is shared state that each call may change: concurrent
        # calls from threads (the web service) must not interleave, or one gets the other's truncation.
        self._lock = threading.Lock()
        # The last chats rendered (text -> string): a request renders its text once, ahead of the shared
        # encoding pool (the service's pre-render), and every later encoding of it reads it here.
        self._chats: dict[str, str] = {}
        self._chat_lock = threading.Lock()

    def marks(self, ids: Sequence[int]) -> tuple[list[bool], list[bool]]:
        """(special, unknown) of each id, by the module docstring's rule."""
        return [i in self.special_ids for i in ids], [i == self.unknown_id for i in ids]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_text(self, text: str, *, cancel: Callable[[], bool] | None = None) -> str:
        """`text` as the user's turn of the tokenizer's chat template, the assistant's turn opened after it:
        the string transformers' apply_chat_template(..., add_generation_prompt=True) renders."""
        if not self.has_chat_template:
            raise NoChatTemplateError()
        with self._chat_lock:
            rendered = self._chats.get(text)
        if rendered is None:
            # The template is untrusted code: rendered in a worker process, bounded (mha.text.chat).
            rendered = render_chat(
                self.tokenizer.get_chat_template(),
                [{"role": "user", "content": text}],
                self.tokenizer.special_tokens_map,
                cancel=cancel,
            )
            with self._chat_lock:
                self._chats[text] = rendered
                while len(self._chats) > CHAT_CACHE_SIZE:
                    self._chats.pop(next(iter(self._chats)))
        return rendered

    def encode_batch(
        self, pairs: Sequence[tuple[str, str | None]], limit: int, *, chat: bool = False
    ) -> list[Encoded]:
        """Each (text, pair) cut to at most `limit` tokens, special tokens included. chat=True: each text
        is a user's turn of the chat template (`chat_text`), tokenized as rendered (the template writes
        its own special tokens, so none are added), as apply_chat_template(tokenize=True) does."""
        with self._lock:
            return [self._encode(text, pair, limit, chat=chat) for text, pair in pairs]

    def encode_target(self, target: str, limit: int) -> Encoded:
        """An encoder-decoder's target as tokenizer(text_target=target) gives it (Marian's tokenizer
        switches to its target vocabulary), cut to at most `limit` tokens like a text."""
        with self._lock:
            return self._encode(target, None, limit, field="target")

    def _encode(
        self, text: str, text_pair: str | None, limit: int, *, chat: bool = False, field: str = "text"
    ) -> Encoded:
        """`field` "target": `text` is an encoder-decoder's target, and errors name it so."""
        if not isinstance(text, str) or not text.strip():
            raise EmptyInputError(field, text)
        if text_pair is not None and (not isinstance(text_pair, str) or not text_pair.strip()):
            raise EmptyInputError("text_pair", text_pair)
        if chat:
            if text_pair is not None:
                raise ChatPairError()
            # The rendered template writes its own special tokens: none are added.
            encoded = self._encode_template(self.chat_text(text), None, limit, special_tokens=False)
        elif not self.fast:
            encoded = self._encode_slow(text, text_pair, limit, target=field == "target")
        elif field == "target":
            encoded = self._encode_template(text, None, limit, target=True)
        elif self.pair_template or text_pair is None:
            encoded = self._encode_template(text, text_pair, limit)
        else:
            encoded = self._encode_concatenated(text, text_pair, limit)
        # Each text must give a token of its own; a typed "[SEP]" counts (the model reads it), the
        # template's [CLS] and [SEP] do not.
        for source, (name, given) in enumerate(((field, text), ("text_pair", text_pair))):
            if given is not None and source not in encoded.sources:
                if encoded.truncated:  # max_tokens cut it all away: not an empty text
                    raise NoRoomError(limit, pair=text_pair is not None)
                raise EmptyInputError(name, given, no_tokens=True)
        self._check_fits(encoded)
        if not self.type_vocab_size:  # no segment embeddings: the type ids are not fed
            encoded = replace(encoded, type_ids=[0] * len(encoded.ids))
        return encoded

    def _check_fits(self, encoded: Encoded) -> None:
        """Ids the embeddings have rows for; transformers fails on the others too (index out of range)."""
        outside = sorted({i for i in encoded.ids if not 0 <= i < self.vocab_size})
        if outside:
            raise TokenIdOutOfRangeError(outside, self.vocab_size)
        if self.type_vocab_size and max(encoded.type_ids) >= self.type_vocab_size:
            raise PairNotSupportedError(max(encoded.type_ids), self.type_vocab_size)

    def _call_tokenizer(
        self,
        text: str,
        text_pair: str | None,
        limit: int | None,
        *,
        special_tokens: bool = True,
        target: bool = False,
    ) -> Any:
        # Token type ids as the tokenizer gives them by default: what transformers' model(**tokenizer(...))
        # is fed (BERT's tokenizer gives 0/1, RoBERTa's none, which the model reads as zeros).
        texts: dict[str, Any] = {"text_target": text} if target else {"text": text, "text_pair": text_pair}
        return self.tokenizer(
            **texts,
            add_special_tokens=special_tokens,
            truncation=limit is not None,
            max_length=limit,
            return_offsets_mapping=True,
        )

    def _encode_template(
        self,
        text: str,
        text_pair: str | None,
        limit: int,
        *,
        special_tokens: bool = True,
        target: bool = False,
    ) -> Encoded:
        call = partial(self._call_tokenizer, text, text_pair, special_tokens=special_tokens, target=target)
        enc = call(None)
        truncated = len(enc["input_ids"]) > limit
        if truncated:
            enc = call(limit)
            if len(enc["input_ids"]) > limit:
                raise NoRoomError(limit)
        ids = [int(i) for i in enc["input_ids"]]
        sources: list[int | None] = list(enc.sequence_ids(0))
        given = enc.get("token_type_ids")
        type_ids = [int(t) for t in given] if given is not None else [0] * len(ids)
        # The tokenizer's ids decide what is special: "[SEP]" typed in the text is the real [SEP], which
        # the model reads as such, so it is special like the template's (transformers' own
        # get_special_tokens_mask(already_has_special_tokens=True) rule), [UNK] aside (module docstring).
        special, unknown = self.marks(ids)
        offsets = [
            (0, 0) if source is None else (int(a), int(b))
            for source, (a, b) in zip(sources, enc["offset_mapping"], strict=True)
        ]
        word_ids = [None if sp else w for sp, w in zip(special, enc.word_ids(0), strict=True)]
        segments, texts = display_segments(sources), (text, text_pair)
        return Encoded(
            ids, sources, segments, type_ids, special, unknown, offsets, word_ids, truncated, texts
        )

    def _encode_slow(self, text: str, text_pair: str | None, limit: int, *, target: bool) -> Encoded:
        ids, sources, offsets, words, truncated = encode_slow(
            self.tokenizer, text, text_pair, limit, target=target
        )
        special, unknown = self.marks(ids)
        word_ids = [None if sp else w for sp, w in zip(special, words, strict=True)]
        segments = display_segments(sources)
        zeros = [0] * len(ids)  # no slow tokenizer here gives token types
        return Encoded(
            ids, sources, segments, zeros, special, unknown, offsets, word_ids, truncated, (text, text_pair)
        )

    def _encode_concatenated(self, text: str, text_pair: str, limit: int) -> Encoded:
        """Tokenizers with no pair template (GPT-2): encode each text, join, cut the longer one first."""
        parts = [self._encode_template(t, None, 10**9) for t in (text, text_pair)]
        lengths = [len(p.ids) for p in parts]
        truncated = sum(lengths) > limit
        while sum(lengths) > limit:
            longer = 0 if lengths[0] > lengths[1] else 1
            if lengths[longer] <= 1:
                raise NoRoomError(limit, pair=True)
            lengths[longer] -= 1
        a, b = (p[:n] for p, n in zip(parts, lengths, strict=True))
        return Encoded(
            ids=a.ids + b.ids,
            sources=a.sources + [None if s is None else 1 for s in b.sources],
            segments=[0] * len(a.ids) + [1] * len(b.ids),
            type_ids=a.type_ids + b.type_ids,
            special=a.special + b.special,
            unknown=a.unknown + b.unknown,
            offsets=a.offsets + b.offsets,
            word_ids=a.word_ids + b.word_ids,
            truncated=truncated,
            texts=(text, text_pair),
        )
