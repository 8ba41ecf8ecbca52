"""The layers stay visible, over the whole tree (``algos``, ``bench``, ``envs`` and ``profiling``
included) and counting imports under ``TYPE_CHECKING``:

* no import cycle in the core (``marlbuf/`` without the four packages above it), nor in the
  whole tree;
* the core imports none of ``algos``, ``bench``, ``envs``, ``profiling``;
* no module but the front (``marlbuf/buffer.py``) takes the buffer object: the front's parts
  neither import it nor take a parameter of its type (the clients of the public API, which
  build buffers and hand them around, are exempt);

and no module reaches into another module's private names, and the capabilities table the docs
render is the code's."""

from __future__ import annotations

import ast
from pathlib import Path

import marlbuf

PACKAGE = Path(marlbuf.__file__).resolve().parent
#: the packages above the core that live beside it (symlinked into the package)
ABOVE = ("algos", "bench", "envs", "profiling")
#: the front: the one module that holds the buffer object's parts together
FRONT = "marlbuf.buffer"
#: the buffer's class, by the names a module can know it by
BUFFER_CLASS = "MultiAgentReplayBuffer"
#: clients of the front's public API inside the core: adapters, recorders and the sharded
#: buffer's actors build buffers and hand them around, as the trainers above the core do
CLIENTS = ("marlbuf", "marlbuf.compat", "marlbuf.offline", "marlbuf.distributed._shard")
#: TEMPORARY: modules that still take (or hold) the buffer object, each with what it does;
#: every entry is to go, and the test fails once one is no longer needed, so the list shrinks
TAKES_THE_BUFFER_FOR_NOW: dict[str, str] = {}
#: TEMPORARY: core modules that still import a layer above the core, each with why
IMPORTS_ABOVE_FOR_NOW: dict[str, str] = {}
#: TEMPORARY: annotation-only imports of the front that close a cycle, the same modules
CYCLE_EDGES_FOR_NOW: set[tuple[str, str]] = set()


def _name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(("marlbuf", *rel.parts)).removesuffix(".__init__")


def _all_modules() -> dict[str, Path]:
    """Every module of the tree: the core and the packages above it."""
    return {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_core(name: str) -> bool:
    parts = name.split(".")
    return len(parts) < 2 or parts[1] not in ABOVE


def _modules() -> dict[str, Path]:
    """The core's modules."""
    return {name: path for name, path in _all_modules().items() if _is_core(name)}


def _imported(name: str, path: Path, tree: ast.Module) -> set[str]:
    """Every module name ``name`` imports, anywhere (function bodies and ``TYPE_CHECKING``
    blocks included: a lazy import is still a dependency, an annotation-only one a coupling),
    as written (``from a import b`` gives ``a`` and ``a.b``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            out.add(source)
            out |= {f"{source}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports anywhere (``TYPE_CHECKING`` blocks and
    function bodies included): ``from package import module`` is the module, ``from module
    import name`` the module."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            subs = {f"{source}.{a.name}" for a in node.names} & set(modules)
            out |= subs
            if len(subs) < len(node.names) and source in modules:
                out.add(source)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
    out.discard(name)
    return out


def test_no_import_cycle_in_the_tree() -> None:
    """None in the core, and none in the packages above it either."""
    modules = _all_modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    used = {edge for edge in CYCLE_EDGES_FOR_NOW if edge[1] in graph.get(edge[0], ())}
    assert used == CYCLE_EDGES_FOR_NOW, (
        f"{sorted(CYCLE_EDGES_FOR_NOW - used)} no longer import the front: remove them from "
        "CYCLE_EDGES_FOR_NOW"
    )
    for source, target in CYCLE_EDGES_FOR_NOW:
        graph[source].discard(target)
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


def test_the_core_imports_nothing_above_it() -> None:
    """Not ``marlbuf.algos``/``bench``/``envs``/``profiling``, nor the bare folders."""
    above = {f"marlbuf.{p}" for p in ABOVE} | set(ABOVE)
    offenders, still = [], set()
    for name, path in _modules().items():
        for imp in _imported(name, path, ast.parse(path.read_text())):
            if imp in above or any(imp.startswith(f"{a}.") for a in above):
                if name in IMPORTS_ABOVE_FOR_NOW:
                    still.add(name)
                else:
                    offenders.append(f"{name} imports {imp}")
    done = set(IMPORTS_ABOVE_FOR_NOW) - still
    assert not done, f"{sorted(done)} no longer import above the core: remove them from the list"
    assert not offenders, "the core imports the layers above it:\n" + "\n".join(
        sorted(set(offenders))
    )


def _takes_the_buffer(name: str, path: Path) -> list[str]:
    """Where ``name`` imports the front's buffer class or takes a parameter of its type."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == FRONT:
            found += [f"{name}:{node.lineno}: imports {FRONT}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import) and any(a.name == FRONT for a in node.names):
            found.append(f"{name}:{node.lineno}: imports {FRONT}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if arg.annotation is not None and BUFFER_CLASS in ast.unparse(arg.annotation):
                    found.append(f"{name}:{node.lineno}: {node.name}({arg.arg}: ...)")
    return found


def _is_client(name: str) -> bool:
    return any(name == c or (c != "marlbuf" and name.startswith(f"{c}.")) for c in CLIENTS)


def test_no_module_but_the_front_takes_the_buffer() -> None:
    offenders, still = [], set()
    for name, path in _modules().items():
        if name == FRONT or _is_client(name):
            continue
        found = _takes_the_buffer(name, path)
        if name in TAKES_THE_BUFFER_FOR_NOW:
            still |= {name} if found else set()
            continue
        offenders += found
    assert not offenders, "modules other than the front take the buffer:\n" + "\n".join(offenders)
    done = set(TAKES_THE_BUFFER_FOR_NOW) - still
    assert not done, f"{sorted(done)} no longer take the buffer: remove them from the list"


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
