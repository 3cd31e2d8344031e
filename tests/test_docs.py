"""The documentation a newcomer reads: the README and docs/, one page per topic.

Checked from the files alone: each page stays short enough to read, every setting and CLI flag is defined
once, in docs/configuration.md, the index links every page, and every relative link (and its #anchor)
leads somewhere.
"""

from __future__ import annotations

import contextlib
import io
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from app import cli
from app.settings import Settings
from mha.loading.gguf import CACHE_ENV

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
DESIGN = DOCS / "design.md"
INDEXES = (DOCS / "README.md", DOCS / "index.md")

README_MAX_CHARS = 25_000
PAGE_MAX_CHARS = 40_000
DESIGN_MAX_CHARS = 60_000

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
# [text](target) and ![alt](target), and an <img src="...">; a target never holds a space or ")".
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
IMG_SRC = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
# A definition is a table row whose first cell is the name in backticks: "| `HEADSCOPE_DEVICE` | ...".
DEFINITION = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def documents() -> list[Path]:
    return [README, *pages()]


def prose(path: Path) -> str:
    """The page without its fenced code blocks, where a bracket is code, not a link."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(prose(path)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[str]:
    text = prose(path)
    return MARKDOWN_LINK.findall(text) + IMG_SRC.findall(text)


def definitions(path: Path) -> list[str]:
    return DEFINITION.findall(prose(path))


def env_names() -> list[str]:
    """Every environment variable the service and the library read: each Settings field, and mha's cache."""
    prefix = Settings.model_config.get("env_prefix", "")
    return [f"{prefix}{name}".upper() for name in Settings.model_fields] + [CACHE_ENV]


def cli_flags(command: str) -> list[str]:
    """The options `headscope <command> --help` lists, as argparse prints them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([command, "--help"])
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out.getvalue())) - {"--help"}
    assert flags, f"`headscope {command} --help` listed no option"
    return sorted(flags)


def test_readme_and_pages_stay_short() -> None:
    sizes = {path.name: len(path.read_text(encoding="utf-8")) for path in pages()}
    assert len(README.read_text(encoding="utf-8")) < README_MAX_CHARS
    assert sizes.pop(DESIGN.name) < DESIGN_MAX_CHARS
    too_long = {name: size for name, size in sizes.items() if size >= PAGE_MAX_CHARS}
    assert not too_long, f"pages over {PAGE_MAX_CHARS:,} characters: {too_long}"


def test_readme_keeps_the_test_command() -> None:
    # CI and the deployment tests run what the README's quick start says.
    assert "make test" in README.read_text(encoding="utf-8")


def test_every_setting_is_defined_once_in_configuration() -> None:
    defined = definitions(CONFIGURATION)
    names = env_names()
    assert len(names) > 30  # the list came from Settings, not from an empty model
    wrong = {name: defined.count(name) for name in names if defined.count(name) != 1}
    assert not wrong, f"settings not defined exactly once in docs/configuration.md: {wrong}"
    unknown = [name for name in defined if name.startswith("HEADSCOPE_") and name not in names]
    assert not unknown, f"docs/configuration.md defines settings that do not exist: {unknown}"


def test_no_other_page_defines_a_setting() -> None:
    # Elsewhere a setting is named and linked, never described in a table of its own.
    elsewhere = {}
    for path in documents():
        names = [name for name in definitions(path) if name.startswith("HEADSCOPE_")]
        if path != CONFIGURATION and names:
            elsewhere[path.relative_to(ROOT).as_posix()] = names
    assert not elsewhere, f"settings defined outside docs/configuration.md: {elsewhere}"


@pytest.mark.parametrize("command", ["serve", "corpus", "snapshot"])
def test_every_cli_flag_is_defined_in_configuration(command: str) -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    section = text.split(f"## `headscope {command}`", 1)
    assert len(section) == 2, f"docs/configuration.md has no section for `headscope {command}`"
    body = section[1].split("\n## ", 1)[0]
    defined = DEFINITION.findall(body)
    missing = [flag for flag in cli_flags(command) if defined.count(flag) != 1]
    assert not missing, f"`headscope {command}` flags not defined once in its section: {missing}"


def test_the_index_links_every_page() -> None:
    index = next((path for path in INDEXES if path.exists()), None)
    assert index is not None, "docs/ has no index page (README.md or index.md)"
    linked = {(index.parent / unquote(target.split("#", 1)[0])).resolve() for target in links(index)}
    unlinked = [path.name for path in pages() if path != index and path.resolve() not in linked]
    assert not unlinked, f"the index does not link: {unlinked}"


@pytest.mark.parametrize("path", documents(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"links in {path.relative_to(ROOT)} that lead nowhere: {broken}"


def test_slug_follows_github() -> None:
    # The anchor rule the link check relies on, on the kinds of heading the pages have.
    assert slug("Long inputs: a trace") == "long-inputs-a-trace"
    assert slug("`headscope serve`") == "headscope-serve"
    assert slug("The HSA1 transport (`app/compact.py`)") == "the-hsa1-transport-appcompactpy"
    assert slug("Which fused kernel a trace runs on a GPU") == "which-fused-kernel-a-trace-runs-on-a-gpu"
