"""The models folder's scan and the one table of sources (mha.loading.sources): the one rule for links in
a folder the operator names, and every source scanned once into one precedence. Stand-in folders in tmp,
never the machine's own."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hostile_stores import lay_out
from store_files import lmstudio_model

from mha.loading import sources
from mha.loading.sources import Bundled, scan_models_folder, scan_sources


def test_scan_models_folder_registers_folders_with_config(tmp_path: Path) -> None:
    (tmp_path / "bert-tiny").mkdir()
    (tmp_path / "bert-tiny" / "config.json").write_text("{}")
    (tmp_path / "no-config").mkdir()
    (tmp_path / "file.json").write_text("{}")
    assert scan_models_folder(tmp_path).found == {"bert-tiny": tmp_path / "bert-tiny"}
    assert scan_models_folder(tmp_path).refused == {}
    with pytest.raises(ValueError, match="not a directory"):
        scan_models_folder(tmp_path / "file.json")


def test_scan_models_folder_names_what_it_refuses_and_follows_links_only_inside(tmp_path: Path) -> None:
    """Issue 33 item 6: every *.gguf entry that is not a regular file inside the folder is listed with its
    reason and never opened; links are followed only where they resolve inside the folder."""
    import os

    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    elsewhere.mkdir()
    (models / "real.gguf").write_bytes(b"GGUF")
    (models / "inside.gguf").symlink_to(models / "real.gguf")
    (elsewhere / "far.gguf").write_bytes(b"GGUF")
    (models / "far.gguf").symlink_to(elsewhere / "far.gguf")
    (elsewhere / "far-folder").mkdir()
    (elsewhere / "far-folder" / "config.json").write_text("{}")
    (models / "far-folder").symlink_to(elsewhere / "far-folder")
    os.mkfifo(models / "pipe.gguf")
    (models / "zero.gguf").symlink_to("/dev/zero")
    (models / "gone.gguf").symlink_to(models / "missing.gguf")
    (models / "folder.gguf").mkdir()
    scan = scan_models_folder(models)
    assert scan.found == {"inside": models / "inside.gguf", "real": models / "real.gguf"}
    assert set(scan.refused) == {"far", "far-folder", "pipe", "zero", "gone", "folder"}
    assert "outside the models folder" in scan.refused["far"] and "HEADSCOPE_MODELS" in scan.refused["far"]
    assert "outside the models folder" in scan.refused["far-folder"]
    assert scan.refused["pipe"] == "'pipe.gguf' is a FIFO, not a GGUF file"
    assert "'/dev/zero', outside the models folder" in scan.refused["zero"]
    assert "does not exist" in scan.refused["gone"]
    assert scan.refused["folder"] == "'folder.gguf' is a folder, not a GGUF file"


def test_a_hostile_models_folder_costs_only_its_broken_entries(
    tmp_path: Path, tiny_checkpoints: dict[str, Path]
) -> None:
    """Issue 48 (E2, E7): a link loop, a chain of links too long to follow and a folder link leading out
    are refused with their reason (a loop stopped the start; the folder link vanished), names quoted; a
    config.json nested too deeply is found here and refused by its check (tests/app/test_stores_api.py)."""
    gguf = tmp_path / "any.gguf"
    gguf.write_bytes(b"GGUF")
    hostile = lay_out(
        "models_dir", tmp_path / "models", tmp_path / "outside", gguf, tiny_checkpoints["llama"]
    )
    scan = scan_models_folder(tmp_path / "models")
    assert sorted(scan.found) == sorted([*hostile.found, *hostile.failing])
    assert sorted(scan.refused) == sorted(hostile.refused)
    for name, why in hostile.refused.items():
        assert why in scan.refused[name], (name, scan.refused[name])
    assert not [why for why in scan.refused.values() if "\n" in why]


def test_a_folder_link_leading_out_of_the_models_folder_is_refused(tmp_path: Path) -> None:
    """Issue 48 E7: a folder link leading out was refused only when its target held a config.json (read
    outside the folder to know it); any other vanished. Now every folder link out is refused, unread."""
    (tmp_path / "models").mkdir()
    (tmp_path / "elsewhere" / "weights").mkdir(parents=True)
    (tmp_path / "models" / "linked").symlink_to(tmp_path / "elsewhere" / "weights")
    scan = scan_models_folder(tmp_path / "models")
    assert scan.found == {} and list(scan.refused) == ["linked"]
    assert "outside the models folder" in scan.refused["linked"]


def test_the_table_has_one_row_per_source_with_its_own_label_and_rank() -> None:
    """/api/models sends the label of each row, in the table's order: the page keeps no list of its own."""
    ids = [source.id for source in sources.SOURCES]
    assert ids == ["bundled", "operator", "models_dir", "ollama", "lmstudio", "huggingface"]
    assert len({source.label for source in sources.SOURCES}) == len(ids)
    ranked = [s.id for s in sorted(sources.SOURCES, key=lambda s: s.rank, reverse=True)]
    assert ranked == ["operator", "models_dir", "bundled", "ollama", "lmstudio", "huggingface"]
    assert sources.source_of("lmstudio").label == "LM Studio"


def test_scan_sources_keeps_the_higher_ranked_entry_of_a_name(tmp_path: Path) -> None:
    """A name two sources hold is the higher-ranked one's (the operator's over the models folder's and a
    store's); a name one source holds is its own. A source left out of the places is off: not looked at."""
    folder, store, mine = tmp_path / "models", tmp_path / "lmstudio", tmp_path / "mine.gguf"
    folder.mkdir()
    for name in ("both", "solo"):
        (folder / f"{name}.gguf").write_bytes(b"GGUF")
    for name in ("all", "alone"):
        lmstudio_model(store, "pub", "m", f"{name}.gguf", b"GGUF")
    mine.write_bytes(b"GGUF")
    places: dict[str, object] = {
        "bundled": Bundled(llm=False, random=True),
        "operator": {"both": mine, "pub/m/all": mine},
        "models_dir": folder,
        "lmstudio": store,
    }
    entries = scan_sources(places)
    assert {name: entry.source for name, entry in entries.items()} == {
        "pub/m/all": "operator",
        "pub/m/alone": "lmstudio",
        "all-MiniLM-L6-v2": "bundled",
        "random": "bundled",
        "both": "operator",
        "solo": "models_dir",
    }
    assert entries["both"] == sources.SourceEntry("both", "operator", mine)
    assert entries["random"] == sources.SourceEntry("random", "bundled")  # built in: no path
    assert entries["solo"].path == folder / "solo.gguf" and entries["pub/m/alone"].refused is None
    off = scan_sources({key: value for key, value in places.items() if key != "lmstudio"})
    assert "pub/m/alone" not in off and off["pub/m/all"].source == "operator"


def test_a_store_that_is_not_a_folder_is_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A found-by-itself store missing or not a folder costs only itself; an operator's models folder
    that is not one raises: the operator named it."""
    (tmp_path / "file").write_text("x")
    with caplog.at_level(logging.WARNING, logger="mha.loading.sources.table"):
        entries = scan_sources({"ollama": tmp_path / "file", "lmstudio": tmp_path / "missing"})
    assert entries == {}
    assert caplog.text.count("not a folder: not scanned") == 2
    with pytest.raises(ValueError, match="not a directory"):
        scan_sources({"models_dir": tmp_path / "file"})
