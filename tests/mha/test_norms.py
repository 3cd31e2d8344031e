"""Weight × value norm (mha.analysis.norms, attend(..., norms=True)) against an independent computation from
transformers' own weights and activations: each attention sub-layer's input x as transformers' eager model
feeds it (a forward pre-hook), its value and output projections read from transformers' modules, and
every norm and map worked out in float64 (Kobayashi et al. 2020's definitions, their code's einsum)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tolerances import FORWARD, U32, float32_sum

from mha import analysis, load_pretrained

SENTENCE = "The cat sat on the mat. The dog sat on the log."
# The families whose sub-layer inputs and weights are read below: a post-norm encoder (BERT, biases on the
# value and output projections), a pre-norm decoder with Conv1D projections (GPT-2), a grouped-query rotary
# decoder without biases (Llama) and one with value biases (Qwen2).
FAMILIES = ("bert", "gpt2", "llama", "qwen2")


def projections(family: str, layer: Any, hidden: int) -> tuple[Any, Any, Any, Any, int]:
    """(W_V [kv·D, E], b_V or None, W_O [E, H·D], attention module, query heads) of one transformers layer,
    as float64, y = x W_Vᵀ + b_V and out = W_O y (Linear's convention)."""
    if family == "bert":
        attn = layer.attention.self
        dense = layer.attention.output.dense
        return attn.value.weight, attn.value.bias, dense.weight, attn, attn.num_attention_heads
    if family == "gpt2":
        attn = layer.attn
        # Conv1D: y = x W + b with W [E, 3E], q, k, v along the columns; c_proj W [E, E] likewise.
        w_v = attn.c_attn.weight[:, 2 * hidden :].t()
        b_v = attn.c_attn.bias[2 * hidden :]
        return w_v, b_v, attn.c_proj.weight.t(), attn, attn.num_heads
    attn = layer.self_attn
    return attn.v_proj.weight, attn.v_proj.bias, attn.o_proj.weight, attn, attn.config.num_attention_heads


def layers_of(family: str, model: Any) -> Any:
    return {"bert": lambda: model.encoder.layer, "gpt2": lambda: model.h}.get(family, lambda: model.layers)()


def reference(family: str, directory: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(attentions [L, H, n, n], f [L, H, n, E] every head's f_h(x_j), in float64) from transformers."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()
    hidden = model.config.hidden_size
    inputs: list[torch.Tensor] = []

    def keep_input(_module: Any, args: tuple, kwargs: dict) -> None:
        inputs.append(args[0] if args else kwargs["hidden_states"])

    parts = [projections(family, layer, hidden) for layer in layers_of(family, model)]
    hooks = [attn.register_forward_pre_hook(keep_input, with_kwargs=True) for *_, attn, _ in parts]
    with torch.no_grad():
        out = model(**tokenizer(SENTENCE, return_tensors="pt"), output_attentions=True)
    for hook in hooks:
        hook.remove()
    values = []
    for x, (w_v, b_v, w_o, _, heads) in zip(inputs, parts, strict=True):
        x = x[0].double()  # (n, E)
        v = x @ w_v.double().t() + (0 if b_v is None else b_v.double())  # (n, kv·D)
        head_dim = w_o.shape[1] // heads
        kv_heads = v.shape[1] // head_dim
        v = v.view(-1, kv_heads, head_dim).repeat_interleave(heads // kv_heads, dim=1)  # (n, H, D)
        w = w_o.double().view(w_o.shape[0], heads, head_dim)  # W_O^h = w[:, h, :]
        values.append(torch.einsum("nhd,ehd->hne", v, w))  # f_h(x_j): (H, n, E)
    return torch.stack(out.attentions)[:, 0].double(), torch.stack(values)


@pytest.fixture(scope="module", params=FAMILIES)
def case(request: pytest.FixtureRequest, tiny_checkpoints: dict[str, Path]) -> tuple[Any, ...]:
    directory = tiny_checkpoints[request.param]
    result = load_pretrained(directory, device="cpu").attend(SENTENCE, norms=True)
    return (request.param, result, *reference(request.param, directory))


def bound(scale: torch.Tensor, width: int) -> torch.Tensor:
    """|ours - float64| for a norm of a vector of size `scale`: transformers' float32 forward and ours feed
    x within FORWARD (relative: the sub-layer input is O(1) after a norm) to two float32 projections of
    `width` terms each (Higham: 2·width·u relative); the same relative error carries to the norm."""
    return (FORWARD + 2 * width * U32) * scale.clamp(min=1.0)


def test_norms_are_the_value_through_each_heads_slice_of_the_output(case: tuple[Any, ...]) -> None:
    family, result, attentions, f = case
    assert torch.allclose(result.attentions.double(), attentions, atol=FORWARD, rtol=0), family
    expected = f.norm(dim=-1)  # [L, H, n]
    assert result.norms.shape == expected.shape
    width = f.shape[-1] + result.value_products.shape[-1]
    assert ((result.norms.double() - expected).abs() <= bound(expected, width)).all(), family
    # Not constant: the norm tells tokens apart, which the weight alone would not.
    assert expected.std(dim=-1).min() > 1e-3


def test_products_hold_every_pair_of_heads(case: tuple[Any, ...]) -> None:
    family, result, _, f = case
    expected = torch.einsum("lhne,lgne->lnhg", f, f)  # <f_h(x_j), f_g(x_j)>
    scale = f.norm(dim=-1).amax(dim=1)[:, :, None, None] ** 2  # Cauchy-Schwarz: |<a, b>| <= max norm²
    assert ((result.value_products.double() - expected).abs() <= 2 * bound(scale, f.shape[-1] * 2)).all()


def test_weighted_and_layer_maps_equal_kobayashis_definitions(case: tuple[Any, ...]) -> None:
    family, result, attentions, f = case
    weighted = attentions * f.norm(dim=-1).unsqueeze(-2)  # α_ij ‖f_h(x_j)‖
    ours = analysis.weight_norm_map(result.attentions, result.norms).double()
    scale = f.norm(dim=-1).amax()
    assert (ours - weighted).abs().max() <= bound(scale, f.shape[-1] * 2) + FORWARD * scale, family
    summed = torch.einsum("lhij,lhje->lije", attentions, f).norm(dim=-1)  # ‖Σ_h α^h_ij f_h(x_j)‖
    layer = analysis.layer_norm_map(result.attentions, result.value_products).double()
    heads = f.shape[1]
    # H heads' terms, each within the weighted bound; the square root halves a relative error at most.
    assert (layer - summed).abs().max() <= heads * (bound(scale, f.shape[-1] * 2) + FORWARD * scale)
    shares, totals = analysis.row_shares(ours)
    assert torch.allclose(shares.sum(-1), torch.ones_like(totals), atol=shares.shape[-1] * 4 * U32)


def test_norms_come_from_the_same_forward_and_change_nothing_else(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_pretrained(tiny_checkpoints["llama"], device="cpu")
    plain = model.attend(SENTENCE)
    both = model.attend(SENTENCE, norms=True)
    assert plain.value_products is None and plain.norms is None
    assert torch.equal(plain.attentions, both.attentions)  # the very same arithmetic, one forward
    batch = model.attend_batch([SENTENCE, "Hi."], norms=True)
    n = both.n
    assert batch[0].value_products.shape == (3, n, 4, 4)
    # A padded batch runs other GEMM shapes: within the products' float32 rounding, not bit for bit.
    scale = both.value_products.abs().max()
    assert (batch[0].value_products - both.value_products).abs().max() <= 64 * 2 * U32 * scale
    written = model.attend(SENTENCE, max_new_tokens=3, norms=True)
    assert written.norms.shape == (3, 4, written.n)


def test_maps_refuse_mismatched_shapes() -> None:
    a = torch.full((2, 3, 4, 4), 0.25)
    with pytest.raises(ValueError, match=r"norms must be \[L, H, keys\]"):
        analysis.weight_norm_map(a, torch.ones(2, 3, 5))
    with pytest.raises(ValueError, match=r"value_products must be \[L, keys, H, H\]"):
        analysis.layer_norm_map(a, torch.ones(2, 4, 2, 3))
    big = torch.full((1, 1, 513, 513), 1 / 513)
    with pytest.raises(ValueError, match="up to 512 tokens"):
        analysis.layer_norm_map(big, torch.ones(1, 513, 1, 1))


# The bundled MiniLM on a sentence: its heads put much weight on [CLS] and [SEP], whose values are small.
SINK_SENTENCE = "The cat sat on the mat because it was tired."
SINK_HEAD = (2, 7)  # mha.analysis.stats' docstring quotes this head's shares


def test_head_stats_read_norm_shares_and_see_through_sinks() -> None:
    """head_stats takes the weight × value norm shares as it takes weights (rows summing to 1), and they
    tell another story on MiniLM's sinks: heads busy on [CLS] and [SEP] by weight move little from them."""
    model = load_pretrained(device="cpu")
    result = model.attend(SINK_SENTENCE, norms=True)
    shares, _ = analysis.row_shares(analysis.weight_norm_map(result.attentions, result.norms))
    by_weight = analysis.head_stats(result.attentions, result.tokens, special=result.special)
    by_norm = analysis.head_stats(shares, result.tokens, special=result.special)
    assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"  # the premise

    # `special` of the shares against the same float32 weights and norms worked out in float64: each share
    # carries a product's and a division's rounding and its row total's float32_sum(n) (relative), and
    # head_stats sums a row and averages the rows in float32 (float32_sum(n) each, values <= 1).
    n = result.n
    weighted = result.attentions.double() * result.norms.double().unsqueeze(-2)
    exact = weighted / weighted.sum(-1, keepdim=True)
    columns = [j for j, s in enumerate(result.special) if s]
    special = exact[..., columns].sum(-1).mean(-1)
    assert (by_norm["special"].double() - special).abs().max() <= (n + 2) * U32 + 2 * float32_sum(n)

    # The two differ: by weight most heads are special-sinks here; by norm hardly any, and every head's
    # share on the specials drops.
    weight_sinks = sum(label == "special-sink" for row in analysis.head_labels(by_weight) for label in row)
    norm_sinks = sum(label == "special-sink" for row in analysis.head_labels(by_norm) for label in row)
    assert weight_sinks >= 20 and norm_sinks <= 2, (weight_sinks, norm_sinks)
    assert bool((by_norm["special"] < by_weight["special"]).all())
    # The docstring's head, to the 2 decimals it quotes: each value lies over 1e-3 from a rounding boundary,
    # far beyond what another CPU's forward moves it (FORWARD).
    layer, head = SINK_HEAD
    assert round(by_weight["special"][layer, head].item(), 2) == 0.91
    assert round(by_norm["special"][layer, head].item(), 2) == 0.19
    assert analysis.head_labels(by_weight)[layer][head] == "special-sink"
    assert analysis.head_labels(by_norm)[layer][head] != "special-sink"
    # The page's statistics glossary quotes the same head and figures.
    js = Path(__file__).resolve().parents[2] / "app" / "static" / "js"
    glossary = (js / "weighting.js").read_text("utf-8")
    assert "L2 H7 puts 0.91 of its weight on [CLS] and [SEP]" in glossary and "0.19 of its norm" in glossary


# -- encoder-decoders: the encoder's, the decoder's and cross attention's norms ---------------------------

SOURCE, TARGET = "The house is wonderful.", "Das Haus ist wunderbar."


def seq2seq_modules(family: str, model: Any) -> dict[str, list[tuple[Any, Any, Any, Any, int]]]:
    """{kind: per layer (module, W_V, b_V, W_O, heads)} of transformers' T5 or BART."""

    def t5(attn: Any) -> tuple[Any, Any, Any, Any, int]:
        return attn, attn.v.weight, None, attn.o.weight, attn.n_heads

    def bart(attn: Any) -> tuple[Any, Any, Any, Any, int]:
        return attn, attn.v_proj.weight, attn.v_proj.bias, attn.out_proj.weight, attn.num_heads

    if family == "t5":
        encoder, decoder = model.encoder.block, model.decoder.block
        return {
            "encoder": [t5(block.layer[0].SelfAttention) for block in encoder],
            "decoder": [t5(block.layer[0].SelfAttention) for block in decoder],
            "cross": [t5(block.layer[1].EncDecAttention) for block in decoder],
        }
    encoder, decoder = model.model.encoder.layers, model.model.decoder.layers
    return {
        "encoder": [bart(layer.self_attn) for layer in encoder],
        "decoder": [bart(layer.self_attn) for layer in decoder],
        "cross": [bart(layer.encoder_attn) for layer in decoder],
    }


def seq2seq_reference(family: str, directory: Path, result: Any) -> dict[str, torch.Tensor]:
    """{kind: f [L, H, keys, E]} from transformers' eager model fed our ids: each attention's value input
    as transformers passes it (key_value_states, the encoder's output, for cross attention)."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    modules = seq2seq_modules(family, model)
    seen: dict[str, list[torch.Tensor]] = {kind: [] for kind in modules}
    hooks = []
    for kind, layers in modules.items():
        for attn, *_ in layers:

            def keep(_m: Any, args: tuple, kwargs: dict, kind: str = kind) -> None:
                own = args[0] if args else kwargs["hidden_states"]
                values = kwargs.get("key_value_states") if kind == "cross" else own
                seen[kind].append(values)

            hooks.append(attn.register_forward_pre_hook(keep, with_kwargs=True))
    with torch.no_grad():
        model(
            input_ids=torch.tensor([result.token_ids]),
            decoder_input_ids=torch.tensor([result.target_ids]),
        )
    for hook in hooks:
        hook.remove()
    out = {}
    for kind, layers in modules.items():
        per_layer = []
        for x, (_, w_v, b_v, w_o, heads) in zip(seen[kind], layers, strict=True):
            v = x[0].double() @ w_v.double().t() + (0 if b_v is None else b_v.double())  # (keys, H·D)
            head_dim = w_o.shape[1] // heads
            w = w_o.double().view(w_o.shape[0], heads, head_dim)
            per_layer.append(torch.einsum("nhd,ehd->hne", v.view(-1, heads, head_dim), w))
        out[kind] = torch.stack(per_layer)
    return out


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoder_norms_cover_all_three_attentions(
    family: str, seq2seq_checkpoints: dict[str, Path]
) -> None:
    directory = seq2seq_checkpoints[family]
    result = load_pretrained(directory, device="cpu").attend(SOURCE, target=TARGET, norms=True)
    f = seq2seq_reference(family, directory, result)
    ours = {"encoder": result.norms, "decoder": result.decoder_norms, "cross": result.cross_norms}
    keys = {"encoder": result.n, "decoder": result.m, "cross": result.n}
    for kind, norms in ours.items():
        expected = f[kind].norm(dim=-1)
        assert norms.shape == expected.shape == (*expected.shape[:2], keys[kind]), kind
        width = 2 * f[kind].shape[-1]
        assert ((norms.double() - expected).abs() <= bound(expected, width)).all(), (family, kind)
    # Cross attention moves the source's values into the target's rows: its map is [L, H, m, n].
    moved = analysis.weight_norm_map(result.cross_attentions, result.cross_norms)
    assert moved.shape == result.cross_attentions.shape
    layer = analysis.layer_norm_map(result.cross_attentions, result.cross_value_products)
    assert layer.shape == (result.cross_attentions.shape[0], result.m, result.n)


# -- a trace keeps the norms: a long input's window weighted by norm ------------------------------------


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "gemma2"])
def test_a_trace_keeps_the_norms_and_its_windows_weigh_by_them(
    family: str, tiny_checkpoints: dict[str, Path]
) -> None:
    model = load_pretrained(tiny_checkpoints[family], device="cpu")
    result = model.attend(SENTENCE, norms=True)
    trace = model.trace(SENTENCE)
    expected = result.norms.double()
    width = 2 * model.network.config.embed_dim
    # Another path (a fused kernel, the norms from the vectors rather than their products): each norm
    # within the bound of test_norms_are_the_value_through_each_heads_slice_of_the_output, on either side.
    assert ((trace.norms.double() - expected).abs() <= 2 * bound(expected, width)).all()
    moved = analysis.weight_norm_map(result.attentions, result.norms).double()
    layer, head = 1, 2
    window = trace.window(layer, head, (2, 9), (0, result.n), weighting="norm").values.double()
    scale = expected.max()
    assert (window - moved[layer, head, 2:9]).abs().max() <= 2 * (bound(scale, width) + FORWARD * scale)
    # The weights' window is the plain one: weighting is a switch, not a second trace.
    plain = trace.window(layer, head, (2, 9), (0, result.n)).values.double()
    assert torch.allclose(window, plain * trace.norms[layer, head].double(), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="weighting must be"):
        trace.window(layer, head, weighting="size")
