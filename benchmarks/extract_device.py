"""extract.py --device: issue 27 item 4's figures on one device (attend_batch, and the compact first view's
latency through the service in process), each beside transformers eager + copy to host; benchmarks/gpu.py
reads them as its extract rows through `gpu_rows`. extract.py's docstring says what each figure is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from texts import text_of
from timing import interleaved

BATCH_TEXTS, BATCH_TOKENS = 32, 128
COMPACT_SIZES = (128, 512)
FIRST_VIEW = "/api/attention/compact?scheme=abs-uint8-key-major&bits=auto"  # what the page asks first


def _ms(
    runs: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, tuple[float, float]]:
    """{name: (median ms, min ms)} of interleaved calls, after two warm-up rounds; every run ends with its
    values on the host, so its time includes the device's."""
    times = interleaved(runs, repeats, warm=2, device=device)
    return {name: (t.median_ms, t.min_ms) for name, t in times.items()}


def transformers_eager(device: torch.device) -> Callable[[list[str]], torch.Tensor]:
    """The reference: tokenize (padded), BertModel eager with output_attentions, every layer's maps stacked
    and copied to the host."""
    from transformers import AutoTokenizer, BertModel

    from mha.loading.pretrained import default_model_path

    path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    theirs = BertModel.from_pretrained(path, attn_implementation="eager").to(device).eval()

    def run(texts: list[str]) -> torch.Tensor:
        batch = tokenizer(texts, padding=True, return_tensors="pt").to(device)
        with torch.no_grad():
            return torch.stack(theirs(**batch, output_attentions=True).attentions).cpu()

    return run


def batch_figures(
    ours: Any, theirs: Callable[[list[str]], torch.Tensor], device: torch.device, repeats: int
) -> dict[str, Any]:
    """attend_batch of BATCH_TEXTS different texts of BATCH_TOKENS tokens against `theirs` of the same."""
    texts = [text_of(BATCH_TOKENS, ours.tokenizer, salt=i) for i in range(BATCH_TEXTS)]
    batch = _ms(
        {
            "ours": lambda: ours.attend_batch(texts),
            "ours_no_hidden": lambda: ours.attend_batch(texts, hidden_state=False),
            "theirs": lambda: theirs(texts),
        },
        repeats,
        device,
    )
    return {
        "texts": BATCH_TEXTS,
        "tokens": BATCH_TOKENS,
        **{f"{name}_ms": median for name, (median, _) in batch.items()},
        **{f"{name}_min_ms": least for name, (_, least) in batch.items()},
        "ratio": batch["ours"][0] / batch["theirs"][0],
        "ratio_no_hidden": batch["ours_no_hidden"][0] / batch["theirs"][0],
    }


def device_figures(device: str = "cpu", *, repeats: int = 10) -> dict[str, Any]:
    """attend_batch 32 x 128 and the compact first view's latency at COMPACT_SIZES on `device`, each beside
    transformers eager + copy to host: {"device", "attend_batch": {...}, "compact": {n: {...}}}, times in ms
    (median and min), ratios ours / reference of the medians."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from mha import load_pretrained

    torch_device = torch.device(device)
    theirs = transformers_eager(torch_device)
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu",
        # its own model, freed before the service loads one
        "attend_batch": batch_figures(load_pretrained(device=torch_device), theirs, torch_device, repeats),
        "compact": {},
    }
    settings = Settings(
        device=device,
        log_level="warning",
        models={},
        allowed_hosts=["testserver"],
        bundled_llm=False,
        random_model=False,
        cache_size=0,  # every request runs its forward and its encoding, as a new text does
    )
    with TestClient(create_app(settings)) as client:
        tokenizer = client.app.state.service.models.registry.get(None)[1].tokenizer  # type: ignore[attr-defined]
        for n in COMPACT_SIZES:
            text = text_of(n, tokenizer)

            def ask(text: str = text) -> None:
                answer = client.post(FIRST_VIEW, json={"text": text})
                if answer.status_code != 200:
                    raise RuntimeError(f"{FIRST_VIEW} answered {answer.status_code}: {answer.text[:200]}")

            timed = _ms({"service": ask, "theirs": lambda text=text: theirs([text])}, repeats, torch_device)
            figures["compact"][n] = {
                "service_ms": timed["service"][0],
                "service_min_ms": timed["service"][1],
                "theirs_ms": timed["theirs"][0],
                "theirs_min_ms": timed["theirs"][1],
                "ratio": timed["service"][0] / timed["theirs"][0],
            }
    return figures


def gpu_rows(device: str = "cuda", quick: bool = False) -> list[dict[str, Any]]:
    """device_figures as benchmarks/gpu.py's rows (its Row's fields)."""
    figures = device_figures(device, repeats=3 if quick else 10)
    batch = figures["attend_batch"]
    rows = [
        {
            "check": f"attend_batch {batch['texts']} x {batch['tokens']}",
            "ours": f"{batch['ours_ms']:.1f} ms (no hidden state {batch['ours_no_hidden_ms']:.1f})",
            "reference": f"transformers eager + copy to host {batch['theirs_ms']:.1f} ms",
            "ratio": batch["ratio"],
            "note": "goal <= 1",
            "values": {k: v for k, v in batch.items() if isinstance(v, float)},
        }
    ]
    for n, one in figures["compact"].items():
        rows.append(
            {
                "check": f"/api/attention/compact {n} tokens",
                "ours": f"{one['service_ms']:.1f} ms",
                "reference": f"transformers eager + copy to host {one['theirs_ms']:.1f} ms",
                "ratio": one["ratio"],
                "note": "the whole request: forward, quantize, gzip",
                "values": one,
            }
        )
    return rows


def print_device_figures(figures: dict[str, Any]) -> None:
    batch = figures["attend_batch"]
    print(
        f"{figures['device']}, torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}; median (min) of interleaved repeats, ms"
    )
    print(f"{'check':<34} {'ours':>17} {'reference':>17} {'ratio':>7}")
    print(
        f"{'attend_batch 32 x 128':<34} {batch['ours_ms']:>8.1f} ({batch['ours_min_ms']:>6.1f})"
        f" {batch['theirs_ms']:>8.1f} ({batch['theirs_min_ms']:>6.1f}) {batch['ratio']:>7.3f}"
    )
    print(
        f"{'  without the hidden state':<34} {batch['ours_no_hidden_ms']:>8.1f}"
        f" ({batch['ours_no_hidden_min_ms']:>6.1f}) {'':>17} {batch['ratio_no_hidden']:>7.3f}"
    )
    for n, one in figures["compact"].items():
        check = f"/api/attention/compact {n} tokens"
        print(
            f"{check:<34} {one['service_ms']:>8.1f} ({one['service_min_ms']:>6.1f})"
            f" {one['theirs_ms']:>8.1f} ({one['theirs_min_ms']:>6.1f}) {one['ratio']:>7.3f}"
        )
    print("reference: transformers' BertModel eager (output_attentions) + torch.stack(...).cpu(), same texts")
