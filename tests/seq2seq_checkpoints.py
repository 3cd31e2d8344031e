"""Tiny random encoder-decoder checkpoints (T5, BART, Marian), built offline, with real tokenizer files.

Beside tests/checkpoints.py (the encoders and decoders), in a module of its own to keep each short; the
weights are drawn and the byte-level BPE trained by checkpoints.py's sharpen and byte_level_bpe. The
tokenizers are trained here in milliseconds on a toy bilingual corpus: a SentencePiece Unigram in T5's
tokenizer class, a byte-level BPE in BART's, and for Marian two SentencePiece models (English for the
source, German for the target, so that text_target's switch shows) under one id table. Weights are drawn
wide so that attention is sharp and varied, every norm weight and bias away from 1 and 0 (random init
leaves them there, where a forgotten one would pass), and the stacks differ in depth so that encoder and
decoder counts cannot be swapped.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from checkpoints import byte_level_bpe, sharpen

SEQ2SEQ_FAMILIES = ("t5", "t5_gated", "bart", "marian")
# d_kv differs from d_model / heads (as in T5 v1.1) and max distance is short, so the test texts reach
# T5's logarithmic buckets and the shared last one.
S_HIDDEN, S_HEADS, S_HEAD_DIM, S_FFN, S_ENC_LAYERS, S_DEC_LAYERS = 32, 4, 12, 48, 2, 3
S_BUCKETS, S_MAX_DISTANCE, S_MAX_POSITIONS = 16, 20, 64
# The shape BART and Marian configs are built with (the same names in both)
BART_SHAPE = {
    "d_model": S_HIDDEN,
    "encoder_layers": S_ENC_LAYERS,
    "decoder_layers": S_DEC_LAYERS,
    "encoder_attention_heads": S_HEADS,
    "decoder_attention_heads": S_HEADS,
    "encoder_ffn_dim": S_FFN,
    "decoder_ffn_dim": S_FFN,
    "max_position_embeddings": S_MAX_POSITIONS,
}
CORPUS = [
    "The house is wonderful. Das Haus ist wunderbar.",
    "The cat sat on the mat. Die Katze sass auf der Matte.",
    "Attention heads align the target words to the source words.",
    "Ünïcödé: naïve café, Straße, numbers 12345.",
] * 4


def _sentencepiece(lines: list[str], path: Path, vocab_size: int = 60) -> Any:
    """A SentencePiece Unigram trained on `lines`, written to `path` and loaded. One thread: trained with
    more, the same lines can give other pieces from one run to the next."""
    import sentencepiece as spm

    with path.open("wb") as model:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=1.0,
            hard_vocab_limit=False,  # as many pieces as the few lines give, up to vocab_size
            num_threads=1,
            minloglevel=2,
        )
    return spm.SentencePieceProcessor(model_file=str(path))


def _t5_tokenizer(directory: Path) -> int:
    """A SentencePiece Unigram over the corpus in T5's tokenizer class (<pad> 0, </s> 1, <unk> 2, then its
    pieces with their scores; "</s>" appended)."""
    from transformers import T5Tokenizer

    with tempfile.TemporaryDirectory() as work:
        model = _sentencepiece(CORPUS, Path(work) / "t5.model", vocab_size=120)
        pieces = [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab = specials + [(p, score) for p, score in pieces if p not in ("<unk>", "<s>", "</s>")]
    wrapped = T5Tokenizer(vocab=vocab, extra_ids=0)
    wrapped.model_max_length = S_MAX_POSITIONS
    wrapped.save_pretrained(directory)
    return len(wrapped)


def _t5(directory: Path, *, gated: bool, mt5: bool = False) -> Any:
    import transformers as tf

    vocab = _t5_tokenizer(directory)
    config_class, model_class = (
        (tf.MT5Config, tf.MT5ForConditionalGeneration)
        if mt5
        else (tf.T5Config, tf.T5ForConditionalGeneration)
    )
    config = config_class(
        vocab_size=vocab + 3,  # a little past the tokenizer, as real checkpoints pad their embedding
        d_model=S_HIDDEN,
        d_kv=S_HEAD_DIM,
        d_ff=S_FFN,
        num_layers=S_ENC_LAYERS,
        num_decoder_layers=S_DEC_LAYERS,
        num_heads=S_HEADS,
        relative_attention_num_buckets=S_BUCKETS,
        relative_attention_max_distance=S_MAX_DISTANCE,
        feed_forward_proj="gated-gelu" if gated else "relu",
        # v1.1 unties the LM head from the embeddings; v1.0 ties them
        tie_word_embeddings=not gated,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        n_positions=S_MAX_POSITIONS,
    )
    return model_class(config)


def _bart_tokenizer(directory: Path) -> int:
    """A byte-level BPE over the corpus in BART's tokenizer class (<s> 0, <pad> 1, </s> 2, <unk> 3)."""
    from transformers import BartTokenizer

    tok = byte_level_bpe(CORPUS, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], 300)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    wrapped = BartTokenizer(vocab=model["vocab"], merges=merges)
    wrapped.model_max_length = S_MAX_POSITIONS
    wrapped.save_pretrained(directory)
    return len(wrapped)


