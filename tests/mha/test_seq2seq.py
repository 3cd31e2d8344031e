"""Encoder-decoder models (mha.networks.seq2seq, mha.networks.translate): our layers with converted weights
give exactly transformers' three kinds of attention, and greedy generation writes the same tokens as its
generate().

Tiny random checkpoints of each family (tests/seq2seq_checkpoints.py), against transformers' eager
attention with output_attentions=True, fed what its tokenizer returns for tokenizer(source,
text_target=target), the labels shifted right behind the decoder start token, as transformers does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import build_checkpoint
from safetensors.torch import load_file, save_file
from seq2seq_checkpoints import (
    S_DEC_LAYERS,
    S_ENC_LAYERS,
    S_HEADS,
    S_MAX_POSITIONS,
    SEQ2SEQ_FAMILIES,
    build_seq2seq_checkpoint,
)
from tolerances import FORWARD, row_sum

import mha
from mha import AttentionModel, load_pretrained
from mha.core.relative import relative_position_bucket
from mha.errors import CheckpointMismatchError, EmptyInputError, TargetNotSupportedError
from mha.networks.result import Seq2SeqResult

SOURCE = "The house is wonderful."
TARGET = "Das Haus ist wunderbar."
UNICODE = "Ünïcödé: naïve café, Straße 12345!"


class Pair:
    """Our model and transformers' (with its tokenizer), loaded from the same directory."""

    def __init__(self, family: str, directory: Path) -> None:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.family = family
        self.directory = directory
        self.ours: AttentionModel = load_pretrained(directory, device="cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.theirs: Any = AutoModelForSeq2SeqLM.from_pretrained(
            str(directory), attn_implementation="eager"
        ).eval()

    def check(self, result: Seq2SeqResult, source: str, target: str) -> None:
        """Ids as the tokenizer gives them; all three kinds of attention and both hidden states as
        transformers computes them from those ids."""
        limit = self.ours.info.decoder_max_tokens
        assert limit is not None
        batch = self.tokenizer(source, text_target=target, truncation=True, max_length=limit - 1)
        start = self.theirs.config.decoder_start_token_id
        assert result.token_ids == batch["input_ids"]
        assert result.target_ids == [start, *batch["labels"]]
        with torch.no_grad():
            out = self.theirs(
                input_ids=torch.tensor([result.token_ids]),
                decoder_input_ids=torch.tensor([result.target_ids]),
                output_attentions=True,
                output_hidden_states=True,
            )
        info, n, m = self.ours.info, result.n, result.m
        expected = {
            "encoder": (result.encoder_attentions, out.encoder_attentions, (info.layers, info.heads, n, n)),
            "decoder": (
                result.decoder_attentions,
                out.decoder_attentions,
                (info.decoder_layers, info.decoder_heads, m, m),
            ),
            "cross": (
                result.cross_attentions,
                out.cross_attentions,
                (info.decoder_layers, info.decoder_heads, m, n),
            ),
        }
        for kind, (ours, theirs, shape) in expected.items():
            assert ours.shape == shape, kind
            assert ours.dtype == torch.float32 and ours.is_contiguous(), kind
            # Two float32 forwards that differ in summation order only: FORWARD (tests/tolerances.py).
            torch.testing.assert_close(ours, torch.stack(theirs)[:, 0], atol=FORWARD, rtol=0, msg=kind)
            # A float32 softmax row sums to 1 within row_sum(keys).
            sums = ours.sum(-1)
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=row_sum(shape[-1]), rtol=0)
        assert not result.decoder_attentions.triu(diagonal=1).any(), "the decoder saw a later token"
        assert result.attentions is result.encoder_attentions
        torch.testing.assert_close(
            result.hidden_state, out.encoder_last_hidden_state[0], atol=FORWARD, rtol=0
        )
        decoder_hidden = out.decoder_hidden_states[-1][0]
        torch.testing.assert_close(result.decoder_hidden_state, decoder_hidden, atol=FORWARD, rtol=0)

    def generate(self, source: str, max_new_tokens: int) -> list[int]:
        """transformers' greedy generate: the decoder start token, then what the model wrote."""
        inputs = self.tokenizer(source, return_tensors="pt")
        with torch.no_grad():
            # use_cache=False: transformers 5 sizes T5's cache by the encoder's layer count, which fails
            # for a decoder deeper than its encoder (ours); greedy without a cache writes the same ids.
            ids = self.theirs.generate(
                **inputs, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, use_cache=False
            )
        return [int(i) for i in ids[0]]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    root = tmp_path_factory.mktemp("seq2seq")
    return {f: Pair(f, build_seq2seq_checkpoint(f, root / f)) for f in SEQ2SEQ_FAMILIES}


