"""Non-finite weights or outputs never reach an answer (issue 33 item 4): what can be seen at load (a
weight holding NaN or an infinity, a NaN or negative epsilon, a rope base that is no positive number) is
refused there, naming it; a forward that overflows anyway is a NonFiniteOutputError naming the model, an
InputError the service answers with 422, and the corpus records such a text as an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import FAMILIES
from edited import edited, overflowing

from mha import load_pretrained
from mha._finite import all_finite, refuse_non_finite, softmax_rows
from mha.core.attention import attention_weights
from mha.errors import CheckpointNotFoundError, InputError, NonFiniteOutputError, UnsupportedCheckpointError
from mha.model import attention_model
from mha.networks.result import AttentionResult

TEXT = "The cat sat on the mat."


def test_a_weight_holding_nan_is_refused_at_load_by_name(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    def poison(tensors: dict[str, torch.Tensor]) -> None:
        norm = next(name for name in tensors if name.endswith("input_layernorm.weight"))
        tensors[norm][3] = float("nan")
        tensors[norm][5] = float("inf")

    folder = edited(tiny_checkpoints["llama"], tmp_path / "nan", weights=poison)
    with pytest.raises(CheckpointNotFoundError, match=r"weight layers\.0\..* holds 2 NaN or infinite values"):
        load_pretrained(folder)


@pytest.mark.parametrize("eps", [float("nan"), -1e-5])
def test_a_nan_or_negative_epsilon_is_refused(
    eps: float, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    def edit(data: dict) -> None:  # type: ignore[type-arg]
        data["rms_norm_eps"] = eps

    folder = edited(tiny_checkpoints["llama"], tmp_path / "eps", config=edit)
    with pytest.raises(ValueError, match=r"layer_norm_eps \((nan|-1e-05)\) must be a finite number >= 0"):
        load_pretrained(folder)


@pytest.mark.parametrize("theta", [float("nan"), -10000.0])
def test_a_rope_base_that_is_no_positive_number_is_refused(
    theta: float, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    def edit(data: dict) -> None:  # type: ignore[type-arg]
        data["rope_parameters"]["rope_theta"] = theta

    folder = edited(tiny_checkpoints["llama"], tmp_path / "rope", config=edit)
    with pytest.raises(UnsupportedCheckpointError, match="rope base"):
        load_pretrained(folder)


def test_a_forward_that_overflows_names_the_model(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model = load_pretrained(overflowing(tiny_checkpoints["llama"], tmp_path / "huge"), name="huge")
    with torch.no_grad():  # the premise: its maps do hold NaN
        assert not torch.isfinite(
            model.forward_padded([model.encoder.encode_batch([(TEXT, None)], 64)[0]])[0]
        ).all()
    for call in (
        lambda: model.attend(TEXT),
        lambda: model.attend_batch([TEXT, "Another one."]),
        lambda: model.attend(TEXT, max_new_tokens=2),
    ):
        with pytest.raises(
            NonFiniteOutputError, match="'huge' computed NaN or an infinity in its attention"
        ) as caught:
            call()
        assert isinstance(caught.value, InputError)


def test_a_corpus_records_the_text_as_an_error(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from mha.corpus import CorpusWorker

    model = load_pretrained(overflowing(tiny_checkpoints["llama"], tmp_path / "huge"), name="huge")
    worker = CorpusWorker(model, max_tokens=64)
    table = worker(
        {"line": [0, 1], "id": ["a", "b"], "text": [TEXT, "Another one."], "text_pair": [None, None]}
    )
    rows = table.to_pylist()
    assert all("computed NaN or an infinity" in row["error"] and row["n_tokens"] == 0 for row in rows)
    assert all(all(label == -1 for label in row["label"]) for row in rows)


def test_a_trace_that_overflows_names_the_model(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """The forward's kept q, k, log-sum-exp and norms are checked before the trace is returned: one whose
    scores overflow is refused, so no overview, window or row is ever read from it."""
    model = load_pretrained(overflowing(tiny_checkpoints["llama"], tmp_path / "huge"), name="huge")
    for overview_size in (None, 4):
        with pytest.raises(NonFiniteOutputError, match="'huge' computed NaN or an infinity in its trace"):
            model.trace(TEXT, overview_size=overview_size)


def test_a_trace_read_that_overflows_names_the_model(tiny_checkpoints: dict[str, Path]) -> None:
    """A window, row or overview recomputed from kept values is checked too (its scores are summed in
    another order than the forward's): a trace whose kept log-sum-exp is made -inf here, so that every
    weight exp(score - lse) it recomputes is infinite, refuses each."""
    model = load_pretrained(tiny_checkpoints["llama"], name="tiny")
    trace = model.trace(TEXT)
    trace.layers[0].lse.fill_(float("-inf"))
    for read in (
        lambda: trace.window(0, 0),
        lambda: trace.window(0, 0, weighting="norm"),
        lambda: trace.row(0, 0, 2),
        lambda: trace.overview(size=3, reduce="mean"),
    ):
        with pytest.raises(NonFiniteOutputError, match="'tiny' computed NaN or an infinity in its trace"):
            read()


# --- the cheap check (issue 48 item 4): sums and one weight a row, never a mask of every value ----------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("keys", [1, 7, 16, 33, 512])  # below, at and past a vector's width: every tail
def test_a_softmax_row_is_finite_or_nan_whole(dtype: torch.dtype, keys: int) -> None:
    """softmax_rows' premise, on this machine's kernels: a NaN or +inf score, or a row of -inf, makes every
    weight of its row NaN (the first one too), wherever it sits; a -inf among finite scores is an exact 0."""
    scores = torch.randn(6, keys, generator=torch.Generator().manual_seed(keys)).to(dtype)
    last = keys - 1
    scores[0, last] = float("nan")
    scores[1, last // 2] = float("inf")
    scores[2] = float("-inf")
    scores[3, last] = float("-inf")
    scores[4, 0] = float("nan")
    weights = torch.softmax(scores, dim=-1)
    assert weights[[0, 1, 2, 4]].isnan().all()
    if keys > 1:
        assert weights[3].isfinite().all() and weights[3, last] == 0
    assert weights[5].isfinite().all()
    assert not all_finite([softmax_rows(weights[[0, 3, 5]])])


def test_a_masked_softmax_row_is_finite_or_nan_whole() -> None:
    """The same through the core's two masking paths (a fill before the softmax, and the mask as the GEMM's
    additive bias) and its soft-cap: a NaN in q makes its rows NaN whole; a row with no key kept stays 0."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    q[0, 1, 3, 2] = float("nan")
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padded = causal.clone()
    padded[0] = False  # query 0 keeps no key
    with torch.no_grad():
        for keep, softcap in ((causal, None), (causal, 30.0), (padded.expand(1, 2, 5, 5), None)):
            weights = attention_weights(q, k, keep, scale=0.5, softcap=softcap)
            bad = torch.zeros(1, 2, 5, dtype=torch.bool)
            bad[0, 1, 3] = bool(keep[..., 3, :].any())
            assert torch.equal(weights.isnan().all(-1), bad) and torch.equal(weights.isnan().any(-1), bad)
            assert torch.equal(softmax_rows(weights)[..., 0].isnan(), bad)


