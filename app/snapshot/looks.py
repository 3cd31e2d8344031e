"""The page's look, for what app.snapshot draws in Python (the plotly figure, the still image): colors.js's
colour scale and mask colours, read from that file itself so the page and Python have one scale, its
256-entry LUT, and decoder.js's spelling of a tokenizer's marks.

May import: app.package_data and torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import torch

from app.package_data import STATIC, package_dir

__all__ = [
    "BYTE_LEVEL_MARKS",
    "SENTENCEPIECE_MARKS",
    "PageColors",
    "display_token",
    "lut",
    "page_colors",
    "rgb",
]

# decoder.js displayToken: a tokenizer's marks as visible signs; the byte-level ones only for a byte-level BPE
SENTENCEPIECE_MARKS = (("▁", "␣"),)
BYTE_LEVEL_MARKS = (("Ġ", "␣"), ("Ċ", "↵"), ("ĉ", "⇥"), *SENTENCEPIECE_MARKS)


@dataclass(frozen=True)
class PageColors:
    """The page's attention colours (colors.js): the Plotly colour scale and the masked cells' hatch."""

    colorscale: tuple[tuple[float, str], ...]
    mask_bg: str
    mask_fg: str


@cache
def page_colors() -> PageColors:
    """STOPS, MASK_BG_CSS and MASK_FG_CSS as app/static/js/colors.js writes them (COLORSCALE is STOPS)."""
    path = package_dir(STATIC) / "js" / "colors.js"
    source = path.read_text("utf-8")
    block = re.search(r"export const STOPS = Object\.freeze\(\[(.*?)\]\);", source, re.DOTALL)
    stops = re.findall(r'\[\s*([0-9.]+)\s*,\s*"(#[0-9a-fA-F]{6})"\s*\]', block.group(1) if block else "")

    def constant(name: str) -> str:
        found = re.search(rf'export const {name} = "(#[0-9a-fA-F]{{6}})";', source)
        if found is None:
            raise RuntimeError(f'{path} has no `export const {name} = "#rrggbb";` to read')
        return found.group(1)

    if len(stops) < 2:
        raise RuntimeError(f'{path} has no `export const STOPS = Object.freeze([[t, "#rrggbb"], ...]);`')
    scale = tuple((float(t), colour) for t, colour in stops)
    return PageColors(colorscale=scale, mask_bg=constant("MASK_BG_CSS"), mask_fg=constant("MASK_FG_CSS"))


def rgb(code: str) -> tuple[int, int, int]:
    """ "#rrggbb" -> (r, g, b)."""
    v = int(code[1:], 16)
    return (v >> 16) & 255, (v >> 8) & 255, v & 255


@cache
def _lut() -> torch.Tensor:
    stops = [(t, rgb(code)) for t, code in page_colors().colorscale]
    rows = []
    for k in range(256):
        t = k / 255
        s = 1
        while s < len(stops) - 1 and stops[s][0] < t:
            s += 1
        (t0, c0), (t1, c1) = stops[s - 1], stops[s]
        f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
        rows.append([math.floor(a + f * (b - a) + 0.5) for a, b in zip(c0, c1, strict=True)])  # Math.round
    return torch.tensor(rows, dtype=torch.uint8)


def lut() -> torch.Tensor:
    """[256, 3] uint8, colors.js LUT's colours: entry k for value k/255, interpolated and rounded as there."""
    return _lut().clone()  # callers index it; a clone keeps the cached one unchanged


def display_token(token: str, *, byte_level: bool) -> str:
    """A token as the page shows it: "Ġcat" -> "␣cat" where the tokenizer is byte-level, "▁cat" -> "␣cat"."""
    for mark, sign in BYTE_LEVEL_MARKS if byte_level else SENTENCEPIECE_MARKS:
        token = token.replace(mark, sign)
    return token
