"""AttentionModel.probe_heads on every family's tiny checkpoint, a GGUF file and the encoder-decoders:
its input, its scores against detection_scores of the model's own maps, its chance from the model's own
masks, chunks, cancel, progress and bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import FAMILIES, SLIDING_WINDOW
from edited import edited, overflowing
from gguf_files import write_gguf
from tolerances import FORWARD

from mha import AttentionModel, HeadProbe, load_pretrained
from mha.analysis import DETECTION_MARGIN, DETECTION_THRESHOLD, KINDS, chance_scores, detection_scores
from mha.errors import Cancelled, NonFiniteOutputError, ProbeSizeError
from mha.model import probe
from mha.text.tokenize import control_ids

LENGTH = 12  # tokens drawn per sequence: 2 * 12 + 1 = 25 fits every tiny model (64 positions at least)


def check_input(model: AttentionModel, result: HeadProbe, *, sequences: int, start: int | None) -> None:
    """[start] + drawn + drawn, the drawn ids ordinary tokens of the vocabulary."""
    ids = result.token_ids
    offset = 0 if start is None else 1
    assert ids.dtype == torch.int64 and ids.shape == (sequences, 2 * LENGTH + offset)
    if start is not None:
        assert (ids[:, 0] == start).all()
    drawn = ids[:, offset:]
    assert torch.equal(drawn[:, :LENGTH], drawn[:, LENGTH:])
    assert not set(drawn.flatten().tolist()) & (control_ids(model.tokenizer) | {model.tokenizer.unk_token_id})
    assert result.tokens == model.tokenizer.convert_ids_to_tokens(ids[0].tolist())


def reference_scores(model: AttentionModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """detection_scores of the model's own forward with all its maps, averaged over the sequences."""
    with torch.no_grad():
        maps = model.network(ids, need_hidden=False).attentions  # [L, B, H, n, n]
    scores = detection_scores(maps.transpose(0, 1).float(), ids)
    return {kind: value.mean(0) for kind, value in scores.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_probes_its_own_maps(models: dict[str, AttentionModel], family: str) -> None:
    model = models[family]
    result = model.probe_heads(seed=1, sequences=3, length=LENGTH)
    check_input(model, result, sequences=3, start=probe.start_token(model.tokenizer))
    assert result.kind == "self"
    layers, heads = model.config.num_layers, model.config.num_heads
    want = reference_scores(model, result.token_ids)
    for kind in KINDS:
        assert (
            result.scores[kind].shape
            == result.chance[kind].shape
            == result.spread[kind].shape
            == (layers, heads)
        )
        # One forward of the same batch, weights taken a layer at a time or all at once: the same ops.
        torch.testing.assert_close(result.scores[kind], want[kind], atol=FORWARD, rtol=0)
        assert ((result.chance[kind] >= 0) & (result.chance[kind] <= 1)).all()
    for layer in range(layers):
        for head in range(heads):
            clears = [
                kind
                for kind in KINDS
                if result.scores[kind][layer, head] >= DETECTION_THRESHOLD
                and result.scores[kind][layer, head] - result.chance[kind][layer, head] >= DETECTION_MARGIN
            ]
            assert result.labels[layer][head] == clears
    assert (result.threshold, result.margin) == (DETECTION_THRESHOLD, DETECTION_MARGIN)


def test_chance_follows_each_layers_mask(models: dict[str, AttentionModel]) -> None:
    """Qwen2's first layer has a sliding window of SLIDING_WINDOW keys, its others the full causal
    triangle (max_window_layers 1); each layer's chance is that mask's uniform attention's."""
    model = models["qwen2"]
    result = model.probe_heads(sequences=2, length=LENGTH)
    n = result.token_ids.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    masks = {"window": (j <= i) & (j > i - SLIDING_WINDOW), "causal": j <= i}
    windowed = set(model.config.window_layers)
    assert windowed and windowed != set(range(model.config.num_layers))
    for layer in range(model.config.num_layers):
        visible = masks["window" if layer in windowed else "causal"]
        each = [chance_scores(visible, row) for row in result.token_ids]
        for kind in KINDS:
            want = torch.stack([c[kind] for c in each]).mean()
            torch.testing.assert_close(result.chance[kind][layer], want.expand(model.config.num_heads))
    # The induction key lies LENGTH - 1 back, outside the window: uniform attention there scores 0.
    assert float(result.chance["induction"][min(windowed)].max()) == 0.0


def test_the_same_seed_draws_the_same_probe_across_loads(tiny_checkpoints: dict[str, Path]) -> None:
    first = load_pretrained(tiny_checkpoints["llama"], device="cpu").probe_heads(
        seed=7, sequences=2, length=LENGTH
    )
    again = load_pretrained(tiny_checkpoints["llama"], device="cpu").probe_heads(
        seed=7, sequences=2, length=LENGTH
    )
    assert torch.equal(first.token_ids, again.token_ids) and first.tokens == again.tokens
    for kind in KINDS:
        assert torch.equal(first.scores[kind], again.scores[kind])  # the same ops on the same machine
    other = load_pretrained(tiny_checkpoints["llama"], device="cpu").probe_heads(
        seed=8, sequences=2, length=LENGTH
    )
    assert not torch.equal(first.token_ids, other.token_ids)


def test_chunks_report_progress_and_score_as_one_forward(
    models: dict[str, AttentionModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maps bounded to one sequence's layer: 3 chunks, progress after each, the same scores."""
    model = models["gpt2"]
    whole = model.probe_heads(sequences=3, length=LENGTH)
    n = whole.token_ids.shape[1]
    monkeypatch.setattr(probe, "PROBE_MAPS_BYTES", model.config.num_heads * n * n * 4)
    calls: list[tuple[int, int]] = []
    chunked = model.probe_heads(
        sequences=3, length=LENGTH, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(1, 3), (2, 3), (3, 3)]
    for kind in KINDS:
        # A batch of 1 against a batch of 3: another GEMM shape, so float32 forward rounding (FORWARD).
        torch.testing.assert_close(chunked.scores[kind], whole.scores[kind], atol=FORWARD, rtol=0)
        torch.testing.assert_close(chunked.spread[kind], whole.spread[kind], atol=2 * FORWARD, rtol=0)


def test_cancel_stops_the_probe(models: dict[str, AttentionModel]) -> None:
    asked: list[int] = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 2  # after the chunk's check and the first layer's

    with pytest.raises(Cancelled):
        models["llama"].probe_heads(sequences=2, length=LENGTH, cancel=cancel)


@pytest.mark.parametrize(("sequences", "length"), [(0, 5), (33, 5), (2, 0), (2, 64)])
def test_a_probe_out_of_bounds_is_refused(
    models: dict[str, AttentionModel], sequences: int, length: int
) -> None:
    model = models["llama"]
    assert probe.max_length(model) == (model.info.max_tokens - 1) // 2 < 64
    with pytest.raises(ProbeSizeError, match="a head probe takes 1 to 32 sequences") as raised:
        model.probe_heads(sequences=sequences, length=length)
    assert raised.value.most_length == probe.max_length(model) and raised.value.limit == model.info.max_tokens


def test_one_sequence_has_no_spread(models: dict[str, AttentionModel]) -> None:
    result = models["bert"].probe_heads(sequences=1, length=LENGTH)
    assert all(result.spread[kind].isnan().all() for kind in KINDS)
    assert all(result.scores[kind].isfinite().all() for kind in KINDS)


def test_a_gguf_model_probes_as_its_checkpoint(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """The tiny Llama as an F32 GGUF file: its tokenizer from the file, the same draw and scores."""
    file = write_gguf(tiny_checkpoints["llama"], tmp_path / "tiny-llama.gguf", qtype="F32")
    model = load_pretrained(file, device="cpu")
    result = model.probe_heads(seed=3, sequences=2, length=LENGTH)
    check_input(model, result, sequences=2, start=probe.start_token(model.tokenizer))
    want = reference_scores(model, result.token_ids)
    for kind in KINDS:
        torch.testing.assert_close(result.scores[kind], want[kind], atol=FORWARD, rtol=0)


@pytest.mark.parametrize("family", ["t5", "bart", "marian"])
def test_an_encoder_decoder_probes_its_decoder(seq2seq_checkpoints: dict[str, Path], family: str) -> None:
    """The repeated sequence as the target after the decoder start token, the empty source: the decoder's
    self-attention, scored as attend(target=...) gives it."""
    model = load_pretrained(seq2seq_checkpoints[family], device="cpu")
    result = model.probe_heads(sequences=2, length=LENGTH)
    start = model.network.config.decoder_start_token_id
    check_input(model, result, sequences=2, start=start)
    assert result.kind == "decoder"
    decoder = model.network.decoder.config
    source = probe._empty_source(model)
    with torch.no_grad():
        memory, _ = model.network.encode(source, need_weights=False)
        _, own, _ = model.network.decoder.decode(result.token_ids, memory.expand(2, -1, -1))
    want = detection_scores(own.transpose(0, 1), result.token_ids)
    for kind in KINDS:
        assert result.scores[kind].shape == (decoder.num_layers, decoder.num_heads)
        torch.testing.assert_close(result.scores[kind], want[kind].mean(0), atol=FORWARD, rtol=0)


def test_the_vocabulary_leaves_out_control_added_and_byte_tokens(models: dict[str, AttentionModel]) -> None:
    model = models["llama"]
    tokenizer = model.tokenizer
    vocabulary = probe.probe_vocabulary(tokenizer, model.config.vocab_size)
    kept = set(vocabulary.tolist())
    assert kept and vocabulary.tolist() == sorted(kept)
    assert not kept & (control_ids(tokenizer) | set(tokenizer.get_added_vocab().values()))
    spelled = tokenizer.convert_ids_to_tokens(sorted(kept))
    assert not any(probe.RESERVED.fullmatch(token) for token in spelled)
    assert max(kept) < min(len(tokenizer), model.config.vocab_size)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_planted_uniform_head_scores_its_chance(tiny_checkpoints: dict[str, Path], family: str) -> None:
    """Every query of every layer zeroed: each head spreads its weight evenly over the keys its mask
    leaves (causal; Qwen2's first layer windowed), so its score is the probe's chance, layer by layer."""
    model = load_pretrained(tiny_checkpoints[family], device="cpu")
    with torch.no_grad():
        for layer in model.network.layers:
            attn = layer.attn
            q = attn.in_proj if attn.fused else attn.q_proj  # fused: q's rows come first
            q.weight[: attn.widths[0]] = 0.0
            if q.bias is not None:
                q.bias[: attn.widths[0]] = 0.0
    result = model.probe_heads(sequences=2, length=LENGTH)
    for kind in KINDS:
        # softmax of equal logits is 1/k exactly up to one division's rounding; sums as detection's.
        torch.testing.assert_close(result.scores[kind], result.chance[kind], atol=1e-6, rtol=0)


def test_without_a_start_token_the_sequences_are_twice_the_length() -> None:
    """No BOS and no CLS: 2 * length ids, the halves equal, drawn only from the vocabulary given."""
    vocabulary = torch.tensor([3, 5, 8, 13])
    ids = probe.probe_ids(vocabulary, None, seed=4, sequences=5, length=6)
    assert ids.shape == (5, 12) and torch.equal(ids[:, :6], ids[:, 6:])
    assert set(ids.flatten().tolist()) <= set(vocabulary.tolist())
    assert torch.equal(ids, probe.probe_ids(vocabulary, None, seed=4, sequences=5, length=6))
    assert probe.start_token(type("NoStart", (), {"bos_token_id": None, "cls_token_id": None})()) is None


def test_attend_ids_opens_a_probe_sequence_as_attend_opens_a_text(minilm: AttentionModel) -> None:
    """attend_ids gives the ids' own forward: on a text's ids the same maps as attend (the same forward,
    one sequence), and on the probe's first sequence the maps its scores came from."""
    text = minilm.attend("The cat sat on the mat.")
    again = minilm.attend_ids(text.token_ids)
    assert again.tokens == text.tokens and again.special == text.special
    torch.testing.assert_close(again.attentions, text.attentions, atol=FORWARD, rtol=0)
    result = minilm.probe_heads(sequences=1, length=LENGTH)
    opened = minilm.attend_ids(result.token_ids[0])
    assert opened.tokens == result.tokens
    scores = detection_scores(opened.attentions, result.token_ids[0])
    for kind in KINDS:
        torch.testing.assert_close(scores[kind], result.scores[kind], atol=FORWARD, rtol=0)
    with pytest.raises(ValueError, match="past"):
        minilm.attend_ids([0, minilm.config.vocab_size])


def test_a_forward_that_overflows_is_refused_not_scored(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """Its maps are NaN: as attend's, the probe refuses them with the model's name, never a score of NaN
    (which would read as "no pattern key"), and so does its input opened by attend_probe or attend_ids."""
    model = load_pretrained(overflowing(tiny_checkpoints["llama"], tmp_path / "overflowing"))
    with pytest.raises(NonFiniteOutputError, match="computed NaN or an infinity"):
        model.probe_heads(sequences=2, length=4)
    # Nor is its input opened with NaN maps: refused as attend refuses them, by ids as by text.
    with pytest.raises(NonFiniteOutputError, match="computed NaN or an infinity"):
        model.attend_probe(length=4)
    with pytest.raises(NonFiniteOutputError, match="computed NaN or an infinity"):
        model.attend_ids(probe._draw(model, seed=0, sequences=1, length=4)[0])


def test_an_encoder_decoder_whose_input_overflows_is_refused(
    seq2seq_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """T5's query and key weights x 1e30: its probe input's maps are NaN, refused as attend refuses them."""

    def scale(tensors: dict[str, torch.Tensor]) -> None:
        for name in tensors:
            if name.endswith((".q.weight", ".k.weight")):
                tensors[name] = tensors[name] * 1e30

    model = load_pretrained(edited(seq2seq_checkpoints["t5"], tmp_path / "t5", weights=scale), device="cpu")
    with pytest.raises(NonFiniteOutputError, match="computed NaN or an infinity"):
        model.attend_probe(length=4)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_attend_probe_opens_the_first_sequence_of_every_probe(
    models: dict[str, AttentionModel], family: str
) -> None:
    """attend_probe(seed, length) is row 0 of the probe's draw whatever its number of sequences (one
    seeded generator, row by row), and its maps are the ones that row was scored on."""
    model = models[family]
    opened = model.attend_probe(seed=5, length=LENGTH)
    for sequences in (1, 8, probe.MAX_SEQUENCES):
        drawn = probe._draw(model, seed=5, sequences=sequences, length=LENGTH)
        assert opened.token_ids == drawn[0].tolist()
    one = model.probe_heads(seed=5, sequences=1, length=LENGTH)
    assert opened.tokens == one.tokens and len(opened.tokens) == 2 * LENGTH + 1
    scores = detection_scores(opened.attentions, torch.tensor(opened.token_ids))
    for kind in KINDS:
        # The same ids through the same forward, alone or as the probe's batch of one.
        torch.testing.assert_close(scores[kind], one.scores[kind], atol=FORWARD, rtol=0)
    with pytest.raises(ProbeSizeError):
        model.attend_probe(seed=5, length=probe.max_length(model) + 1)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_attend_probe_of_an_encoder_decoder_reads_the_sequence_as_its_target(
    seq2seq_checkpoints: dict[str, Path], family: str
) -> None:
    """The empty source, the probe's row 0 as the decoder's input (its start token first): the three
    attentions of that forced decoding, the decoder's the maps the probe scored."""
    model = load_pretrained(seq2seq_checkpoints[family], device="cpu")
    opened = model.attend_probe(seed=2, length=LENGTH)
    ids = probe._draw(model, seed=2, sequences=4, length=LENGTH)[0]
    assert opened.target_ids == ids.tolist()
    assert opened.token_ids == probe._empty_source(model)[0].tolist()
    with torch.no_grad():
        memory, _ = model.network.encode(probe._empty_source(model), need_weights=False)
        _, own, cross = model.network.decoder.decode(ids[None], memory)
    # The same decoder forward over the same ids and memory.
    torch.testing.assert_close(opened.decoder_attentions, own[:, 0], atol=FORWARD, rtol=0)
    torch.testing.assert_close(opened.cross_attentions, cross[:, 0], atol=FORWARD, rtol=0)
    scores = detection_scores(opened.decoder_attentions, ids)
    one = model.probe_heads(seed=2, sequences=1, length=LENGTH)
    for kind in KINDS:
        torch.testing.assert_close(scores[kind], one.scores[kind], atol=FORWARD, rtol=0)


@pytest.mark.parametrize("family", ["llama", "t5", "bart"])
def test_attend_probe_equals_transformers_on_the_probes_ids(
    tiny_checkpoints: dict[str, Path], seq2seq_checkpoints: dict[str, Path], family: str
) -> None:
    """The reference: transformers' eager attention (output_attentions) over the probe's row 0 of an
    8-sequence draw; an encoder-decoder's with that row as decoder_input_ids (its start token first) and
    the empty source as input_ids, all three attentions."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    seq2seq = family != "llama"
    path = (seq2seq_checkpoints if seq2seq else tiny_checkpoints)[family]
    model = load_pretrained(path, device="cpu")
    opened = model.attend_probe(seed=4, length=LENGTH)
    ids = probe._draw(model, seed=4, sequences=8, length=LENGTH)[0]
    loader: Any = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    theirs = loader.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        if seq2seq:
            assert opened.target_ids == ids.tolist()
            source = torch.tensor([opened.token_ids])
            out = theirs(input_ids=source, decoder_input_ids=ids[None], output_attentions=True)
            pairs = [
                (opened.encoder_attentions, out.encoder_attentions),
                (opened.decoder_attentions, out.decoder_attentions),
                (opened.cross_attentions, out.cross_attentions),
            ]
        else:
            assert opened.token_ids == ids.tolist()
            pairs = [(opened.attentions, theirs(input_ids=ids[None], output_attentions=True).attentions)]
    for mine, reference in pairs:
        # The same ids through two implementations of one forward: FORWARD (tests/tolerances.py).
        torch.testing.assert_close(mine, torch.stack(reference)[:, 0].float(), atol=FORWARD, rtol=0)
