"""The embedded all-MiniLM-L6-v2 in our layers gives exactly transformers' attention."""

from __future__ import annotations

import pytest
import torch

from mha import AttentionModel, load_pretrained
from mha.pretrained import default_model_path


@pytest.fixture(scope="module")
def ours() -> AttentionModel:
    return load_pretrained(device="cpu")


@pytest.fixture(scope="module")
def theirs() -> torch.nn.Module:
    from transformers import BertModel

    return BertModel.from_pretrained(str(default_model_path()), attn_implementation="eager").eval()


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("The cat sat on the mat.", None),
        ("The cat sat on the mat.", "It was happy there."),
        ("Ünïcödé — naïve café, 東京, emoji 🙂!", None),
    ],
)
def test_minilm_matches_transformers(
    ours: AttentionModel, theirs: torch.nn.Module, text: str, pair: str | None
) -> None:
    result = ours.attend(text, pair)
    with torch.no_grad():
        out = theirs(
            input_ids=torch.tensor([result.token_ids]),
            token_type_ids=torch.tensor([result.segments]),
            output_attentions=True,
        )
    expected = torch.stack(out.attentions)[:, 0]  # (L, H, n, n)
    assert result.attentions.shape == (6, 12, result.n, result.n)
    assert result.attentions.dtype == torch.float32 and result.attentions.is_contiguous()
    torch.testing.assert_close(result.attentions, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(result.hidden_state, out.last_hidden_state[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(result.attentions.sum(-1), torch.ones(6, 12, result.n), atol=1e-5, rtol=0)
    assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"
    assert result.segments[-1] == (1 if pair else 0)


def test_info_describes_the_default_model(ours: AttentionModel) -> None:
    info = ours.info
    assert (info.name, info.family, info.layers, info.heads, info.max_tokens) == (
        "all-MiniLM-L6-v2",
        "bert",
        6,
        12,
        512,
    )
    assert (info.causal, info.pretrained, info.device, info.dtype) == (False, True, "cpu", "float32")
