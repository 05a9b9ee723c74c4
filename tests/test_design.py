"""docs/design.md checked by behaviour: its read path is live code, its invariants are the marked tests.

And no public name is kept alive only by the tests: every name in a module's
``__all__`` is used by the package, an example or the bench, or documented.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from pathlib import Path

from test_layering import ROOT as PACKAGE_ROOT
from test_layering import module_graph

import insitubatch

REPO = PACKAGE_ROOT.parent
DESIGN = REPO / "docs" / "design.md"
TESTS = REPO / "tests"
# A module, kernel or test the page names: `_engine/passes/driver.py`, `_ext/gather.pyx`, `tests/x.py::test_y`.
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|pyx))(?:::(\w+))?`")
# The page names far more modules on its read path, and more invariant tests, than these.
MIN_READ_PATH = 40
MIN_INVARIANTS = 20
# Names in an ``__all__`` that nothing outside the tests uses, kept on purpose (none today).
UNUSED_ON_PURPOSE: dict[str, str] = {}


def _section(heading: str) -> str:
    """The text of the design page's ``## heading`` section, up to the next ``## ``."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _module_of(path: str) -> str:
    """``_engine/passes/driver.py`` -> ``insitubatch._engine.passes.driver``."""
    parts = Path(path).with_suffix("").parts
    if parts[0] == PACKAGE_ROOT.name:
        parts = parts[1:]
    name = ".".join((PACKAGE_ROOT.name, *parts))
    return name.removesuffix(".__init__")


def _lazy_modules() -> set[str]:
    """The modules the package's ``__getattr__`` imports for a public name (the framework adapters).

    Read from the source (the string values of the table it keeps), so the test imports no framework.
    """
    tree = ast.parse((PACKAGE_ROOT / "__init__.py").read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and "_LAZY" in ast.unparse(node.targets[0]):
            for value in ast.walk(node.value):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.add(f"{PACKAGE_ROOT.name}.{value.value}")
    return found


def _reachable_from_the_package() -> set[str]:
    """Modules ``import insitubatch`` reaches, with the framework adapters its public names import lazily."""
    graph = module_graph(PACKAGE_ROOT)
    roots = {PACKAGE_ROOT.name} | {m for m in _lazy_modules() if m in graph}
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.get(module, ()))
    return seen


def _kernels_imported_by(modules: set[str]) -> set[str]:
    """The compiled ``_ext`` modules that ``modules`` import (not in the graph: they are no ``.py`` files)."""
    found = set()
    for module in modules:
        relative = module.split(".")[1:]
        path = PACKAGE_ROOT.joinpath(*relative)
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-2:-1] == ["_ext"]:
                found.add(node.module.split(".")[-1])
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("_ext"):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[-1] for a in node.names if "._ext." in a.name)
    return found


def test_every_module_on_the_read_path_is_reachable_from_the_package() -> None:
    named = [path for path, _ in NAMED.findall(_section("One batch, end to end"))]
    assert len(set(named)) >= MIN_READ_PATH, f"only {len(set(named))} modules found on the read path"
    reachable = _reachable_from_the_package()
    kernels = _kernels_imported_by(reachable)
    dead = []
    for path in sorted(set(named)):
        if path.endswith(".pyx"):
            if Path(path).stem not in kernels:
                dead.append(f"{path}: no module import insitubatch reaches imports this kernel")
        elif _module_of(path) not in reachable:
            dead.append(f"{path}: not reached from `import insitubatch` through the import graph")
    assert not dead, f"{DESIGN.name} puts on the read path what the package never imports:\n" + "\n".join(dead)


def _marked_invariants() -> set[str]:
    """``tests/<file>.py::<test>`` for every test decorated ``@pytest.mark.invariant``."""
    marked = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if ast.unparse(target) == "pytest.mark.invariant":
                        marked.add(f"{path.relative_to(REPO).as_posix()}::{node.name}")
    return marked


def test_the_invariants_section_lists_exactly_the_marked_tests() -> None:
    listed = {f"{path}::{test}" for path, test in NAMED.findall(_section("Invariants")) if test}
    assert len(listed) >= MIN_INVARIANTS, f"only {len(listed)} tests found under Invariants"
    marked = _marked_invariants()
    problems = [f"listed in {DESIGN.name} but not marked invariant: {t}" for t in sorted(listed - marked)]
    problems += [f"marked invariant but not listed in {DESIGN.name}: {t}" for t in sorted(marked - listed)]
    assert not problems, "\n".join(problems)


def _uses(path: Path) -> Counter[str]:
    """Names ``path`` reads (loads, attributes, and imports outside a package ``__init__``'s re-exports)."""
    counts: Counter[str] = Counter()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            counts[node.id] += 1
        elif isinstance(node, ast.Attribute):
            counts[node.attr] += 1
        elif isinstance(node, ast.ImportFrom) and path.name != "__init__.py":
            counts.update(alias.name for alias in node.names)  # ruff (F401) keeps an unused import out
    return counts


def _declared_all(path: Path) -> list[str]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def test_no_public_name_is_used_only_by_the_tests() -> None:
    sources = [p for folder in ("insitubatch", "examples", "bench") for p in sorted((REPO / folder).rglob("*.py"))]
    used = Counter[str]()
    for path in sources:
        used.update(_uses(path))
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md"])
    public = set(insitubatch.__all__) | set(importlib.import_module("insitubatch.write").__all__)
    unused = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for name in _declared_all(path):
            if name in public or used[name] or re.search(rf"\b{re.escape(name)}\b", docs):
                continue
            where = f"{path.relative_to(REPO).as_posix()}::{name}"
            if where not in UNUSED_ON_PURPOSE:
                unused.append(where)
    assert not unused, "in an __all__ but used only by the tests (remove it, or list it with a reason):\n" + "\n".join(
        unused
    )
