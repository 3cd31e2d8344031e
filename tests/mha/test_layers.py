"""The floors of mha hold: each package imports only what its docstring's "May import:" names (TYPE_CHECKING
imports count, as they reach up too), so that data flows one way, loading -> networks -> analysis/trace ->
the model facade -> corpus and the service. Read from the source, nothing imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "mha"
PRIVATE = {p.stem for p in ROOT.glob("_*.py") if p.stem != "__init__"}


def _rule(package: Path) -> set[str] | None:
    """The mha modules and packages `package` may import, from its docstring's "May import:"."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    found = re.search(r"May import:(.*?)(?:Never|Nothing else|$)", doc, re.S)
    if found is None:
        return None
    text = found.group(1)
    allowed = set(re.findall(r"``mha\.([a-z_]+)``", text))
    if "private helpers" in text:
        allowed |= PRIVATE
    return allowed


def _governing(module: Path) -> tuple[Path, set[str]]:
    """The nearest package above `module` whose docstring says what it may import, and that rule."""
    for package in module.parents:
        if package == ROOT.parent:
            break
        if (package / "__init__.py").is_file() and package != ROOT:
            rule = _rule(package)
            if rule is not None:
                return package, rule
    raise AssertionError(f"{module}: no package above it says what it may import")


def _mha_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, first name under mha) of every import of mha in `tree`, wherever it stands."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "mha"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "mha":
                found += [(node.lineno, f"mha.{a.name}") for a in node.names]
            elif node.module.split(".")[0] == "mha":
                found.append((node.lineno, node.module))
    return [(line, name.split(".")[1] if "." in name else "") for line, name in found]


PACKAGES = sorted(p.parent for p in ROOT.glob("*/__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_imports_only_what_its_docstring_allows(package: Path) -> None:
    wrong = []
    for module in sorted(package.rglob("*.py")):
        governing, allowed = _governing(module)
        own = governing.relative_to(ROOT).parts[0]
        for line, name in _mha_imports(ast.parse(module.read_text(encoding="utf-8"))):
            if name != own and name not in allowed:
                wrong.append(f"{module.relative_to(ROOT.parent)}:{line} imports mha.{name or '(the top)'}")
    assert not wrong, f"{package.name} may import only {sorted(_rule(package) or ())}:\n" + "\n".join(wrong)


def test_loading_turns_a_file_into_a_network_and_reaches_no_higher() -> None:
    """The issue's rule by name, apart from what the docstring happens to say."""
    allowed = _rule(ROOT / "loading") or set()
    assert not allowed & {"analysis", "trace", "model", "corpus"}, allowed
