"""app/snapshot without a browser: the bundle of the page's modules, the file's policy and what it loads,
what it carries and its sizes, every kind of `attend` result, and `headscope snapshot`.
tests/browser/test_snapshot.py opens the files in Chromium."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

import mha
from app import compact, page
from app.cli import main
from app.service.computed import from_result
from app.snapshot import (
    BYTES_PER_VALUE,
    Asked,
    BundleError,
    Snapshot,
    asset_sizes,
    build,
    build_view,
    bundle,
    link,
)
from app.snapshot.bundle import parse
from tests.seq2seq_checkpoints import build_seq2seq_checkpoint

LONG_TEXT = " ".join(
    ["The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat."] * 12
)


class Page(HTMLParser):
    """Every tag's attributes, in order, and the text of each <script> (with its attributes)."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._script: dict[str, str | None] | None = None
        self._text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None


def carried(html: str) -> dict[str, Any]:
    block = re.search(r'<script type="application/json" id="headscope-snapshot">(.*?)</script>', html, re.S)
    assert block is not None
    return json.loads(block.group(1))  # type: ignore[no-any-return]


def unpacked(answer: dict[str, Any]) -> bytes:
    return gzip.decompress(base64.b64decode(answer["gzip"]))


@pytest.fixture(scope="module")
def minilm_128(minilm: mha.AttentionModel) -> tuple[mha.AttentionResult, Snapshot]:
    """MiniLM at 128 tokens (a long text cut there), and its snapshot opened on layer 2, head 5."""
    result = minilm.attend(LONG_TEXT, max_tokens=128, hidden_state=False)
    assert result.n == 128
    return result, build(result, model=minilm, selected=(2, 5))


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
    assert set(linked.modules) >= {"api.js", "carried.js", "snapshot-page.js", "decode.js", "grid.js"}
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


# -- the file: its policy, what it loads ------------------------------------------------------------


def test_the_policy_comes_first_and_allows_exactly_the_inline_scripts(minilm_128) -> None:
    _, snapshot = minilm_128
    parsed = Page(snapshot.html)
    first = parsed.tags[parsed.tags.index(("head", {})) + 1]
    assert first[0] == "meta" and first[1]["http-equiv"] == "Content-Security-Policy"
    policy = dict(part.strip().split(" ", 1) for part in str(first[1]["content"]).split(";"))
    executable = [text for attrs, text in parsed.scripts if attrs.get("type") is None]
    assert len(executable) == 1  # the page's modules; plotly.js is text until the page runs it
    source = [text for attrs, text in parsed.scripts if attrs.get("id") == "plotly-source"]
    assert [attrs.get("type") for attrs, _ in parsed.scripts if attrs.get("id") == "plotly-source"] == [
        "text/plain"
    ]
    vendored = page.PLOTLY_JS.read_text(encoding="utf-8")
    assert source[0].replace("\\x3C", "<") == vendored.replace("\\x3C", "<")  # the file, `<` escaped
    # plotly-ready.js inserts a script of exactly that text: the policy allows it by its hash.
    hashes = {
        "'sha256-" + base64.b64encode(hashlib.sha256(t.encode()).digest()).decode() + "'"
        for t in executable + source
    }
    assert set(policy["script-src"].split()) == hashes
    assert policy["default-src"] == policy["connect-src"] == policy["base-uri"] == "'none'"
    assert policy["form-action"] == "'none'" and policy["img-src"] == "data: blob:"
    assert "unsafe-eval" not in first[1]["content"] and "blob:" not in policy["script-src"]
    data = [attrs["id"] for attrs, _ in parsed.scripts if attrs.get("type") == "application/json"]
    assert data == ["initial-state", "headscope-snapshot"]
    for _, text in parsed.scripts:
        assert "</script" not in text.lower() and "<!--" not in text


def test_the_file_names_nothing_to_load_from_anywhere(minilm_128) -> None:
    _, snapshot = minilm_128
    parsed = Page(snapshot.html)
    urls = [
        (tag, name, value)
        for tag, attrs in parsed.tags
        for name, value in attrs.items()
        if name in ("src", "href", "action", "formaction", "srcset", "poster", "data", "background")
    ]
    assert urls and [url for url in urls if not str(url[2]).startswith("data:")] == []
    links = [attrs for tag, attrs in parsed.tags if tag == "link"]
    assert [link["rel"] for link in links] == ["icon"]  # inline: no stylesheet, no font, no preload
    assert [attrs for tag, attrs in parsed.tags if tag == "script" and "src" in attrs] == []


# -- what it carries, and its sizes -----------------------------------------------------------------


