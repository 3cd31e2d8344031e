"""The wheel (issue 46, "pip install works outside the repository"): built from the project as a user builds
it, it carries every module and the page's package data (app/static, app/templates) and nothing else, and,
installed into a new venv outside the checkout, `headscope serve` run from outside the checkout serves the
page, its JS, the vendored plotly.js and an answer, all from the installed package, and `headscope snapshot`
writes a whole snapshot file there.

Cheap by design: the wheel is built without build isolation (the running venv's setuptools: no network),
and the new venv gets its third-party packages from the running venv through a .pth line, so only the
wheel is installed (`--no-deps`). A path a .pth line adds is not itself scanned for .pth files, so the
running venv's editable install of headscope (its __editable__ .pth and finder) stays out; a test checks it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from benchmarks.launch import free_port, health, stop, wait_up

ROOT = Path(__file__).resolve().parents[1]
GUARD = 180.0  # seconds for the installed server to start and load the default model on a busy machine
TEXT = "The cat sat on the mat."
# What a build reads from the checkout is the project, never a leftover: an in-tree build/ keeps the files
# of an earlier build (a deleted module among them) and setuptools packs them again.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.py[co]", ".*_cache", ".hypothesis",
    ".schemathesis", "schemathesis-report", "test-artifacts", "node_modules", "results",
)  # fmt: skip
# The venv's site-packages, relative to it (the same Python as the one running the tests)
SITE = Path("lib") / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
MARKER = "installed-marker.txt"  # written into the installed app/static only: served, it proves whose files


def expected_files() -> set[str]:
    """What the wheel must hold, read from the checkout: every module of app and mha, and every file of
    app/static and app/templates (pyproject's package-data)."""
    names = {
        path.relative_to(ROOT).as_posix()
        for package in ("app", "mha")
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    for data in ("app/static", "app/templates"):
        names |= {
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / data).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "headscope"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*command, "-w", str(out), "-q"], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("headscope-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv outside the checkout holding the wheel; the running venv's packages seen through a .pth."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    # The running venv's pip installs into the new one (pip --python): no pip bootstrapped there. The .pth
    # comes after, so pip sees no headscope already installed beside the new one; so does an environment
    # without PYTHONPATH (a checkout on it holds headscope.egg-info: "already satisfied", nothing installed).
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    env = outside_env(root.parent)
    installed = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    (root / SITE / "_headscope_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (root / SITE / "app" / "static" / MARKER).write_text("from the installed package\n")
    return root


def outside_env(tmp: Path) -> dict[str, str]:
    """The environment of a user outside the checkout: nothing of ours on PYTHONPATH, no HEADSCOPE_*
    setting but a cache folder of its own, nothing discovered, no hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADSCOPE_") and k != "PYTHONPATH"}
    return env | {
        "HEADSCOPE_CACHE_DIR": str(tmp / "cache"),
        "HEADSCOPE_BUNDLED_LLM": "false",  # its GGUF header read costs seconds and proves nothing here
        "HEADSCOPE_DISCOVER": "false",
        "HEADSCOPE_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def test_the_wheel_holds_the_modules_and_the_page_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    info = {name for name in names if name.split("/", 1)[0].endswith(".dist-info")}
    shipped, expected = names - info, expected_files()
    assert shipped == expected, f"missing {sorted(expected - shipped)}; not ours {sorted(shipped - expected)}"
    # What `headscope serve` and a snapshot read at run time, by name (so a glob that empties both sides
    # cannot pass): the page, its entry module, the vendored bundles and their licences.
    for name in (
        "app/templates/index.html",
        "app/templates/base.html",
        "app/static/js/main.js",
        "app/static/js/api.js",
        "app/static/css/headscope.css",
        "app/static/img/favicon.svg",
        "app/static/vendor/plotly/plotly-cartesian.min.js",
        "app/static/vendor/plotly/LICENSE",
        "app/static/vendor/plotly/VERSION",
        "app/static/vendor/swagger-ui/swagger-ui-bundle.js",
        "app/static/vendor/swagger-ui/LICENSE",
        "mha/text/_chat_worker.py",  # run as a file by mha.text.chat, not imported
    ):
        assert name in names, name
    assert {name.split("/", 1)[0] for name in names - info} == {"app", "mha"}  # no tests, benchmarks, docs
    assert "headscope = app.cli:main" in scripts


def test_the_install_imports_its_own_files_not_the_checkouts(venv: Path, tmp_path: Path) -> None:
    # find_spec, not import: where each would come from, without a torch import's seconds.
    probe = (
        "import json, sys\n"
        "from importlib.util import find_spec\n"
        "from app.package_data import STATIC, TEMPLATES, package_dir\n"
        "print(json.dumps({'app': find_spec('app').origin, 'mha': find_spec('mha').origin,\n"
        "  'static': str(package_dir(STATIC)), 'templates': str(package_dir(TEMPLATES)),\n"
        "  'finders': [repr(f) for f in sys.meta_path]}))\n"
    )
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        cwd=tmp_path,
        env=outside_env(tmp_path),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    site = (venv / SITE).resolve()
    for key in ("app", "mha", "static", "templates"):
        assert Path(found[key]).resolve().is_relative_to(site), (key, found[key])
    # The running venv's editable install maps app and mha onto a checkout by a finder its .pth installs.
    assert not [finder for finder in found["finders"] if "editable" in finder.lower()], found["finders"]


def _get(url: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=GUARD) as response:  # noqa: S310 (loopback)
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def served(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`headscope serve` of the install, started from a folder outside the checkout; its base URL once its
    health says ready (the default model loaded)."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    assert not cwd.resolve().is_relative_to(ROOT)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = cwd / "server.log"
    command = [str(venv / "bin" / "headscope"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        env = outside_env(cwd)
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        try:  # until the health says ready (200): 503 while the default model loads
            wait_up(process, base, until=lambda base: health(base) is not None, start_s=GUARD, poll_s=0.05)
        except RuntimeError as error:
            pytest.fail(f"the installed server did not start ({error}):\n{log.read_text(errors='replace')}")
        yield base
    finally:
        stop(process, timeout=30)


@pytest.mark.slow
def test_the_installed_server_serves_the_page_from_the_installed_package(served: str, venv: Path) -> None:
    static = venv / SITE / "app" / "static"
    status, page = _get(f"{served}/")
    assert status == 200 and b'id="initial-state"' in page
    status, main_js = _get(f"{served}/static/js/main.js")
    assert (status, main_js) == (200, (static / "js" / "main.js").read_bytes())
    # The bundle at the URL the page itself names for it
    (plotly_url,) = {
        line.split('src="', 1)[1].split('"', 1)[0] for line in page.decode().splitlines() if "plotly" in line
    }
    status, plotly = _get(f"{served}{plotly_url}")
    assert (status, plotly) == (200, (static / "vendor" / "plotly" / "plotly-cartesian.min.js").read_bytes())
    # A file only the installed package has: the static files served are the install's, not a checkout's.
    assert _get(f"{served}/static/{MARKER}") == (200, (static / MARKER).read_bytes())
    status, body = _get(f"{served}/api/attention", {"text": TEXT})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["tokens"][:3] == ["[CLS]", "the", "cat"]
    assert (answer["layers"], answer["heads"]) == (6, 12)


class Tags(HTMLParser):
    """Every tag's attributes in order, and each <script>'s attributes and text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._open: dict[str, str | None] | None = None
        self._text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._open, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._open is not None:
            self.scripts.append((self._open, "".join(self._text)))
            self._open = None


@pytest.mark.slow
def test_the_installed_cli_writes_a_whole_snapshot(venv: Path, tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT)
    command = [str(venv / "bin" / "headscope"), "snapshot", "--text", TEXT, "-o", "cat.html"]
    run = subprocess.run(command, cwd=tmp_path, env=outside_env(tmp_path), capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    html = (tmp_path / "cat.html").read_text("utf-8")
    parsed = Tags(html)
    # The policy first in <head>: nothing from anywhere, only the file's own inline scripts, by hash.
    meta = parsed.tags[parsed.tags.index(("head", {})) + 1]
    assert meta[0] == "meta" and meta[1]["http-equiv"] == "Content-Security-Policy"
    policy = dict(part.strip().split(" ", 1) for part in str(meta[1]["content"]).split(";") if part.strip())
    assert policy["default-src"] == policy["connect-src"] == "'none'"
    # The page's script, and plotly.js carried as text that the page runs after the grid (by its hash).
    code = [t for a, t in parsed.scripts if a.get("type") is None or a.get("id") == "plotly-source"]
    hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(t.encode()).digest()).decode() + "'" for t in code}
    assert set(policy["script-src"].split()) == hashes
    remote = [
        (tag, value)
        for tag, attrs in parsed.tags
        for name, value in attrs.items()
        if name in ("src", "href", "action", "srcset") and not str(value).startswith("data:")
    ]
    assert remote == []
    # Whole: the installed plotly.js and the page's modules inline, and the run's answers carried: every
    # head (the compact grid), the first head's exact values, its statistics.
    static = venv / SITE / "app" / "static"
    plotly = (static / "vendor" / "plotly" / "plotly-cartesian.min.js").read_text("utf-8")
    assert plotly.strip()[:200] in code[0]
    (carried,) = [
        json.loads(text) for attrs, text in parsed.scripts if attrs.get("id") == "headscope-snapshot"
    ]
    assert carried["input"]["text"] == TEXT
    assert {"models", "compact", "head:encoder:0:0", "analysis:encoder"} <= set(carried["answers"])
