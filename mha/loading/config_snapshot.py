"""A transformers config kept as the values it answered, so that a GGUF's cached config loads without it.

Reading config.json through AutoConfig builds the family's config class, and importing that class imports
half of transformers (its model loading, torch.distributed's tensors, accelerate): about a second on a
small CPU, most of a cached GGUF load. A GGUF's cache folder (mha.loading.gguf.cache) therefore
also keeps SNAPSHOT: every public name of the config AutoConfig reads from that directory, with its value
where JSON holds it exactly, and to_dict(). A Snapshot answers attribute reads and to_dict() as that config
did, so a converter's config_from_hf reads it unchanged; a name whose value was not kept (a method, a set, an
object) raises NotKept, which is not an AttributeError, so getattr(config, name, default) cannot quietly
take the default where the real config had a value. mha.loading.checkpoint_files.read_config uses a snapshot
only where it was written by the transformers installed now and our config from it is made without error;
else it reads config.json through AutoConfig, as for any checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["SNAPSHOT", "NotKept", "Snapshot", "read", "take", "write"]

SNAPSHOT = "config_snapshot.json"


class NotKept(LookupError):
    """A name the config had whose value the snapshot did not keep: read config.json instead."""


class Snapshot:
    """A transformers config's public names, read back: their values, to_dict(), and model_type."""

    def __init__(self, values: dict[str, Any], not_kept: list[str], as_dict: dict[str, Any]) -> None:
        self._values = values
        self._not_kept = frozenset(not_kept)
        self._as_dict = as_dict

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return copy.deepcopy(values[name])  # a caller that edits a dict edits its own copy
        if name in self.__dict__.get("_not_kept", ()):
            raise NotKept(name)
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._as_dict)

    def __repr__(self) -> str:
        return f"Snapshot({self._values.get('model_type')!r}, {len(self._values)} values)"


def take(hf_config: Any) -> dict[str, Any] | None:
    """What a snapshot file holds for `hf_config`: each public name's value where JSON gives it back
    exactly (else the name alone), to_dict(), and the transformers that read it. None where to_dict()
    itself does not come back exactly."""
    import transformers

    as_dict = hf_config.to_dict()
    if not _round_trips(as_dict):
        return None
    values: dict[str, Any] = {}
    not_kept: list[str] = []
    aliases = set(getattr(hf_config, "attribute_map", {}))  # GPT-2's hidden_size for n_embd, ...
    names = {n for n in dir(hf_config) if not n.startswith("_")} | aliases
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # reading every name reads the deprecated ones, each with a warning
    try:
        for name in sorted(names):
            try:
                value = getattr(hf_config, name)
            except Exception:  # a property that raises: whoever reads it gets config.json's answer
                not_kept.append(name)
                continue
            if not callable(value) and _round_trips(value):
                values[name] = value
            else:
                not_kept.append(name)
    finally:
        quiet.setLevel(level)
    return {
        "transformers": transformers.__version__,
        "values": values,
        "not_kept": not_kept,
        "to_dict": as_dict,
    }


def write(folder: Path, taken: dict[str, Any]) -> None:
    text = json.dumps(_encode(taken), indent=1, sort_keys=True)
    (folder / SNAPSHOT).write_text(text + "\n", encoding="utf-8")


def read(directory: Path) -> Snapshot | None:
    """The snapshot in `directory`, if there is one that the transformers installed now wrote."""
    try:
        taken = _decode(json.loads((directory / SNAPSHOT).read_text(encoding="utf-8")))
        if taken["transformers"] != _installed_transformers():
            return None  # another version may read config.json otherwise
        values, as_dict = dict(taken["values"]), dict(taken["to_dict"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or not ours: config.json
        return None
    # AutoConfig records the folder it read, which was the cache's temporary one: it is here now
    for fields, key in ((values, "name_or_path"), (as_dict, "_name_or_path")):
        if key in fields:
            fields[key] = str(directory)
    return Snapshot(values, list(taken["not_kept"]), as_dict)


def _installed_transformers() -> str:
    """transformers' version from its installed metadata: importing it to ask costs about a second."""
    from importlib.metadata import version

    return version("transformers")


# JSON keeps str, int, float, bool, None and lists. Every dict is written as a one-key wrapper, so the
# tuples and the dicts with keys other than strings (id2label's ints) that configs hold come back as such.
def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {"dict": {k: _encode(v) for k, v in value.items()}}
        return {"items": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, inner),) = value.items()  # ValueError for any other dict: not a file we wrote
    if kind == "tuple":
        return tuple(_decode(v) for v in inner)
    if kind == "dict":
        return {k: _decode(v) for k, v in inner.items()}
    if kind == "items":
        return {_decode(k): _decode(v) for k, v in inner}
    raise ValueError(f"not a snapshot: {kind!r}")


def _round_trips(value: Any) -> bool:
    """Whether the file gives `value` back equal and of the same types all the way down."""
    try:
        back = _decode(json.loads(json.dumps(_encode(value))))
    except (TypeError, ValueError):
        return False
    return _same(value, back)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
