"""The package's folder map is its pipeline: imports run one way, never in a cycle, and privates stay home.

Every module under ``insitubatch/`` is parsed with ``ast``; every import
counts (top level, under ``TYPE_CHECKING``, inside functions), because a
deferred import is still an arrow a reader has to follow. A module's
``_private`` names are its own (no other module imports them) and an
object's ``_private`` attributes are its own (only ``self``/``cls`` touch
them); module size is a guideline (``docs/design.md``), not a rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "insitubatch"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# lowest first; an import may go to its own layer or a lower one
LAYERS: dict[str, int] = {
    "errors": 0,
    "config": 0,  # the settings: every INSITUBATCH_* variable and its default
    "validation": 0,
    "assembly": 6,  # the dataset's composition root, behind its door
    "_zarr_compat": 0,
    "_weak": 0,
    "progress": 0,
    "_progress": 0,
    "_ext": 0,
    # the store layer: the factories, what a store carries (its client, retry and timeout settings, its reader,
    # what closes with it) and obstore's fork safety; stands on the settings and the backends on its own floor
    # (``_wire``), so io and the engine stand on it
    "stores": 1,
    # the backends a store's reader sends its GETs through (obstore's, the engine's own HTTP/S3 client, a store's
    # own get): on the store layer's floor, because a store builds its reader from them and they read the
    # store layer's byte spans, settings and fork check (module imports stay acyclic: test_no_import_cycles)
    "_wire": 1,
    "io": 2,
    "plan": 3,
    # chunk transforms, the disk cache and the zarr writer all stand on io alone
    "transforms": 4,
    "cache": 4,
    "write": 4,
    "_engine": 5,
    "dataset": 6,
    "views": 6,
    "adapters": 7,
    "tools": 7,
    "testing": 7,
    "__init__": 8,  # the public facade re-exports every layer
    "__main__": 8,  # `python -m insitubatch`: the command line
}
# The engine's rooms, lowest first: a module of one room imports its own room's modules or a lower room's.
# ``loop`` and ``stats`` (the executors and the counters) sit under every room; ``lifecycle`` (what closes at exit) under tiles and passes.
ENGINE_ROOMS: dict[str, int] = {"loop": 0, "stats": 0, "lifecycle": 1, "reads": 1, "pool": 1, "tiles": 2, "passes": 3}
# a folder past this many modules is split into subpackages (its rooms)
MAX_MODULES_PER_FOLDER = 25


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules it imports}`` for every ``.py`` under ``root``, internal imports only."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                absolute = _imported_from(node, package)
                # ``from pkg import submodule`` is an import of that submodule; ``from mod import name`` of mod
                for alias in node.names:
                    submodule = f"{absolute}.{alias.name}"
                    targets.add(submodule if submodule in modules else absolute)
        graph[name] = {_nearest_module(t, modules) for t in targets if t.split(".")[0] == root.name} - {None, name}
    return graph


def _imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, resolved against the importing module's ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _nearest_module(target: str, modules: set[str]) -> str | None:
    """``target`` or its closest enclosing module that exists (``pkg.mod.Class`` -> ``pkg.mod``)."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["__init__"]
    if parts[1] not in LAYERS:
        raise KeyError(f"{module} is in no layer: add {parts[1]!r} to LAYERS in tests/test_layering.py")
    return LAYERS[parts[1]]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, dsts in graph.items()
        for dst in dsts
        if layer_of(dst) > layer_of(src)
    )


def engine_room(module: str) -> str | None:
    """The room of an ``_engine`` module (``insitubatch._engine.reads.fetch`` -> ``reads``), else None."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "_engine":
        return None
    if parts[2] not in ENGINE_ROOMS:
        raise KeyError(f"{module} is in no engine room: add {parts[2]!r} to ENGINE_ROOMS in tests/test_layering.py")
    return parts[2]


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between engine rooms that go up a floor, or sideways between two rooms on one floor."""
    found = []
    for src, dsts in graph.items():
        here = engine_room(src)
        if here is None:
            continue
        for dst in dsts:
            there = engine_room(dst)
            if there is None or there == here:
                continue
            if ENGINE_ROOMS[there] >= ENGINE_ROOMS[here]:
                found.append(f"{src} (room {here}) imports {dst} (room {there})")
    return sorted(found)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# -- the package ----------------------------------------------------------------


