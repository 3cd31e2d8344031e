"""Issue 34 item 3's goal: GET /api/models answers within 50 ms with 30 store entries (stand-in files).

The stores are laid out as ollama, LM Studio and the Hugging Face cache lay theirs out
(tests/store_files.py): 10 ollama models (manifest + blob), 10 LM Studio files and 10 Hugging Face
snapshots (links into ../../blobs), each a tiny Llama (Q8_0 GGUF) or Qwen2 (safetensors) checkpoint,
plus 5 broken entries listed with their reason (not counted among the 30). Printed:
  startup  = the one scan of every folder and store (find_models) and the startup checks that read every
             header (Registry.check_all): once, what a server pays before it answers
  models   = GET /api/models through the app, median and min of the repeats, beside the 50 ms goal as a
             ratio (< 1 meets it)

    PYTHONPATH=. .venv/bin/python benchmarks/stores.py [--per-store 10] [--repeats 50]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from checkpoints import build_checkpoint  # noqa: E402
from gguf_files import write_gguf  # noqa: E402
from store_files import OLLAMA_MODEL, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model  # noqa: E402
from timing import ratio, timed  # noqa: E402

GOAL_MS = 50.0
LIBRARY = ("registry.ollama.ai", "library")


def build_stores(root: Path, per_store: int) -> dict[str, Path]:
    """The three store folders under `root`, `per_store` models each, and five broken ollama entries."""
    folders = {key: root / key for key in ("ollama_models", "lmstudio_models", "hf_cache")}
    llama = build_checkpoint("llama", root / "src" / "llama")
    qwen2 = build_checkpoint("qwen2", root / "src" / "qwen2")
    for i in range(per_store):
        # a distinct file each (seed): distinct blobs, as distinct models are
        gguf = write_gguf(
            build_checkpoint("llama", root / "src" / f"l{i}", seed=i),
            root / "src" / f"{i}.gguf",
            qtype="Q8_0",
        )
        ollama_model(folders["ollama_models"], (*LIBRARY, f"model{i}", "7b"), gguf)
        lmstudio_model(folders["lmstudio_models"], "pub", f"Model{i}-GGUF", f"model{i}-Q8_0.gguf", gguf)
        hf_snapshot(folders["hf_cache"], f"org/model{i}", qwen2 if i % 2 else llama)
    ollama = folders["ollama_models"]
    ollama_manifest(ollama, (*LIBRARY, "text", "latest"), "not json")
    ollama_manifest(
        ollama, (*LIBRARY, "gone", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": "sha256:" + "0" * 64}]
    )
    ollama_manifest(
        ollama, (*LIBRARY, "escape", "latest"), [{"mediaType": OLLAMA_MODEL, "digest": "sha256:../../x"}]
    )
    ollama_model(ollama, (*LIBRARY, "notgguf", "latest"), b"not a model")
    ollama_model(
        ollama,
        (*LIBRARY, "bert", "latest"),
        write_gguf(llama, root / "src" / "bert.gguf", architecture="bert"),
    )
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-store", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from fastapi.testclient import TestClient

    import mha
    from app.main import create_app
    from app.registry import Registry
    from app.service.offers import find_models
    from app.settings import Settings

    root = Path(tempfile.mkdtemp(prefix="headscope-stores-"))
    os.environ["HEADSCOPE_CACHE_DIR"] = str(root / "cache")
    try:
        folders = build_stores(root, args.per_store)
        settings = Settings(device="cpu", threads=1, log_level="critical", bundled_llm=False, discover=True,
                            allowed_hosts=["testserver"], **folders)  # fmt: skip
        started = time.perf_counter()
        offers = find_models(settings)
        scanned = time.perf_counter()
        registry: Registry[mha.AttentionModel] = Registry(
            {name: offer.loader for name, offer in offers.items()},
            default=mha.DEFAULT_MODEL_NAME,
            checks={name: offer.check for name, offer in offers.items() if offer.check is not None},
        )
        registry.check_all()
        checked = time.perf_counter()
        stored = [o for o in offers.values() if o.source in ("ollama", "lmstudio", "huggingface")]
        broken = sum(1 for entry in registry if entry.error is not None)
        scan_ms, check_ms = 1000 * (scanned - started), 1000 * (checked - scanned)
        print(f"store entries: {len(stored) - broken} models and {broken} listed with their reason")
        print(
            f"startup: scan {scan_ms:.1f} ms, header checks {check_ms:.0f} ms "
            f"({check_ms / len(stored):.1f} ms an entry)"
        )
        with TestClient(create_app(settings)) as client:
            # the startup's checks run in the background: time the list once they have read every header
            assert client.app.state.service.models.loads.started.wait(600)  # type: ignore[attr-defined]
            assert client.get("/api/models").status_code == 200
            got = timed(lambda: client.get("/api/models"), args.repeats, warm=3)
            count = len(client.get("/api/models").json()["models"])
        print(f"GET /api/models ({count} entries): median {got.median_ms:.1f} ms, min {got.min_ms:.1f} ms; "
              f"goal {GOAL_MS:.0f} ms: ratio {ratio(got.median_ms, GOAL_MS):.2f} (median), "
              f"{ratio(got.min_ms, GOAL_MS):.2f} (min)")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
