"""Non-finite weights or outputs never reach an answer (issue 33 item 4): what can be seen at load (a
weight holding NaN or an infinity, a NaN or negative epsilon, a rope base that is no positive number) is
refused there, naming it; a forward that overflows anyway is a NonFiniteOutputError naming the model, an
InputError the service answers with 422, and the corpus records such a text as an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from edited import edited, overflowing

from mha import load_pretrained
from mha.errors import CheckpointNotFoundError, InputError, NonFiniteOutputError, UnsupportedCheckpointError

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