@pytest.fixture(params=SEQ2SEQ_FAMILIES)
def pair(request: pytest.FixtureRequest, pairs: dict[str, Pair]) -> Pair:
    return pairs[request.param]


def test_info_names_the_architecture_and_the_decoder(pair: Pair) -> None:
    info = pair.ours.info
    assert info.architecture == "encoder-decoder" and info.seq2seq and not info.causal
    assert (info.layers, info.decoder_layers) == (S_ENC_LAYERS, S_DEC_LAYERS)
    assert info.heads == info.decoder_heads == S_HEADS


@pytest.mark.parametrize(("source", "target"), [(SOURCE, TARGET), (UNICODE, SOURCE), ("Hi.", UNICODE)])
def test_forced_decoding_matches_transformers(pair: Pair, source: str, target: str) -> None:
    result = pair.ours.attend(source, target=target)
    assert isinstance(result, Seq2SeqResult)
    assert result.generated == 0 and not result.truncated and not result.target_truncated
    assert result.target == target
    pair.check(result, source, target)
    # The decoder start token opens the target, a template token: no span, no word.
    assert result.target_offsets[0] == (0, 0) and result.target_word_ids[0] is None
    for start, end in result.target_offsets:
        assert 0 <= start <= end <= len(target)


def test_long_target_is_truncated_and_flagged(pair: Pair) -> None:
    limit = pair.ours.info.decoder_max_tokens
    assert limit is not None
    target = " ".join([TARGET] * limit)
    result = pair.ours.attend(SOURCE, target=target)
    assert result.target_truncated and not result.truncated
    assert result.m == limit  # the start token and limit - 1 of the target's
    pair.check(result, SOURCE, target)


def test_long_source_is_truncated_like_an_encoders(pair: Pair) -> None:
    result = pair.ours.attend(" ".join([SOURCE] * 64), target=TARGET, max_tokens=12)
    assert result.truncated and not result.target_truncated and result.n == 12


@pytest.mark.parametrize("max_new_tokens", [1, 6, 12])
def test_greedy_generation_writes_what_generate_writes(pair: Pair, max_new_tokens: int) -> None:
    result = pair.ours.attend(SOURCE, max_new_tokens=max_new_tokens)
    expected = pair.generate(SOURCE, max_new_tokens)
    assert result.target_ids == expected
    assert result.generated == len(expected) - 1 and result.target == ""
    # The attention over what it wrote is forced decoding of those ids (through autograd's path, another
    # summation order: FORWARD).
    forced = pair.ours.network(torch.tensor([result.token_ids]), torch.tensor([result.target_ids]))
    assert forced.cross_attentions is not None
    torch.testing.assert_close(result.cross_attentions, forced.cross_attentions[:, 0], atol=FORWARD, rtol=0)


def test_target_none_generates_by_default(pair: Pair) -> None:
    from mha.networks.translate import DEFAULT_NEW_TOKENS

    result = pair.ours.attend(SOURCE)
    assert result.target_ids == pair.generate(SOURCE, DEFAULT_NEW_TOKENS)
    batch = pair.ours.attend_batch([SOURCE])
    assert isinstance(batch[0], Seq2SeqResult) and batch[0].target_ids == result.target_ids


@pytest.mark.parametrize("blank", ["", "   \n"])
def test_blank_target_is_refused(pair: Pair, blank: str) -> None:
    with pytest.raises(EmptyInputError, match="target is empty") as error:
        pair.ours.attend(SOURCE, target=blank)
    assert error.value.field == "target"


