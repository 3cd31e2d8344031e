"""`weighting: "norm"` (weight × value norm, issue 25): every answer's maps become each row's shares of
α_ij ‖f_h(x_j)‖, with the row totals beside them, worked out here from mha's own result independently of
the service's code path (mha.analysis.norms on attend(..., norms=True))."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from tolerances import FORWARD, ROUND6, U32

import mha
from app import compact
from app.main import create_app
from app.settings import Settings
from mha import analysis
from tests.app.started import serving

TEXT = "The cat sat on the mat because it was warm."
NORM = {"text": TEXT, "weighting": "norm"}


@pytest.fixture(scope="module")
def expected() -> tuple[torch.Tensor, torch.Tensor]:
    """(shares [L, H, n, n], totals [L, H, n]) of MiniLM on TEXT, in float64 from mha's own norms."""
    result = mha.load_pretrained(device="cpu").attend(TEXT, norms=True)
    moved = analysis.weight_norm_map(result.attentions.double(), result.norms.double())
    return moved / moved.sum(-1, keepdim=True), moved.sum(-1)


# A share is a ratio of two float32 sums of n terms of size <= the row's total: each within n·u relative
# (float32_sum), so the ratio within 2·n·u; the forward itself runs the same code as the reference here.
def share_bound(n: int) -> float:
    return 2 * n * U32 + FORWARD


def test_norm_maps_are_row_shares_with_their_totals(
    client: TestClient, expected: tuple[torch.Tensor, torch.Tensor]
) -> None:
    shares, totals = expected
    body = client.post("/api/attention", json=NORM).json()
    assert body["weighting"] == "norm"
    got = np.asarray(body["attention"])
    n = body["n"]
    assert np.abs(got - shares.numpy()).max() <= share_bound(n) + ROUND6
    assert np.abs(got.sum(-1) - 1).max() <= n * ROUND6 + share_bound(n)
    rows = np.asarray(body["row_norms"])
    assert np.abs(rows - totals.numpy()).max() <= (share_bound(n) + ROUND6) * totals.max().item()
    # Another picture than the weights: [CLS] and [SEP] draw weight but move little (Kobayashi et al.).
    weights = np.asarray(client.post("/api/attention", json={"text": TEXT}).json()["attention"])
    assert "weighting" not in client.post("/api/attention", json={"text": TEXT}).json()
    special = [0, n - 1]
    assert got[..., special].sum() < weights[..., special].sum()


def test_one_head_json_and_binary_carry_the_same_shares_and_totals(client: TestClient) -> None:
    head = {**NORM, "layer": 2, "head": 5}
    as_json = client.post("/api/attention/head", json=head).json()
    header, values = compact.decode(client.post("/api/attention/head/compact", json=head).content)
    assert as_json["weighting"] == header["weighting"] == "norm"
    assert np.array_equal(values[0, 0], np.asarray(as_json["attention"], dtype=np.float32))  # both exact
    assert header["row_norms"] == as_json["row_norms"]
    full = client.post("/api/attention", json=NORM).json()
    assert np.abs(np.asarray(as_json["row_norms"]) - np.asarray(full["row_norms"][2][5])).max() <= ROUND6


def test_statistics_and_grid_follow_the_weighting(
    client: TestClient, expected: tuple[torch.Tensor, torch.Tensor]
) -> None:
    shares, _ = expected
    answer = client.post("/api/analysis", json=NORM).json()
    stats = answer["stats"]
    plain = client.post("/api/analysis", json={"text": TEXT}).json()["stats"]
    tokens = answer["tokens"]
    special = [t in ("[CLS]", "[SEP]") for t in tokens]
    reference = analysis.head_stats(shares.float(), tokens, special=special, causal=False)
    for name in ("entropy", "special", "previous"):
        got, want = np.asarray(stats[name]), reference[name].numpy()
        # The statistics are sums over a row of the shares: n terms, each within share_bound.
        assert np.abs(got - want).max() <= 12 * share_bound(12) + ROUND6, name
    assert stats["special"] != plain["special"]
    header, values = compact.decode(
        client.post("/api/attention/compact?scheme=abs-uint8-key-major", json=NORM).content
    )
    assert header["weighting"] == "norm"
    assert np.abs(values - shares.numpy()).max() <= header["quantization"]["max_abs_error"] + share_bound(12)


