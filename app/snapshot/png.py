"""A view's still image: the model view (every layer x head, and each layer's mean) beside the selected
head's heatmap, drawn in Python from the values with Pillow, in the page's colour scale.

It is what a notebook cell shows where the interactive view cannot run (an untrusted notebook, GitHub's
renderer: app/snapshot/notebook.py), so it reads as the page does: each thumbnail pixel is the max of its
block of cells (grid.js paintThumbnail: sparse peaks survive), a causal model's masked blocks are hatched
grey, never drawn as zero, and tokens are spelled as decoder.js displayToken spells them.

May import: mha (the names it exports), app.snapshot.answers and .looks, torch and PIL.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import torch
from PIL import Image, ImageDraw, ImageFont

from app.snapshot import answers
from app.snapshot.looks import display_token, lut, page_colors, rgb
from mha import AttentionModel, AttentionResult

PAD = 16  # around the image and between its parts
GRID_BOX = 540  # the thumbnails' area, at most, in each direction
GAP = 3  # between thumbnails
MEAN_GAP = 8  # before the layer-mean column, as the page sets it apart
THUMB_MAX = 64  # grid.js THUMB_PX: no thumbnail is drawn larger
DETAIL_BOX = 420  # the head heatmap's side, at most
CELL_MAX = 28  # a short text's cells stay this size rather than fill the box
LABEL_CHARS = 14  # longer token labels are cut, with an ellipsis
TITLE_H = 22  # a part's title ("Model view", "Head detail: ...") above it
TICKS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # the detail's colour bar, as Plotly labels it
# The image's last line: why it is still, and where the view is not.
STILL_NOTE = (
    "Still image: scripts do not run here. Trust the notebook, or open the view saved as HTML, to explore it."
)
INK = (31, 35, 40)
MUTED = (87, 96, 106)
FRAME = (208, 215, 222)

# decoder.js displayToken: a byte-level BPE's space, newline and tab marks, and SentencePiece's space.
# Pillow's own font (where no DejaVu is installed) has no glyph for the visible marks: ASCII stand-ins.
ASCII_MARKS = (("␣", "_"), ("↵", "\\n"), ("⇥", "\\t"), ("…", "..."), ("×", "x"), ("·", "-"), ("→", "->"))


@dataclass(frozen=True)
class Still:
    """What the image shows: `maps` [L, H, rows, cols], the tokens down and across, and how to say it."""

    maps: torch.Tensor
    rows: list[str]
    cols: list[str]
    causal: bool
    title: str  # "all-MiniLM-L6-v2 · 12 tokens · 6 layers × 12 heads"
    kind: str = ""  # what else the detail's title says: "cross-attention", "weight × value norm"


def still_of(
    result: AttentionResult, *, model: AttentionModel | None = None, name: str | None = None
) -> Still:
    """The maps, tokens and title the image of `result` draws: the attention the snapshot document opens
    on (answers.view_of: an encoder-decoder's cross attention, weight × value norm shares when the run
    used them), described as the document describes it (answers.describe, from the tensors when no
    `model` is given)."""
    info = answers.describe(result, model, name, chat=False)
    view = answers.view_of(result, info)
    shown = view.of_kind("cross" if view.seq2seq is not None else "encoder")  # as html.build opens it
    maps = shown.attentions
    rows = [display_token(t, byte_level=shown.byte_level) for t in shown.tokens]
    cols = [display_token(t, byte_level=shown.byte_level) for t in shown.key_tokens or shown.tokens]
    layers, heads = maps.shape[:2]
    if view.seq2seq is not None:
        tokens = f"{len(cols)} source → {len(rows)} target tokens"
    elif shown.generated:
        tokens = f"{len(rows) - shown.generated} prompt tokens + {shown.generated} written"
    else:
        tokens = f"{len(rows)} tokens"
    kind = "cross-attention" if view.seq2seq is not None else ""
    if shown.weighting == "norm":
        kind = ", ".join(part for part in (kind, "weight × value norm") if part)
    title = f"{info.name} · {tokens} · {layers} layers × {heads} heads"
    return Still(maps, rows, cols, causal=shown.causal, title=title, kind=kind)


def block_max(maps: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """`maps` with axis `dim` (n cells) drawn in `size` pixels as grid.js does: pixel y covers cells
    floor(y n / size) up to floor((y + 1) n / size) (at least one), and shows their max."""
    n = maps.shape[dim]
    starts = torch.arange(size) * n // size
    if n <= size:
        return maps.index_select(dim, starts)  # each pixel one cell, repeated
    owner = torch.searchsorted(starts, torch.arange(n), right=True) - 1  # the pixel whose block holds cell r
    shape = list(maps.shape)
    shape[dim] = size
    view = [1] * maps.dim()
    view[dim] = n
    index = owner.view(view).expand_as(maps)
    return maps.new_zeros(shape).scatter_reduce_(dim, index, maps, "amax", include_self=False)


def masked(rows: int, cols: int, height: int, width: int) -> torch.Tensor:
    """[height, width] bool: pixels whose block lies wholly above a causal map's diagonal (grid.js:
    first column c0 > last row r1 - 1), hatched as masked, not zero."""
    y = torch.arange(height)
    r1 = torch.maximum(y * rows // height + 1, (y + 1) * rows // height)
    c0 = torch.arange(width) * cols // width
    return c0[None, :] > (r1 - 1)[:, None]


def paint(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[..., h, w] values -> [..., h, w, 3] uint8 through the LUT (index round(v * 255), at most 255),
    with the masked pixels of a causal map hatched (grid.js: (x + y) % 6 < 2 the darker grey)."""
    # In float64, as JS rounds: v * 255 of a float32 v is exact there, so no value rounds the other way.
    index = (values.double().nan_to_num(0.0) * 255 + 0.5).floor().clamp(0, 255).long()
    pixels = lut()[index]
    if mask is not None:
        colors = page_colors()
        h, w = mask.shape
        stripe = (torch.arange(h)[:, None] + torch.arange(w)[None, :]) % 6 < 2
        dark, light = torch.tensor(rgb(colors.mask_fg)), torch.tensor(rgb(colors.mask_bg))
        pixels = torch.where(
            mask[..., None], torch.where(stripe[..., None], dark, light).to(torch.uint8), pixels
        )
    return pixels