def test_every_module_is_in_a_layer() -> None:
    for module in module_graph(ROOT):
        layer_of(module)


def test_imports_never_go_to_a_higher_layer() -> None:
    assert upward_imports(module_graph(ROOT)) == []


def test_no_import_cycles() -> None:
    assert import_cycles(module_graph(ROOT)) == []


def test_engine_rooms_import_only_lower_rooms() -> None:
    assert room_violations(module_graph(ROOT)) == []


def test_every_engine_room_says_what_it_holds() -> None:
    for room in ENGINE_ROOMS:
        init = ROOT / "_engine" / room / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc and "\n" not in doc.strip(), f"{init} needs a one-line docstring saying what the room holds"


def test_no_folder_holds_more_modules_than_a_reader_can_scan() -> None:
    counts = {
        folder.relative_to(ROOT.parent).as_posix(): sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
        for folder in [ROOT, *(d for d in ROOT.rglob("*") if d.is_dir() and (d / "__init__.py").exists())]
    }
    assert {folder: n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER} == {}


# The store layer is the door to the backends: only it (and the backends themselves, ``_wire``) imports
# obstore or the engine's own client, and on the read path (io, the engine) only it names zarr's concrete
# store classes. These modules still reach past it, until the engine reads through the store's own reader;
# the set may only shrink.
REACHES_PAST_THE_STORE_LAYER: set[str] = set()
_READ_PATH = ("io", "_engine")


def reaches_past_the_store_layer(root: Path) -> set[str]:
    """Modules outside ``stores/`` and ``_wire/`` that import obstore or ``_wire``, or (io, engine) ``zarr.storage``."""
    found = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] in ("stores", "_wire"):
            continue
        name = module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                absolute = ".".join(base + ([node.module] if node.module else []))
                targets = [absolute] + [f"{absolute}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if (
                    parts[0] == "obstore"
                    or parts[:2] == [root.name, "_wire"]
                    or (parts[:2] == ["zarr", "storage"] and rel.parts[0] in _READ_PATH)
                ):
                    found.add(rel.as_posix())
    return found


def test_only_the_store_layer_reaches_the_backends() -> None:
    found = reaches_past_the_store_layer(ROOT)
    assert found - REACHES_PAST_THE_STORE_LAYER == set(), "import the backend through insitubatch/stores/"
    # an entry that no longer reaches past the store layer leaves the set, so the set only shrinks
    assert REACHES_PAST_THE_STORE_LAYER - found == set()


def test_checker_catches_a_backend_import_outside_the_store_layer(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "stores/__init__.py": "",
            "stores/obstore_stores.py": "import obstore\nfrom zarr.storage import ObjectStore\n",
            "_wire/__init__.py": "",
            "_wire/backends.py": "import obstore.store\n",
            "io/__init__.py": "",
            "io/sync_get.py": "def f():\n    from zarr.storage import ObjectStore\n",
            "_engine/__init__.py": "",
            "_engine/fetch.py": "from .._wire.backends import X\n",
            "write/__init__.py": "",
            "write/records.py": "from zarr.storage import MemoryStore\nfrom obstore.store import S3Store\n",
            "write/layout.py": "from zarr.storage import MemoryStore\n",
        },
    )
    assert reaches_past_the_store_layer(pkg) == {"io/sync_get.py", "_engine/fetch.py", "write/records.py"}


def test_dataset_views_and_passes_do_not_reach_back() -> None:
    """Passes and views read the engine context; neither imports the dataset that built it."""
    graph = module_graph(ROOT)
    assert f"{PACKAGE}.dataset" not in graph[f"{PACKAGE}.views"]
    assert f"{PACKAGE}.dataset" not in graph[f"{PACKAGE}._engine.passes.producer"]


