"""Data flows one way: no module imports from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

import splatscale

# Bottom to top; a module may import its own layer and those below it.
# ``backends`` is the backend contract and registry (backends/__init__.py), which imports no
# splatscale module; each device's backend (backends/cpu.py, ...) sits above what it assembles.
LAYERS = [
    {"errors", "atomic", "messages", "allocator", "threads", "folder_lock", "native",
     "limits", "parent_death", "vector_width", "cache_home", "kernel_cache", "numba_config",
     "backends"},
    {"data"},
    {"model"},
    {"render"},
    {"step"},
    {"backends.cpu", "backends.cuda", "backends.cpu_compile"},
    {"engine"},
    {"strategy"},
    {"train", "demo", "prepare", "launch"},
    {"viewer"},
    {"commands"},
    {"cli", "__main__"},
]
PACKAGE = Path(splatscale.__file__).parent
BACKEND_MODULES = {p.stem for p in (PACKAGE / "backends").glob("*.py")} - {"__init__"}


def unit(parts: list[str]) -> str:
    """The layered unit of a module below splatscale, from its path's parts: its top
    package or module, but a backend module of its own under backends/."""
    names = [part.removesuffix(".py") for part in parts]
    if names[0] == "backends" and len(names) > 1 and names[1] in BACKEND_MODULES:
        return f"backends.{names[1]}"
    return names[0]


def layer_of(top: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if top in names)


def imported_tops(source: Path) -> set[str]:
    """The splatscale subpackages or modules that ``source`` imports."""
    tops = set()
    for node in ast.walk(ast.parse(source.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "splatscale" and len(parts) > 1:
                tops.add(unit(parts[1:]))
    return tops


def test_every_module_has_a_layer():
    tops = {unit(list(p.relative_to(PACKAGE).parts)) for p in PACKAGE.rglob("*.py")}
    tops.discard("__init__")
    assert tops <= set().union(*LAYERS), tops - set().union(*LAYERS)


def test_no_import_runs_up_the_layers():
    upward = []
    for source in sorted(PACKAGE.rglob("*.py")):
        top = unit(list(source.relative_to(PACKAGE).parts))
        if top == "__init__":
            continue
        for imported in imported_tops(source):
            if imported in set().union(*LAYERS) and layer_of(imported) > layer_of(top):
                upward.append(f"{source.relative_to(PACKAGE)} imports splatscale.{imported}")
    assert not upward, "\n".join(upward)
