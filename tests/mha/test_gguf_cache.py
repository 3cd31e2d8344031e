"""The cache of GGUF files' configs and tokenizers (mha.loading.gguf.cache, in mha.loading.gguf.folders):
used on the second load, keyed by the header's content, never trusting a write that did not finish, and
written into a temporary folder where it cannot be written. It holds no tensor: those are read from the
file at each load."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from gguf_files import write_gguf
from spies import record_calls

from mha import load_pretrained
from mha.loading.gguf import CACHE_KIND, header_digest
from mha.loading.gguf import cache as gguf_cache
from mha.loading.gguf import folders as cache

TEXT = "The cat sat on the mat."
TIMEOUT_S = 120  # a bound on a wait that must end, so a broken lock fails the test instead of hanging it


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for the test, and no fallback folder remembered in this process (as in a fresh one)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(folder))
    monkeypatch.setattr(cache, "_fallbacks", {})
    return folder


@pytest.fixture(scope="module")
def llama_gguf(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gguf-cache")
    return write_gguf(tiny_checkpoints["llama"], folder / "tiny.gguf", qtype="Q8_0")


def _conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records every reading of a file's config and tokenizer (gguf_cache._read) from here on."""
    return record_calls(monkeypatch, gguf_cache, "_read")


def test_the_second_load_reads_the_cache_and_hashes_nothing(
    llama_gguf: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversions = _conversions(monkeypatch)
    first = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    digest = header_digest(llama_gguf)
    folder = cache_dir / CACHE_KIND / digest
    written = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "gguf_names.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "gguf.json",
    } <= written
    assert not {"model.safetensors", "pytorch_model.bin"} & written  # no tensor: read from the file itself
    assert "chat_template.jinja" in written  # the tiny Llama's chat template, kept
    monkeypatch.setattr(cache, "_fallbacks", {})  # a fresh process: only the cache on disk remains

    def no_hashing(*_: object) -> None:
        raise AssertionError("hashed again")

    monkeypatch.setattr(hashlib, "file_digest", no_hashing)  # no whole file is hashed
    again = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    assert conversions == [llama_gguf]
    assert (again == first).all()


