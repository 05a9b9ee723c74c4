"""The documentation cannot rot: its code runs, its API reference matches the code.

* Every fenced block in ``README.md`` and ``docs/*.md`` carries a language
  from a known set, so nothing meant to run hides in an untagged block.
* Every ```` ```python ```` block runs. A page's blocks run in order, in one
  fresh interpreter per page (``-W error``, a temporary working directory),
  Each page's first block sets ``url = "demo_data/era5_demo.zarr"`` (``URL_LINE``),
  so the blocks run as written from the repository root after ``./dev demo``;
  the test sets that ``url`` to the same dataset served over HTTP by the
  loopback emulator (``insitubatch.testing.emulator``), i.e. a real zarr
  group behind a real, slightly slow HTTP server on 127.0.0.1. README's
  blocks run once as written (beside a ``demo_data/`` directory) and once
  per kind of ``url`` a newcomer may give them (``README_URLS``):
  ``file://``, and HTTP and S3 against the emulator, with and without
  consolidated metadata.
* ```` ```python pytest ```` blocks are complete test files: each is written
  to a fresh directory and run by pytest there (``-W error``), as a user
  would run it, with insitubatch's pytest plugin providing the fixtures; it
  must pass.
* ```` ```python signature ```` blocks in ``docs/api.md`` are compared with what
  :func:`api_entries` derives from the code with ``inspect.signature``: every
  public name (``insitubatch.__all__``, ``insitubatch.write.__all__``, the
  built-in transforms, ``insitubatch.errors.__all__``, a few helpers) and
  every public method of a public class must appear exactly as derived,
  and no block may describe a name that no longer exists. The exceptions a
  docstring's ``Raises`` section names must be named in that entry too.
* ```` ```text usage ```` blocks are compared with the argparse usage of the
  command line tools, and every ``insitubatch ...`` command in a ```` ```bash ````
  block is parsed by the real parser, so documented flags exist.
* ``yaml`` blocks parse; relative links point at files that exist.

When the API changes, run ``python tests/test_docs.py`` to print every
signature block as it should read now.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API_DOC = ROOT / "docs" / "api.md"

# The languages a fenced block may carry. ``python`` runs; the others are checked or shown.
LANGUAGES = {
    "python",  # executed
    "python pytest",  # a complete test file: run with pytest (the plugin's fixtures), must pass
    "python signature",  # api.md: compared with inspect.signature
    "text usage",  # compared with the argparse usage of a command
    "bash",  # insitubatch commands in it are parsed by the real parser
    "yaml",  # parsed
    "text",  # shown as is (output, file layouts)
    "json",  # parsed
    "mermaid",  # diagrams
}
# Lines wider than this are rendered one parameter per line.
SIGNATURE_WIDTH = 88
# The "bucket" the emulator serves the demo data from (the first path segment, as S3 reads it).
BUCKET = "docs"
S3_REGION = "us-east-1"
# Every way README's python blocks are run: as written (the local path ./dev demo writes), file://,
# and the S3 and HTTP protocols against the emulator, with and without consolidated metadata.
README_URLS = (
    "as written",
    "file",
    "http",
    "http+consolidated",
    "s3",
    "s3+consolidated",
)
# The ones the fast lane runs (the others are marked slow; CI runs them all).
README_FAST_URLS = ("as written", "http", "s3")
# The line that starts each page's code, and that the test points elsewhere (its value: what ./dev demo writes).
URL_LINE = 'url = "demo_data/era5_demo.zarr"'
DEMO_NAME = "era5_demo.zarr"
# Time to first byte the emulator adds to every request: cloud-like, but keeps the test fast.
EMULATOR_LATENCY_S = 0.005
# A page's snippets must finish within this (they read a few MB from loopback).
PAGE_TIMEOUT_S = 120

# Namespaces whose ``__all__`` is the public API, in the order a name is attributed
# to (a name exported by two is documented under the first).
API_NAMESPACES = ("insitubatch", "insitubatch.write", "insitubatch.errors")
# Public helpers outside any ``__all__`` above that users call directly.
API_EXTRAS = {
    "insitubatch.transforms": ("Coarsen", "KelvinToCelsius", "Regrid", "StandardScaler", "kelvin_to_celsius"),
    "insitubatch.config": ("get", "set"),
    "insitubatch.tools.inspect_store": ("inspect_store",),
    "insitubatch.tools.demo": ("write_demo_dataset",),
    # what the pytest plugin's fixtures return, and the helpers under them (docs/testing.md)
    "insitubatch.testing.served": ("ServedZarr", "serve_zarr"),
    "insitubatch.testing.loader_bench": ("LoaderBenchmark", "PassReport", "measure_loader"),
    "insitubatch.testing.ceiling": ("GetCeiling", "raw_get_ceiling"),
}

# Run before a page's blocks (nothing today: each page sets its own url).
PREAMBLE = ""

RUNNER = """
import json, pathlib, sys
blocks = json.loads(pathlib.Path(sys.argv[1]).read_text(encoding="utf-8"))
namespace = {"__name__": "__main__"}
exec(compile(sys.argv[2], "<docs preamble>", "exec"), namespace)
for filename, line, source in blocks:
    # pad with blank lines so a traceback's line numbers are the Markdown file's own
    exec(compile("\\n" * line + source, filename, "exec"), namespace)
