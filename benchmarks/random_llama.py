"""A random-weight Llama of SmolLM2-135M's shape, the long-input benchmarks' model: its checkpoint, both
sides loaded from it (ours and transformers' eager LlamaModel), random ids, and the same network's forward
run blind (each layer's attention through a kernel that gives no weights).

Used by extract.py --family llama, long.py, fused_trace.py, trace_memory.py and gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F

from mha.core.layers import Block
from mha.networks.model import Transformer

# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M config.json): 30 layers, 9 query heads over 3 KV heads
SMOLLM2: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "tie_word_embeddings": True,
}

# one layer's q, k, v ((B, H, n, D), (B, H_kv, n, D) x 2) and scale -> its output (B, H, n, D)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def llama_checkpoint(directory: str) -> str:
    """A random SmolLM2-135M-shaped Llama saved in `directory` (weights only: no tokenizer is needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2))
    with torch.no_grad():  # wider than the init, so heads are sharp as trained ones are
        for name, p in model.named_parameters():
            if p.ndim > 1 and "embed" not in name:
                p.mul_(3.0)
    model.save_pretrained(directory)
    return directory


def load_llama(which: str, directory: str):
    """(model, run(ids)) for one side of the llama comparison: "ours" or "theirs"."""
    from transformers import AutoConfig, LlamaModel

    from mha.loading import checkpoint_files
    from mha.loading.convert import for_model_type
    from mha.loading.pretrained import build_network

    if which == "ours":
        # No tokenizer: the ids are random, so the network alone, loaded as load_pretrained loads it.
        converter = for_model_type("llama")
        config = converter.config_from_hf(AutoConfig.from_pretrained(directory))
        network = build_network(config, converter, checkpoint_files.weight_files(Path(directory)))

        def run_ours(ids: torch.Tensor):
            with torch.no_grad():
                return network(ids, need_hidden=False).attentions

        return network, run_ours
    theirs = LlamaModel.from_pretrained(directory, attn_implementation="eager").eval()

    def run_theirs(ids: torch.Tensor):
        with torch.no_grad():
            return theirs(ids, output_attentions=True).attentions

    return theirs, run_theirs


def load_network(directory: str) -> Transformer:
    """Our network for the checkpoint in `directory`."""
    network, _ = load_llama("ours", directory)
    return network


def ids_of(n: int) -> torch.Tensor:
    """n random token ids, (1, n), the same for every call with that n."""
    vocab = cast(int, SMOLLM2["vocab_size"])
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))


def hooked_forward(network: Transformer, ids: torch.Tensor, attend: Attend) -> torch.Tensor:
    """The whole forward with every layer's attention through `attend` (its own q, k, v: post-rotary)."""
    position_ids = network.position_ids(ids)
    with torch.no_grad():
        x = network.embeddings(ids, position_ids, None)
        rotaries = network.rotaries(position_ids, x.dtype)
        for layer, rotary in zip(cast("list[Block]", network.layers), rotaries, strict=True):
            attn = layer.attn

            def hook(h: torch.Tensor, attn=attn, rotary=rotary) -> torch.Tensor:
                q, k, v = attn.heads(h, h, h, True, rotary)  # (1, H, n, D), (1, H_kv, n, D) x 2
                out = attend(q, k, v, attn.scale)  # (1, H, n, D)
                return attn.out_proj(out.transpose(1, 2).reshape(h.shape[0], h.shape[1], -1))

            x = layer(x, None, rotary=rotary, need_weights=False, attention=hook)[0]
        return x if network.final_norm is None else network.final_norm(x)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """torch's fused causal attention over grouped heads: no weights anywhere."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def blind_forward(network: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """The whole forward with torch's fused causal attention in every layer: the model run without weights.
    (Our MultiHeadAttention's need_weights=False path takes SDPA only when query and key heads are equal;
    grouped heads go through explicit weights, so this calls SDPA itself, via Block's `attention` hook.)"""
    return hooked_forward(network, ids, sdpa)
