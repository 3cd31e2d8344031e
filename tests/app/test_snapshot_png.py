"""app.snapshot.png: the still image a notebook shows where scripts do not run. Its thumbnails are the
page's own pixels (grid.js paintThumbnail, run in Node on the same values), its heatmap shows each value
through the page's colour scale (colors.js), and it is drawn from the result alone."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from app.snapshot.looks import display_token, lut, page_colors, rgb
from app.snapshot.png import (
    Layout,
    block_max,
    masked,
    paint,
    snapshot_png,
    still_of,
    thumbnails,
)
from mha import AttentionModel, random_model

NODE = shutil.which("node")
JS = Path(__file__).resolve().parents[2] / "app" / "static" / "js"
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")

# Paints each case with the page's own function and prints the RGBA bytes; prints colors.js's scale too.
SCRIPT = """
import { readFileSync } from "node:fs";
import { paintThumbnail } from "JS/grid.js";
import { LUT, STOPS, MASK_BG, MASK_FG } from "JS/colors.js";
const cases = JSON.parse(readFileSync(0, "utf8"));
const painted = cases.map(({ size, values, n, cols, causal }) => {
  const image = { width: size, height: size, data: new Uint8ClampedArray(size * size * 4) };
  paintThumbnail(image, Float32Array.from(values), n, causal, cols);
  return Array.from(image.data);
});
const lut = Array.from(LUT);
console.log(JSON.stringify({ painted, lut, stops: STOPS, maskBg: MASK_BG, maskFg: MASK_FG }));
"""


def page_paint(tmp_path: Path, cases: list[dict]) -> dict:
    script = tmp_path / "paint.mjs"
    script.write_text(SCRIPT.replace("JS/", JS.as_uri() + "/"))
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(script)], input=json.dumps(cases), capture_output=True, text=True, check=True, timeout=60
    )
    return dict(json.loads(done.stdout))


def softmax_map(rows: int, cols: int, *, causal: bool, seed: int) -> torch.Tensor:
    """[rows, cols] rows summing to 1, as attention is; causal: the upper triangle exactly 0."""
    scores = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3
    if causal:
        scores = scores.masked_fill(torch.ones(rows, cols, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(dim=-1)


@needs_node
def test_the_colour_scale_is_the_pages(tmp_path: Path) -> None:
    page = page_paint(tmp_path, [])
    colors = page_colors()  # read from colors.js's text; the page's module must agree once run
    assert [[t, code] for t, code in colors.colorscale] == page["stops"]
    assert [list(rgb(colors.mask_bg)), list(rgb(colors.mask_fg))] == [page["maskBg"], page["maskFg"]]
    rgba = torch.tensor(page["lut"], dtype=torch.uint8).reshape(256, 4)
    assert torch.equal(lut(), rgba[:, :3])  # every entry, to the unit


@needs_node
def test_thumbnails_are_the_pages_pixels(tmp_path: Path) -> None:
    # Fewer cells than pixels (repeated), as many, more (each pixel a block's max; 37 and 100 do not divide
    # 16, so blocks differ in size), rectangular (a cross-attention head), causal and not.
    shapes = [(5, 5, False), (16, 16, True), (37, 37, True), (100, 100, False), (7, 23, False)]
    size = 16
    cases, ours = [], []
    for k, (rows, cols, causal) in enumerate(shapes):
        values = softmax_map(rows, cols, causal=causal, seed=k)
        cases.append(
            {"size": size, "values": values.flatten().tolist(), "n": rows, "cols": cols, "causal": causal}
        )
        pooled = block_max(block_max(values, size, 0), size, 1)
        ours.append(paint(pooled, masked(rows, cols, size, size) if causal else None))
    page = page_paint(tmp_path, cases)
    for (rows, cols, causal), mine, theirs in zip(shapes, ours, page["painted"], strict=True):
        rgba = torch.tensor(theirs, dtype=torch.uint8).reshape(size, size, 4)
        assert torch.equal(mine, rgba[..., :3]), f"{rows} x {cols}, causal={causal}"


def test_block_max_keeps_every_peak() -> None:
    values = torch.zeros(2, 3, 50, 50)
    values[1, 2, 49, 0] = 0.7  # one peak in the last row's block
    pooled = block_max(block_max(values, 8, 2), 8, 3)
    assert pooled.shape == (2, 3, 8, 8)
    assert pooled[1, 2, 7, 0] == pytest.approx(0.7)
    assert pooled.sum() == pytest.approx(0.7)  # nowhere else


def image_of(png: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        rgb = bytearray(image.convert("RGB").tobytes())
        return torch.frombuffer(rgb, dtype=torch.uint8).reshape(image.height, image.width, 3)


def test_the_image_draws_every_head_and_the_selected_one_from_the_values(minilm: AttentionModel) -> None:
    result = minilm.attend("The animal didn't cross the street because it was too tired.")
    layers, heads, n, _ = result.attentions.shape
    selected = (3, 1)
    pixels = image_of(snapshot_png(result, model=minilm, selected=selected))
    still = still_of(result, model=minilm)
    at = Layout.of(still)
    assert pixels.shape == (at.height, at.width, 3)
    # Every layer x head and each layer's mean, where the grid puts it.
    thumb = at.grid.thumb
    drawn = thumbnails(still, thumb).reshape(layers, heads + 1, thumb, thumb, 3)
    for layer in range(layers):
        for column in range(heads + 1):
            x, y = at.grid.cell(at.top, layer, column)
            assert torch.equal(pixels[y : y + thumb, x : x + thumb], drawn[layer, column]), (layer, column)
    # The selected head: each cell's centre in the colour of its value (the LUT entry round(v * 255)).
    hx, hy = at.heatmap
    cell = at.detail.height_px / n
    colours = lut()
    values = result.attentions[selected]
    for i in range(n):
        for j in range(n):
            centre = pixels[hy + int((i + 0.5) * cell), hx + int((j + 0.5) * cell)]
            assert torch.equal(centre, colours[int(values[i, j].item() * 255 + 0.5)]), (i, j)


def test_a_causal_models_masked_corner_is_hatched_not_zero() -> None:
    model = random_model(layers=2, heads=2, embed_dim=32, causal=True, seed=0)
    result = model.attend("one two three four five six")
    still = still_of(result)  # no model: the exact zeros above the diagonal say it is causal
    assert still.causal
    at = Layout.of(still)
    pixels = image_of(snapshot_png(result))
    hx, hy = at.heatmap
    n = result.n
    cell = at.detail.height_px / n
    corner = pixels[hy + int(0.5 * cell), hx + int((n - 0.5) * cell)]  # query 0, key n - 1: masked
    assert tuple(corner.tolist()) in (rgb(page_colors().mask_bg), rgb(page_colors().mask_fg))
    assert not still_of(random_model(layers=1, heads=2, embed_dim=32, seed=0).attend("a b c")).causal


def test_tokens_are_spelled_as_the_page_spells_them() -> None:
    assert display_token("Ġcat", byte_level=True) == "␣cat"
    assert display_token("Ċ", byte_level=True) == "↵"
    assert display_token("▁cat", byte_level=False) == "␣cat"
    assert display_token("Ġcat", byte_level=False) == "Ġcat"  # a letter someone typed, in WordPiece


def test_a_selection_outside_the_model_is_refused(minilm: AttentionModel) -> None:
    result = minilm.attend("a short text")
    with pytest.raises(ValueError, match=r"selected \(6, 0\) is outside the model's 6 layers × 12 heads"):
        snapshot_png(result, selected=(6, 0))
