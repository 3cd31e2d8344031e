"""Head ablation (mha.analysis.ablation, AttentionModel.head_effects) against transformers' eager models with
the same head zeroed by a forward pre-hook on their output projection (o_proj, GPT-2's c_proj, BERT's
attention.output.dense): the input slice that head writes set to 0, one whole forward per head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tolerances import FORWARD

from mha import AttentionModel, load_pretrained
from mha.analysis.ablation import HeadEffects
from mha.errors import Cancelled

PROMPT = "The cat sat on the mat because it was"


def output_projections(family: str, model: Any) -> list[Any]:
    """Each layer's output projection in transformers' `model`, whose input is the heads' outputs side by
    side (head h: columns h·D to (h + 1)·D)."""
    if family == "bert":
        return [layer.attention.output.dense for layer in model.encoder.layer]
    if family == "gpt2":
        return [block.attn.c_proj for block in model.transformer.h]
    return [layer.self_attn.o_proj for layer in model.model.layers]


def ablated(model: Any, projection: Any, head: int, head_dim: int, run: Any) -> Any:
    """run() with `head`'s slice of `projection`'s input zeroed."""

    def zero(_module: Any, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., head * head_dim : (head + 1) * head_dim] = 0
        return (x,)

    hook = projection.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            return run()
    finally:
        hook.remove()


def decoder_effects(directory: Path, **options: Any) -> tuple[AttentionModel, HeadEffects, Any, torch.Tensor]:
    """(our model, its head effects over PROMPT and 3 tokens continued, transformers' eager model, the ids
    of prompt and continuation) for the decoder checkpoint in `directory`."""
    from transformers import AutoModelForCausalLM

    ours = load_pretrained(directory, device="cpu")
    effects = ours.head_effects(PROMPT, max_new_tokens=3, **options)
    theirs = AutoModelForCausalLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    return ours, effects, theirs, torch.tensor([ours.attend(PROMPT, max_new_tokens=3).token_ids])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_decoder_effects_are_the_next_token_kl_of_transformers_with_that_head_zeroed(
    family: str, tiny_checkpoints: dict[str, Path]
) -> None:
    done: list[tuple[int, int]] = []
    _ours, effects, theirs, ids = decoder_effects(
        tiny_checkpoints[family], progress=lambda i, n: done.append((i, n))
    )
    positions = effects.positions
    assert (
        positions is not None
        and effects.generated == 3
        and positions == list(range(ids.shape[1] - 4, ids.shape[1]))
    )

    def log_probs() -> torch.Tensor:
        return F.log_softmax(theirs(input_ids=ids).logits[0, positions].double(), dim=-1)

    with torch.no_grad():
        full = log_probs()
    layers, heads = effects.layers, effects.heads
    head_dim = theirs.config.hidden_size // heads
    expected = torch.empty(layers, heads, len(positions), dtype=torch.float64)
    for layer, projection in enumerate(output_projections(family, theirs)):
        for head in range(heads):
            q = ablated(theirs, projection, head, head_dim, log_probs)
            expected[layer, head] = (full.exp() * (full - q)).sum(-1)
    assert effects.measure == "kl" and effects.steps is not None
    # KL = Σ p (log p − log q): each log-probability within FORWARD of transformers' (both float32
    # forwards, read in float64), so the KL within 2·FORWARD plus p's own change times |log p − log q|.
    assert (effects.steps.double() - expected).abs().max() <= 2 * FORWARD + FORWARD * expected.abs().max()
    assert torch.equal(effects.effects, effects.steps[..., -1])
    assert expected.max() > 1e-3  # some head matters: the comparison is not of zeros
    assert done == [(i + 1, layers) for i in range(layers)]


def test_encoder_effects_are_one_minus_cosine_of_transformers_with_that_head_zeroed(
    tiny_checkpoints: dict[str, Path],
) -> None:
    from transformers import AutoModel, AutoTokenizer

    directory = tiny_checkpoints["bert"]
    ours = load_pretrained(directory, device="cpu")
    effects = ours.head_effects(PROMPT, "It was warm.")
    theirs = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()
    batch = AutoTokenizer.from_pretrained(str(directory))(PROMPT, "It was warm.", return_tensors="pt")

    def states() -> torch.Tensor:
        hidden = theirs(**batch).last_hidden_state[0].double()
        return torch.stack([hidden[0], hidden.mean(0)])

    with torch.no_grad():
        full = states()
    heads = effects.heads
    head_dim = theirs.config.hidden_size // heads
    expected = torch.empty(effects.layers, heads, 2, dtype=torch.float64)
    for layer, projection in enumerate(output_projections("bert", theirs)):
        for head in range(heads):
            expected[layer, head] = 1 - F.cosine_similarity(
                full, ablated(theirs, projection, head, head_dim, states)
            )
    assert effects.measure == "cosine" and effects.pooled is not None
    # 1 − cos of two float32 forwards' states, each within FORWARD relative of transformers'.
    assert (effects.effects.double() - expected[..., 0]).abs().max() <= 4 * FORWARD
    assert (effects.pooled.double() - expected[..., 1]).abs().max() <= 4 * FORWARD
    assert expected.max() > 1e-3


def test_cancel_stops_between_layers(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_pretrained(tiny_checkpoints["llama"], device="cpu")
    asked: list[int] = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(Cancelled, match="before layer 2"):
        model.head_effects(PROMPT, cancel=cancel)


def test_an_ablation_changes_nothing_below_its_layer_nor_the_plain_forward(
    tiny_checkpoints: dict[str, Path],
) -> None:
    model = load_pretrained(tiny_checkpoints["llama"], device="cpu")
    before = model.attend(PROMPT).attentions
    effects = model.head_effects(PROMPT)
    assert torch.equal(model.attend(PROMPT).attentions, before)  # no state left behind
    assert (effects.effects >= -1e-12).all()  # a KL is never negative (float64 sums)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_decoder_names_the_token_each_kl_refers_to_and_its_probability(
    family: str, tiny_checkpoints: dict[str, Path]
) -> None:
    ours, effects, theirs, ids = decoder_effects(tiny_checkpoints[family])
    positions = effects.positions
    assert positions is not None and effects.top_tokens is not None and effects.top_probs is not None
    with torch.no_grad():
        p = F.softmax(theirs(input_ids=ids).logits[0, positions].double(), dim=-1)
    best = p.topk(2, dim=-1)
    # Each log-probability within FORWARD of transformers' (both float32 forwards): the argmax is theirs
    # where the top two differ by more than twice that (each may move FORWARD), and each probability is
    # within p·(e^FORWARD − 1) < 2·FORWARD of theirs (p ≤ 1).
    assert (best.values[:, 0].log() - best.values[:, 1].log()).min() > 2 * FORWARD
    assert effects.top_tokens == ours.tokenizer.convert_ids_to_tokens(best.indices[:, 0].tolist())
    assert (torch.tensor(effects.top_probs) - best.values[:, 0]).abs().max() <= 2 * FORWARD
    # Greedy decoding wrote what p_full ranks first: the steps before the last name the written tokens.
    assert effects.top_tokens[:-1] == effects.tokens[positions[0] + 1 :]
    assert not effects.truncated


def test_an_encoder_names_no_token_and_refuses_a_continuation(tiny_checkpoints: dict[str, Path]) -> None:
    from mha.errors import NotCausalError

    model = load_pretrained(tiny_checkpoints["bert"], device="cpu")
    effects = model.head_effects(PROMPT, max_tokens=5)
    assert effects.top_tokens is None and effects.top_probs is None and effects.truncated
    with pytest.raises(NotCausalError, match="needs a decoder model"):
        model.head_effects(PROMPT, max_new_tokens=2)


# -- encoder-decoders: the heads of all three attentions, read at the decoder's next-token distribution ---


def seq2seq_projections(family: str, model: Any) -> dict[str, list[Any]]:
    """transformers' output projections of each attention kind (their input: the heads side by side)."""
    if family == "t5":
        encoder, decoder = model.encoder.block, model.decoder.block
        return {
            "encoder": [block.layer[0].SelfAttention.o for block in encoder],
            "decoder": [block.layer[0].SelfAttention.o for block in decoder],
            "cross": [block.layer[1].EncDecAttention.o for block in decoder],
        }
    inner = model.model  # BART and Marian
    return {
        "encoder": [layer.self_attn.out_proj for layer in inner.encoder.layers],
        "decoder": [layer.self_attn.out_proj for layer in inner.decoder.layers],
        "cross": [layer.encoder_attn.out_proj for layer in inner.decoder.layers],
    }


