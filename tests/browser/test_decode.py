"""app/static/js/decode.js against the server's own encoder (app/compact.py), run in Node (no browser)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tolerances import U32, quant8

from app import compact

NODE = shutil.which("node")
DECODE_JS = Path(__file__).resolve().parents[2] / "app" / "static" / "js" / "decode.js"

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

# Decodes every buffer given on the command line; prints each head, each layer mean, or the error.
SCRIPT = """
import { readFileSync } from "node:fs";
import { decodeCompact } from "./decode.mjs";
const out = [];
for (const path of process.argv.slice(2)) {
  const bytes = readFileSync(path);
  const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  try {
    const a = decodeCompact(buffer);
    const heads = [];
    for (let l = 0; l < a.layers; l++)
      for (let h = 0; h < a.heads; h++) heads.push(Array.from(a.headInto(l, h)));
    const means = [];
    for (let l = 0; l < a.layers; l++) means.push(Array.from(a.meanInto(l)));
    out.push({ tokens: a.tokens, n: a.n, causal: a.causal, boundary: a.boundary, heads, means });
  } catch (error) {
    out.push({ error: `${error.constructor.name}: ${error.message}` });
  }
}
console.log(JSON.stringify(out));
"""


def decode(tmp_path: Path, buffers: list[bytes]) -> list[dict]:
    shutil.copy(DECODE_JS, tmp_path / "decode.mjs")
    (tmp_path / "run.mjs").write_text(SCRIPT)
    paths = []
    for k, buffer in enumerate(buffers):
        path = tmp_path / f"b{k}.hsa1"
        path.write_bytes(buffer)
        paths.append(str(path))
    done = subprocess.run(
        [NODE, str(tmp_path / "run.mjs"), *paths], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout)


def sample(layers: int, heads: int, n: int, *, causal: bool, seed: int) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, n, n, generator=g) * 3
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attentions = scores.softmax(-1)
    tokens = ["[CLS]", "the", "<b>", "the", "é", "[SEP]", "pair", "[SEP]"][:n]
    segments = [0] * (n - 2) + [1, 1]
    header = {
        "model": "test",
        "tokens": tokens,
        "segments": segments,
        "special": [t.startswith("[") for t in tokens],
        "layers": layers,
        "heads": heads,
        "n": n,
        "truncated": False,
        "causal": causal,
    }
    return header, attentions


@pytest.mark.parametrize("scheme", compact.SCHEMES)
@pytest.mark.parametrize("causal", [False, True])
def test_decoder_matches_the_encoder_within_the_stated_error(
    tmp_path: Path, scheme: str, causal: bool
) -> None:
    header, attentions = sample(3, 4, 7, causal=causal, seed=1)
    [result] = decode(tmp_path, [compact.encode(header, attentions, scheme=scheme)])
    assert result["tokens"] == header["tokens"] and result["n"] == 7 and result["causal"] is causal
    assert result["boundary"] == 5
    got = torch.tensor(result["heads"], dtype=torch.float64).reshape(3, 4, 7, 7)
    if scheme in compact.QUANTIZED_SCHEMES:
        assert (got - attentions.double()).abs().max().item() <= quant8()
    else:  # float32 through JSON and back is exact
        assert torch.equal(got, attentions.double())
    if causal:  # masked cells decode to exactly 0
        assert got.triu(1).abs().max().item() == 0
    means = torch.tensor(result["means"], dtype=torch.float64).reshape(3, 7, 7)
    # The decoder's mean of 4 heads, against torch's float32 mean (4 additions and a division: 5u).
    bound = (quant8(heads=4) if scheme in compact.QUANTIZED_SCHEMES else 4 * U32) + 5 * U32
    assert (means - attentions.mean(1).double()).abs().max().item() <= bound


def test_decoder_rejects_damaged_buffers_with_the_values(tmp_path: Path) -> None:
    header, attentions = sample(2, 2, 5, causal=False, seed=2)
    good = compact.encode(header, attentions)
    results = decode(tmp_path, [b"XXXX" + good[4:], good[:-3], good[:6]])
    assert results[0]["error"] == 'CompactDecodeError: bad magic "XXXX", expected "HSA1"'
    expected = (
        f"CompactDecodeError: buffer is {len(good) - 3} bytes, expected {len(good)} for L=2 H=2 n=5 "
        "(row-max-uint8)"
    )
    assert results[1]["error"] == expected
    assert results[2]["error"] == "CompactDecodeError: buffer of 6 bytes is too short"
