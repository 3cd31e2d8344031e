"""A GGUF's config and tokenizer, kept between runs: read once from the file through transformers' GGUF
utilities, then from the cache.

No reader of our own for these: load_gguf_checkpoint gives the config, transformers' GGUF name map each
tensor's transformers name, AutoTokenizer(gguf_file=...) the tokenizer, all slow to rebuild (seconds for a
large vocabulary). They are kept (mha.loading.gguf.folders) as a checkpoint folder without weights
(config.json, the tokenizer files with the chat template, gguf.json, gguf_names.json), named by the
header's digest (Header.digest): everything the folder holds comes from the header alone. The tensors
are never kept: mha.loading.gguf.weights reads them from the file itself at each load.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mha.errors import CheckpointError, CheckpointNotFoundError
from mha.loading.checkpoint_files import PROVENANCE, Checked, check_gguf_cache
from mha.loading.convert import check_shapes
from mha.loading.gguf import folders, weights
from mha.loading.gguf.header import Header, read_header
from mha.loading.gguf.reading import one_reading
from mha.loading.gguf.weights import Names
from mha.loading.load_progress import Progress, report

__all__ = ["CACHE_KIND", "CONFIG_STEPS", "CachedConfig", "cached_config", "cached_directory", "read_names"]

logger = logging.getLogger(__name__)

# The cache folder's kind: a new version when what its folders hold changes, so older folders are unused
# (gguf-v1 held every tensor dequantized to float32; gguf-v2 holds no tensor)
CACHE_KIND = "gguf-v2"
NAMES = "gguf_names.json"  # in the cache folder: llama.cpp's tensor names -> transformers'
CONFIG_STEPS = 3  # the steps of writing a cache folder, for its progress: transformers' readings (2), written
# One lock per header content (its digest): a file is read once however many load it at once, and never
# waits for another file's reading.
_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def cached_directory(file: Path) -> Path | None:
    """The cached config and tokenizer of `file`, if there are any (read_header's checks first)."""
    return folders.cached_folder(CACHE_KIND, read_header(file).digest)


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


class CachedConfig(NamedTuple):
    """A GGUF's cache folder, and what a load reads of it."""

    folder: Path  # config.json, the tokenizer files, gguf.json, gguf_names.json
    checked: Checked  # check_gguf_cache's reading of it: our config, transformers', the converter
    names: Names


def cached_config(header: Header, *, progress: Progress | None = None) -> CachedConfig:
    """The file's config, names and tokenizer: the cached folder, or one written now (and cached; where
    the cache cannot be written, a temporary one, with a warning). A CheckpointError for a file
    transformers cannot read: nothing half-written is ever cached. `progress(step, CONFIG_STEPS)` is told
    each step of writing it (none when the cache has it)."""
    with _file_lock(header.digest):  # a second load of the same header waits, then finds it cached
        return _cached_or_written(header, progress)


def _file_lock(digest: str) -> threading.Lock:
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(digest, threading.Lock())


def _cached_or_written(header: Header, progress: Progress | None) -> CachedConfig:
    file = header.file
    folder = folders.cached_folder(CACHE_KIND, header.digest)
    if folder is not None:
        try:
            return _read_folder(folder)
        except CheckpointError as exc:  # damaged since it was written: write it again
            logger.warning(
                "the cached config of %r in %r is unusable (%s): reading it again",
                str(file),
                str(folder),
                exc,
            )
            folders.discard(folder)
    logger.info(
        "reading the config and tokenizer of %r (GGUF %s, %s) once; later loads read the cache",
        str(file),
        header.architecture,
        header.quantization,
    )
    write = _written(header, progress)
    try:
        published = folders.publish_folder(CACHE_KIND, header.digest, write)
    except OSError as exc:  # not even a temporary folder could be written
        raise CheckpointError(f"{file} could not be read: no folder to write its config to ({exc})") from exc
    cached = _read_folder(published)
    report(progress, CONFIG_STEPS, CONFIG_STEPS)
    return cached


def _read_folder(folder: Path) -> CachedConfig:
    return CachedConfig(folder, check_gguf_cache(folder), read_names(folder))


def _written(header: Header, progress: Progress | None) -> Callable[[Path], None]:
    """The file's config, name map and tokenizer read, and a function that writes them as a checkpoint
    folder without weights and checks it as loading will (check_gguf_cache)."""
    file = header.file
    try:
        hf_config, names, tokenizer = _read(file, header.architecture, progress)
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
        (folder / PROVENANCE).write_text(json.dumps(_provenance(header), indent=2) + "\n")
        checked = check_gguf_cache(folder)
        # the tensors' names and shapes, from the header, against our key map: a mis-shaped file fails here
        shapes = weights.hf_shapes(header, names.processor_config, names.names)
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


def _read(file: Path, architecture: str, progress: Progress | None = None) -> tuple[Any, Names, Any]:
    """(transformers config, {llama.cpp's tensor name: transformers'}, fast tokenizer) of a GGUF file of
    `architecture` (its header's)."""
    report(progress, 0, CONFIG_STEPS)
    with one_reading():
        read = _read_once(file, architecture)
    report(progress, 2, CONFIG_STEPS)  # transformers' readings: most of writing the folder
    return read


def _read_once(file: Path, architecture: str) -> tuple[Any, Names, Any]:
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
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(skeleton, processor)
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    return hf_config, Names(dict(names), dict(parsed["config"])), tokenizer


def _provenance(header: Header) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "file": header.file.name,
        "sha256": header.digest,
        "architecture": header.architecture,
        "name": header.name,
        "tensor_types": header.tensor_types,
        "read_by": {"transformers": version("transformers"), "gguf": version("gguf")},
    }