def snapshot_png(
    result: AttentionResult,
    *,
    model: AttentionModel | None = None,
    name: str | None = None,
    selected: tuple[int, int] | None = None,
) -> bytes:
    """The PNG of `result`: its model view and the `selected` (layer, head), (0, 0) by default, as the
    page opens. `model` names the model and its tokenizer's spelling (or `name` alone names it)."""
    return draw(still_of(result, model=model, name=name), selected=selected or (0, 0))


@dataclass(frozen=True)
class Layout:
    """Where each part of the image of a still goes: the title, then the grid beside the head detail."""

    fonts: _Fonts
    grid: GridLayout
    detail: DetailLayout
    top: int  # y of both parts' titles
    detail_x: int  # x of the head detail's query labels
    width: int
    height: int

    @classmethod
    def of(cls, still: Still) -> Layout:
        layers, heads = still.maps.shape[:2]
        fonts = _Fonts()
        grid = GridLayout.of(layers, heads, fonts)
        detail = DetailLayout.of(still, fonts)
        top = PAD + 2 * fonts.line + PAD // 2
        width = PAD + grid.width + 2 * PAD + detail.width + PAD
        height = top + max(grid.height, detail.height) + PAD // 2 + fonts.line + PAD
        return cls(fonts, grid, detail, top, PAD + grid.width + 2 * PAD, width, height)

    @property
    def heatmap(self) -> tuple[int, int]:
        """Top-left of the head detail's heatmap."""
        return self.detail.origin(self.detail_x, self.top)


def draw(still: Still, *, selected: tuple[int, int]) -> bytes:
    """The PNG of `still` with (layer, head) `selected` outlined in the grid and drawn in detail."""
    layers, heads = still.maps.shape[:2]
    layer, head = selected
    if not (0 <= layer < layers and 0 <= head < heads):
        raise ValueError(f"selected ({layer}, {head}) is outside the model's {layers} layers × {heads} heads")
    at = Layout.of(still)
    grid, detail, fonts = at.grid, at.detail, at.fonts
    canvas = torch.full((at.height, at.width, 3), 255, dtype=torch.uint8)
    for (x, y), thumb in zip(grid.places(at.top), thumbnails(still, grid.thumb), strict=True):
        canvas[y : y + grid.thumb, x : x + grid.thumb] = thumb
    hx, hy = at.heatmap
    canvas[hy : hy + detail.height_px, hx : hx + detail.width_px] = _heatmap(still, layer, head, detail)
    image = Image.fromarray(canvas.numpy(), "RGB")
    pen = ImageDraw.Draw(image)
    pen.text((PAD, PAD), fonts.plain(still.title), font=fonts.bold, fill=INK)
    _grid_labels(pen, grid, fonts, at.top, selected)
    _detail_labels(image, pen, still, detail, fonts, (at.detail_x, at.top), selected)
    pen.text((PAD, at.height - PAD - fonts.line + 2), fonts.plain(STILL_NOTE), font=fonts.small, fill=MUTED)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