@pytest.mark.parametrize("family", ["t5", "bart", "marian"])
def test_encoder_decoder_effects_are_the_decoders_kl_with_each_head_of_each_attention_zeroed(
    family: str, seq2seq_checkpoints: dict[str, Path]
) -> None:
    from transformers import AutoModelForSeq2SeqLM

    source, target = "The house is wonderful.", "Das Haus ist wunderbar."
    directory = seq2seq_checkpoints[family]
    ours = load_pretrained(directory, device="cpu")
    done: list[tuple[int, int]] = []
    effects = ours.head_effects(source, target=target, progress=lambda i, n: done.append((i, n)))
    attended = ours.attend(source, target=target)
    theirs = AutoModelForSeq2SeqLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    source_ids = torch.tensor([attended.token_ids])
    decoder_ids = torch.tensor([attended.target_ids])
    banned = list(ours.network.config.banned_token_ids)  # generate's bad_words_ids: probability 0

    def log_probs() -> torch.Tensor:
        logits = theirs(input_ids=source_ids, decoder_input_ids=decoder_ids).logits[0].double()
        logits[:, banned] = -torch.inf
        return F.log_softmax(logits, dim=-1)

    def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isneginf(p), 0.0, p.exp() * (p - q)).sum(-1)

    with torch.no_grad():
        full = log_probs()
    n = decoder_ids.shape[1]
    assert effects.positions == list(range(n)) and effects.generated == 0
    assert effects.tokens == attended.target_tokens and effects.source_tokens == attended.tokens
    assert effects.sections is not None and set(effects.sections) == {"encoder", "decoder", "cross"}
    head_dim = theirs.config.d_kv if family == "t5" else theirs.config.d_model // effects.heads
    largest = 0.0
    for kind, projections in seq2seq_projections(family, theirs).items():
        section = effects.sections[kind]
        heads = section.steps.shape[1]
        expected = torch.empty(len(projections), heads, n, dtype=torch.float64)
        for layer, projection in enumerate(projections):
            for head in range(heads):
                expected[layer, head] = kl(full, ablated(theirs, projection, head, head_dim, log_probs))
        # As the decoder's test: each log-probability within FORWARD of transformers' (float32 forwards).
        bound = 2 * FORWARD + FORWARD * expected.abs().max()
        assert (section.steps.double() - expected).abs().max() <= bound, kind
        assert torch.equal(section.effects, section.steps[..., -1])
        largest = max(largest, float(expected.max()))
    assert largest > 1e-3  # some head matters: the comparison is not of zeros
    assert torch.equal(effects.effects, effects.sections["encoder"].effects)
    layers = len(effects.sections["encoder"].effects) + 2 * len(effects.sections["decoder"].effects)
    assert done == [(i + 1, layers) for i in range(layers)]


def test_an_encoder_decoder_without_a_target_measures_the_one_it_writes(
    seq2seq_checkpoints: dict[str, Path], tiny_checkpoints: dict[str, Path]
) -> None:
    model = load_pretrained(seq2seq_checkpoints["marian"], device="cpu")
    attended = model.attend("The house is wonderful.", max_new_tokens=4)
    effects = model.head_effects("The house is wonderful.", max_new_tokens=4)
    assert effects.tokens == attended.target_tokens and effects.generated == attended.generated > 0
    assert effects.top_tokens is not None and effects.top_probs is not None
    # Greedy decoding wrote what p_full ranks first, but for the last token (a forced EOS may take it).
    written = effects.tokens[1:]
    assert effects.top_tokens[: len(written) - 1] == written[:-1]
    with pytest.raises(ValueError, match="encoder-decoder"):
        load_pretrained(tiny_checkpoints["llama"], device="cpu").head_effects(PROMPT, target="a target")