def test_a_128_token_minilm_file_is_within_its_bytes_per_value(minilm_128) -> None:
    result, snapshot = minilm_128
    assert snapshot.values == 6 * 12 * 128 * 128 and snapshot.heads == 72
    assert snapshot.bytes_per_value <= BYTES_PER_VALUE
    sizes = asset_sizes()
    assert sizes["plotly"] == page.PLOTLY_JS.stat().st_size  # carried as it is vendored
    assert snapshot.asset_bytes >= sizes["plotly"] + sizes["script"] + sizes["css"]
    assert snapshot.bytes == snapshot.asset_bytes + snapshot.data_bytes
    # The selected head first, then its neighbours, as many as the budget allows: some, not all.
    assert snapshot.exact[0] == ("encoder", 2, 5)
    assert set(snapshot.exact[1:5]) == {
        ("encoder", 1, 5),
        ("encoder", 3, 5),
        ("encoder", 2, 4),
        ("encoder", 2, 6),
    }
    assert 5 <= len(snapshot.exact) < 72
    assert f"Exact float32 values for {len(snapshot.exact)} of its 72 heads" in snapshot.html


def test_the_carried_answers_are_the_services_values(minilm_128) -> None:
    result, snapshot = minilm_128
    answers = carried(snapshot.html)["answers"]
    header, values = compact.decode(unpacked(answers["compact"]))
    assert header["quantization"]["bits"] == 8 and header["n"] == 128
    # Every head at 8 bits: within the scheme's stated bound of the model's weights (a float32 rounding
    # of the scale's product adds under 1e-7).
    assert header["quantization"]["max_abs_error"] == pytest.approx(1 / 510)
    assert float((torch.from_numpy(values) - result.attentions).abs().max()) <= 1 / 510 + 1e-7
    exact_header, exact = compact.decode(unpacked(answers["head:encoder:2:5"]))
    assert (exact_header["layer"], exact_header["head"]) == (2, 5)
    assert torch.equal(torch.from_numpy(exact[0, 0]), result.attentions[2, 5])  # float32, bit for bit
    statistics = json.loads(unpacked(answers["analysis:encoder"]))
    assert len(statistics["labels"]) == 6 and len(statistics["labels"][0]) == 12
    assert answers["models"]["json"]["models"][0]["layers"] == 6
    assert "flow:encoder" not in answers  # 128 tokens: over the flow limit, as the page says itself


def test_max_bytes_is_honoured_by_pooling_the_grid_and_the_page_says_so(minilm_128) -> None:
    result, snapshot = minilm_128
    limit = snapshot.asset_bytes + 60_000  # the assets, and far less than the 8-bit grid of 128 tokens
    pooled = build(result, max_bytes=limit)
    assert pooled.bytes <= limit and pooled.pooled in (64, 32, 16, 8) and pooled.exact == ()
    header, values = compact.decode(unpacked(carried(pooled.html)["answers"]["compact"]))
    assert header["n"] == pooled.pooled and header["reduce"] == "max" and header["input_n"] == 128
    # Max pooling: each block's value is the largest weight in it (within 8 bits' bound).
    width = 128 // pooled.pooled
    blocks = result.attentions.unflatten(2, (-1, width)).unflatten(4, (-1, width)).amax(dim=(3, 5))
    assert float((torch.from_numpy(values) - blocks).abs().max()) <= 1 / 510 + 1e-7
    assert f"Every head is pooled to {pooled.pooled} × {pooled.pooled} blocks" in pooled.html
    with pytest.raises(ValueError, match="max_bytes"):
        build(result, max_bytes=snapshot.asset_bytes)


def test_tokens_stay_text_in_the_markup(minilm: mha.AttentionModel) -> None:
    payload = "<img src=x onerror=alert(1)> <b>bold</b> </script><script>window.owned=1</script>"
    snapshot = build(minilm.attend(payload, hidden_state=False), model=minilm)
    assert "<img src=x" not in snapshot.html and "<b>bold" not in snapshot.html  # only as \u003c... in JSON
    assert carried(snapshot.html)["state"]["text"] == payload  # as typed, read back through the escapes
    # No data block ends early: each </script> closes one of the file's four scripts.
    assert snapshot.html.count("</script>") == len(Page(snapshot.html).scripts) == 4


# -- every kind of attend result -------------------------------------------------------------------


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> mha.AttentionModel:
    return mha.load_pretrained(
        str(build_seq2seq_checkpoint("t5", tmp_path_factory.mktemp("t5"))), device="cpu"
    )