# Bases a class of another module may deliberately build on (besides the exceptions of ``errors.py`` and any
# ``Protocol`` or ``ABC``, which are contracts): each names what it shares and why a subclass is the right shape.
DELIBERATE_BASES: dict[str, str] = {
    # the dimension names, coordinates and selections of a frozen array view: variables (``ArrayGeometry``) and
    # statics (``StaticField``) are both labelled views, with the same isel/sel behind both (no state of its own)
    f"{PACKAGE}.io.labelled.Labelled": "a public base of the labelled array-view dataclasses",
    # a read-only zarr ``Store`` that routes each key to the member store holding it: joining and concatenating
    # datasets are its two routings (``JoinedStore``, ``ConcatStore``), with the store interface in one place
    f"{PACKAGE}.io.sources.routed.RoutedStore": "the public base of the stores that make one dataset from many",
}
# Classes that still inherit another module's class, each for its room's own rework; the list only shrinks
# (an entry whose class no longer inherits is dropped by whoever reworks it; it is not checked to be stale, so a
# branch merged in either order stays green)
PENDING_INHERITANCE: set[str] = set()
# names that make a class a contract, not state to inherit (``class P(Protocol)``, ``class A(ABC)``)
INTERFACE_BASES = {"Protocol", "ABC"}


def _is_interface(node: ast.ClassDef) -> bool:
    """Whether a class is a contract: a ``Protocol`` or an ``ABC`` (by base or ``metaclass=ABCMeta``)."""
    names = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
    names |= {
        b.value.id if isinstance(b.value, ast.Name) else ""
        for b in node.bases
        if isinstance(b, ast.Subscript)  # Protocol[T]
    }
    meta = {k.value.id if isinstance(k.value, ast.Name) else "" for k in node.keywords if k.arg == "metaclass"}
    return bool(names & INTERFACE_BASES) or "ABCMeta" in meta


