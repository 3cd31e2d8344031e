"""app/snapshot without a browser: the bundle of the page's modules (a snapshot file's one script)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app import page
from app.snapshot import BundleError, bundle, link
from app.snapshot.bundle import parse

# -- the bundle ------------------------------------------------------------------------------------


def _entries() -> list[str]:
    """The script every page template loads from app/static/js (main.js, corpus.js, docs.js)."""
    found = set()
    for template in page.TEMPLATES_DIR.glob("*.html"):
        found |= set(re.findall(r'<script[^>]* src="[^"]*/js/([\w-]+\.js)"', template.read_text()))
    return sorted(found)


def test_the_bundle_holds_every_module_main_reaches_each_after_its_imports() -> None:
    linked = bundle()
    assert linked.modules[-1] == "main.js"
    position = {name: i for i, name in enumerate(linked.modules)}
    for name in linked.modules:
        module = parse(name, (page.JS_DIR / name).read_text(encoding="utf-8"))
        assert all(position[dependency] < position[name] for dependency in module.imports), name
        assert f'modules["{name}"] = (function () {{' in linked.script
    # Every module of app/static/js is some page's, and every page's entry links: a module in a form the
    # bundler does not take fails here, whichever page imports it.
    reached = set().union(*(link(entry).modules for entry in _entries()))
    assert reached == {path.name for path in page.JS_DIR.glob("*.js")}
    assert set(linked.modules) >= {"api.js", "decode.js", "grid.js"}
    assert "import {" not in linked.script and "\nexport " not in linked.script


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js")
def test_node_parses_the_bundle(tmp_path: Path) -> None:
    script = tmp_path / "bundle.js"
    script.write_text(bundle().script, encoding="utf-8")
    checked = subprocess.run(["node", "--check", str(script)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('import x from "./a.js";\n', "main.js:1"),
        ('import * as a from "./a.js";\n', "main.js:1"),
        ('import "./a.js";\n', "main.js:1"),
        ("const a = 1;\nexport default a;\n", "main.js:2"),
        ("export let a = 1;\n", "main.js:1"),
        ('export { a } from "./a.js";\n', "main.js:1"),
        ("export const { a } = {};\n", "is not a form the snapshot bundler links"),
        ('const m = await import("./a.js");\n', "dynamic import"),
        ('import { nope } from "./a.js";\n', "does not export"),
        ('import { a } from "./missing.js";\n', "not in"),
        ('import { b } from "./b.js";\nexport const a = 1;\n', "import cycle main.js -> b.js -> main.js"),
    ],
)
def test_an_unsupported_form_is_a_clear_error(tmp_path: Path, source: str, says: str) -> None:
    (tmp_path / "a.js").write_text("export const a = 1;\n")
    (tmp_path / "b.js").write_text('import { a } from "./main.js";\nexport const b = a;\n')
    (tmp_path / "main.js").write_text(source)
    with pytest.raises(BundleError, match=re.escape(says)):
        link("main.js", tmp_path)


def test_the_supported_forms_link_as_es_modules_would(tmp_path: Path) -> None:
    (tmp_path / "a.js").write_text("export const one = 1;\nexport function two() { return 2; }\n")
    (tmp_path / "b.js").write_text(
        'import {\n  one,\n  two as deux,\n} from "./a.js";\nexport class Three {}\nexport { one, deux };\n'
    )
    (tmp_path / "main.js").write_text(
        'import { one, deux, Three } from "./b.js";\nglobalThis.seen = [one, deux(), typeof Three];\n'
    )
    linked = link("main.js", tmp_path)
    assert linked.modules == ("a.js", "b.js", "main.js")
    assert 'const { one, two: deux } = modules["a.js"];' in linked.script
    if shutil.which("node") is None:
        pytest.skip("no Node.js to run it")
    document = "globalThis.document = { readyState: 'complete' };"  # run() at once, as after parsing
    runner = f"{document}\n{linked.script}\nconsole.log(JSON.stringify(seen));"
    ran = subprocess.run(["node", "-e", runner], capture_output=True, text=True, check=False)
    assert ran.stdout.strip() == '[1,2,"function"]', ran.stderr