"""


# -- reading the Markdown ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 0-based line of the block's first content line
    info: str
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line + 1}"


_FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [
        Block(path, text.count("\n", 0, m.start("body")), " ".join(m["info"].split()), m["body"])
        for m in _FENCE.finditer(text)
    ]


def all_blocks() -> Iterator[Block]:
    for path in DOC_FILES:
        yield from blocks(path)


# -- deriving the API reference from the code ----------------------------------------------
def _annotation(annotation: object) -> str | None:
    if annotation is inspect.Parameter.empty or annotation is inspect.Signature.empty:
        return None
    if isinstance(annotation, str):  # ``from __future__ import annotations``: the source text
        return annotation
    return inspect.formatannotation(annotation)


def _parameter(p: inspect.Parameter) -> str:
    text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
    annotation = _annotation(p.annotation)
    if annotation is not None:
        text += f": {annotation}"
    if p.default is not p.empty:
        text += (" = " if annotation is not None else "=") + repr(p.default)
    return text


def _parameters(sig: inspect.Signature) -> list[str]:
    params = list(sig.parameters.values())
    has_star = any(p.kind is p.VAR_POSITIONAL for p in params)
    out: list[str] = []
    starred = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not has_star and not starred:
            out.append("*")
            starred = True
        out.append(_parameter(p))
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            out.append("/")
    return out


def render(head: str, sig: inspect.Signature, *, returns: bool = True) -> str:
    """``head(params) -> return``; one parameter per line when that is wider than ``SIGNATURE_WIDTH``."""
    params = _parameters(sig)
    ret = _annotation(sig.return_annotation) if returns else None
    tail = f" -> {ret}" if ret is not None else ""
    one_line = f"{head}({', '.join(params)}){tail}"
    if len(one_line) <= SIGNATURE_WIDTH:
        return one_line
    return f"{head}(\n" + "".join(f"    {p},\n" for p in params) + f"){tail}"


def _drop_first(sig: inspect.Signature) -> inspect.Signature:
    return sig.replace(parameters=list(sig.parameters.values())[1:])


@dataclasses.dataclass(frozen=True)
class Entry:
    """One documented API item: its signature block and the exceptions its docstring names."""

    key: str
    block: str
    raises: tuple[str, ...]


def _docstring_raises(obj: object) -> tuple[str, ...]:
    """Exception names under a numpy-style ``Raises`` heading of ``obj``'s docstring."""
    doc = inspect.getdoc(obj) or ""
    m = re.search(r"^Raises\n-+\n(?P<body>.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.M | re.S)
    if not m:
        return ()
    names = re.findall(r"^(\w+(?:Error|Exception|Warning|Interrupt))\b", m["body"], re.M)
    return tuple(dict.fromkeys(names))


def _members(cls: type) -> dict[str, object]:
    """``cls``'s own attributes and those it inherits from insitubatch's own (private) bases."""
    members: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if klass is cls or klass.__module__.startswith("insitubatch."):
            members.update(vars(klass))
    return members


def _member_entries(cls: type, owner: str) -> Iterator[Entry]:
    for name, attr in _members(cls).items():
        if name.startswith("_"):
            continue
        key = f"{owner}.{name}"
        if isinstance(attr, (property, functools.cached_property)):
            fget = attr.fget if isinstance(attr, property) else attr.func
            ret = _annotation(inspect.signature(fget).return_annotation)
            yield Entry(key, f"property {cls.__name__}.{name}" + (f" -> {ret}" if ret else ""), _docstring_raises(fget))
        elif isinstance(attr, classmethod):
            sig = inspect.signature(getattr(cls, name))
            yield Entry(key, render(f"classmethod {cls.__name__}.{name}", sig), _docstring_raises(attr.__func__))
        elif isinstance(attr, staticmethod):
            sig = inspect.signature(attr.__func__)
            yield Entry(key, render(f"staticmethod {cls.__name__}.{name}", sig), _docstring_raises(attr.__func__))
        elif inspect.isfunction(attr):
            sig = _drop_first(inspect.signature(attr))
            yield Entry(key, render(f"{cls.__name__}.{name}", sig), _docstring_raises(attr))


def api_entries() -> list[Entry]:
    """Every public name and public method, with the signature block ``docs/api.md`` must hold."""
    seen: set[int] = set()
    names: list[tuple[str, str, object]] = []
    for namespace in API_NAMESPACES:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            names.append((namespace, name, getattr(module, name)))
    for namespace, extra in API_EXTRAS.items():
        module = importlib.import_module(namespace)
        names.extend((namespace, name, getattr(module, name)) for name in extra)
    entries: list[Entry] = []
    for namespace, name, obj in names:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        full = f"{namespace}.{name}"
        if isinstance(obj, type) and issubclass(obj, BaseException):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            entries.append(Entry(full, f"class {full}({bases})", ()))
        elif isinstance(obj, type):
            sig = inspect.signature(obj)
            entries.append(Entry(full, render(f"class {full}", sig, returns=False), _docstring_raises(obj)))
            entries.extend(_member_entries(obj, full))
        elif callable(obj) and (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            entries.append(Entry(full, render(full, inspect.signature(obj)), _docstring_raises(obj)))
        else:  # a constant or a ready-made instance
            entries.append(Entry(full, f"{full} = {obj!r}", ()))
    return entries


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """``{"insitubatch": parser, "insitubatch <command>": parser, "insitubatch-check-transform": parser}``."""
    from insitubatch.tools import check_transform, cli

    top = cli.build_parser()
    parsers: dict[str, argparse.ArgumentParser] = {"insitubatch": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, parser in action.choices.items():
                parsers[f"insitubatch {command}"] = parser
    parsers["insitubatch-check-transform"] = check_transform.build_parser()
    return parsers


def unregistered_parsers(registered: dict[str, argparse.ArgumentParser]) -> dict[str, argparse.ArgumentParser]:
    """Documented subcommands whose parser exists but that ``insitubatch.tools.cli`` does not register yet.

    The docs are checked against them all the same; the tests then report the
    missing registration as an expected failure, which disappears once it is made.
    """
    from insitubatch.tools.inspect_store import add_inspect_parser

    pending: dict[str, argparse.ArgumentParser] = {}
    if "insitubatch inspect" not in registered:
        top = argparse.ArgumentParser(prog="insitubatch")
        pending["insitubatch inspect"] = add_inspect_parser(top.add_subparsers(dest="command"))
    return pending


def _xfail_if_unregistered(pending: dict[str, argparse.ArgumentParser]) -> None:
    if pending:
        pytest.xfail(f"documented but not registered in insitubatch.tools.cli (_SUBCOMMANDS): {sorted(pending)}")


# -- fixtures -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Served:
    """The demo dataset twice (with and without consolidated metadata), on disk and behind the emulator."""

    consolidated: Path
    plain: Path
    http: str  # the emulator's base URL; the datasets are under /BUCKET/
    url: str  # what every page's ``url`` is: the consolidated dataset over HTTP

    def where(self, kind: str) -> tuple[str | None, dict[str, str]]:
        """``(url, extra environment)`` of one way to reach the demo data (``README_URLS``); None: as written."""
        path = self.consolidated if kind.endswith("+consolidated") else self.plain
        scheme = kind.split("+")[0]
        if scheme == "as written":
            return None, {}
        if scheme == "file":
            return path.as_uri(), {}
        if scheme == "http":
            return f"{self.http}/{BUCKET}/{path.name}", {}
        # the S3 protocol, path-style, against the same emulator: what a user does for MinIO or a mirror
        return f"s3://{BUCKET}/{path.name}", {"AWS_ENDPOINT_URL": self.http, "AWS_REGION": S3_REGION}


def _without_consolidated_metadata(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    meta = json.loads((target / "zarr.json").read_text(encoding="utf-8"))
    meta.pop("consolidated_metadata", None)
    (target / "zarr.json").write_text(json.dumps(meta), encoding="utf-8")
    return target


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The demo dataset (as ``./dev demo`` writes it, consolidated) and a copy without consolidated metadata."""
    from insitubatch.testing.emulator import Emulator
    from insitubatch.tools.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("docs-data")
    consolidated = write_demo_dataset(root / BUCKET / DEMO_NAME)
    plain = _without_consolidated_metadata(consolidated, root / BUCKET / "era5_demo_plain.zarr")
    with Emulator(root, latency_s=EMULATOR_LATENCY_S, jitter_s=0.0) as emulator:
        yield Served(consolidated, plain, emulator.url, emulator.url_for(f"{BUCKET}/{consolidated.name}"))


# -- tests --------------------------------------------------------------------------------
def test_every_block_has_a_known_language() -> None:
    unknown = [f"{b.where}: ```{b.info}" for b in all_blocks() if b.info not in LANGUAGES]
    assert not unknown, f"fenced blocks need one of {sorted(LANGUAGES)}:\n" + "\n".join(unknown)


def test_readme_keeps_the_two_quick_start_commands() -> None:
    commands = [
        line.split("#")[0].strip()
        for b in blocks(ROOT / "README.md")
        if b.info == "bash"
        for line in b.source.splitlines()
    ]
    assert "./dev demo" in commands and "./dev test" in commands


# A block importing one of these needs it; CI leg 2 (Python 3.13) installs neither.
_FRAMEWORK_IMPORT = re.compile(r"^\s*(?:import|from)\s+(torch|jax)\b", re.M)
PAGES_WITH_CODE = [p for p in DOC_FILES if any(b.info == "python" for b in blocks(p))]


def _python(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This interpreter on ``args`` in ``cwd``, importing the tree under test, one OpenMP thread."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, **(env_extra or {}), OMP_NUM_THREADS="1", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S
    )


def _pointed_at(source: str, url: str | None) -> str:
    """A block with ``URL_LINE`` set to ``url`` instead (unchanged for None: run as written)."""
    return source if url is None else source.replace(URL_LINE, f"url = {json.dumps(url)}")


def _run_page(page: Path, url: str | None, env_extra: dict[str, str], tmp_path: Path, data: Path) -> None:
    """Run a page's python blocks in order; ``url=None`` as written, beside a ``demo_data/`` holding ``data``."""
    code = [
        (str(b.path.relative_to(ROOT)), b.line, _pointed_at(b.source, url)) for b in blocks(page) if b.info == "python"
    ]
    for framework in sorted({m[1] for _, _, source in code for m in _FRAMEWORK_IMPORT.finditer(source)}):
        pytest.importorskip(framework)  # a page that trains with torch or runs jax needs it installed
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps(code), encoding="utf-8")
    work = tmp_path / "work"
    (work / "demo_data").mkdir(parents=True)
    (work / "demo_data" / DEMO_NAME).symlink_to(data, target_is_directory=True)  # where ./dev demo writes it
    proc = _python(["-W", "error", "-c", RUNNER, str(script), PREAMBLE], work, env_extra)
    assert proc.returncode == 0, f"a python block of {page.name} failed with url={url}:\n{proc.stdout}\n{proc.stderr}"
    # a warning raised in a finalizer or a logged one does not change the exit status; it still fails
    noise = [
        line for line in proc.stderr.splitlines() if re.search(r"Warning|Exception ignored|Traceback|WARNING", line)
    ]
    assert not noise, f"the python blocks of {page.name} warned:\n{proc.stderr}"


@pytest.mark.parametrize("page", [p for p in PAGES_WITH_CODE if p.name != "README.md"], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, served: Served, tmp_path: Path) -> None:
    _run_page(page, served.url, {}, tmp_path, served.consolidated)


@pytest.mark.parametrize(
    "kind", [k if k in README_FAST_URLS else pytest.param(k, marks=pytest.mark.slow) for k in README_URLS]
)
def test_readme_runs_as_written(kind: str, served: Served, tmp_path: Path) -> None:
    """README's blocks, unchanged, on every kind of url a newcomer may give them."""
    url, env = served.where(kind)
    _run_page(ROOT / "README.md", url, env, tmp_path, served.consolidated)


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_a_page_sets_its_url_where_its_code_starts(page: Path) -> None:
    """Pasted in order from the repository root after ./dev demo, a page's blocks run as they are."""
    code = [b for b in blocks(page) if b.info == "python"]
    uses = [b for b in code if re.search(r"\burl\b", b.source)]
    if uses:
        first = code[0].source.splitlines()
        assert any(line.startswith(URL_LINE) for line in first), f"{code[0].where}: its first block sets {URL_LINE}"


PYTEST_BLOCKS = [b for b in all_blocks() if b.info == "python pytest"]


@pytest.mark.parametrize("block", PYTEST_BLOCKS, ids=lambda b: b.where)
def test_pytest_blocks_pass(block: Block, tmp_path: Path) -> None:
    """A documented test file, copied as is into a project of its own, passes under pytest."""
    (tmp_path / "test_from_the_docs.py").write_text(block.source, encoding="utf-8")
    proc = _python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "test_from_the_docs.py"], tmp_path)
    assert proc.returncode == 0, f"{block.where}: the documented test file failed:\n{proc.stdout}\n{proc.stderr}"


def test_api_reference_matches_the_code() -> None:
    entries = api_entries()
    documented = [b.source.rstrip("\n") for b in blocks(API_DOC) if b.info == "python signature"]
    expected = {e.block for e in entries}
    missing = [e.block for e in entries if e.block not in documented]
    stale = [text for text in documented if text not in expected]
    repeated = sorted({text for text in documented if documented.count(text) > 1})
    problems = []
    if missing:
        problems.append("missing from docs/api.md (or changed), as the code reads now:\n\n" + "\n\n".join(missing))
    if stale:
        problems.append("in docs/api.md but not in the code (renamed, removed or changed):\n\n" + "\n\n".join(stale))
    if repeated:
        problems.append("documented twice:\n\n" + "\n\n".join(repeated))
    assert not problems, "\n\n".join(problems)


def test_api_reference_names_the_documented_exceptions() -> None:
    text = API_DOC.read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    found = list(re.finditer(r"^```python signature\n(?P<body>.*?)^```", text, re.M | re.S))
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        sections[m["body"].rstrip("\n")] = text[m.end() : end]
    lacking = []
    for e in api_entries():
        section = sections.get(e.block)
        if section is None:
            continue  # reported by test_api_reference_matches_the_code
        absent = [name for name in e.raises if not re.search(rf"\b{name}\b", section)]
        if absent:
            lacking.append(f"{e.key}: {absent}")
    assert not lacking, "api.md entries must name the exceptions their docstrings raise:\n" + "\n".join(lacking)


def _normal(text: str) -> str:
    return " ".join(text.split())


def _help_usage(parser: argparse.ArgumentParser) -> str:
    """The usage paragraph that ``--help`` prints first, whitespace normalised."""
    return _normal(parser.format_help().split("\n\n", 1)[0])


def test_cli_usage_blocks_match_the_parsers() -> None:
    """Every usage block, wherever it is and however often a command is shown, reads as ``--help`` does."""
    registered = cli_parsers()
    pending = unregistered_parsers(registered)
    parsers = {**registered, **pending}
    shown: set[str] = set()
    wrong = []
    for b in all_blocks():
        if b.info != "text usage":
            continue
        text = _normal(b.source)
        m = re.match(r"usage: (insitubatch(?:-check-transform| [\w-]+)?)", text)
        assert m, f"{b.where}: a usage block starts with 'usage: insitubatch ...'"
        command = m[1]
        shown.add(command)
        if command not in parsers:
            wrong.append(f"{b.where}: {command!r} is not a command; commands are {sorted(parsers)}")
        elif text != _help_usage(parsers[command]):
            wrong.append(f"{b.where}: the usage of {command!r} now reads:\n{parsers[command].format_usage()}")
    undocumented = sorted(set(parsers) - shown)
    assert not wrong and not undocumented, "\n".join(wrong) + (
        f"\ncommands without a usage block in the docs: {undocumented}" if undocumented else ""
    )
    _xfail_if_unregistered(pending)


def _commands(source: str) -> Iterator[list[str]]:
    """The ``insitubatch`` invocations of a bash block, as argv lists (env assignments stripped)."""
    for line in source.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line)
        if argv and argv[-1] == "&":  # started in the background
            argv = argv[:-1]
        while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv[:3] == ["python", "-m", "insitubatch.tools.check_transform"]:
            argv = ["insitubatch-check-transform", *argv[3:]]
        elif argv[:3] == ["python", "-m", "insitubatch"]:
            argv = ["insitubatch", *argv[3:]]
        elif argv[:3] == ["python", "-m", "insitubatch.testing.emulator"]:
            argv = ["insitubatch", "emulate", *argv[3:]]
        if argv and argv[0] in ("insitubatch", "insitubatch-check-transform"):
            yield argv


