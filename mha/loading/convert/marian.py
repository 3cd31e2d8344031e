"""Marian (Helsinki-NLP opus-mt) checkpoints -> our encoder-decoder: BART's post-norm layers
(mha.loading.convert.bart) with Marian's sinusoidal positions (computed as transformers builds its table,
never loaded), sqrt(d_model)-scaled token embeddings, no embedding norm, and the pad token as the decoder's
start. Its encoder and decoder share one embedding (`shared`) unless share_encoder_decoder_embeddings is
off, when each has its own (the decoder's of decoder_vocab_size rows). Its tokenizer is a Python
SentencePiece one (mha.text.slow_tokenize).
"""

from __future__ import annotations

from typing import Any

from mha.loading.convert.bart import seq2seq_config, seq2seq_converter, seq2seq_key_map
from mha.loading.convert.base import KeyMap
from mha.networks.seq2seq import Seq2SeqConfig

__all__ = ["MARIAN", "config_from_hf", "key_map"]


def config_from_hf(cfg: Any) -> Seq2SeqConfig:
    return seq2seq_config(
        cfg,
        positions="sinusoidal",
        max_positions=cfg.max_position_embeddings,
        embedding_norm=False,
        shared_embeddings=bool(getattr(cfg, "share_encoder_decoder_embeddings", True)),
    )


def key_map(config: Seq2SeqConfig) -> KeyMap:
    embeddings: dict[str, tuple[str, ...]] = {
        f"{stack}.embeddings.token.weight": (
            "shared.weight" if config.shared_embeddings else f"{stack}.embed_tokens.weight",
        )
        for stack in ("encoder", "decoder")
    }
    return seq2seq_key_map(config, embeddings=embeddings)


MARIAN = seq2seq_converter("marian", config_from_hf, key_map, slow_tokenizer=True)