def test_finite_values_whose_sum_overflows_are_not_refused() -> None:
    """A sum overflows for finite values too (two of 3e38 in float32, 4 x 60,000 in float16): then each
    value is looked at, and only a real NaN or infinity refuses."""
    big = torch.full((2,), 3e38)
    half = torch.full((4,), 60000.0, dtype=torch.float16)
    assert all_finite([big, half, torch.tensor([1e300], dtype=torch.float64)])
    assert not all_finite([big, torch.tensor([1.0, float("-inf")])])
    assert not all_finite([torch.tensor([float("nan")], dtype=torch.bfloat16)])
    refuse_non_finite("tiny", {"its attention": [big]})
    with pytest.raises(NonFiniteOutputError, match="'tiny' computed NaN or an infinity in its hidden state"):
        refuse_non_finite("tiny", {"its attention": [big], "its hidden state": [big, big.log() / 0]})


def _poison(network: torch.nn.Module, where: str) -> None:
    """A NaN or an infinity put into the loaded tiny Llama's weights (after load_pretrained's own check)."""
    layers = network.layers
    with torch.no_grad():
        if where == "inf scores":  # every query and key weight x 1e30: scores overflow float32
            for layer in layers:
                q_k = sum(layer.attn.widths[:2])
                layer.attn.in_proj.weight[:q_k] *= 1e30
        elif where == "first norm":
            layers[0].attn_norm.weight[3] = float("nan")
        elif where == "first values":
            layers[0].attn.in_proj.weight[sum(layers[0].attn.widths[:2])] = float("nan")
        elif where == "last values":
            layers[-1].attn.in_proj.weight[sum(layers[-1].attn.widths[:2])] = float("inf")
        elif where == "hidden state":  # the final norm: the hidden state alone, after every attention
            network.final_norm.weight[0] = float("nan")