def test_bash_blocks_use_real_commands_and_flags() -> None:
    registered = cli_parsers()
    pending = unregistered_parsers(registered)
    parsers = {**registered, **pending}
    bad = []
    for b in all_blocks():
        if b.info != "bash":
            continue
        for argv in _commands(b.source):
            if argv[0] == "insitubatch-check-transform" or len(argv) == 1 or argv[1].startswith("-"):
                command, rest = argv[0], argv[1:]
            else:
                command, rest = " ".join(argv[:2]), argv[2:]
            parser = parsers.get(command)
            if parser is None:
                bad.append(f"{b.where}: {' '.join(argv)}: no command {command!r}")
                continue
            try:
                with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                    parser.parse_args(rest)
            except SystemExit as exit_:
                if exit_.code == 0:  # --help, --version
                    continue
                bad.append(f"{b.where}: {' '.join(argv)}: rejected by the parser ({parser.format_usage().strip()})")
    assert not bad, "\n".join(bad)
    _xfail_if_unregistered(pending)


# Words of the project's internal planning, which mean nothing to a user reading the docs or the code.
PLANNING_WORDS = re.compile(r"\bBRIEF\b|\bissue #?\d+|\bseeds?/|design card", re.I)
USER_FACING = [
    *DOC_FILES,
    ROOT / "docs" / "bench" / "report.md",
    *sorted((ROOT / "examples").glob("*.py")),
    *sorted((ROOT / "insitubatch").rglob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
]


def test_no_internal_planning_words_in_user_facing_text() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in USER_FACING
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PLANNING_WORDS.search(line)
    ]
    assert not found, "internal planning words in user-facing text:\n" + "\n".join(found)