def test_an_encoder_decoder_carries_its_three_kinds(t5: mha.AttentionModel) -> None:
    result = t5.attend("The house is wonderful.", target="Das Haus ist wunderbar.", hidden_state=False)
    snapshot = build(result, model=t5, selected=(1, 2))
    data = carried(snapshot.html)
    assert data["state"]["kind"] == "cross" and data["input"]["target"] == "Das Haus ist wunderbar."
    assert {f"analysis:{kind}" for kind in ("encoder", "decoder", "cross")} <= set(data["answers"])
    assert snapshot.exact[0] == ("cross", 1, 2)
    header, sections = compact.decode_sections(unpacked(data["answers"]["compact"]))
    assert [s["kind"] for s in header["sections"]] == ["encoder", "decoder", "cross"]
    assert sections["cross"].shape == tuple(result.cross_attentions.shape)
    assert snapshot.values == sum(
        t.numel() for t in (result.attentions, result.decoder_attentions, result.cross_attentions)
    )


def test_pairs_continuations_and_norms_carry_their_run(tiny_checkpoints: dict[str, Path], minilm) -> None:
    pair = build(minilm.attend("The cat sat.", text_pair="It was tired.", hidden_state=False), model=minilm)
    assert carried(pair.html)["input"]["text_pair"] == "It was tired."
    llama = mha.load_pretrained(str(tiny_checkpoints["llama"]), device="cpu")
    written = llama.attend("Hello there my friend", max_new_tokens=4, hidden_state=False)
    state = carried(build(written, model=llama).html)["state"]
    assert state["newTokens"] == written.generated > 0
    norm = build(llama.attend("Hello there my friend", norms=True, hidden_state=False), model=llama)
    data = carried(norm.html)
    assert data["input"]["weighting"] == data["state"]["weighting"] == "norm"
    header, _ = compact.decode(unpacked(data["answers"]["head:encoder:0:0"]))
    assert header["weighting"] == "norm" and len(header["row_norms"]) == header["n"]
    # Without the model: its shape from the tensors, causal from the masked triangle.
    bare = carried(build(written, name="my-llama").html)
    entry = bare["answers"]["models"]["json"]["models"][0]
    assert (entry["name"], entry["causal"], entry["layers"]) == ("my-llama", True, llama.info.layers)


def test_the_services_view_builds_the_same_file(minilm: mha.AttentionModel) -> None:
    """build_view, a route's way in from the service's cached view, carries what build does."""
    result = minilm.attend("The cat sat.", text_pair="It was tired.", hidden_state=False)
    view = from_result(minilm.info.name, minilm.info, result)
    served = build_view(view, minilm.info, Asked("The cat sat.", "It was tired."), selected=(1, 2))
    assert carried(served.html) == carried(build(result, model=minilm, selected=(1, 2)).html)
    with pytest.raises(ValueError, match="cross attention alone"):
        build_view(replace(view, kind="cross"), minilm.info, Asked("x"))  # one kind's view is not a run


# -- headscope snapshot -----------------------------------------------------------------------------


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(["snapshot", *argv])
    except SystemExit as stop:
        return int(stop.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_the_cli_writes_a_file_of_a_served_model(
    tiny_checkpoints, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("HEADSCOPE_MODELS", json.dumps({"tiny-llama": str(tiny_checkpoints["llama"])}))
    out = tmp_path / "view.html"
    code, err = run_cli(
        ["--model", "tiny-llama", "--text", "Hello there", "--max-new-tokens", "3", "-o", str(out)], capsys
    )
    assert code == 0 and str(out) in err and len(err.splitlines()) == 1
    assert carried(out.read_text(encoding="utf-8"))["state"]["model"] == "tiny-llama"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", "nope", "--text", "x"], "unknown model 'nope'"),
        (["--text", "   "], "--text is blank"),
        (["--model", "tiny-llama", "--text", "x", "--max-new-tokens", "999"], "over the limit"),
        (["--model", "tiny-llama", "--text", "x", "--target", "y"], "encoder-decoder"),
    ],
)
def test_bad_arguments_exit_with_one_line(
    argv, says, tiny_checkpoints, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("HEADSCOPE_MODELS", json.dumps({"tiny-llama": str(tiny_checkpoints["llama"])}))
    code, err = run_cli([*argv, "-o", str(tmp_path / "x.html")], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_a_count_below_zero_is_argparses_error(tmp_path: Path, capsys) -> None:
    code, err = run_cli(["--text", "x", "--max-new-tokens", "-1", "-o", str(tmp_path / "x.html")], capsys)
    assert code == 2 and "argument --max-new-tokens: '-1' must be at least 0" in err
