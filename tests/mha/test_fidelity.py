"""Our layers with converted weights give exactly transformers' attention and hidden states.

Tiny random BERT, RoBERTa, DistilBERT and GPT-2 checkpoints (tests/checkpoints.py) and the embedded
all-MiniLM-L6-v2, against transformers' eager attention with output_attentions=True, fed exactly what
AutoTokenizer returns for the same texts, as a transformers user would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from checkpoints import FAMILIES, TYPE_VOCAB_SIZES, build_checkpoint
from tolerances import FORWARD, float32_sum, row_sum

from mha import AttentionModel, AttentionResult, load_pretrained
from mha.analysis import head_stats
from mha.errors import PairNotSupportedError
from mha.loading.pretrained import default_model_path

MODELS = (*FAMILIES, "minilm")
SENTENCE = "The cat sat on the mat."
PAIR = "It was happy there, said the dog."
UNICODE = "Ünïcödé — naïve café, Straße, 東京, emoji 🙂!"

Item = tuple[str, str | None]


class Pair:
    """Our model and transformers' model (and tokenizer) loaded from the same directory."""

    def __init__(self, family: str, directory: Path) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.family = family
        self.ours: AttentionModel = load_pretrained(directory, device="cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.theirs = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()

    def encode(self, items: Sequence[Item], max_tokens: int | None = None) -> dict[str, torch.Tensor]:
        """What AutoTokenizer returns for each item, right-padded into one batch: every field it gives."""
        encodings = [
            self.tokenizer(text, pair, truncation=max_tokens is not None, max_length=max_tokens)
            for text, pair in items
        ]
        width = max(len(e["input_ids"]) for e in encodings)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return {
            key: torch.tensor(
                [list(e[key]) + [pad if key == "input_ids" else 0] * (width - len(e[key])) for e in encodings]
            )
            for key in encodings[0]
        }

    def reference(
        self, items: Sequence[Item], max_tokens: int | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """(the batch fed, attentions [L, B, H, T, T], last hidden [B, T, E]) from transformers."""
        batch = self.encode(items, max_tokens)
        with torch.no_grad():
            out = self.theirs(**batch, output_attentions=True)
        return batch, torch.stack(out.attentions), out.last_hidden_state

    def check(
        self, items: Sequence[Item], results: list[AttentionResult], max_tokens: int | None = None
    ) -> None:
        batch, attentions, hidden = self.reference(items, max_tokens)
        for row, r in enumerate(results):
            n = r.n
            layers, heads = self.ours.info.layers, self.ours.info.heads
            # The same ids, and the type ids the tokenizer gives (zeros when it gives none) for a model
            # that has a type embedding.
            assert r.token_ids == batch["input_ids"][row, :n].tolist()
            if self.ours.config.type_vocab_size:
                given = batch.get("token_type_ids", torch.zeros_like(batch["input_ids"]))
                assert r.type_ids == given[row, :n].tolist()
            else:
                assert r.type_ids == [0] * n
            assert r.attentions.shape == (layers, heads, n, n)
            assert r.attentions.dtype == torch.float32 and r.attentions.device.type == "cpu"
            assert r.attentions.is_contiguous()
            # Only the unpadded part: padded rows are no real token's attention. Two float32 forwards
            # that differ in summation order only: FORWARD.
            torch.testing.assert_close(r.attentions, attentions[:, row, :, :n, :n], atol=FORWARD, rtol=0)
            torch.testing.assert_close(r.hidden_state, hidden[row, :n], atol=FORWARD, rtol=0)
            # A float32 softmax row sums to 1 within row_sum(n).
            torch.testing.assert_close(
                r.attentions.sum(-1), torch.ones(layers, heads, n), atol=row_sum(n), rtol=0
            )
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
    pair.check([(SENTENCE, None)], [result])


def test_sentence_pair(pair: Pair) -> None:
    result = pair.ours.attend(SENTENCE, PAIR)
    assert result.segments[0] == 0 and result.segments[-1] == 1
    # The segments are contiguous: the first text, then the pair.
    assert result.segments == sorted(result.segments)
    pair.check([(SENTENCE, PAIR)], [result])


def test_unicode(pair: Pair) -> None:
    result = pair.ours.attend(UNICODE)
    for (start, end), special in zip(result.offsets, result.special, strict=True):
        # Byte-level BPE may split one character over two tokens, so a span can be empty.
        assert special or 0 <= start <= end <= len(UNICODE)
    pair.check([(UNICODE, None)], [result])


def test_padded_batch(pair: Pair) -> None:
    items: list[Item] = [("Hi.", None), (SENTENCE, PAIR), (UNICODE, None)]
    results = pair.ours.attend_batch(items)
    assert len({r.n for r in results}) == 3, "the batch must really be padded"
    pair.check(items, results)
    # The same texts one at a time: padding changes the summation order only (FORWARD).
    alone = pair.ours.attend(SENTENCE, PAIR)
    torch.testing.assert_close(alone.attentions, results[1].attentions, atol=FORWARD, rtol=0)


def test_near_max_length(pair: Pair) -> None:
    limit = pair.ours.info.max_tokens
    long_text = " ".join(["the cat sat on the mat and looked at the dog"] * (limit // 4))
    result = pair.ours.attend(long_text)
    assert result.truncated and result.n == limit
    pair.check([(long_text, None)], [result], max_tokens=limit)
    shorter = pair.ours.attend(long_text, max_tokens=limit - 3)
    assert shorter.truncated and shorter.n == limit - 3
    pair.check([(long_text, None)], [shorter], max_tokens=limit - 3)


def test_attention_only_skips_the_last_layer_but_not_its_attention(pair: Pair) -> None:
    # hidden_state=False (the service's call) drops the last layer's value path and feed-forward; every
    # attention, the last layer's included, must still equal transformers', single and padded alike.
    single_items: list[Item] = [(SENTENCE, PAIR)]
    batch_items: list[Item] = [("Hi.", None), (UNICODE, None)]
    single = pair.ours.attend_batch(single_items, hidden_state=False)
    batch = pair.ours.attend_batch(batch_items, hidden_state=False)
    assert all(r.hidden_state is None for r in single + batch)
    for items, results in ((single_items, single), (batch_items, batch)):
        _, attentions, _ = pair.reference(items)
        for row, r in enumerate(results):
            torch.testing.assert_close(
                r.attentions, attentions[:, row, :, : r.n, : r.n], atol=FORWARD, rtol=0
            )


# --------------------------------------------------------------------- token types: one or two of them


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Pair]:
    """(family, type_vocab_size) -> Pair, for each family with a type embedding, with 1 and 2 types."""
    root = tmp_path_factory.mktemp("typed")
    return {
        (family, types): Pair(
            family, build_checkpoint(family, root / f"{family}-{types}", seed=3, type_vocab_size=types)
        )
        for family in TYPE_VOCAB_SIZES
        for types in (1, 2)
    }


@pytest.mark.parametrize("types", [1, 2])
@pytest.mark.parametrize("family", sorted(TYPE_VOCAB_SIZES))
@pytest.mark.parametrize("text_pair", [None, PAIR], ids=["single", "pair"])
def test_token_types_are_what_the_tokenizer_gives(
    typed: dict[tuple[str, int], Pair], family: str, types: int, text_pair: str | None
) -> None:
    # RoBERTa's tokenizer gives no type ids, so transformers feeds zeros even to a model with two types;
    # BERT's gives 0 for the text and 1 for the pair. The display segments are 0/1 for both.
    pair = typed[family, types]
    assert pair.ours.config.type_vocab_size == types
    items: list[Item] = [(SENTENCE, text_pair)]
    given = pair.tokenizer(SENTENCE, text_pair).get("token_type_ids")
    if given is not None and max(given) >= types:
        # BERT's tokenizer marks the pair with type 1, which a one-type model has no row for.
        with pytest.raises(IndexError):
            pair.reference(items)
        with pytest.raises(PairNotSupportedError, match=r"token type 1 but the model has 1 token type") as e:
            pair.ours.attend(SENTENCE, text_pair)
        assert (e.value.type_id, e.value.type_vocab_size) == (1, 1)
        return
    result = pair.ours.attend(SENTENCE, text_pair)
    assert result.segments[-1] == (0 if text_pair is None else 1)
    pair.check(items, [result])
    assert result.type_ids == (list(given) if given is not None else [0] * result.n)


# Characters all-MiniLM-L6-v2's WordPiece vocabulary lacks: each word holding one becomes [UNK].
UNKNOWN_WORDS = ("The snowman ☃ waved at me 😀 today.", "鿿 is a rare character.")


def test_special_is_clarks_cls_plus_sep_with_unknown_words() -> None:
    """head_stats' `special` on MiniLM is what Clark et al. 2019 ("What Does BERT Look At?") measure: each
    token's attention to [CLS] plus [SEP], averaged, from transformers' own attentions and tokenizer. [UNK]
    stands for a word, so it is no special token (before, it counted, and the two differed by ~1e-1)."""
    reference = Pair("minilm", default_model_path())
    tokenizer = reference.tokenizer
    batch, attentions, _ = reference.reference([UNKNOWN_WORDS])
    theirs = attentions[:, 0].double()  # [L, H, n, n], one text: nothing padded
    ids = batch["input_ids"][0].tolist()
    result = reference.ours.attend(*UNKNOWN_WORDS)
    assert result.token_ids == ids and ids.count(tokenizer.unk_token_id) == 3  # ☃, 😀, 鿿: the premise
    sinks = [j for j, i in enumerate(ids) if i in (tokenizer.cls_token_id, tokenizer.sep_token_id)]
    assert len(sinks) == 3  # [CLS] text [SEP] pair [SEP]
    clark = theirs[..., sinks].sum(-1).mean(-1)  # [L, H]

    ours = head_stats(result.attentions, result.tokens, special=result.special)["special"].double()
    assert result.unknown == [i == tokenizer.unk_token_id for i in ids]
    # Each weight within FORWARD of transformers' (3 summed), and our float32 sum of 3 weights and mean of
    # n rows (<= 1 each) round by at most float32_sum(3) + n·u.
    bound = 3 * FORWARD + float32_sum(3) + float32_sum(result.n)
    assert (ours - clark).abs().max().item() <= bound
    # The premise that [UNK] matters here: counted as special, it moves the statistic far past the bound.
    unknowns = [j for j, i in enumerate(ids) if i == tokenizer.unk_token_id]
    assert theirs[..., unknowns].sum(-1).mean(-1).max().item() > 100 * bound