def _stamps(text: str) -> list[tuple[str, str]]:
    from bench.provenance import STAMP

    return STAMP.findall(text)


def test_published_numbers_are_dated_and_name_their_commit() -> None:
    """README's measured table and the report it comes from name the same run; the tuning tables are stamped."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    measured = readme.split("## Measured", 1)[1].split("\n## ", 1)[0]
    report = (ROOT / "docs" / "bench" / "report.md").read_text(encoding="utf-8")
    assert _stamps(measured), "README's Measured section needs 'Measured YYYY-MM-DD at commit <sha>'"
    assert _stamps(measured)[0] == _stamps(report)[0], "README's numbers and docs/bench/report.md name different runs"
    tuning = (ROOT / "docs" / "tuning.md").read_text(encoding="utf-8")
    decode_threads = tuning.split("One thread per core stays the default.", 1)[1].split("\n## ", 1)[0]
    assert _stamps(decode_threads), "the decode-thread table in docs/tuning.md needs its date and commit"


def test_yaml_and_json_blocks_parse() -> None:
    yaml = pytest.importorskip("yaml")
    for b in all_blocks():
        if b.info == "yaml":
            list(yaml.safe_load_all(b.source))
        elif b.info == "json":
            json.loads(b.source)


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes for a Markdown file (lowercase, punctuation dropped, spaces to -)."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_relative_links_point_at_files_and_headings() -> None:
    broken = []
    for path in DOC_FILES:
        text = _FENCE.sub("", path.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file) if file else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


DESIGN_DOC = ROOT / "docs" / "design.md"
# A module path in backticks (`insitubatch/views.py`, `_engine/passes/driver.py`, `_ext/gather.pyx`),
# optionally naming a test in it (`tests/test_dataset.py::test_name`).
_MODULE_PATH = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|pyx|pxd|h))(?:::(\w+))?`")
# The design page names far more modules than this; fewer found means the pattern stopped matching.
DESIGN_MIN_PATHS = 40


def _module_file(path: str) -> Path | None:
    """The file a module path names: from the repository root, else inside the package."""
    for base in (ROOT, ROOT / "insitubatch"):
        if (base / path).is_file():
            return base / path
    return None


def test_design_names_only_modules_and_tests_that_exist() -> None:
    named = _MODULE_PATH.findall(_FENCE.sub("", DESIGN_DOC.read_text(encoding="utf-8")))
    assert len(named) >= DESIGN_MIN_PATHS, f"only {len(named)} module paths found in {DESIGN_DOC.name}"
    missing = []
    for path, test in named:
        file = _module_file(path)
        if file is None:
            missing.append(f"{path}: no such file under the repository or insitubatch/")
        elif test and not re.search(rf"^(?:async )?def {test}\(", file.read_text(encoding="utf-8"), re.M):
            missing.append(f"{path}::{test}: no such test")
    assert not missing, f"{DESIGN_DOC.name} names what is not there:\n" + "\n".join(missing)


if __name__ == "__main__":  # print every signature block as the code reads now
    for entry in api_entries():
        print(f"```python signature\n{entry.block}\n```")
        if entry.raises:
            print("raises:", ", ".join(entry.raises))
        print()
    for parser in cli_parsers().values():
        print(f"```text usage\n{textwrap.dedent(parser.format_usage()).rstrip()}\n```\n")