class _Fonts:
    """DejaVu Sans where the system has it (every sign the page shows); else Pillow's own font, with the
    visible marks in ASCII."""

    def __init__(self) -> None:
        try:
            self.small: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype(
                "DejaVuSans.ttf", 11
            )
            self.bold: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype(
                "DejaVuSans-Bold.ttf", 13
            )
            self.ascii = False
        except OSError:
            self.small = ImageFont.load_default(size=11)
            self.bold = ImageFont.load_default(size=13)
            self.ascii = True
        self.line = 18

    def plain(self, text: str) -> str:
        if self.ascii:
            for sign, stand_in in ASCII_MARKS:
                text = text.replace(sign, stand_in)
        return text

    def width(self, text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont | None = None) -> int:
        box = (font or self.small).getbbox(self.plain(text))
        return int(box[2] - box[0])


@dataclass(frozen=True)
class GridLayout:
    layers: int
    heads: int
    thumb: int  # px
    label_w: int  # the "L11" column
    header: int  # the "H0" row

    @classmethod
    def of(cls, layers: int, heads: int, fonts: _Fonts) -> GridLayout:
        header = TITLE_H + fonts.line + 4
        label_w = fonts.width(f"L{layers - 1}") + 8
        across = (GRID_BOX - label_w - MEAN_GAP) // (heads + 1) - GAP
        down = (GRID_BOX - header - fonts.line) // layers - GAP
        return cls(layers, heads, max(6, min(THUMB_MAX, across, down)), label_w, header)

    @property
    def step(self) -> int:
        return self.thumb + GAP

    @property
    def width(self) -> int:
        return self.label_w + (self.heads + 1) * self.step + MEAN_GAP

    @property
    def height(self) -> int:
        return self.header + self.layers * self.step

    def cell(self, top: int, layer: int, column: int) -> tuple[int, int]:
        """Top-left of thumbnail (layer, column); column `heads` is the layer mean."""
        x = PAD + self.label_w + column * self.step + (MEAN_GAP if column == self.heads else 0)
        return x, top + self.header + layer * self.step

    def places(self, top: int) -> list[tuple[int, int]]:
        """Every thumbnail's top-left in _thumbnails' order: each layer's heads, then its mean."""
        return [self.cell(top, layer, c) for layer in range(self.layers) for c in range(self.heads + 1)]


def thumbnails(still: Still, size: int) -> torch.Tensor:
    """[L * (H + 1), size, size, 3]: each layer's heads, then its mean (aggregates.js), pooled and painted."""
    maps = still.maps.float()
    with_mean = torch.cat([maps, maps.mean(dim=1, keepdim=True)], dim=1)  # [L, H + 1, rows, cols]
    pooled = block_max(block_max(with_mean, size, 2), size, 3)
    rows, cols = maps.shape[-2:]
    mask = masked(rows, cols, size, size) if still.causal else None
    return paint(pooled, mask).reshape(-1, size, size, 3)


