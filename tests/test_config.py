"""``insitubatch.config``: one table of settings, read at use time, with obstore's yes/no words."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import obstore
import pytest
import zarr
from obstore.store import HTTPStore

from insitubatch import config, open_geometries
from insitubatch._engine.pool.buffers import BufferPool
from insitubatch._wire.pool import HttpPool
from insitubatch.errors import SettingError
from insitubatch.stores import options as store_options
from insitubatch.stores.client_choice import resolve_client
from insitubatch.stores.read_policy import ReadPolicy
from insitubatch.stores.wire_settings import EngineSettings
from insitubatch.tools import cli
from insitubatch.tools.debug import debug_info
from insitubatch.write import slots

ROOT = Path(__file__).resolve().parents[1]
TABLE_PAGE = ROOT / "docs" / "tuning.md"
# A loopback port nothing listens on (discard): a GET there fails at once, after obstore decided on http.
CLOSED_URL = "http://127.0.0.1:9/x"
VARIABLE = re.compile(r"\bINSITUBATCH_[A-Z_]*[A-Z]\b")


def _obstore_reads(word: str) -> bool | None:
    """How obstore reads ``word`` as ``allow_http``: True, False, or None (refused)."""
    try:
        store = HTTPStore.from_url(CLOSED_URL, client_options={"allow_http": word}, retry_config={"max_retries": 0})
        obstore.get(store, "k")
    except obstore.exceptions.BaseError as exc:
        text = str(exc)
        if "as boolean" in text:
            return None
        if "builder error" in text:  # plain http refused
            return False
        if "error sending request" in text:  # allowed, and nobody answered
            return True
        raise
    raise AssertionError(f"a GET to {CLOSED_URL} succeeded")


@pytest.mark.parametrize("word", [*config.TRUE_WORDS, *config.FALSE_WORDS, "ON", "Yes", "N", "TRUE", "maybe", "2"])
def test_yes_no_words_are_the_ones_obstore_reads(word: str) -> None:
    expected = _obstore_reads(word)
    if expected is None:
        with pytest.raises(SettingError, match=rf"AWS_ALLOW_HTTP={word!r} must be one of 1/true/on/yes/y"):
            config.parse_flag(word, "AWS_ALLOW_HTTP")
    else:
        assert config.parse_flag(word, "AWS_ALLOW_HTTP") is expected


def test_a_variable_set_after_import_takes_effect_and_set_wins(monkeypatch) -> None:
    monkeypatch.delenv("INSITUBATCH_NO_BUFFER_REUSE", raising=False)
    assert BufferPool().reuse and config.lookup("no_buffer_reuse") == (False, "the default")
    monkeypatch.setenv("INSITUBATCH_NO_BUFFER_REUSE", "on")  # ignored before the one rule
    assert not BufferPool().reuse
    with config.set(no_buffer_reuse="no"):
        assert BufferPool().reuse
        assert config.lookup("no_buffer_reuse") == (False, "insitubatch.config.set(no_buffer_reuse=False)")
        with config.set(no_buffer_reuse=True):
            assert not BufferPool().reuse
        assert BufferPool().reuse
    assert not BufferPool().reuse  # leaving the block gives the variable back
    assert config.config.get("no_buffer_reuse", None) is None


def test_an_unknown_word_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("INSITUBATCH_NO_BUFFER_REUSE", "sometimes")
    with pytest.raises(SettingError, match=r"INSITUBATCH_NO_BUFFER_REUSE='sometimes' must be one of .*environment"):
        BufferPool()
    assert isinstance(SettingError("x"), ValueError)
    monkeypatch.setenv("INSITUBATCH_MAX_CHUNK_BYTES", "-3")
    with pytest.raises(SettingError, match=r"INSITUBATCH_MAX_CHUNK_BYTES='-3' must be a positive integer"):
        config.get("max_chunk_bytes")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"buffer_reuse": True}, r"'buffer_reuse' is not an insitubatch setting; settings: client, max_chunk_bytes"),
        ({"client": "curl"}, r"client='curl' must be one of auto, engine, obstore \(given to insitubatch.config.set\)"),
        ({"max_chunk_bytes": 2.5}, r"max_chunk_bytes=2.5 must be a positive integer number of bytes"),
        ({"max_chunk_bytes": True}, r"max_chunk_bytes=True must be a positive integer"),
        ({"traceback": "loud"}, r"traceback='loud' must be one of 1/true/on/yes/y or 0/false/off/no/n"),
    ],
)
def test_set_refuses_what_no_setting_accepts_and_changes_nothing(given: dict, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        config.set(given)
    assert all(config.config.get(key, None) is None for key in config.SETTINGS)


def test_set_wins_over_the_environment_for_the_client(monkeypatch) -> None:
    monkeypatch.setenv("INSITUBATCH_CLIENT", "Engine")
    assert resolve_client(None) == ("engine", "INSITUBATCH_CLIENT=Engine")
    with config.set(client="obstore"):
        assert resolve_client(None) == ("obstore", "insitubatch.config.set(client='obstore')")
        assert resolve_client("auto") == ("auto", "client='auto'")  # a store's own argument wins over both
    monkeypatch.delenv("INSITUBATCH_CLIENT")
    assert resolve_client(None) == ("auto", "the default")


def test_the_chunk_byte_limit_set_in_a_block(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("INSITUBATCH_MAX_CHUNK_BYTES", raising=False)
    root = zarr.open_group(tmp_path / "a.zarr", mode="w")
    root.create_array("a", shape=(8, 4), chunks=(4, 4), dtype="f4")[:] = np.arange(32, dtype="f4").reshape(8, 4)
    chunk_bytes = 4 * 4 * 4
    assert open_geometries(str(tmp_path / "a.zarr"))["a"].chunk_nbytes == chunk_bytes
    with config.set(max_chunk_bytes=chunk_bytes - 1):
        with pytest.raises(ValueError, match=rf"over max_chunk_bytes={chunk_bytes - 1}.*INSITUBATCH_MAX_CHUNK_BYTES"):
            open_geometries(str(tmp_path / "a.zarr"))
    monkeypatch.setenv("INSITUBATCH_MAX_CHUNK_BYTES", str(chunk_bytes - 1))
    with config.set({"max_chunk_bytes": str(chunk_bytes)}):  # the block wins over the variable
        assert open_geometries(str(tmp_path / "a.zarr"))["a"].chunk_nbytes == chunk_bytes


def test_the_traceback_setting_takes_obstores_words(tmp_path: Path, monkeypatch, capsys) -> None:
    missing = str(tmp_path / "nothing.zarr")
    monkeypatch.setenv("INSITUBATCH_TRACEBACK", "off")
    assert cli.main(["inspect", missing]) == cli.EXIT_FAILURE
    assert "insitubatch inspect: error:" in capsys.readouterr().err
    monkeypatch.setenv("INSITUBATCH_TRACEBACK", "Yes")
    with pytest.raises(Exception, match="nothing.zarr"):
        cli.main(["inspect", missing])


def test_debug_info_reports_every_variable_that_is_set(monkeypatch) -> None:
    for setting in config.SETTINGS.values():
        monkeypatch.setenv(setting.variable, str(setting.default))
    reported = debug_info()["environment"]
    assert {s.variable for s in config.SETTINGS.values()} <= set(reported)


def _table_rows() -> dict[str, list[str]]:
    """``{variable: [kind, key, default, what]}`` from the Settings table of docs/tuning.md."""
    text = TABLE_PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `INSITUBATCH_"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_table_lists_exactly_the_variables_there_are() -> None:
    rows = _table_rows()
    settings = {s.variable: s for s in config.SETTINGS.values()}
    task = {getattr(slots, name) for name in slots.__all__ if name.startswith("ENV_")}
    build = set(config.BUILD_VARIABLES)
    assert set(rows) == set(settings) | task | build
    for variable, (kind, key, default, _what) in rows.items():
        if variable in settings:
            setting = settings[variable]
            assert kind.startswith("setting") and key == f"`{setting.key}`", variable
            assert ("yes/no" in kind) == isinstance(setting.default, bool), variable
            if isinstance(setting.default, bool):
                assert default == ("yes" if setting.default else "no"), variable
        else:
            assert kind.startswith("task" if variable in task else "build") and not key, variable
    # and every INSITUBATCH_* name the package or its build reads is a row
    sources = [*(ROOT / "insitubatch").rglob("*.py"), ROOT / "setup.py"]
    named = {m for path in sources for m in VARIABLE.findall(path.read_text(encoding="utf-8"))}
    assert named <= set(rows), f"not in the table of {TABLE_PAGE.name}: {sorted(named - set(rows))}"


def test_setup_py_reads_build_switches_with_the_same_words() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    words = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        if node.targets[0].id in ("TRUE_WORDS", "FALSE_WORDS")
    }
    assert words == {"TRUE_WORDS": config.TRUE_WORDS, "FALSE_WORDS": config.FALSE_WORDS}
    reads = {
        n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_flag"
    }
    assert reads == set(config.BUILD_VARIABLES)


def test_obstores_defaults_reach_the_engine_from_one_place() -> None:
    policy = ReadPolicy()
    assert policy.init_backoff_s == store_options.OBSTORE_INIT_BACKOFF.total_seconds()
    assert policy.max_backoff_s == store_options.OBSTORE_MAX_BACKOFF.total_seconds()
    assert policy.backoff_base == store_options.OBSTORE_BACKOFF_BASE
    assert policy.max_retries == store_options.DEFAULT_MAX_RETRIES == store_options.OBSTORE_MAX_RETRIES
    assert policy.retry_timeout_s == store_options.DEFAULT_RETRY_TIMEOUT.total_seconds()
    plain = EngineSettings(scheme="http", host="127.0.0.1", port=9, path="")
    assert plain.connect_timeout_s == store_options.OBSTORE_CONNECT_TIMEOUT.total_seconds()
    assert plain.pool_idle_timeout_s == store_options.OBSTORE_POOL_IDLE_TIMEOUT.total_seconds()
    assert store_options.DEFAULT_CLIENT_OPTIONS["connect_timeout"] == "5s"  # obstore's, as the string it echoes
    pool = inspect.signature(HttpPool).parameters
    assert pool["connect_timeout_s"].default == plain.connect_timeout_s
    assert pool["idle_timeout_s"].default == plain.pool_idle_timeout_s