# What each poison reaches: (attend(hidden_state=False), attend() and the others that return a hidden
# state, attend(hidden_state=False, norms=True), a trace); None: nothing an answer holds, which is answered.
REACHES = {
    "inf scores": ("its attention", "its attention", "its attention", "its trace"),
    "first norm": ("its attention", "its attention", "its attention", "its trace"),
    "first values": ("its attention", "its attention", "its attention", "its trace"),
    "last values": (None, "its hidden state", "its value norms", "its trace"),  # its norms are kept
    "hidden state": (None, "its hidden state", None, None),  # a trace stops before the final norm
}


@pytest.mark.parametrize("where", list(REACHES))
def test_a_nan_or_infinity_put_anywhere_is_refused_where_an_answer_holds_it(
    where: str, tiny_checkpoints: dict[str, Path]
) -> None:
    """Each poison is refused by every call whose answer it reaches, naming what holds it, and every other
    call answers with nothing but finite values."""
    model = load_pretrained(tiny_checkpoints["llama"], name="tiny")
    _poison(model.network, where)
    blind, whole, norms, traced = REACHES[where]
    calls = [
        (blind, lambda: [model.attend(TEXT, hidden_state=False)]),
        (whole, lambda: [model.attend(TEXT)]),
        (whole, lambda: model.attend_batch([TEXT, "Another one."])),
        (whole, lambda: [model.attend(TEXT, max_new_tokens=2)]),
        (norms, lambda: [model.attend(TEXT, hidden_state=False, norms=True)]),
    ]
    for what, call in calls:
        if what is None:
            for result in call():
                held = [result.attentions, result.hidden_state, result.value_products]
                assert all(torch.isfinite(t).all() for t in held if t is not None)
            continue
        with pytest.raises(NonFiniteOutputError, match=f"'tiny' computed NaN or an infinity in {what} "):
            call()
    if traced is None:
        trace = model.trace(TEXT)
        assert all(
            torch.isfinite(t).all() for t in (trace.norms, trace.overview().values, trace.row(0, 0, 3))
        )
    else:
        with pytest.raises(NonFiniteOutputError, match=f"'tiny' computed NaN or an infinity in {traced}"):
            model.trace(TEXT)


@pytest.mark.parametrize("family", [*FAMILIES, "t5", "bart", "marian"])
def test_the_cheap_check_refuses_exactly_what_the_whole_check_would(
    family: str,
    tiny_checkpoints: dict[str, Path],
    seq2seq_checkpoints: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """For one NaN, then one infinity, in each weight of every family's first and last layers (an
    encoder-decoder's: both stacks', cross attention's too): an answer is refused exactly when, unchecked,
    it would hold NaN or an infinity (torch.isfinite over all of it)."""
    model = load_pretrained({**tiny_checkpoints, **seq2seq_checkpoints}[family], name="tiny")
    names = [n for n, _ in model.network.named_parameters() if _first_or_last(n, model.network)]
    asks: list[dict[str, Any]] = [{"hidden_state": False}, {"hidden_state": True, "norms": True}]
    if model.info.seq2seq:  # a target given: forced decoding, no greedy writing a forward a token
        asks = [{**ask, "target": "Le chat."} for ask in asks]
    for name in names:
        weight = model.network.get_parameter(name)
        kept = weight.detach().clone()
        for value in (float("nan"), float("inf")):
            with torch.no_grad():
                weight[torch.unravel_index(torch.tensor(weight.numel() // 2), weight.shape)] = value
            for ask in asks:
                with monkeypatch.context() as unchecked:
                    unchecked.setattr(attention_model, "refuse_non_finite_answer", lambda *_: None)
                    raw = model.attend(TEXT, **ask)
                finite = all(bool(torch.isfinite(t).all()) for t in _held(raw))
                try:
                    model.attend(TEXT, **ask)
                    refused = False
                except NonFiniteOutputError:
                    refused = True
                assert refused == (not finite), (name, value, ask)
        with torch.no_grad():
            weight.copy_(kept)


def _first_or_last(name: str, network: torch.nn.Module) -> bool:
    """Whether parameter `name` is outside the layers or in a stack's first or last layer."""
    parts = name.split(".")
    if "layers" not in parts:
        return True
    at = parts.index("layers")
    stack = network.get_submodule(".".join(parts[: at + 1]))
    return int(parts[at + 1]) in (0, len(stack) - 1)


def _held(result: AttentionResult) -> list[torch.Tensor]:
    """Every tensor an answer holds (an encoder-decoder's decoder and cross attention's too)."""
    names = ("attentions", "hidden_state", "value_products", "decoder_attentions", "cross_attentions")
    names += ("decoder_hidden_state", "decoder_value_products", "cross_value_products")
    return [t for t in (getattr(result, n, None) for n in names) if t is not None]
