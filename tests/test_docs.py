"""The documentation cannot rot: its code runs, its API reference matches the code.

* Every fenced block in ``README.md`` and ``docs/*.md`` carries a language
  from a known set, so nothing meant to run hides in an untagged block.
* Every ```` ```python ```` block runs. A page's blocks run in order, in one
  fresh interpreter per page (``-W error``, a temporary working directory),
  after a hidden preamble that defines ``url``: the demo dataset served over
  HTTP by the loopback emulator (``insitubatch.testing.emulator``), i.e. a real zarr group
  behind a real, slightly slow HTTP server on 127.0.0.1.
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
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API_DOC = ROOT / "docs" / "api.md"

# The languages a fenced block may carry. ``python`` runs; the others are checked or shown.
LANGUAGES = {
    "python",  # executed
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
# Demo dataset the snippets read: one year of 6-hourly steps on the demo's grid.
DEMO_SHAPE = (730, 32, 64)
# Time to first byte the emulator adds to every request: cloud-like, but keeps the test fast.
EMULATOR_LATENCY_S = 0.005
# A page's snippets must finish within this (they read a few MB from loopback).
PAGE_TIMEOUT_S = 120
# Environment variable through which the hidden preamble learns the dataset's URL.
URL_ENV = "INSITUBATCH_DOCS_URL"

# Namespaces whose ``__all__`` is the public API, in the order a name is attributed
# to (a name exported by two is documented under the first).
API_NAMESPACES = ("insitubatch", "insitubatch.write", "insitubatch.errors")
# Public helpers outside any ``__all__`` above that users call directly.
API_EXTRAS = {
    "insitubatch.transforms": ("Coarsen", "KelvinToCelsius", "Regrid", "StandardScaler", "kelvin_to_celsius"),
    "insitubatch.tools.inspect_store": ("inspect_store",),
    "insitubatch.tools.demo": ("write_demo_dataset",),
}

PREAMBLE = f"""
import os
url = os.environ[{URL_ENV!r}]  # the demo dataset behind the loopback emulator (HTTP, {EMULATOR_LATENCY_S * 1e3:g} ms)
"""

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
    """``{"insitubatch <command>": parser, "insitubatch-check-transform": parser}``."""
    from insitubatch.tools import check_transform, cli

    parsers: dict[str, argparse.ArgumentParser] = {}
    top = cli.build_parser()
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
@pytest.fixture(scope="module")
def served_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo dataset (consolidated, so HTTP needs no listing) behind the loopback emulator."""
    import zarr
    from zarr.errors import ZarrUserWarning

    from insitubatch.tools.demo import write_demo_dataset

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from insitubatch.testing.emulator import Emulator

    root = tmp_path_factory.mktemp("docs-data")
    path = write_demo_dataset(root / "era5.zarr", shape=DEMO_SHAPE)
    with warnings.catch_warnings():
        # zarr warns that v3 consolidated metadata is not in the spec yet; an HTTP store needs it
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(str(path))
    with Emulator(root, latency_s=EMULATOR_LATENCY_S, jitter_s=0.0) as emulator:
        yield emulator.url_for("era5.zarr")


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


# A block importing one of these needs it; the Python 3.12 CI leg installs neither.
_FRAMEWORK_IMPORT = re.compile(r"^\s*(?:import|from)\s+(torch|jax)\b", re.M)
PAGES_WITH_CODE = [p for p in DOC_FILES if any(b.info == "python" for b in blocks(p))]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, served_url: str, tmp_path: Path) -> None:
    code = [(str(b.path.relative_to(ROOT)), b.line, b.source) for b in blocks(page) if b.info == "python"]
    for framework in sorted({m[1] for _, _, source in code for m in _FRAMEWORK_IMPORT.finditer(source)}):
        pytest.importorskip(framework)  # a page that trains with torch or runs jax needs it installed
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps(code), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(
        os.environ,
        **{URL_ENV: served_url},
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", RUNNER, str(script), PREAMBLE],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"a python block of {page.name} failed:\n{proc.stdout}\n{proc.stderr}"
    # a warning raised in a finalizer or a logged one does not change the exit status; it still fails
    noise = [
        line for line in proc.stderr.splitlines() if re.search(r"Warning|Exception ignored|Traceback|WARNING", line)
    ]
    assert not noise, f"the python blocks of {page.name} warned:\n{proc.stderr}"


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


def _usage(parser: argparse.ArgumentParser) -> str:
    return _normal(parser.format_usage())


def test_cli_usage_blocks_match_the_parsers() -> None:
    registered = cli_parsers()
    pending = unregistered_parsers(registered)
    parsers = {**registered, **pending}
    shown = {}
    for b in all_blocks():
        if b.info == "text usage":
            m = re.match(r"usage: (insitubatch(?:-check-transform| [\w-]+))", _normal(b.source))
            assert m, f"{b.where}: a usage block starts with 'usage: insitubatch ...'"
            shown[m[1]] = (b, _normal(b.source))
    wrong = []
    for command, (b, text) in shown.items():
        if command not in parsers:
            wrong.append(f"{b.where}: {command!r} is not a command; commands are {sorted(parsers)}")
        elif text != _usage(parsers[command]):
            wrong.append(f"{b.where}: the usage of {command!r} now reads:\n{parsers[command].format_usage()}")
    undocumented = sorted(set(parsers) - set(shown))
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
        while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv[:3] == ["python", "-m", "insitubatch.tools.check_transform"]:
            argv = ["insitubatch-check-transform", *argv[3:]]
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
            if argv[0] == "insitubatch-check-transform":
                command, rest = argv[0], argv[1:]
            else:
                command, rest = " ".join(argv[:2]), argv[2:]
            parser = parsers.get(command)
            if parser is None:
                bad.append(f"{b.where}: {' '.join(argv)}: no command {command!r}")
                continue
            try:
                with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
                    parser.parse_args(rest)
            except SystemExit:
                bad.append(f"{b.where}: {' '.join(argv)}: rejected by the parser ({parser.format_usage().strip()})")
    assert not bad, "\n".join(bad)
    _xfail_if_unregistered(pending)


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


if __name__ == "__main__":  # print every signature block as the code reads now
    for entry in api_entries():
        print(f"```python signature\n{entry.block}\n```")
        if entry.raises:
            print("raises:", ", ".join(entry.raises))
        print()
    for parser in cli_parsers().values():
        print(f"```text usage\n{textwrap.dedent(parser.format_usage()).rstrip()}\n```\n")
