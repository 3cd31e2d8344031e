"""Chat templates are untrusted code (issue 33 item 3): rendered by mha.text.chat in a worker process
that is stopped at a time limit, a memory cap or on cancel, its output bounded, every failure a
ChatTemplateError (an InputError) whose sentence names the template; the string otherwise is the one
transformers' apply_chat_template renders."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from mha.errors import Cancelled, ChatTemplateError, InputError
from mha.text import chat
from mha.text.chat import MAX_RENDERED_CHARS, render_chat

USER = [{"role": "user", "content": "hello <world> & {{ not a tag }}"}]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Real templates' features: the special tokens as variables, raise_exception, tojson, loop controls,
# namespace, strftime_now (its value is the date: only its presence is compared).
RICH = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
    "{% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('roles') }}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% if loop.index > 5 %}{% break %}{% endif %}"
    "[{{ m['role'] | upper }}] {{ m['content'] | tojson }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] ({{ ns.n }}){% endif %}"
)


def _tokenizer(template: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello world"], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    wrapped.chat_template = template
    return wrapped


@pytest.mark.parametrize("template", [CHATML, RICH], ids=["chatml", "rich"])
def test_rendered_as_transformers_renders_it(template: str) -> None:
    tokenizer = _tokenizer(template)
    expected = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert render_chat(template, USER, tokenizer.special_tokens_map) == expected
    plain = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=False)
    assert render_chat(template, USER, tokenizer.special_tokens_map, add_generation_prompt=False) == plain


# Each hostile template and the end of the sentence it must get. The bounds, not the sandbox, stop the
# first three; the rest are the template's own errors, which transformers raises raw.
HOSTILE = {
    "loop": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "took longer than",
    ),
    "output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "wrote more than"),
    "syntax": ("{% for %}", "is not valid Jinja"),
    "sandbox": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "the sandbox forbids"),
    "raise": ("{{ raise_exception('Roles must alternate') }}", "refused this input: Roles must alternate"),
    "overflow": ("{{ 'x' * 10**20 }}", "OverflowError"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed too deeply"),
    "range": ("{% for i in range(10**8) %}{% endfor %}", "MAX_RANGE"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_a_sentence_naming_it(name: str) -> None:
    template, says = HOSTILE[name]
    with pytest.raises(ChatTemplateError) as caught:
        render_chat(template, USER, {})
    message = str(caught.value)
    assert message.startswith("this model's chat template ") and says in message
    assert isinstance(caught.value, InputError)  # a 4xx in the service, never a 500
    assert "\n" not in message and len(message) < 400
    # It crosses processes whole (the corpus engine pickles errors).
    assert str(pickle.loads(pickle.dumps(caught.value))) == message
    # Whatever happened to the worker, the next render is right.
    assert render_chat(CHATML, USER, {}) == "<|im_start|>user\n" + USER[0]["content"] + "<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


def test_memory_is_capped() -> None:
    """A template that doubles a string without end fails in its worker (MemoryError, or the worker is
    stopped), not in the server: given time enough, the memory cap is what stops it."""
    doubling = (
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}"
    )
    with pytest.raises(ChatTemplateError, match="MiB of memory"):
        render_chat(doubling, USER, {}, seconds=60)


def test_a_render_is_stopped_when_its_caller_cancels() -> None:
    looping = HOSTILE["loop"][0]
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Cancelled):
        render_chat(looping, USER, {}, cancel=stop.is_set, seconds=600)
    assert render_chat(CHATML, USER, {}).endswith("assistant\n")


def test_renders_run_side_by_side_and_a_stuck_one_holds_no_other() -> None:
    """While one template loops, another render finishes: the pool has room for both. The loop is then
    cancelled, not left to its time limit: it spun a core for all of it (20 s), and the limit has tests of
    its own (test_a_hostile_template_is_a_sentence_naming_it[loop], and cancel's above)."""
    chat.prewarm()
    looping = HOSTILE["loop"][0]
    results: dict[str, object] = {}
    done = threading.Event()
    # Were the quick render held behind the loop, it would end only when the loop does: cancelled here at
    # the latest, and the quick render then fails the test rather than hang it.
    latest = time.monotonic() + 60

    def ended() -> bool:
        return done.is_set() or time.monotonic() > latest

    def stuck() -> None:
        try:
            render_chat(looping, USER, {}, cancel=ended, seconds=600)
        except Cancelled as error:
            results["stuck"] = error

    thread = threading.Thread(target=stuck)
    thread.start()
    time.sleep(0.2)
    results["quick"] = render_chat(CHATML, USER, {})  # done while the loop still runs
    assert "stuck" not in results and thread.is_alive()
    done.set()
    thread.join(timeout=60)
    assert isinstance(results.get("stuck"), Cancelled), results


def test_the_output_bound_is_the_module_constant() -> None:
    just = "{{ 'y' * " + str(MAX_RENDERED_CHARS) + " }}"
    assert len(render_chat(just, USER, {})) == MAX_RENDERED_CHARS
    with pytest.raises(ChatTemplateError, match="wrote more than"):
        render_chat("{{ 'y' * " + str(MAX_RENDERED_CHARS + 1) + " }}", USER, {})


def test_text_encoder_raises_the_mha_error_not_jinja() -> None:
    """Through TextEncoder (as load_pretrained's models use it): a ChatTemplateError, never a raw jinja2
    exception; a good template's rendering is cached per text."""
    from mha.text.tokenize import TextEncoder

    bad = _tokenizer("{{ raise_exception('no system prompt allowed') }}")
    encoder = TextEncoder(bad, vocab_size=len(bad), type_vocab_size=0, pair_template=False)
    with pytest.raises(ChatTemplateError, match="refused this input: no system prompt allowed"):
        encoder.encode_batch([("hello", None)], 64, chat=True)
    good = _tokenizer(CHATML)
    encoder = TextEncoder(good, vocab_size=len(good), type_vocab_size=0, pair_template=False)
    first = encoder.encode_batch([("hello", None)], 64, chat=True)[0]
    assert first.texts[0] == good.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert encoder.chat_text("hello") is encoder.chat_text("hello")  # the cached string
