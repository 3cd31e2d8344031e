"""load_pretrained / random_model: errors, devices, truncation, batches, checkpoint formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tolerances import FORWARD, row_sum

from mha import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    EmptyInputError,
    TransformerConfig,
    UnsupportedCheckpointError,
    analysis,
    load_pretrained,
    random_model,
)
from mha.devices import resolve_device


@pytest.fixture(scope="module")
def bert(tiny_checkpoints: dict[str, Path]):
    return load_pretrained(tiny_checkpoints["bert"], device="cpu", name="tiny-bert")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_random_model_is_seeded_and_causal_when_asked() -> None:
    a = random_model(layers=2, heads=4, embed_dim=32, seed=1)
    b = random_model(layers=2, heads=4, embed_dim=32, seed=1)
    c = random_model(layers=2, heads=4, embed_dim=32, seed=2)
    ra, rb, rc = (m.attend("The cat sat on the mat.") for m in (a, b, c))
    assert ra.attentions.shape == (2, 4, ra.n, ra.n) and ra.tokens[0] == "[CLS]"
    torch.testing.assert_close(ra.attentions, rb.attentions, atol=0, rtol=0)
    assert (ra.attentions - rc.attentions).abs().max() > FORWARD  # another model, not rounding
    assert a.info.family == "random" and not a.info.pretrained and not a.info.causal
    decoder = random_model(layers=1, heads=2, embed_dim=16, causal=True)
    r = decoder.attend("The cat sat.")
    assert decoder.info.causal and not r.attentions.triu(1).any()
    torch.testing.assert_close(r.attentions.sum(-1), torch.ones(1, 2, r.n), atol=row_sum(r.n), rtol=0)
    with pytest.raises(ValueError, match=r"embed_dim \(30\) is not divisible by num_heads \(4\)"):
        random_model(layers=1, heads=4, embed_dim=30)


def test_devices_and_dtypes(tiny_checkpoints: dict[str, Path]) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"device \('tpu'\) must be one of"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device \('cuda:1'\) asked for, but CUDA is not available"):
            resolve_device("cuda:1")
    with pytest.raises(ValueError, match=r"only allowed on a GPU"):
        load_pretrained(tiny_checkpoints["bert"], device="cpu", dtype="float16")
    with pytest.raises(ValueError, match=r"dtype \('float8'\) must be one of"):
        load_pretrained(tiny_checkpoints["bert"], device="cpu", dtype="float8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_half_precision_on_gpu_returns_float32_cpu(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_pretrained(tiny_checkpoints["bert"], device="cuda", dtype="bfloat16")
    r = model.attend("The cat sat on the mat.")
    assert r.attentions.dtype == torch.float32 and r.attentions.device.type == "cpu"
    assert model.info.dtype == "bfloat16"


def test_info_and_result_fields(bert) -> None:
    assert bert.info.name == "tiny-bert" and bert.info.family == "bert" and bert.info.max_tokens == 64
    r = bert.attend("Hello world", "again")
    assert r.tokens == ["[CLS]", "hello", "world", "[SEP]", "again", "[SEP]"]
    assert r.token_ids == bert.tokenizer.convert_tokens_to_ids(r.tokens)
    assert r.segments == [0, 0, 0, 0, 1, 1]
    assert r.special == [True, False, False, True, False, True]
    assert r.offsets == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 5), (0, 0)]
    assert r.word_ids == [None, 0, 1, None, 0, None]
    assert r.hidden_state.shape == (6, 32) and not r.truncated


def test_empty_and_bad_inputs(bert) -> None:
    for text in ("", "   "):
        with pytest.raises(EmptyInputError):
            bert.attend(text)
    with pytest.raises(EmptyInputError):
        bert.attend("fine", "")
    with pytest.raises(
        ValueError, match=r"max_tokens \(65\) must be between 1 and the model's maximum \(64\)"
    ):
        bert.attend("fine", max_tokens=65)
    assert bert.attend_batch([]) == []


def test_batch_accepts_plain_strings_and_pairs(bert) -> None:
    batch = bert.attend_batch(["one two three four", ("a", "b")])
    alone = [bert.attend("one two three four"), bert.attend("a", "b")]
    for got, want in zip(batch, alone, strict=True):
        assert got.tokens == want.tokens
        # Padding to the batch's width changes the summation order only.
        torch.testing.assert_close(got.attentions, want.attentions, atol=FORWARD, rtol=0)


def test_batch_results_own_their_storage() -> None:
    # One layer: a row's slice of the batch's [L, B, H, n, n] buffer is contiguous when its text is the
    # longest, so only a copy keeps it from being a view into memory every result of the batch shares.
    model = random_model(layers=1, heads=2, embed_dim=16)
    results = model.attend_batch(["one two three", "four five six", "seven"])
    assert results[0].n == results[1].n > results[2].n  # the premise: two rows as wide as the batch
    tensors = [t for r in results for t in (r.attentions, r.hidden_state)]
    for t in tensors:
        assert t.is_contiguous() and t.storage_offset() == 0
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()  # nothing else kept alive
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)
    kept = [r.attentions.clone() for r in results]
    results[0].attentions.fill_(0.0)
    results[0].hidden_state.fill_(0.0)
    del results[2]
    torch.testing.assert_close(results[1].attentions, kept[1], atol=0, rtol=0)
    # A batch of one is its own buffer already: kept as is, owned all the same.
    alone = model.attend("one two three").attentions
    assert alone.untyped_storage().nbytes() == alone.numel() * alone.element_size()


@pytest.mark.parametrize("at_once", [1, 2])
@pytest.mark.parametrize("family", ["bert", "llama", "gemma2", "t5"])
def test_forward_layers_hands_forward_padded_attentions_a_few_layers_at_a_time(
    family: str, at_once: int, tiny_checkpoints: dict[str, Path], seq2seq_checkpoints: dict[str, Path]
) -> None:
    """The corpus worker's forward: each group's weights equal forward_padded's bit for bit (the same
    kernels write them), and on the CPU every group is written into the one buffer of at_once layers, so
    no more maps than that are alive."""
    model = load_pretrained({**tiny_checkpoints, **seq2seq_checkpoints}[family], device="cpu")
    encoded = model.encoder.encode_batch([("The cat sat on the mat.", None), ("Hi, you.", "A pair")], 64)
    attentions, _ = model.forward_padded(encoded)
    handed: list[tuple[int, torch.Tensor, int]] = []
    model.forward_layers(
        encoded, lambda i, w: handed.append((i, w.clone(), w.data_ptr())), layers_at_once=at_once
    )
    layers = model.info.layers  # 2 or 3: a last group of fewer layers at 2 at once where there are 3
    assert [i for i, _, _ in handed] == list(range(0, layers, at_once))
    for first, weights, _ in handed:
        assert torch.equal(weights, attentions[first : first + at_once]), first
    assert len({pointer for _, _, pointer in handed}) == 1
    with pytest.raises(ValueError, match=r"layers_at_once \(0\) must be at least 1"):
        model.forward_layers(encoded, lambda i, w: None, layers_at_once=0)


@pytest.mark.parametrize("family", ["bert", "llama", "t5"])
def test_forward_layers_hands_each_groups_norms_beside_the_same_weights(
    family: str, tiny_checkpoints: dict[str, Path], seq2seq_checkpoints: dict[str, Path]
) -> None:
    """norms=True (the corpus's --weighting norm): the weights are those without it, bit for bit (the value
    products go to memory of their own), and each group's norms [k, B, H, T] are attend's for each text."""
    model = load_pretrained({**tiny_checkpoints, **seq2seq_checkpoints}[family], device="cpu")
    items = [("The cat sat on the mat.", None), ("Hi, you.", "A pair")]
    encoded = model.encoder.encode_batch(items, 64)
    plain: list[torch.Tensor] = []
    model.forward_layers(encoded, lambda i, w: plain.append(w.clone()), layers_at_once=2)
    handed: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    model.forward_layers(
        encoded, lambda i, w, n: handed.append((i, w.clone(), n.clone())), layers_at_once=2, norms=True
    )
    assert [i for i, _, _ in handed] == list(range(0, model.info.layers, 2))
    norms = torch.cat([n for _, _, n in handed])  # [L, B, H, T]
    for weights, (_, with_norms, _) in zip(plain, handed, strict=True):
        assert torch.equal(weights, with_norms)
    for row, result in enumerate(model.attend_batch(items, max_tokens=64, norms=True)):
        alone = result.norms  # [L, H, n]
        # Another GEMM shape (attend's own forward) moves a norm by FORWARD relative at most (tolerances).
        difference = (norms[:, row, :, : result.n] - alone).abs().max().item()
        assert difference <= FORWARD * alone.abs().max().item(), (row, difference)


def test_gpt2_pairs_are_joined_and_truncated_longest_first(tiny_checkpoints: dict[str, Path]) -> None:
    gpt2 = load_pretrained(tiny_checkpoints["gpt2"], device="cpu")
    short, long = "The cat.", " ".join(["the dog sat on the log"] * 20)
    r = gpt2.attend(short, long, max_tokens=20)
    assert r.truncated and r.n == 20
    first = gpt2.attend(short)
    assert r.token_ids[: first.n] == first.token_ids  # the short text is kept whole
    assert r.segments == [0] * first.n + [1] * (20 - first.n)
    assert not any(r.special)


def test_roberta_positions_are_offset_past_padding(tiny_checkpoints: dict[str, Path]) -> None:
    roberta = load_pretrained(tiny_checkpoints["roberta"], device="cpu")
    assert roberta.info.max_tokens == 64  # 66 positions minus the offset of pad_token_id + 1
    ids = torch.tensor([[0, 5, 6, 2, 1, 1]])
    assert roberta.network.position_ids(ids).tolist() == [[2, 3, 4, 5, 1, 1]]


def test_unsupported_architecture_names_the_supported_ones(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    directory = _copy(tiny_checkpoints["bert"], tmp_path / "xlnet")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "xlnet"}))
    supported = (
        "bart, bert, distilbert, gemma2, gemma3, gemma3_text, gpt2, llama, marian, mistral, mt5, phi3, "
        "qwen2, qwen3, roberta, t5"
    )
    pattern = rf"'xlnet'.*supported: {supported}"
    with pytest.raises(UnsupportedCheckpointError, match=pattern):
        load_pretrained(directory, device="cpu")
    with pytest.raises(CheckpointNotFoundError):
        load_pretrained(tmp_path / "does" / "not" / "exist", device="cpu")


def test_mismatched_keys_are_reported_together(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    directory = _copy(tiny_checkpoints["bert"], tmp_path / "broken")
    weights = load_file(directory / "model.safetensors")
    del weights["encoder.layer.1.output.dense.bias"]
    weights["encoder.layer.0.surprise.weight"] = torch.zeros(2)
    weights["encoder.layer.0.attention.self.key.weight"] = torch.zeros(32, 31)
    save_file(weights, directory / "model.safetensors")
    with pytest.raises(CheckpointMismatchError) as caught:
        load_pretrained(directory, device="cpu")
    message = str(caught.value)
    assert "missing keys (1): encoder.layer.1.output.dense.bias" in message
    assert "unexpected keys (1): encoder.layer.0.surprise.weight" in message
    assert "mis-shaped keys (1)" in message and "attention.self.key.weight (32, 31)" in message


def test_task_model_prefixes_and_pytorch_bin(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    from transformers import BertForMaskedLM

    directory = _copy(tiny_checkpoints["bert"], tmp_path / "mlm")
    mlm = BertForMaskedLM.from_pretrained(str(directory))
    (directory / "model.safetensors").unlink()
    torch.save({k: v.contiguous() for k, v in mlm.state_dict().items()}, directory / "pytorch_model.bin")
    base = load_pretrained(tiny_checkpoints["bert"], device="cpu")
    prefixed = load_pretrained(directory, device="cpu")
    text = "The cat sat on the mat."
    torch.testing.assert_close(prefixed.attend(text).attentions, base.attend(text).attentions, atol=0, rtol=0)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match=r"activation \('swish'\) must be one of"):
        TransformerConfig(activation="swish")
    with pytest.raises(ValueError, match=r"num_layers \(0\) must be positive"):
        TransformerConfig(num_layers=0)


def test_large_buffers_are_ordinary_tensors() -> None:
    from mha._memory import empty_buffer

    like = torch.zeros(1, dtype=torch.float64)
    big = empty_buffer(3, 1024, 1024, like=like)  # 24 MiB: takes the huge-page advice path
    assert big.shape == (3, 1024, 1024) and big.dtype == torch.float64 and big.is_contiguous()
    big.fill_(2.0)
    assert big.sum().item() == 2.0 * 3 * 1024 * 1024
    assert empty_buffer(2, 2, like=like).shape == (2, 2)


# ------------------------------------------------------------------------- special tokens typed by users


def test_a_typed_special_token_is_special_like_the_templates(bert) -> None:
    # The tokenizer turns a typed "[SEP]" into the real [SEP] id: the model reads it as [SEP], so it is
    # special, with its span in the text and no word id (a word group of its own). [UNK], typed or written
    # for "☃", stands for a word: not special, marked unknown, with its word id.
    text = "a [SEP] b [UNK] c ☃"
    r = bert.attend(text, "[CLS] d")
    assert r.tokens == ["[CLS]", "a", "[SEP]", "b", "[UNK]", "c", "[UNK]", "[SEP]", "[CLS]", "d", "[SEP]"]
    assert r.special == [True, False, True, False, False, False, False, True, True, False, True]
    assert r.unknown == [t == "[UNK]" for t in r.tokens]
    assert r.segments == [0] * 8 + [1] * 3
    assert r.offsets[2] == (2, 7) and r.offsets[6] == (18, 19) and r.offsets[8] == (0, 5)
    assert r.offsets[0] == r.offsets[7] == r.offsets[-1] == (0, 0)  # the template's own
    assert r.word_ids == [None, 0, None, 2, 3, 4, 5, None, None, 1, None]
    groups = analysis.word_groups_from(r.word_ids, r.segments, r.special).groups
    assert groups == [[i] for i in range(r.n)]
    labels = analysis.word_labels(r.tokens, groups, offsets=r.offsets, segments=r.segments, texts=(text, "x"))
    assert labels[2] == "[SEP]" and labels[6] == "☃"  # an unknown word keeps its text


def test_typed_special_tokens_have_the_ids_transformers_gives(tiny_checkpoints: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    texts = {
        "bert": ("a [SEP] b [UNK] c", "[MASK] d [PAD]"),
        "distilbert": ("a [SEP] b [UNK] c", "[MASK] d [PAD]"),
        "roberta": ("a </s> b <unk> c<mask>", "<s>d <pad>"),
        "gpt2": ("a <|endoftext|> b", "c<|endoftext|>"),
    }
    for family, (text, pair) in texts.items():
        model = load_pretrained(tiny_checkpoints[family], device="cpu")
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoints[family]))
        # WordPiece writes [UNK] for a word it cannot spell: no control token. The byte-level BPEs write
        # none (they spell every byte), so their <unk> (GPT-2's is <|endoftext|>) stays one.
        unknown = {"[UNK]"} if family in ("bert", "distilbert") else set()
        specials = set(tokenizer.all_special_ids) - set(tokenizer.convert_tokens_to_ids(sorted(unknown)))
        # Every special token of the tokenizer is spelled in SPECIAL_TOKENS, so the rules agree.
        assert set(tokenizer.all_special_tokens) - unknown <= analysis.SPECIAL_TOKENS, family
        assert not unknown & analysis.SPECIAL_TOKENS
        for args in ((text,), (text, pair)):
            r = model.attend(*args)
            assert r.token_ids == tokenizer(*args)["input_ids"], (family, args)
            assert r.special == [i in specials for i in r.token_ids], (family, args)
            assert r.unknown == [t in unknown for t in r.tokens], (family, args)
            assert r.special == [t in analysis.SPECIAL_TOKENS for t in r.tokens], (family, args)
            typed = [s for s, source in zip(r.special, r.offsets, strict=True) if s and source != (0, 0)]
            assert typed, (family, args)  # the premise: a special token typed in the text


def test_head_stats_agree_with_and_without_the_special_mask(bert) -> None:
    r = bert.attend("a [SEP] b [UNK] c")
    with_mask = analysis.head_stats(r.attentions, r.tokens, special=r.special)
    spelled = analysis.head_stats(r.attentions, r.tokens)
    for key in with_mask:  # the same masks through the same code: exactly equal
        torch.testing.assert_close(with_mask[key], spelled[key], atol=0, rtol=0, msg=key)


def _chat_tokenizer():
    """A byte-level BPE in SmolLM2's way: <|endoftext|> is BOS, EOS and the nominal unk token; the chat
    markers are special, <|im_start|> named (an extra special token), <|im_end|> only added as special, so
    all_special_ids misses it; <think> is added but not special (as in Qwen3)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tok.train_from_iterator(["hello world, the cat sat on the mat"], trainer=trainer)
    end = "<|endoftext|>"
    named = {"bos_token": end, "eos_token": end, "unk_token": end, "extra_special_tokens": ["<|im_start|>"]}
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, **named)
    wrapped.add_tokens([AddedToken("<|im_end|>", special=True), AddedToken("<think>", special=False)])
    wrapped.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return wrapped


