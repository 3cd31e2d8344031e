"""mha.text.tokenize.is_byte_level reads a tokenizer's pre-tokenizer and decoder, wherever ByteLevel sits."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mha.text.tokenize import is_byte_level

LLAMA3_PRE = pre_tokenizers.Sequence(
    [pre_tokenizers.Split("x", "isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
)


def _fast(pre_tokenizer: object, decoder: object) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    if decoder is not None:
        tok.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize(
    ("pre_tokenizer", "decoder", "expected"),
    [
        (pre_tokenizers.ByteLevel(), decoders.ByteLevel(), True),  # GPT-2, RoBERTa
        # Llama 3 / Qwen: a regex Split before ByteLevel(use_regex=False), inside a Sequence
        (LLAMA3_PRE, decoders.ByteLevel(), True),
        (None, decoders.ByteLevel(), True),  # the decoder alone says so
        (pre_tokenizers.Metaspace(), decoders.Metaspace(), False),  # SentencePiece (Llama 2): "▁", not "Ġ"
        (pre_tokenizers.BertPreTokenizer(), decoders.WordPiece(), False),  # BERT
        (None, None, False),
    ],
)
def test_is_byte_level(pre_tokenizer: object, decoder: object, expected: bool) -> None:
    assert is_byte_level(_fast(pre_tokenizer, decoder)) is expected


def test_a_slow_tokenizer_is_not_byte_level() -> None:
    assert is_byte_level(object()) is False  # no backend_tokenizer to read
