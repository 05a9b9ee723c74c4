"""Progress bars: tqdm on a terminal when installed; silent off a terminal or without tqdm."""

from __future__ import annotations

import io
import sys
import types

import pytest
from write_helpers import GROUP, layout_spec, write_batches
from zarr.storage import MemoryStore

from insitubatch.progress import progress
from insitubatch.tools import cli
from insitubatch.write import create_layout, plan_slots, run_plan


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _FakeTqdm:
    """Records how it was made and what it counted (stands in for tqdm, an optional dependency)."""

    made: list[_FakeTqdm] = []

    def __init__(self, iterable=None, *, total=None, desc=None, unit="it", file=None, **kw):
        self.iterable, self.total, self.desc, self.unit, self.file, self.n = iterable, total, desc, unit, file, 0
        self.closed = False
        _FakeTqdm.made.append(self)

    def __iter__(self):
        for item in self.iterable:
            self.n += 1
            yield item

    def update(self, n=1):
        self.n += n

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def fake_tqdm(monkeypatch):
    _FakeTqdm.made = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=_FakeTqdm))
    return _FakeTqdm


def test_silent_off_a_terminal_even_with_tqdm(fake_tqdm) -> None:
    items = [1, 2, 3]
    assert progress(items, file=io.StringIO()) is items
    with progress(total=3, file=io.StringIO()) as bar:
        bar.update()
    assert fake_tqdm.made == []


def test_silent_without_tqdm(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed: the import raises ImportError
    items = [1, 2]
    assert progress(items, file=_Terminal()) is items
    progress(total=2, file=_Terminal()).update(2)


def test_tqdm_on_a_terminal(fake_tqdm) -> None:
    term = _Terminal()
    assert list(progress(range(4), total=4, desc="x", unit="batch", file=term)) == [0, 1, 2, 3]
    (bar,) = fake_tqdm.made
    assert (bar.total, bar.desc, bar.unit, bar.file, bar.n) == (4, "x", "batch", term, 4)


def test_slot_runs_and_write_status_show_bars_on_a_terminal(fake_tqdm, monkeypatch, capsys) -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    plan = plan_slots(store, group=GROUP)
    run_plan(store, plan, write_batches)
    slots = [b for b in fake_tqdm.made if b.desc == "slots"]
    assert len(slots) == 1 and slots[0].n == len(plan.ranges)
    monkeypatch.setattr(cli, "_open_store", lambda args, read_only: store)
    assert cli.main(["write-status", "memory://", "--group", GROUP]) == 0
    status = [b for b in fake_tqdm.made if b.desc == "write-status"]
    assert len(status) == 1 and status[0].n == status[0].total == 1 and status[0].closed
    assert "remaining: none" in capsys.readouterr().out


def test_real_tqdm_draws_on_a_terminal_only() -> None:
    pytest.importorskip("tqdm")  # the optional extra; the fake above covers the wiring without it
    term = _Terminal()
    assert list(progress(range(3), total=3, desc="real", file=term)) == [0, 1, 2]
    assert "real" in term.getvalue()
    with progress(total=2, desc="manual", file=term) as bar:
        bar.update(2)
    assert "manual" in term.getvalue()
