"""app/ reaches mha only through the public names mha's packages export (their ``__all__``): a module
path under a package (``mha.trace.windows``) or a private helper (``mha._transfer``) is mha's to move.
Read from app's source; mha is imported to know what each package exports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

APP = Path(__file__).resolve().parents[2] / "app"


def _public(module: ModuleType, name: str) -> ModuleType | bool:
    """What `module.name` is when public: a package or module that says what it exports (its own
    ``__all__``), True for another exported name, False when not exported."""
    if name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        return value if isinstance(value, ModuleType) else True
    try:
        sub = importlib.import_module(f"{module.__name__}.{name}")
    except ImportError:
        return False
    # Public: a package that says what it exports, or one of mha's top modules (errors, devices); never a
    # private helper, nor a module inside a package (the package exports what of it is public).
    says = hasattr(sub, "__all__") and not name.startswith("_")
    return sub if says and (hasattr(sub, "__path__") or module.__name__ == "mha") else False


def _resolve(path: list[str]) -> str | None:
    """None when the dotted `path` (mha, then names) runs through public names only; else the first
    name that is not."""
    module: ModuleType = importlib.import_module("mha")
    for i, name in enumerate(path[1:], start=1):
        found = _public(module, name)
        if found is False:
            return ".".join(path[: i + 1])
        if found is True:
            return None  # an exported name; what is read off it is that object's business
        assert isinstance(found, ModuleType)
        module = found
    return None


def _chain(node: ast.expr) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(names)]
    return None


def _reaches(tree: ast.Module) -> list[tuple[int, list[str]]]:
    """(line, dotted path) of everything `tree` takes from mha: imports, and attribute chains off `mha`."""
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "mha":
                found += [(node.lineno, [*node.module.split("."), a.name]) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")) for a in node.names if a.name.split(".")[0] == "mha"]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] == "mha":
                found.append((node.lineno, chain))
    return found


def test_app_imports_only_the_names_mhas_packages_export() -> None:
    wrong = []
    for file in sorted(APP.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for line, path in _reaches(tree):
            if (bad := _resolve(path)) is not None:
                wrong.append(f"{file.relative_to(APP.parent)}:{line} reaches {bad}")
    assert not wrong, "app reaches past mha's public names:\n" + "\n".join(sorted(set(wrong)))


def test_the_check_sees_a_module_path_and_a_private_helper() -> None:
    """The rule's own check: a module under a package, and a private helper, are caught; exports pass."""
    assert _resolve(["mha", "trace", "windows", "Trace"]) == "mha.trace.windows"
    assert _resolve(["mha", "_transfer", "to_host"]) == "mha._transfer"
    assert _resolve(["mha", "trace", "Trace"]) is None
    assert _resolve(["mha", "load_pretrained"]) is None
    assert _resolve(["mha", "loading", "gguf", "read_header"]) is None