def _bart(directory: Path) -> Any:
    import transformers as tf

    vocab = _bart_tokenizer(directory)
    config = tf.BartConfig(
        vocab_size=vocab + 3,
        **BART_SHAPE,
        scale_embedding=True,
        # BART's own defaults, spelled out: generation forces </s> into the last slot
        forced_eos_token_id=2,
        decoder_start_token_id=2,
    )
    return tf.BartForConditionalGeneration(config)


def _marian_tokenizer(directory: Path) -> tuple[int, int]:
    """Marian's files: source.spm and target.spm trained on each side of the corpus, vocab.json giving
    </s> 0, <unk> 1, every piece of either, <pad> last. Returns (vocabulary size, pad id)."""
    from transformers import MarianTokenizer

    sides = {
        "source": ["The house is wonderful.", "The cat sat on the mat.", "Attention heads align words."],
        "target": ["Das Haus ist wunderbar.", "Die Katze sass auf der Matte.", "Köpfe richten Wörter aus."],
    }
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        pieces: dict[str, None] = {}
        for side, lines in sides.items():
            model = _sentencepiece(lines * 8, work / f"{side}.model")
            pieces.update(dict.fromkeys(model.id_to_piece(i) for i in range(model.get_piece_size())))
        ordered = ["</s>", "<unk>", *(p for p in pieces if p not in ("<unk>", "<s>", "</s>")), "<pad>"]
        vocab = {piece: i for i, piece in enumerate(ordered)}
        (work / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        tokenizer = MarianTokenizer(
            source_spm=str(work / "source.model"),
            target_spm=str(work / "target.model"),
            vocab=str(work / "vocab.json"),
            model_max_length=S_MAX_POSITIONS,
        )
        tokenizer.save_pretrained(directory)  # copies the models in as source.spm and target.spm
    return len(vocab), vocab["<pad>"]


def _marian(directory: Path) -> Any:
    import transformers as tf

    vocab, pad = _marian_tokenizer(directory)
    config = tf.MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        **BART_SHAPE,
        activation_function="swish",  # opus-mt's
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,  # Marian starts decoding from its pad token
        eos_token_id=0,
        forced_eos_token_id=0,
    )
    return tf.MarianMTModel(config)


def build_seq2seq_checkpoint(family: str, directory: Path, *, seed: int = 0) -> Path:
    """Write a tiny random `family` checkpoint (config, weights, tokenizer files) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if family in ("t5", "t5_gated", "mt5"):
        # mT5 is T5 v1.1 (gated, untied) under its own model_type and classes
        model = _t5(directory, gated=family != "t5", mt5=family == "mt5")
    elif family == "bart":
        model = _bart(directory)
    elif family == "marian":
        model = _marian(directory)
    else:
        raise ValueError(f"family ({family!r}) must be one of {(*SEQ2SEQ_FAMILIES, 'mt5')}")
    sharpen(
        model,
        seed,
        is_norm=lambda name: "norm" in name and name.endswith("weight"),
        # T5 has no 1/sqrt(d_kv) on its logits and folds it into q's init instead: so do we, which keeps
        # its logits the size of the other families' (tests/tolerances.py's FORWARD).
        scales={".q.weight": 0.3 / S_HEAD_DIM**0.5},
        buffers={"final_logits_bias": 0.5},
    )
    if family in ("t5_gated", "mt5"):
        with torch.no_grad():  # untied: a head of its own, unlike the embeddings
            model.lm_head.weight = torch.nn.Parameter(0.3 * torch.randn_like(model.shared.weight))
    model.save_pretrained(directory)
    return directory
