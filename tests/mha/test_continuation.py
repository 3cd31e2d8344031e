"""attend(prompt, max_new_tokens=k): the greedy continuation equals transformers' generate(do_sample=False),
and the attention over prompt and continuation equals transformers' eager forward over the same ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import DECODER_FAMILIES
from tolerances import FORWARD

from mha import load_pretrained
from mha.errors import NotCausalError

PROMPT = "The cat sat on the mat. The dog"
CAUSAL = ("gpt2", *DECODER_FAMILIES)


@pytest.fixture(scope="module", params=CAUSAL)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_greedy_continuation_equals_generate(family: str, tiny_checkpoints: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_checkpoints[family]
    ours = load_pretrained(directory, device="cpu")
    result = ours.attend(PROMPT, max_new_tokens=8)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    theirs = AutoModelForCausalLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    batch = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        generated = theirs.generate(**batch, max_new_tokens=8, do_sample=False)
    assert result.token_ids == generated[0].tolist()
    prompt_n = batch["input_ids"].shape[1]
    assert result.prompt_n == prompt_n and result.generated == result.n - prompt_n >= 1
    assert result.offsets[prompt_n:] == [(0, 0)] * result.generated
    with torch.no_grad():
        reference = theirs(generated, output_attentions=True).attentions
    # Two float32 forwards over the same ids: FORWARD.
    torch.testing.assert_close(result.attentions, torch.stack(reference)[:, 0], atol=FORWARD, rtol=0)


def test_continuation_stops_at_end_of_sequence_and_at_the_limit(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_pretrained(tiny_checkpoints["llama"], device="cpu")
    free = model.attend(PROMPT, max_new_tokens=6)
    first = free.token_ids[free.prompt_n]
    eos, model.eos_ids = model.eos_ids, frozenset({first})  # the first token written now ends it
    stopped = model.attend(PROMPT, max_new_tokens=6)
    assert stopped.generated == 1 and stopped.token_ids[-1] == first
    model.eos_ids = eos
    limit = free.prompt_n + 2  # room for two new tokens only
    short = model.attend(PROMPT, max_new_tokens=6, max_tokens=limit)
    assert short.n == limit and short.generated == 2


def test_an_encoder_cannot_continue(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_pretrained(tiny_checkpoints["bert"], device="cpu")
    with pytest.raises(NotCausalError, match="encoder"):
        model.attend(PROMPT, max_new_tokens=3)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_chat_template_tokens_are_apply_chat_templates(
    family: str, tiny_checkpoints: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    directory = tiny_checkpoints[family]
    model = load_pretrained(directory, device="cpu")
    assert model.info.chat_template is True
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=True, add_generation_prompt=True
    )
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)  # BatchEncoding in v5
    result = model.attend(PROMPT, chat=True)
    assert result.token_ids == expected and result.token_ids.count(model.tokenizer.bos_token_id) <= 2
    rendered = result.texts[0]
    assert PROMPT in rendered and rendered != PROMPT
    # Offsets index into the rendered template: the prompt's tokens spell the prompt there.
    spans = [rendered[a:b] for (a, b), sp in zip(result.offsets, result.special, strict=True) if not sp]
    assert PROMPT.split()[1] in "".join(spans)
    continued = model.attend(PROMPT, chat=True, max_new_tokens=3)
    assert continued.token_ids[: continued.prompt_n] == expected


def test_chat_refused_clearly_without_a_template_or_with_a_pair(tiny_checkpoints: dict[str, Path]) -> None:
    from mha.errors import ChatPairError, NoChatTemplateError

    mistral = load_pretrained(tiny_checkpoints["mistral"], device="cpu")
    assert mistral.info.chat_template is False
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        mistral.attend(PROMPT, chat=True)
    with pytest.raises(ChatPairError, match="one user turn"):
        load_pretrained(tiny_checkpoints["llama"], device="cpu").attend(PROMPT, "and a pair", chat=True)
