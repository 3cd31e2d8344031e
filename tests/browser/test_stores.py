"""The model menu grouped by where models come from (issue 34 item 5), in Chromium, on a server of its own
with stand-in ollama, LM Studio and Hugging Face stores and a models folder (tests/store_files.py): one
<optgroup> per source, each option with its family, parameters, quantization and size, a broken store
entry shown unavailable with its reason, the menu used by keyboard across groups, and a store model run."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf_files import write_gguf
from store_files import OLLAMA_MODEL, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model

from benchmarks.launch import health, serve
from mha.loading.gguf import folders as model_cache

pytestmark = pytest.mark.browser

LIBRARY = ("registry.ollama.ai", "library")
GROUPS = ["Bundled", "Models folder", "ollama", "LM Studio", "Hugging Face"]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoints: dict[str, Path], artifacts: Path
) -> Iterator[str]:
    """This module's own server: the built-in models, a models folder and the three stores, nothing else."""
    root = tmp_path_factory.mktemp("stores")
    folders = {name: root / name for name in ("ollama", "lmstudio", "hub", "models")}
    for folder in folders.values():
        folder.mkdir()
    tiny = write_gguf(tiny_checkpoints["llama"], root / "tiny.gguf", qtype="Q8_0")
    ollama_model(folders["ollama"], (*LIBRARY, "tiny", "q8"), tiny)
    ollama_manifest(
        folders["ollama"],
        (*LIBRARY, "escape", "latest"),
        [{"mediaType": OLLAMA_MODEL, "digest": "sha256:../x"}],
    )
    lmstudio_model(folders["lmstudio"], "pub", "Tiny-GGUF", "tiny-Q8_0.gguf", tiny)
    hf_snapshot(folders["hub"], "org/tiny-qwen2", tiny_checkpoints["qwen2"])
    shutil.copytree(tiny_checkpoints["gpt2"], folders["models"] / "mine")  # a link would lead outside it
    env = {
        "HEADSCOPE_DEVICE": "cpu",
        "HEADSCOPE_THREADS": "1",
        "HEADSCOPE_LOG_LEVEL": "warning",
        "HEADSCOPE_MODELS": json.dumps({}),
        "HEADSCOPE_MODELS_DIR": str(folders["models"]),
        "HEADSCOPE_DISCOVER": "true",  # tests/conftest.py turns it off for every other server
        "HEADSCOPE_OLLAMA_MODELS": str(folders["ollama"]),
        "HEADSCOPE_LMSTUDIO_MODELS": str(folders["lmstudio"]),
        "HEADSCOPE_HF_CACHE": str(folders["hub"]),
        "HEADSCOPE_BUNDLED_LLM": "false",
        model_cache.CACHE_ENV: str(root / "headscope-cache"),
    }
    with serve(env, log=artifacts / "stores-server.log", start_s=180) as running:
        # health says ok once the default has loaded; the checks that read the stores' headers run beside
        # that load, and the page shows what they read: wait until none is left
        deadline = time.monotonic() + 60
        while (health(running.base) or {}).get("checking", [None]) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield running.base


MENU_JS = """() => [...document.querySelectorAll('#model optgroup')].map((group) => [
  group.label,
  [...group.querySelectorAll('option')].map((o) => (
    {value: o.value, text: o.textContent, disabled: o.disabled, title: o.title})),
])"""


def test_the_menu_groups_models_by_source_with_their_facts(session: Any) -> None:
    page = session.open()
    page.wait_for_function("() => document.querySelectorAll('#model optgroup').length > 0")
    groups = dict(page.evaluate(MENU_JS))
    assert list(groups) == GROUPS
    assert [o["value"] for o in groups["Bundled"]] == ["all-MiniLM-L6-v2", "random"]
    minilm = groups["Bundled"][0]["text"]
    assert (
        minilm.startswith("all-MiniLM-L6-v2 — 6 layers × 12 heads")
        and "bert · 23 M params · F32 · 91 MB" in minilm
    )
    by_value = {o["value"]: o for members in groups.values() for o in members}
    tiny = by_value["tiny:q8"]
    assert tiny["text"].startswith("tiny:q8 — loads on first use · llama · ") and " · Q8_0 · " in tiny["text"]
    assert not tiny["disabled"]
    escape = by_value["escape:latest"]
    assert (
        escape["disabled"]
        and escape["text"].startswith("escape:latest — unavailable: ")
        and "loads on first use" not in escape["text"]
        and "sha256:<64 hex digits>" in escape["title"]
    )
    assert [o["value"] for o in groups["LM Studio"]] == ["pub/Tiny-GGUF/tiny-Q8_0"]
    assert [o["value"] for o in groups["Hugging Face"]] == ["org/tiny-qwen2"] and "qwen2 · " in groups[
        "Hugging Face"
    ][0]["text"]
    assert [o["value"] for o in groups["Models folder"]] == ["mine"]
    # B's menu is the same groups
    assert (
        page.evaluate("() => [...document.querySelectorAll('#model-b optgroup')].map((g) => g.label)")
        == GROUPS
    )
    assert not session.errors


def test_the_grouped_menu_works_by_keyboard_and_runs_a_store_model(session: Any) -> None:
    page = session.open()
    page.wait_for_function("() => document.querySelectorAll('#model optgroup').length > 0")
    page.select_option("#model", "random")  # the last of the first group
    page.focus("#model")
    page.keyboard.press("ArrowDown")  # into the next group, as a menu without groups moves
    assert page.input_value("#model") == "mine"
    page.keyboard.press("ArrowDown")
    assert page.input_value("#model") == "tiny:q8"
    page.keyboard.press("ArrowDown")  # the unavailable entry is skipped
    assert page.input_value("#model") == "pub/Tiny-GGUF/tiny-Q8_0"
    page.select_option("#model", "tiny:q8")
    page.fill("#text", "The cat sat on the mat.")
    page.evaluate("document.body.dataset.state = 'idle'")
    page.click("#run")
    # its first load reads the GGUF and builds its tokenizer (transformers' GGUF code imported then):
    # seconds alone, several times that on a loaded shared machine
    session.wait_ready(timeout_ms=180_000)
    assert "layers" in page.locator("#status").text_content()
    option = page.locator('#model option[value="tiny:q8"]').text_content()
    assert "layers ×" in option and " · Q8_0 · " in option  # its size too, now that it has loaded
    assert not session.errors
