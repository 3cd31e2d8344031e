"""Our layers with converted weights give exactly transformers' attention and hidden states (1e-5).

Tiny random BERT, RoBERTa, DistilBERT and GPT-2 checkpoints (tests/checkpoints.py) and the embedded
all-MiniLM-L6-v2, against transformers' eager attention with output_attentions=True.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mha import AttentionModel, AttentionResult, load_pretrained
from mha.pretrained import default_model_path

MODELS = ("bert", "roberta", "distilbert", "gpt2", "minilm")
SENTENCE = "The cat sat on the mat."
PAIR = "It was happy there, said the dog."
UNICODE = "Ünïcödé — naïve café, Straße, 東京, emoji 🙂!"


class Pair:
    """Our model and transformers' model loaded from the same directory."""

    def __init__(self, family: str, directory: Path) -> None:
        from transformers import AutoModel

        self.family = family
        self.ours: AttentionModel = load_pretrained(directory, device="cpu")
        self.theirs = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()

    def reference(self, results: list[AttentionResult]) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' (attentions [L, B, H, T, T], last hidden [B, T, E]) on the same padded batch."""
        width = max(r.n for r in results)
        pad = self.ours.tokenizer.pad_token_id if self.ours.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(results), width), pad)
        mask = torch.zeros((len(results), width), dtype=torch.long)
        segments = torch.zeros((len(results), width), dtype=torch.long)
        for row, r in enumerate(results):
            ids[row, : r.n] = torch.tensor(r.token_ids)
            mask[row, : r.n] = 1
            segments[row, : r.n] = torch.tensor(r.segments)
        kwargs = {"input_ids": ids, "attention_mask": mask, "output_attentions": True}
        if self.family in ("bert", "minilm"):
            kwargs["token_type_ids"] = segments
        with torch.no_grad():
            out = self.theirs(**kwargs)
        return torch.stack(out.attentions), out.last_hidden_state

    def check(self, results: list[AttentionResult]) -> None:
        attentions, hidden = self.reference(results)
        for row, r in enumerate(results):
            n = r.n
            layers, heads = self.ours.info.layers, self.ours.info.heads
            assert r.attentions.shape == (layers, heads, n, n)
            assert r.attentions.dtype == torch.float32 and r.attentions.device.type == "cpu"
            assert r.attentions.is_contiguous()
            # Only the unpadded part: padded rows are no real token's attention.
            torch.testing.assert_close(r.attentions, attentions[:, row, :, :n, :n], atol=1e-5, rtol=0)
            torch.testing.assert_close(r.hidden_state, hidden[row, :n], atol=1e-5, rtol=0)
            torch.testing.assert_close(r.attentions.sum(-1), torch.ones(layers, heads, n), atol=1e-5, rtol=0)
            if self.ours.info.causal:
                assert not r.attentions.triu(diagonal=1).any(), "a causal model attended to a later token"


@pytest.fixture(scope="module", params=MODELS)
def pair(request: pytest.FixtureRequest, tiny_checkpoints: dict[str, Path]) -> Pair:
    family = request.param
    directory = default_model_path() if family == "minilm" else tiny_checkpoints[family]
    return Pair(family, directory)


def test_single_sentence(pair: Pair) -> None:
    result = pair.ours.attend(SENTENCE)
    assert not result.truncated and set(result.segments) == {0}
    pair.check([result])


def test_sentence_pair(pair: Pair) -> None:
    result = pair.ours.attend(SENTENCE, PAIR)
    assert result.segments[0] == 0 and result.segments[-1] == 1
    # The segments are contiguous: the first text, then the pair.
    assert result.segments == sorted(result.segments)
    pair.check([result])


def test_unicode(pair: Pair) -> None:
    result = pair.ours.attend(UNICODE)
    for (start, end), special in zip(result.offsets, result.special, strict=True):
        # Byte-level BPE may split one character over two tokens, so a span can be empty.
        assert special or 0 <= start <= end <= len(UNICODE)
    pair.check([result])


def test_padded_batch(pair: Pair) -> None:
    items: list[tuple[str, str | None]] = [("Hi.", None), (SENTENCE, PAIR), (UNICODE, None)]
    results = pair.ours.attend_batch(items)
    assert len({r.n for r in results}) == 3, "the batch must really be padded"
    pair.check(results)
    # The same texts one at a time give the same numbers: padding changes nothing.
    alone = pair.ours.attend(SENTENCE, PAIR)
    torch.testing.assert_close(alone.attentions, results[1].attentions, atol=1e-5, rtol=0)


def test_near_max_length(pair: Pair) -> None:
    limit = pair.ours.info.max_tokens
    long_text = " ".join(["the cat sat on the mat and looked at the dog"] * (limit // 4))
    result = pair.ours.attend(long_text)
    assert result.truncated and result.n == limit
    pair.check([result])
    shorter = pair.ours.attend(long_text, max_tokens=limit - 3)
    assert shorter.truncated and shorter.n == limit - 3
    pair.check([shorter])


def test_attention_only_skips_the_last_layer_but_not_its_attention(pair: Pair) -> None:
    # hidden_state=False (the service's call) drops the last layer's value path and feed-forward; every
    # attention, the last layer's included, must still equal transformers', single and padded alike.
    single = pair.ours.attend(SENTENCE, PAIR, hidden_state=False)
    batch = pair.ours.attend_batch([("Hi.", None), (UNICODE, None)], hidden_state=False)
    assert single.hidden_state is None and all(r.hidden_state is None for r in batch)
    for results in ([single], batch):
        attentions, _ = pair.reference(results)
        for row, r in enumerate(results):
            torch.testing.assert_close(r.attentions, attentions[:, row, :, : r.n, : r.n], atol=1e-5, rtol=0)
