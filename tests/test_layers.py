"""The layers stay visible: no import cycle inside ``marlbuf/``, no module that reaches into
another module's private names, and the capabilities table the docs render is the code's."""

from __future__ import annotations

import ast
from pathlib import Path

import marlbuf

PACKAGE = Path(marlbuf.__file__).resolve().parent
#: the packages above the core that live beside it (symlinked into the package): their own
#: layering is not the core's
ABOVE = ("algos", "bench", "envs", "profiling")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts[0] in ABOVE:
            continue
        name = ".".join(("marlbuf", *rel.parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The marlbuf modules ``name`` imports anywhere (function bodies included): a lazy
    import is still a dependency."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    type_only = {  # imports under ``if TYPE_CHECKING:`` are for annotations, not run
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            subs = {f"{source}.{a.name}" for a in node.names} & set(modules)
            if subs:
                out |= subs
            if len(subs) < len(node.names) and source in modules:
                out.add(source)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
    out.discard(name)
    return out


def test_no_import_cycle_in_the_core() -> None:
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = [*path[path.index(d) :], d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_names_across_modules() -> None:
    """``other._name`` is only read where ``_name`` is defined in the same module (its own
    classes and objects); ``self``/``cls`` and dunders are exempt."""
    offenders = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        defined: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attr = node.attr
                if not attr.startswith("_") or attr.startswith("__") or attr in defined:
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                offenders.append(f"{name}:{node.lineno}: .{attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("marlbuf"):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and alias.name not in ("_config", "_kernels"):
                        offenders.append(f"{name}:{node.lineno}: import {alias.name}")
    assert not offenders, "private names used across modules:\n" + "\n".join(offenders)


def test_the_docs_render_the_capabilities_table() -> None:
    from marlbuf.stores.capabilities import markdown_table

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    start, end = "<!-- capabilities:start -->\n", "<!-- capabilities:end -->"
    shown = doc[doc.index(start) + len(start) : doc.index(end)]
    assert shown == markdown_table(), (
        "docs/architecture.md's capabilities table differs from marlbuf.stores.capabilities: "
        "paste markdown_table()'s output between the markers"
    )