def test_the_cache_is_keyed_by_the_headers_content(
    llama_gguf: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything the folder holds comes from the header: a renamed copy finds it, and new tensor bytes under
    the same header find it too (and are the ones the model holds)."""
    conversions = _conversions(monkeypatch)
    first = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(llama_gguf, copy)
    assert load_pretrained(copy, device="cpu").info.name == "renamed"
    assert len(conversions) == 1  # the same header: the same folder

    data = bytearray(copy.read_bytes())
    norm = _tensor_span(copy, "blk.0.attn_norm.weight")
    data[norm] = bytes(len(data[norm]))  # the first layer's norm weights all 0 (F32 zeros)
    copy.write_bytes(bytes(data))
    changed = load_pretrained(copy, device="cpu").attend(TEXT).attentions
    assert len(conversions) == 1
    assert not torch.allclose(changed, first)  # the tensors come from the file, not from the cache


def test_a_header_changed_in_place_is_read_again(
    llama_gguf: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with its size and mtime as they were (cp -p, rsync -t, touch -d): keyed by the header's bytes."""
    conversions = _conversions(monkeypatch)
    copy = tmp_path / "edited.gguf"
    shutil.copy(llama_gguf, copy)
    load_pretrained(copy, device="cpu")
    data = bytearray(copy.read_bytes())
    before = copy.stat()
    at = bytes(data).index(b"tiny")  # general.name, in the header
    data[at : at + 4] = b"tinz"
    with copy.open("r+b") as f:
        f.write(bytes(data))
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (copy.stat().st_size, copy.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    load_pretrained(copy, device="cpu")
    assert conversions == [copy, copy]
    assert len(list((cache_dir / CACHE_KIND).iterdir())) == 2


def _tensor_span(file: Path, name: str) -> slice:
    from gguf import GGUFReader

    tensor = next(t for t in GGUFReader(file).tensors if t.name == name)
    return slice(int(tensor.data_offset), int(tensor.data_offset) + int(tensor.n_bytes))


def test_an_interrupted_write_leaves_nothing_trusted(
    llama_gguf: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep = gguf_cache._keep_config

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C or a kill would stop it, mid-write

    monkeypatch.setattr(gguf_cache, "_keep_config", killed)
    with pytest.raises(KeyboardInterrupt):
        load_pretrained(llama_gguf, device="cpu")
    assert list((cache_dir / CACHE_KIND).iterdir()) == []  # the temporary folder went with it

    # A writer killed outright (SIGKILL) leaves its temporary folder: it is never read, and removed.
    digest = header_digest(llama_gguf)
    abandoned = cache_dir / CACHE_KIND / f".tmp-{digest}-999999999-x"
    abandoned.mkdir()
    (abandoned / "config.json").write_text("{}")
    monkeypatch.setattr(gguf_cache, "_keep_config", keep)
    model = load_pretrained(llama_gguf, device="cpu")
    assert model.attend(TEXT).n > 0
    assert sorted(p.name for p in (cache_dir / CACHE_KIND).iterdir()) == [digest]


def test_a_damaged_cache_entry_is_converted_again(
    llama_gguf: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    conversions = _conversions(monkeypatch)
    expected = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    names = cache_dir / CACHE_KIND / header_digest(llama_gguf) / "gguf_names.json"
    names.write_bytes(names.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="mha.loading.gguf.cache"):
        again = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    assert len(conversions) == 2
    assert "is unusable" in caplog.text
    assert (again == expected).all()


def test_an_unwritable_cache_converts_in_a_temporary_folder_with_one_warning(
    llama_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Under a file, no folder can be made, whoever runs the test (root ignores permission bits).
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(cache, "_fallbacks", {})
    conversions = _conversions(monkeypatch)
    with caplog.at_level(logging.WARNING):
        first = load_pretrained(llama_gguf, device="cpu")
        second = load_pretrained(llama_gguf, device="cpu")  # the same process reuses its folder
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "not writable" in warnings[0].getMessage() and cache.CACHE_ENV in warnings[0].getMessage()
    assert len(conversions) == 1
    assert (first.attend(TEXT).attentions == second.attend(TEXT).attentions).all()
    folder = cache.cached_folder(CACHE_KIND, header_digest(llama_gguf))
    assert folder is not None and os.path.commonpath([folder, tmp_path]) != str(tmp_path)


def test_two_files_convert_at_once_and_one_file_once(
    llama_gguf: Path,
    tiny_checkpoints: dict[str, Path],
    tmp_path: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33 item 2: a lock per file, not per process. While one file's conversion is held mid-way
    (inside its shared readings, holding its lock), another file converts to the end; a second load of the
    held file waits for it and converts nothing again."""
    import gguf

    other = write_gguf(tiny_checkpoints["qwen2"], tmp_path / "other.gguf", qtype="Q8_0")
    own_reader = gguf.GGUFReader
    read_once = gguf_cache._read_once
    held, release = threading.Event(), threading.Event()
    conversions = _conversions(monkeypatch)

    def holding(file: Path, *rest: object) -> object:
        read = read_once(file, *rest)  # the real reading, its stand-ins in place
        if file == llama_gguf:
            held.set()
            release.wait()  # held until the other file is done
        return read

    monkeypatch.setattr(gguf_cache, "_read_once", holding)
    with ThreadPoolExecutor(3) as pool:
        try:
            first = pool.submit(load_pretrained, llama_gguf, device="cpu")
            assert held.wait(TIMEOUT_S), "the first conversion never started"
            again = pool.submit(load_pretrained, llama_gguf, device="cpu")  # waits on the file's own lock
            # converted while the first file's lock is held (a process-wide lock would time out here)
            model = pool.submit(load_pretrained, other, device="cpu").result(timeout=TIMEOUT_S)
            assert not first.done() and model.attend(TEXT).n > 0
        finally:
            release.set()
        a, b = first.result(), again.result()
    assert (a.attend(TEXT).attentions == b.attend(TEXT).attentions).all()
    assert conversions == [llama_gguf, other]  # the held file converted once, the second load cached
    assert gguf.GGUFReader is own_reader  # gguf's own reader back once no conversion runs


def test_a_load_reads_the_header_once_cold_or_warm(
    llama_gguf: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: one walk over the header a load (mha.loading.gguf.bounds.walk, the one reader of it),
    whether the config and tokenizer are read into the cache then (cold) or found there (warm); the Header
    it gives is handed on to the cache, the weights and the checks. A warm load reads the file through no
    other GGUF reader either."""
    import gguf
    from transformers.integrations import gguf as transformers_gguf

    from mha.loading.gguf import bounds

    conversions = _conversions(monkeypatch)
    walks = record_calls(monkeypatch, bounds, "walk")
    cold = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    assert walks == [llama_gguf] and conversions == [llama_gguf]

    def no_reader(*_: object, **__: object) -> None:
        raise AssertionError("the file read by another GGUF reader")

    walks.clear()
    with monkeypatch.context() as patched:
        patched.setattr(gguf, "GGUFReader", no_reader)
        patched.setattr(transformers_gguf.GgufHeader, "from_file", no_reader)
        patched.setattr(transformers_gguf, "read_gguf_metadata", no_reader)
        warm = load_pretrained(llama_gguf, device="cpu").attend(TEXT).attentions
    assert walks == [llama_gguf] and conversions == [llama_gguf]  # cached: not read into it again
    assert (warm == cold).all()