@dataclass(frozen=True)
class DetailLayout:
    rows: int
    cols: int
    height_px: int
    width_px: int
    label_w: int  # the query labels' column, left of the heatmap
    label_h: int  # the key labels' band, above it (written upwards)
    row_every: int  # one query label in this many (all where the cells are tall enough)
    col_every: int

    @classmethod
    def of(cls, still: Still, fonts: _Fonts) -> DetailLayout:
        rows, cols = still.maps.shape[-2:]
        cell = max(1, min(CELL_MAX, DETAIL_BOX // max(rows, cols)))
        height_px, width_px = min(rows * cell, DETAIL_BOX), min(cols * cell, DETAIL_BOX)
        row_labels = [_cut(t) for t in still.rows]
        col_labels = [_cut(t) for t in still.cols]
        label_w = max(fonts.width(t) for t in row_labels) + 6
        label_h = max(fonts.width(t) for t in col_labels) + 6
        return cls(
            rows,
            cols,
            height_px,
            width_px,
            label_w,
            label_h,
            _every(fonts.line, height_px, rows),
            _every(fonts.line, width_px, cols),
        )

    def origin(self, x: int, top: int) -> tuple[int, int]:
        """Top-left of the heatmap, its title and key labels above it, query labels left."""
        return x + self.label_w, top + TITLE_H + self.label_h

    @property
    def width(self) -> int:
        return self.label_w + self.width_px + 14 + 16 + 34  # heatmap, gap, colour bar, its tick labels

    @property
    def height(self) -> int:
        return TITLE_H + self.label_h + self.height_px


def _heatmap(still: Still, layer: int, head: int, detail: DetailLayout) -> torch.Tensor:
    values = still.maps[layer, head].float()
    pooled = block_max(block_max(values, detail.height_px, 0), detail.width_px, 1)
    mask = masked(detail.rows, detail.cols, detail.height_px, detail.width_px) if still.causal else None
    return paint(pooled, mask)


def _grid_labels(
    pen: ImageDraw.ImageDraw, grid: GridLayout, fonts: _Fonts, top: int, selected: tuple[int, int]
) -> None:
    pen.text((PAD, top), "Model view", font=fonts.bold, fill=INK)
    layer, head = selected
    every = max(1, math.ceil((fonts.width(f"H{grid.heads - 1}") + 4) / grid.step))
    for column in range(grid.heads + 1):
        x, y = grid.cell(top, 0, column)
        text = "mean" if column == grid.heads else f"H{column}"
        if column != grid.heads and column % every and column != head:
            continue
        pen.text(
            (x + grid.thumb // 2, y - 3),
            fonts.plain(text),
            font=fonts.small,
            anchor="ms",
            fill=INK if column == head else MUTED,
        )
    every = max(1, math.ceil(fonts.line / grid.step))
    for row in range(grid.layers):
        x, y = grid.cell(top, row, 0)
        if row % every == 0 or row == layer:
            pen.text(
                (PAD, y + grid.thumb // 2),
                f"L{row}",
                font=fonts.small,
                anchor="lm",
                fill=INK if row == layer else MUTED,
            )
    for row in range(grid.layers):
        for column in range(grid.heads + 1):
            x, y = grid.cell(top, row, column)
            pen.rectangle((x - 1, y - 1, x + grid.thumb, y + grid.thumb), outline=FRAME)
    x, y = grid.cell(top, layer, head)
    pen.rectangle((x - 3, y - 3, x + grid.thumb + 2, y + grid.thumb + 2), outline=INK, width=2)


def _detail_labels(
    image: Image.Image,
    pen: ImageDraw.ImageDraw,
    still: Still,
    detail: DetailLayout,
    fonts: _Fonts,
    at: tuple[int, int],
    selected: tuple[int, int],
) -> None:
    x, top = at
    hx, hy = detail.origin(x, top)
    layer, head = selected
    kind = f" ({still.kind})" if still.kind else ""
    pen.text((x, top), f"Head detail: layer {layer}, head {head}{kind}", font=fonts.bold, fill=INK)
    row_px = detail.height_px / detail.rows
    for i in range(0, detail.rows, detail.row_every):
        centre = hy + int((i + 0.5) * row_px)
        pen.text((hx - 4, centre), fonts.plain(_cut(still.rows[i])), font=fonts.small, anchor="rm", fill=INK)
    col_px = detail.width_px / detail.cols
    for j in range(0, detail.cols, detail.col_every):
        _upright(image, fonts, _cut(still.cols[j]), (hx + int((j + 0.5) * col_px), hy - 4))
    pen.rectangle((hx - 1, hy - 1, hx + detail.width_px, hy + detail.height_px), outline=FRAME)
    _colour_bar(image, pen, fonts, (hx + detail.width_px + 14, hy), detail.height_px)


def _upright(image: Image.Image, fonts: _Fonts, text: str, foot: tuple[int, int]) -> None:
    """`text` written upwards, its end at `foot` (x centred): a key label over its column, as the page's."""
    text = fonts.plain(text)
    w = fonts.width(text) + 4
    label = Image.new("L", (w, fonts.line), 0)
    ImageDraw.Draw(label).text((2, fonts.line // 2), text, font=fonts.small, anchor="lm", fill=255)
    label = label.rotate(90, expand=True)
    ink = Image.new("RGB", label.size, INK)
    image.paste(ink, (foot[0] - label.width // 2, foot[1] - label.height), label)


def _colour_bar(
    image: Image.Image, pen: ImageDraw.ImageDraw, fonts: _Fonts, at: tuple[int, int], height: int
) -> None:
    x, y = at
    values = torch.linspace(1.0, 0.0, height)[:, None].expand(height, 16)
    bar = Image.fromarray(paint(values, None).numpy(), "RGB")
    image.paste(bar, (x, y))
    pen.rectangle((x - 1, y - 1, x + 16, y + height), outline=FRAME)
    for tick in TICKS:
        ty = y + round((1 - tick) * (height - 1))
        pen.line((x + 16, ty, x + 19, ty), fill=MUTED)
        pen.text((x + 22, ty), f"{tick:g}", font=fonts.small, anchor="lm", fill=MUTED)


def _every(label_px: int, axis_px: int, cells: int) -> int:
    """Label one cell in this many, so that labels `label_px` apart fit along `axis_px`."""
    return max(1, math.ceil(label_px * cells / axis_px))


def _cut(token: str) -> str:
    return token if len(token) <= LABEL_CHARS else token[: LABEL_CHARS - 1] + "…"