def test_missing_keys_are_reported_together(pair: Pair, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(pair.directory, broken)
    weights = load_file(broken / "model.safetensors")
    gone = sorted(k for k in weights if "layer_norm" in k or "EncDecAttention.k" in k)[:3]
    save_file({k: v for k, v in weights.items() if k not in gone}, broken / "model.safetensors")
    with pytest.raises(CheckpointMismatchError) as error:
        load_pretrained(broken, device="cpu")
    message = str(error.value)
    assert f"missing keys ({len(gone)})" in message
    assert all(key.removeprefix("model.") in message for key in gone)  # BART's base-model prefix dropped


@pytest.mark.parametrize(("family", "architecture"), [("bert", "encoder"), ("gpt2", "decoder")])
def test_target_on_a_model_without_a_decoder_reading_it(
    tmp_path: Path, family: str, architecture: str
) -> None:
    model = load_pretrained(build_checkpoint(family, tmp_path / family), device="cpu")
    assert model.info.architecture == architecture and model.info.decoder_layers is None
    with pytest.raises(TargetNotSupportedError, match=f"its architecture is '{architecture}'"):
        model.attend(SOURCE, target=TARGET)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (16, 20), (8, 9)])
def test_relative_buckets_are_t5s(bidirectional: bool, buckets: int, distance: int) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    positions = torch.arange(-600, 601).view(1, -1)
    theirs = T5Attention._relative_position_bucket(
        positions, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
    )
    ours = relative_position_bucket(
        positions, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
    )
    assert torch.equal(ours, theirs)


def test_slow_tokenizer_pieces_find_their_spans() -> None:
    from mha.text.slow_tokenize import align_pieces

    text = "Das  Haus ist wunderbar."
    spans, words = align_pieces(text, ["▁Das", "▁Ha", "us", "▁ist", "▁w", "<unk>", "bar", "."])
    assert [text[a:b] for a, b in spans] == ["Das", "Ha", "us", "ist", "w", "under", "bar", "."]
    assert words == [0, 1, 1, 2, 3, 3, 3, 3]
    # A piece the text does not spell (normalised: the ligature) gets what lies before the next piece.
    spans, _ = align_pieces("ﬁne day", ["▁fi", "ne", "▁day"])
    assert spans == [(0, 1), (1, 3), (4, 7)]
    spans, _ = align_pieces("a ?", ["▁a", "▁<unk>"])  # nothing after it: an empty span
    assert spans == [(0, 1), (1, 1)]


def test_marian_source_offsets_spell_its_pieces(pairs: dict[str, Pair]) -> None:
    result = pairs["marian"].ours.attend(SOURCE, target=TARGET)
    for token, (start, end), special in zip(result.tokens, result.offsets, result.special, strict=True):
        assert special or SOURCE[start:end] == token.replace("▁", ""), token
    for token, (start, end), special in zip(
        result.target_tokens, result.target_offsets, result.target_special, strict=True
    ):
        assert special or TARGET[start:end] == token.replace("▁", ""), token


def test_a_logit_bias_is_added_before_the_mask_on_every_path() -> None:
    # float64: the paths differ in summation order only, by a few ulps of 1e-16; 1e-10 is that with room.
    from mha import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, bias=False, scale=1.0).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    bias = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool().view(2, 1, 1, 5)
    with torch.no_grad():
        out, weights = attn(x, keep=keep, bias=bias)
        fused, none = attn(x, keep=keep, bias=bias, need_weights=False)  # torch's kernel, a float mask
        q, k, _ = attn.heads(x, x, x, True, None)
    assert weights is not None and none is None
    scores = (q @ k.transpose(-1, -2) + bias).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-10, rtol=0)
    torch.testing.assert_close(fused, out, atol=1e-10, rtol=0)
    # One sequence takes the copy-free path without a bias; with one it must not.
    alone = attn(x[:1], bias=bias)[1]
    assert alone is not None
    torch.testing.assert_close(
        alone, (q[:1] @ k[:1].transpose(-1, -2) + bias).softmax(-1), atol=1e-10, rtol=0
    )


def test_generation_stops_at_the_decoders_limit_and_can_be_cancelled(pairs: dict[str, Pair]) -> None:
    from mha.errors import Cancelled

    model = pairs["t5"].ours  # its random weights write one token over and over, never </s>
    limit = model.info.decoder_max_tokens
    result = model.attend(SOURCE, max_new_tokens=10 * S_MAX_POSITIONS, hidden_state=False)
    assert result.m == limit and result.generated == limit - 1
    assert result.hidden_state is None and result.decoder_hidden_state is None
    calls = iter(range(100))
    with pytest.raises(Cancelled):
        model.attend(SOURCE, max_new_tokens=20, cancel=lambda: next(calls) > 12)