def test_chat_markers_are_special_and_a_nominal_unk_token_too() -> None:
    """Special = the control tokens: named special ids and every token added as special (chat markers),
    template's or typed. A byte-level BPE writes no [UNK] for a word, so its unk token is no unknown word."""
    from mha.text.tokenize import TextEncoder

    tokenizer = _chat_tokenizer()
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") not in tokenizer.all_special_ids  # the premise
    encoder = TextEncoder(tokenizer, vocab_size=len(tokenizer), type_vocab_size=0, pair_template=False)
    assert encoder.unknown_id is None
    encoded = encoder.encode_batch([("hello <think> world<|endoftext|><|im_end|>", None)], 64, chat=True)[0]
    tokens = tokenizer.convert_ids_to_tokens(encoded.ids)
    controls = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    assert tokens.count("<|im_end|>") == 2 and "<think>" in tokens and "<|endoftext|>" in tokens
    assert encoded.special == [t in controls for t in tokens]
    assert not any(encoded.unknown)
    assert all(w is None for w, s in zip(encoded.word_ids, encoded.special, strict=True) if s)


def test_unk_is_unknown_unless_it_plays_another_role() -> None:
    """WordPiece writes [UNK] for a word it cannot spell; made the PAD token too (as fine-tunes of Llama 2
    make <unk>), it is a control token."""
    from transformers import AutoTokenizer

    from mha.loading.pretrained import default_model_path
    from mha.text.tokenize import unknown_id

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    assert unknown_id(tokenizer) == tokenizer.convert_tokens_to_ids("[UNK]")
    tokenizer.pad_token = tokenizer.unk_token
    assert unknown_id(tokenizer) is None


def test_a_text_of_special_tokens_only_is_not_empty(tiny_checkpoints: dict[str, Path], bert) -> None:
    # The model reads a typed [SEP]; only a text that gives no token of its own is refused.
    r = bert.attend("[SEP]")
    assert r.tokens == ["[CLS]", "[SEP]", "[SEP]"] and all(r.special)
    gpt2 = load_pretrained(tiny_checkpoints["gpt2"], device="cpu")
    assert gpt2.attend("<|endoftext|>").special == [True]
    for blank in ("\u200b", "\x00"):  # removed by BERT's normalizer: no token at all
        with pytest.raises(EmptyInputError, match="text gives no tokens"):
            bert.attend(blank)
        with pytest.raises(EmptyInputError, match="text_pair gives no tokens"):
            bert.attend("fine", blank)
