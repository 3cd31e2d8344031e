"""The page's ES modules linked into one classic script, at run time, in Python (no Node at install).

A snapshot file cannot load modules (a `file://` page or a sandboxed `srcdoc` has no origin to load them
from, and its CSP allows only hashed inline scripts), so its one inline script is the modules of
app/static/js linked from an entry (main.js): each module in its own function scope, in the order the
browser would evaluate them (depth first, imports in source order: a module runs after everything it
imports), its exports returned as a frozen object, and every `import {a, b as c} from "./x.js";` made
`const {a, b: c} = modules["x.js"];`. Destructuring reads each export once, when the importing module
starts; that equals ES modules' live bindings because the graph is acyclic (a cycle is refused) and
every export is a `const`, a function or a class, never reassigned (`export let` and `export var` are
refused).

Only the forms our modules use are accepted; any other is a `BundleError` naming the file and line, so
a module written in a new form fails a test rather than a user's snapshot:

    import { a, b as c } from "./x.js";       (one or several lines)
    export function f / export async function f / export class C / export const NAME = ...
    export { a, b as c };                      (names this module declares or imports)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from app.page import JS_DIR

__all__ = ["Bundle", "BundleError", "bundle", "link"]

ENTRY = "main.js"
IDENT = r"[A-Za-z_$][\w$]*"
_IMPORT = re.compile(
    r'^import\s*\{(?P<names>[^}]*)\}\s*from\s*"\./(?P<file>[\w.-]+\.js)"\s*;[ \t]*(?://[^\n]*)?$', re.M
)
_EXPORT_DECL = re.compile(
    rf"^export\s+(?P<kind>async\s+function\*?|function\*?|class|const)\s+(?P<name>{IDENT})", re.M
)
_EXPORT_LIST = re.compile(r"^export\s*\{(?P<names>[^}]*)\}\s*;[ \t]*(?://[^\n]*)?$", re.M)
_STATEMENT = re.compile(r"^(import|export)\b", re.M)
_DYNAMIC = re.compile(r"\bimport\s*\(|\bimport\.meta\b")
_SPEC = re.compile(rf"^(?P<name>{IDENT})(?:\s+as\s+(?P<alias>{IDENT}))?$")


class BundleError(ValueError):
    """A module the bundler cannot link: an import or export form it does not support, a missing file or
    name, or an import cycle."""


@dataclass(frozen=True)
class Module:
    """One module: its file name, its source, what it imports (file -> [(name, local)]) and exports
    (exported name -> local name)."""

    file: str
    source: str
    imports: dict[str, list[tuple[str, str]]]
    exports: dict[str, str]


@dataclass(frozen=True)
class Bundle:
    """The linked script and the modules in it, in evaluation order (the entry last)."""

    script: str
    modules: tuple[str, ...]


def _line(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _specs(names: str, where: str) -> list[tuple[str, str]]:
    """(name, local) of `a, b as c`; a trailing comma is allowed, as Prettier writes long lists."""
    specs = []
    for spec in (part.strip() for part in names.split(",")):
        if not spec:
            continue
        match = _SPEC.match(" ".join(spec.split()))
        if match is None:
            raise BundleError(f"{where}: cannot read {spec!r} in an import or export list")
        specs.append((match["name"], match["alias"] or match["name"]))
    return specs


def parse(file: str, source: str) -> Module:
    """The module's imports and exports; BundleError for any statement form the bundler does not take."""
    if found := _DYNAMIC.search(source):
        where = f"{file}:{_line(source, found.start())}"
        raise BundleError(f"{where}: dynamic import() and import.meta are not bundled")
    imports: dict[str, list[tuple[str, str]]] = {}
    exports: dict[str, str] = {}
    taken = set()  # offsets of the statements read
    for match in _IMPORT.finditer(source):
        where = f"{file}:{_line(source, match.start())}"
        imports.setdefault(match["file"], []).extend(_specs(match["names"], where))
        taken.add(match.start())
    for match in _EXPORT_LIST.finditer(source):
        where = f"{file}:{_line(source, match.start())}"
        exports.update({alias: name for name, alias in _specs(match["names"], where)})
        taken.add(match.start())
    for match in _STATEMENT.finditer(source):
        if match.start() in taken:
            continue
        where = f"{file}:{_line(source, match.start())}"
        declared = _EXPORT_DECL.match(source, match.start())
        if declared is None:
            text = source[match.start() : source.find("\n", match.start())].strip()
            raise BundleError(
                f"{where}: {text!r} is not a form the snapshot bundler links (app/snapshot/bundle.py: named "
                "imports from ./x.js, exported const, function and class declarations, export { ... })"
            )
        exports[declared["name"]] = declared["name"]
    return Module(file, source, imports, exports)


def _body(module: Module) -> str:
    """The module's source with its import statements made reads of the linked exports, its export
    statements plain declarations; line numbers are kept (each statement becomes as many lines)."""

    def read(match: re.Match[str]) -> str:
        specs = _specs(match["names"], module.file)
        names = ", ".join(name if name == local else f"{name}: {local}" for name, local in specs)
        pad = "\n" * match.group(0).count("\n")
        return f'const {{ {names} }} = modules["{match["file"]}"];{pad}'

    body = _IMPORT.sub(read, module.source)
    body = _EXPORT_LIST.sub(lambda match: "\n" * match.group(0).count("\n"), body)
    return re.sub(r"^export\s+", "", body, flags=re.M)


def _order(entry: str, read: dict[str, Module], folder: Path) -> list[str]:
    """Depth-first post-order from `entry`, imports in source order: the browser's evaluation order."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(file: str) -> None:
        if file in order:
            return
        if file in visiting:
            cycle = " -> ".join([*visiting[visiting.index(file) :], file])
            raise BundleError(f"import cycle {cycle}: the snapshot bundler links acyclic graphs only")
        path = folder / file
        if not path.is_file():
            importer = visiting[-1] if visiting else "the entry"
            raise BundleError(f"{importer} imports ./{file}, which is not in {folder}")
        read[file] = parse(file, path.read_text(encoding="utf-8"))
        visiting.append(file)
        for dependency, specs in read[file].imports.items():
            visit(dependency)
            if missing := [name for name, _ in specs if name not in read[dependency].exports]:
                names = ", ".join(missing)
                raise BundleError(f"{file} imports {names} from ./{dependency}, which does not export them")
        visiting.pop()
        order.append(file)

    visit(entry)
    return order


def link(entry: str = ENTRY, folder: Path = JS_DIR) -> Bundle:
    """The modules reachable from `entry` in `folder` as one classic script that runs them in order once
    the document is parsed (as module scripts run: deferred)."""
    read: dict[str, Module] = {}
    order = _order(entry, read, folder)
    parts = ['(function () {\n"use strict";\nconst modules = Object.create(null);\nfunction run() {\n']
    for file in order:
        module = read[file]
        exported = ", ".join(f"{json_key(name)}: {local}" for name, local in module.exports.items())
        parts.append(
            f"// ---- {file} ----\nmodules[{json_key(file)}] = (function () {{\n{_body(module)}\n"
            f"return Object.freeze({{ {exported} }});\n}})();\n"
        )
    parts.append(
        '}\nif (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run, '
        "{ once: true });\nelse run();\n})();\n"
    )
    return Bundle(script="".join(parts), modules=tuple(order))


def json_key(name: str) -> str:
    """A property name or string literal for `name` (module files and export names are plain ASCII)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1)
def bundle() -> Bundle:
    """The page's script (main.js and all it imports), linked once per process: the files of an installed
    package do not change while it runs."""
    return link()