def test_mt5_is_t5_under_its_own_model_type(tmp_path: Path) -> None:
    pair = Pair("mt5", build_seq2seq_checkpoint("mt5", tmp_path / "mt5"))
    assert pair.ours.info.family == "mt5" and pair.ours.config.decoder.mlp == "gated"
    pair.check(pair.ours.attend(SOURCE, target=TARGET), SOURCE, TARGET)
    assert pair.ours.attend(SOURCE, max_new_tokens=6).target_ids == pair.generate(SOURCE, 6)


def test_a_padded_batch_matches_transformers(pair: Pair) -> None:
    # The network alone, as a batch: padded sources (masked keys in the encoder and in cross-attention)
    # and padded targets (masked in the decoder's own attention), against transformers fed the same masks.
    sources, targets = ["Hi.", UNICODE], [UNICODE, "Das Haus."]
    start = pair.theirs.config.decoder_start_token_id
    encoded = [pair.tokenizer(s, text_target=t) for s, t in zip(sources, targets, strict=True)]
    source_ids = [e["input_ids"] for e in encoded]
    target_ids = [[start, *e["labels"]] for e in encoded]

    def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pair.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return ids, mask

    (ids, mask), (dec_ids, dec_mask) = padded(source_ids), padded(target_ids)
    assert not mask.all() and not dec_mask.all(), "both sides must really be padded"
    with torch.no_grad():
        ours = pair.ours.network(ids, dec_ids, attention_mask=mask, decoder_attention_mask=dec_mask)
        theirs = pair.theirs(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=dec_ids,
            decoder_attention_mask=dec_mask,
            output_attentions=True,
        )
    for row, (n, m) in enumerate(zip(map(len, source_ids), map(len, target_ids), strict=True)):
        kinds = (
            (ours.encoder_attentions, theirs.encoder_attentions, n, n),
            (ours.decoder_attentions, theirs.decoder_attentions, m, m),
            (ours.cross_attentions, theirs.cross_attentions, m, n),
        )
        for mine, reference, rows, cols in kinds:
            assert mine is not None
            # Only real tokens' rows and keys; padding changes the summation order only: FORWARD.
            expected = torch.stack(reference)[:, row, :, :rows, :cols]
            torch.testing.assert_close(mine[:, row, :, :rows, :cols], expected, atol=FORWARD, rtol=0)
            assert not mine[:, row, :, :rows, cols:].any(), "a real token attended to padding"


def test_generation_config_bans_and_forces_as_generate_does(pairs: dict[str, Pair], tmp_path: Path) -> None:
    # opus-mt's generation_config.json bans its pad token (bad_words_ids); here the token the model
    # writes first is banned, and the last slot forced to another, and both models must agree.
    import json
    import shutil

    source = pairs["marian"]
    first = source.ours.attend(SOURCE, max_new_tokens=4).target_ids[1]
    directory = tmp_path / "marian"
    shutil.copytree(source.directory, directory)
    settings_path = directory / "generation_config.json"
    settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}
    forced = next(i for i in range(4, 20) if i != first)
    settings.update(bad_words_ids=[[first]], forced_eos_token_id=forced)
    settings_path.write_text(json.dumps(settings))
    pair = Pair("marian", directory)
    assert pair.ours.config.banned_token_ids == (first,)
    written = pair.ours.attend(SOURCE, max_new_tokens=4).target_ids
    assert first not in written[1:] and written[-1] == forced
    assert written == pair.generate(SOURCE, 4)


def test_a_checkpoint_says_its_architecture_from_its_config_alone(
    seq2seq_checkpoints: dict[str, Path], tiny_checkpoints: dict[str, Path]
) -> None:
    for family in ("t5", "bart", "marian"):
        assert mha.checkpoint_architecture(seq2seq_checkpoints[family]) == "encoder-decoder"
    assert mha.checkpoint_architecture(tiny_checkpoints["bert"]) == "encoder"
    assert mha.checkpoint_architecture(tiny_checkpoints["llama"]) == "decoder"
    assert mha.checkpoint_architecture("someone/not-on-disk") is None  # a hub id: known once fetched
