"""The API reference (``docs/api/*.md``) documents every public class and function.

The reference names objects by the path users import them from (``::: marlbuf.samplers.Uniform``),
never by the module that defines them, so a module that moves inside the package keeps its
objects in the reference, and a public object that the reference leaves out fails here. The
public API is the ``__all__`` of ``marlbuf`` and of its public subpackages (below); a module
without ``__all__`` exports the classes and functions it defines.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
DIRECTIVE = re.compile(r"^:::\s+(\S+)\s*$", re.M)

#: The public modules, and the extra-providing module each needs where it is not a core one.
PUBLIC_MODULES: dict[str, str | None] = {
    "marlbuf": None,
    "marlbuf.samplers": None,
    "marlbuf.memory": None,
    "marlbuf.compat": None,
    "marlbuf.compat.maddpg": None,
    "marlbuf.compat.pettingzoo": None,
    "marlbuf.compat.tf2marl": None,
    "marlbuf.compat.epymarl": "torch",
    "marlbuf.compat.torchrl": "torchrl",
    "marlbuf.compat.torchrl.benchmarl": "torchrl",
    "marlbuf.distributed": "ray",
    "marlbuf.algos": "torch",
    "marlbuf.envs": None,
    "marlbuf.profiling": None,
    "marlbuf.offline": None,
}

#: Names in ``__all__`` that are not API objects.
NOT_DOCUMENTED = {"__version__"}


def directives() -> list[str]:
    """Every ``::: path`` of the API pages, in page order."""
    return [m.group(1) for page in API_PAGES for m in DIRECTIVE.finditer(page.read_text())]


def load(name: str) -> ModuleType:
    """A public module; skipped where it does not exist (yet) or its extra is missing."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not in this checkout")
    needs = PUBLIC_MODULES[name]
    if needs is not None:
        pytest.importorskip(needs)
    return importlib.import_module(name)


def resolve(path: str) -> Any:
    """The object a directive names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def public_names(module: ModuleType) -> list[str]:
    """``__all__``, or the classes and functions the module (or its package) defines."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", "").startswith(module.__name__)
        ]
    return [name for name in names if name not in NOT_DOCUMENTED]


def is_api_object(obj: Any) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj)


def test_pages_exist_and_hold_directives() -> None:
    assert API_PAGES and directives()


@pytest.mark.parametrize("module_name", list(PUBLIC_MODULES))
def test_every_public_name_is_in_the_reference(module_name: str) -> None:
    module = load(module_name)
    paths = set(directives())
    documented_objects = []
    for path in paths:
        try:
            documented_objects.append(resolve(path))
        except (ImportError, AttributeError):
            continue  # test_directives_name_public_objects reports it
    missing = []
    for name in public_names(module):
        obj = getattr(module, name)
        if f"{module_name}.{name}" in paths:
            continue
        # a class or function re-exported by two public modules is documented once
        if is_api_object(obj) and any(obj is other for other in documented_objects):
            continue
        missing.append(f"{module_name}.{name}")
    assert not missing, f"public names missing from docs/api/*.md: {missing}"


@pytest.mark.parametrize("path", directives())
def test_directives_name_public_objects(path: str) -> None:
    """A directive names an object by a public path under a public module, and the object
    has a docstring to show."""
    assert not any(part.startswith("_") for part in path.split(".")), path
    module_name = max((m for m in PUBLIC_MODULES if path.startswith(m + ".")), key=len)
    load(module_name)
    assert "." not in path[len(module_name) + 1 :], f"{path}: not an attribute of {module_name}"
    obj = resolve(path)
    if is_api_object(obj):
        assert inspect.getdoc(obj), f"{path} has no docstring"