def test_words_take_the_norm_shares_without_totals(client: TestClient) -> None:
    body = client.post("/api/attention", json={**NORM, "words": True}).json()
    assert body["weighting"] == "norm" and "row_norms" not in body
    assert np.abs(np.asarray(body["attention"]).sum(-1) - 1).max() <= 1e-4  # merged shares still sum to 1


@pytest.fixture(scope="module")
def seq2seq_client(
    seq2seq_checkpoints: dict[str, Path], make_settings: Callable[..., Settings]
) -> Iterator[TestClient]:
    with serving(create_app(make_settings(models={"t5": seq2seq_checkpoints["t5"]}))) as client:
        yield client


def test_an_encoder_decoder_weighs_all_three_attentions(
    seq2seq_client: TestClient, seq2seq_checkpoints: dict[str, Path]
) -> None:
    source = {"text": "The house is wonderful.", "target": "Das Haus ist wunderbar.", "model": "t5"}
    result = mha.load_pretrained(seq2seq_checkpoints["t5"], device="cpu").attend(
        source["text"], target=source["target"], norms=True
    )
    body = seq2seq_client.post("/api/attention", json={**source, "weighting": "norm"}).json()
    assert body["weighting"] == "norm"
    pairs = {
        "attention": (result.attentions, result.norms),
        "decoder_attentions": (result.decoder_attentions, result.decoder_norms),
        "cross_attentions": (result.cross_attentions, result.cross_norms),
    }
    for field, (weights, norms) in pairs.items():
        moved = analysis.weight_norm_map(weights.double(), norms.double())
        shares = moved / moved.sum(-1, keepdim=True)
        got = np.asarray(body[field])
        assert got.shape == shares.shape, field
        assert np.abs(got - shares.numpy()).max() <= share_bound(got.shape[-1]) + ROUND6, field
    # One cross head: its rows' totals are what the head moves from the source into each target token.
    head = {**source, "weighting": "norm", "kind": "cross", "layer": 1, "head": 2}
    answer = seq2seq_client.post("/api/attention/head", json=head).json()
    moved = analysis.weight_norm_map(result.cross_attentions.double(), result.cross_norms.double())[1, 2]
    totals = moved.sum(-1).numpy()
    assert np.abs(np.asarray(answer["row_norms"]) - totals).max() <= share_bound(result.n) * totals.max()
    header, sections = compact.decode_sections(
        seq2seq_client.post("/api/attention/compact", json={**source, "weighting": "norm"}).content
    )
    assert header["weighting"] == "norm"
    bound = header["quantization"]["max_abs_error"] + share_bound(result.n)
    assert np.abs(sections["cross"] - np.asarray(body["cross_attentions"])).max() <= bound + ROUND6


def test_the_first_view_does_not_pay_for_the_norms(client: TestClient) -> None:
    text = "A text asked with weights first, then by norm."
    source = ("all-MiniLM-L6-v2", text, None, None, False, None, None)
    service = client.app.state.service  # type: ignore[attr-defined]
    client.post("/api/attention/compact", json={"text": text})
    assert service.answers.cache.get(("result", *source)).norms is None  # a forward without the products
    assert service.answers.cache.get(("result.norms", *source)) is None
    client.post("/api/attention/compact", json={"text": text, "weighting": "norm"})
    assert service.answers.cache.get(("result.norms", *source)).norms is not None
    # Another text asked by norm first: its weights then come from that forward, not a second one.
    other = "Norm first, then weights."
    client.post("/api/analysis", json={"text": other, "weighting": "norm"})
    client.post("/api/analysis", json={"text": other})
    assert (
        service.answers.cache.get(("result", "all-MiniLM-L6-v2", other, None, None, False, None, None))
        is None
    )