def inherited_across_modules(root: Path, room: str = "") -> list[str]:
    """Classes under ``root/room`` (the whole package by default) whose base is a class defined in another module.

    A base named through ``from .mod import Base`` or ``mod.Base`` counts when
    ``mod`` is a module of the package that defines a class ``Base`` (a class
    spread over modules as mixins reads that way); a base from outside the
    package (``Exception``, a stdlib or numpy class) does not, nor a deliberate
    public base: an exception of ``errors.py``, a ``Protocol`` or ``ABC``, or
    one listed in ``DELIBERATE_BASES``.
    """
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    trees = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in files.items()}
    classes = {
        name: {n.name: _is_interface(n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        for name, tree in trees.items()
    }
    prefix = f"{root.name}.{room}" if room else root.name
    found = []
    for name, tree in sorted(trees.items()):
        if not (name == prefix or name.startswith(f"{prefix}.")):
            continue
        package = name if files[name].name == "__init__.py" else name.rpartition(".")[0]
        origin: dict[str, str] = {}  # a name bound by an import -> the module it names, or the module it comes from
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                absolute = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    origin[alias.asname or alias.name] = absolute
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    origin[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else ""
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in origin:
                    where, cls = origin[base.id], base.id
                elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in origin:
                    module = origin[base.value.id]
                    where, cls = (
                        (f"{module}.{base.value.id}" if f"{module}.{base.value.id}" in modules else module),
                        base.attr,
                    )
                else:
                    continue
                if where not in modules or where == name or cls not in classes[where]:
                    continue
                if classes[where][cls] or where == f"{root.name}.errors" or f"{where}.{cls}" in DELIBERATE_BASES:
                    continue  # a contract, an exception family, or a listed public base
                found.append(f"{name}.{node.name} inherits {where}.{cls}")
    return found


def test_no_cache_class_inherits_from_another_module() -> None:
    """The disk cache is collaborating objects: none of its classes is built from another module's class."""
    assert inherited_across_modules(ROOT, "cache") == []


def test_no_class_inherits_state_from_another_module() -> None:
    """No class of the package is spread over modules: the scheduler, the cache, every room compose instead.

    A class builds on another module's class only when that base is a
    deliberate public one (an exception, a ``Protocol`` or ``ABC``,
    ``DELIBERATE_BASES``).
    """
    assert [f for f in inherited_across_modules(ROOT) if f not in PENDING_INHERITANCE] == []


def test_every_deliberate_base_is_a_class_of_the_package() -> None:
    """A listed base names a class that exists (a renamed or removed base leaves the list)."""
    for qualified in DELIBERATE_BASES:
        module, _, cls = qualified.rpartition(".")
        path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
        assert cls in {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}, qualified


# -- private names and attributes stay with their owner ---------------------------------------

# Modules exempt from both private rules, each with its reason.
PRIVATE_EXEMPT_MODULES: dict[str, str] = {
    # the one module that touches zarr's internals, by design: every other module goes through its public names
    "_zarr_compat.py": "the adapter over zarr's internals",
}
# ``expr._attr`` that is not ``self``/``cls`` but is still the owner's own business: ``(module, expression)``
# with the reason. A stale entry fails ``test_every_allowed_private_access_is_still_there``.
ALLOWED_PRIVATE_ATTRIBUTES: dict[tuple[str, str], str] = {
    # ``isel``/``sel`` fold their selections over copies of the same view (``g = self`` then ``g = g._with(..)``)
    ("io/labelled.py", "g._field_axis"): "a Labelled view's selection chain over copies of itself",
    ("io/labelled.py", "g._with"): "a Labelled view's selection chain over copies of itself",
    ("io/labelled.py", "g._chosen"): "a Labelled view's selection chain over copies of itself",
    # ``IcechunkTransaction.resume`` (a classmethod) builds ``tx = cls(...)`` and seeds that new instance's state
    ("write/icechunk.py", "tx._ledger"): "a classmethod seeding the instance of its own class it built",
    ("write/icechunk.py", "tx._bases"): "a classmethod seeding the instance of its own class it built",
    ("write/icechunk.py", "tx._on_commit"): "a classmethod seeding the instance of its own class it built",
}
# The store layer, restructured on its own branch this round: a violation whose importing module, imported
# module or accessing module is one of these is pending (the fix is a public name in that module). The set may
# only shrink: an entry with no violation left fails ``test_every_pending_store_module_still_has_a_violation``.
PENDING_PRIVATE: set[str] = set()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package_files(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def private_imports(root: Path) -> list[tuple[str, str, str]]:
    """``(importing file, imported file, name)`` for each ``from X import _name`` of another module of the package.

    Files are relative to ``root``; importing a private submodule (``from . import _kernels``) is not a name.
    """
    files = _package_files(root)
    found = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _imported_from(node, package)
            if source not in files or source == name:
                continue
            for alias in node.names:
                if _is_private(alias.name) and f"{source}.{alias.name}" not in files:
                    rel = path.relative_to(root).as_posix()
                    found.append((rel, files[source].relative_to(root).as_posix(), alias.name))
    return found


def _is_own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object whose class defines the code reading it."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def private_attributes(root: Path) -> list[tuple[str, str]]:
    """``(file, expression)`` for each ``expr._attr`` whose ``expr`` is not ``self``/``cls``/``super()``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and _is_private(node.attr) and not _is_own(node.value):
                found.append((path.relative_to(root).as_posix(), ast.unparse(node)))
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    # (that the checker finds such imports at all: test_checker_* on a synthetic package below)
    found = private_imports(ROOT)
    assert [
        f"{importer} imports {name} from {source}"
        for importer, source, name in found
        if not {importer, source} & (PENDING_PRIVATE | set(PRIVATE_EXEMPT_MODULES))
    ] == []


def test_no_object_reaches_into_another_objects_private_attributes() -> None:
    assert [
        f"{path}: {expr}"
        for path, expr in private_attributes(ROOT)
        if path not in PENDING_PRIVATE
        and path not in PRIVATE_EXEMPT_MODULES
        and (path, expr) not in ALLOWED_PRIVATE_ATTRIBUTES
    ] == []


def test_every_allowed_private_access_is_still_there() -> None:
    assert set(ALLOWED_PRIVATE_ATTRIBUTES) - set(private_attributes(ROOT)) == set()
    assert {path for path in PRIVATE_EXEMPT_MODULES if not (ROOT / path).is_file()} == set()


def test_every_pending_store_module_still_has_a_violation() -> None:
    """A store module whose privates no longer cross a boundary leaves ``PENDING_PRIVATE``: the set only shrinks."""
    involved = {p for importer, source, _ in private_imports(ROOT) for p in (importer, source)}
    involved |= {path for path, _ in private_attributes(ROOT)}
    assert PENDING_PRIVATE - involved == set()


# -- the checker itself, on synthetic packages --------------------------------------


def _write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / PACKAGE
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_checker_catches_an_upward_import_hidden_under_type_checking(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "dataset.py": "",
            "io/__init__.py": "",
            "io/stores.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..dataset import InSituDataset\n",
        },
    )
    assert upward_imports(module_graph(pkg)) == [f"{PACKAGE}.io.stores (layer 2) imports {PACKAGE}.dataset (layer 6)"]


def test_checker_catches_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "_engine/__init__.py": "",
            "_engine/pool.py": "def f():\n    from insitubatch import views\n",
            "views.py": "",
        },
    )
    assert upward_imports(module_graph(pkg)) == [f"{PACKAGE}._engine.pool (layer 5) imports {PACKAGE}.views (layer 6)"]


def test_checker_catches_a_same_layer_cycle(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "dataset.py": "from .views import DatasetView\n",
            "views.py": "def f():\n    from . import dataset\n",
        },
    )
    graph = module_graph(pkg)
    assert upward_imports(graph) == []
    assert import_cycles(graph) == [[f"{PACKAGE}.dataset", f"{PACKAGE}.views"]]


def test_checker_accepts_downward_imports(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "from .dataset import InSituDataset\n",
            "errors.py": "",
            "dataset.py": "from .io.geometry import ArrayGeometry\nfrom .errors import InSituError\n",
            "io/__init__.py": "",
            "io/geometry.py": "from ..errors import InSituError\n",
        },
    )
    graph = module_graph(pkg)
    assert graph[f"{PACKAGE}.dataset"] == {f"{PACKAGE}.io.geometry", f"{PACKAGE}.errors"}
    assert upward_imports(graph) == [] and import_cycles(graph) == []


def test_checker_catches_an_engine_room_reaching_up(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "_engine/__init__.py": "",
            "_engine/reads/__init__.py": "",
            "_engine/reads/fetch.py": "from ..passes.driver import PassDriver\n",
            "_engine/pool/__init__.py": "",
            "_engine/pool/chunk_pool.py": "from ..reads import fetch\n",
            "_engine/passes/__init__.py": "",
            "_engine/passes/driver.py": "from ..reads.fetch import Fetcher\n",
        },
    )
    assert room_violations(module_graph(pkg)) == [
        f"{PACKAGE}._engine.pool.chunk_pool (room pool) imports {PACKAGE}._engine.reads.fetch (room reads)",
        f"{PACKAGE}._engine.reads.fetch (room reads) imports {PACKAGE}._engine.passes.driver (room passes)",
    ]


def test_a_folder_in_no_layer_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="'shiny'"):
        layer_of(f"{PACKAGE}.shiny.thing")


def test_checker_catches_a_class_built_from_other_modules_mixins(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "cache/__init__.py": "",
            "cache/book.py": "class _Book:\n    pass\n",
            "cache/reading.py": "from .book import _Book\nclass _Reading(_Book):\n    pass\n",
            "cache/disk.py": (
                "import threading\nfrom . import book\nfrom .reading import _Reading\n"
                "class DiskCache(_Reading, book._Book):\n    pass\n"
                "class Local:\n    pass\nclass Sub(Local, OSError, threading.Thread):\n    pass\n"
            ),
        },
    )
    assert inherited_across_modules(pkg, "cache") == [
        f"{PACKAGE}.cache.disk.DiskCache inherits {PACKAGE}.cache.reading._Reading",
        f"{PACKAGE}.cache.disk.DiskCache inherits {PACKAGE}.cache.book._Book",
        f"{PACKAGE}.cache.reading._Reading inherits {PACKAGE}.cache.book._Book",
    ]


def test_checker_catches_the_scheduler_spread_over_rooms_and_spares_contracts(tmp_path: Path) -> None:
    """The shape the scheduler had (a driver built from the tiles room's mixins) fails the package-wide rule."""
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "class InSituError(Exception):\n    pass\n",
            "io/__init__.py": "",
            "io/errors_use.py": "from ..errors import InSituError\nclass StoreGone(InSituError, OSError):\n    pass\n",
            "io/contracts.py": (
                "from abc import ABC, ABCMeta\nfrom typing import Protocol\n"
                "class Source(Protocol):\n    pass\nclass Base(ABC):\n    pass\n"
                "class Meta(metaclass=ABCMeta):\n    pass\n"
            ),
            "io/impl.py": (
                "from .contracts import Base, Meta, Source\n"
                "class A(Source):\n    pass\nclass B(Base):\n    pass\nclass C(Meta):\n    pass\n"
            ),
            "_engine/__init__.py": "",
            "_engine/tiles/__init__.py": "",
            "_engine/tiles/finishing.py": "class _Finishing:\n    pass\n",
            "_engine/tiles/tile_jobs.py": "from .finishing import _Finishing\nclass _TileJobs(_Finishing):\n    pass\n",
            "_engine/passes/__init__.py": "",
            "_engine/passes/driver.py": (
                "from ..tiles.tile_jobs import _TileJobs\nclass PassDriver(_TileJobs):\n    pass\n"
            ),
        },
    )
    assert inherited_across_modules(pkg) == [
        f"{PACKAGE}._engine.passes.driver.PassDriver inherits {PACKAGE}._engine.tiles.tile_jobs._TileJobs",
        f"{PACKAGE}._engine.tiles.tile_jobs._TileJobs inherits {PACKAGE}._engine.tiles.finishing._Finishing",
    ]
    assert inherited_across_modules(pkg, "io") == []


def test_checker_catches_an_import_of_another_modules_private_name(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "from . import _kernels\n",
            "_kernels.py": "",
            "io/__init__.py": "",
            "io/chain.py": "_ABSENT = 1\nPUBLIC = 2\ndef _own():\n    return _ABSENT\n",
            "io/decode.py": "from .chain import PUBLIC, _ABSENT\nfrom . import chain\n",
            "plan/__init__.py": "",
            "plan/epoch.py": "def f():\n    from ..io.chain import _ABSENT\n    return _ABSENT\n",
        },
    )
    assert private_imports(pkg) == [
        ("io/decode.py", "io/chain.py", "_ABSENT"),
        ("plan/epoch.py", "io/chain.py", "_ABSENT"),
    ]


def test_checker_catches_a_reach_into_another_objects_private_attribute(tmp_path: Path) -> None:
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "window.py": (
                "class Window:\n"
                "    def __init__(self):\n        self._waiters = []\n"
                "    @classmethod\n    def make(cls):\n        return cls._build()\n"
                "    def __repr__(self):\n        return super().__repr__() + str(super()._x)\n"
                "class User:\n"
                "    def __init__(self, window):\n        self.window = window\n"
                "    def locked(self, w):\n        return bool(w._waiters) or self.window._can(self)\n"
            ),
        },
    )
    assert private_attributes(pkg) == [("window.py", "w._waiters"), ("window.py", "self.window._can")]
