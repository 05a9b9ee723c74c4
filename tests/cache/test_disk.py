"""DiskCache and pipeline fingerprints: real files in tmp_path, real subprocesses for locks and crashes.

Several writers sharing one directory are ``test_sharing``; the locks between
processes ``test_lock``; full disks ``test_full_disk``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import crc32c
import numpy as np
import pytest

from insitubatch.cache import (
    LOG_NAME,
    SHARED_DIR,
    DiskCache,
    persisted_basename,
    reading,
    spill_basename,
)
from insitubatch.cache import fingerprint as fp_mod
from insitubatch.cache.fingerprint import array_fingerprints
from insitubatch.cache.tilefile import TileFile
from insitubatch.errors import CacheCorruptError, CacheMissError, StaleCacheError
from insitubatch.transforms import applies

FP_A, FP_B = "0123456789abcdef", "fedcba9876543210"
PATH = "t2m"
# a (4, 5, 7) chunk stored as (4, 5, 4) tiles: one full tile and one packed edge tile
STORED = (4, 5, 4)
SHAPES = [(4, 5, 4), (4, 5, 3)]
# the array's short final chunk: 2 samples
SHORT_SHAPES = [(2, 5, 4), (2, 5, 3)]
SUBPROCESS_TIMEOUT_S = 60
EMPTY_PIPELINE_FINGERPRINT = "9e4684f25a48c831"


def _tiles(shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _put(cache: DiskCache, path: str, chunk: int, tiles, stored=STORED) -> list[np.ndarray]:
    h = cache.begin(path, chunk, len(tiles), stored, tiles[0].dtype)
    for i, t in enumerate(tiles):
        cache.write(h, i, t)
    return cache.commit(h, [t.shape for t in tiles])


def _log_lines(d: Path) -> list[bytes]:
    """The base log's lines."""
    return (d / LOG_NAME).read_bytes().splitlines()


def _segments(d: Path) -> list[Path]:
    shared = d / SHARED_DIR
    return sorted(shared.glob("*.jsonl")) if shared.is_dir() else []


def _logged(d: Path) -> list[dict]:
    """Every entry line, base log and writers' segments, headers left out."""
    lines = _log_lines(d)[1:] if (d / LOG_NAME).exists() else []
    for seg in _segments(d):
        lines += seg.read_bytes().splitlines()[1:]
    return [json.loads(x) for x in lines]


def _name(chunk: int, path: str = PATH, fp: str = FP_A) -> str:
    return persisted_basename(path, chunk, fp)


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps", encoding="utf-8") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


def _npy_files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir() if p.suffix == ".npy"}


def _writer(d: Path, **kw) -> DiskCache:
    kw.setdefault("fingerprints", {PATH: FP_A})
    return DiskCache(d, persist=True, **kw)


# ---------------------------------------------------------------------------
# round trip


def test_commit_and_revive_are_zero_copy_read_only_views(tmp_path: Path) -> None:
    tiles = _tiles(SHAPES)
    short = _tiles(SHORT_SHAPES, seed=1)
    with _writer(tmp_path) as c:
        views = _put(c, PATH, 0, tiles)
        _put(c, PATH, 1, short)
        assert c.written == 2
        assert c.mapped_bytes == 2 * 2 * int(np.prod(STORED)) * 4
        for v, t in zip(views, tiles):
            assert v.shape == t.shape and v.flags.c_contiguous and not v.flags.writeable and not v.flags.owndata
            np.testing.assert_array_equal(v, t)
    with _writer(tmp_path) as c:
        got = c.lookup(PATH, 0, SHAPES, np.float32)
        got_short = c.lookup(PATH, 1, SHORT_SHAPES, np.float32)
        assert c.revived == 2 and c.rejected == {}
        for v, t in zip(got + got_short, tiles + short):
            assert not v.flags.writeable
            np.testing.assert_array_equal(v, t)
        with pytest.raises(ValueError):
            got[0][0, 0, 0] = 1.0
        # zero copy: a write through another shared mapping of the file shows in the views
        mm = np.load(tmp_path / _name(0), mmap_mode="r+")
        mm[0, 1, 2, 3] = 999.0
        mm[1].reshape(-1)[0] = 123.0  # an edge tile is packed at the start of its position
        mm.flush()
        del mm
        assert got[0][1, 2, 3] == 999.0 and got[1].reshape(-1)[0] == 123.0
        # a chunk still mapped is served again without reviving it twice
        again = c.lookup(PATH, 0, SHAPES, np.float32)
        assert again[0][1, 2, 3] == 999.0 and c.revived == 2


def test_shape_or_dtype_mismatch_is_a_miss_then_overwritten(tmp_path: Path) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    new_shapes = [(4, 5, 4), (4, 5, 2)]  # the array's inner extent changed
    with _writer(tmp_path) as c:
        assert c.lookup(PATH, 0, new_shapes, np.float32) is None
        assert c.lookup(PATH, 0, SHAPES, np.float64) is None
        assert c.rejected == {"shape": 1, "dtype": 1}
        fresh = _tiles(new_shapes, seed=2)
        _put(c, PATH, 0, fresh)
        assert len(_logged(tmp_path)) == 2  # the old entry (base log) and the superseding one (segment)
    with _writer(tmp_path) as c:
        assert c.dropped == {"superseded": 1}
        assert len(_logged(tmp_path)) == 1  # compacted
        for v, t in zip(c.lookup(PATH, 0, new_shapes, np.float32), fresh):
            np.testing.assert_array_equal(v, t)


def test_missing_file_is_a_miss_and_commit_checks_its_tiles(tmp_path: Path) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
        h = c.begin(PATH, 1, 2, STORED, np.float32)
        c.write(h, 0, _tiles(SHAPES)[0])
        with pytest.raises(ValueError, match=r"tiles \[1\] of 2 were never written"):
            c.commit(h, SHAPES)
        with pytest.raises(ValueError, match="already being written"):
            c.begin(PATH, 1, 2, STORED, np.float32)
        c.abort(h)
        c.abort(h)
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    (tmp_path / _name(0)).unlink()
    with _writer(tmp_path) as c:
        assert c.lookup(PATH, 0, SHAPES, np.float32) is None
        assert c.rejected == {"missing": 1}


# ---------------------------------------------------------------------------
# the log


def test_log_line_lands_at_each_commit_and_deduplicates(tmp_path: Path) -> None:
    tiles = _tiles(SHAPES)
    with _writer(tmp_path) as c:
        assert _log_lines(tmp_path) == [b'{"format":"insitubatch-cache","version":2}']
        (segment,) = _segments(tmp_path)
        header = json.loads(segment.read_bytes().splitlines()[0])
        assert header["writer"] == c.token and header["pid"] == os.getpid() and header["host"] == socket.gethostname()
        _put(c, PATH, 7, tiles)
        (entry,) = _logged(tmp_path)  # read while the cache is still open
        crc, t = entry.pop("crc32c"), entry.pop("t")
        assert entry == {
            "path": PATH,
            "chunk": 7,
            "file": _name(7),
            "n_tiles": 2,
            "tile_shapes": [list(s) for s in SHAPES],
            "dtype": "<f4",
            "fingerprint": FP_A,
            "nbytes": (tmp_path / _name(7)).stat().st_size,
        }
        assert crc == crc32c.crc32c((tmp_path / _name(7)).read_bytes()) and t > 0
        _put(c, PATH, 8, tiles)
        assert len(_logged(tmp_path)) == 2
        _put(c, PATH, 7, tiles)  # re-completed: same entry, no new line
        assert len(_logged(tmp_path)) == 2
    with _writer(tmp_path) as c:  # alone: the dead writer's segment is folded into the base log
        assert set(c.entries()) == {(PATH, 7), (PATH, 8)}
        assert len(_log_lines(tmp_path)) == 3 and len(_segments(tmp_path)) == 1
        assert c.lookup(PATH, 7, SHAPES, np.float32) is not None
        _put(c, PATH, 8, tiles)  # across a reopen too
        assert len(_logged(tmp_path)) == 2
    assert _segments(tmp_path) == []  # a writer that logged nothing leaves no segment


def test_compaction_only_when_a_writer_is_alone_with_something_to_fold(tmp_path: Path) -> None:
    log = tmp_path / LOG_NAME
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    with _writer(tmp_path) as c:
        assert c.dropped == {}
    clean = log.read_bytes()
    ino = log.stat().st_ino
    with _writer(tmp_path) as c:
        assert c.dropped == {}
    assert log.stat().st_ino == ino  # nothing to fold: not rewritten
    with log.open("ab") as f:  # a process killed in the middle of an append
        f.write(b'{"path":"t2m","chunk":1,"fi')
    with _writer(tmp_path) as c:
        assert c.dropped == {"torn": 1}
        assert set(c.entries()) == {(PATH, 0)}
    assert log.read_bytes() == clean and log.stat().st_ino != ino


@pytest.mark.invariant
def test_readonly_keeps_a_torn_final_line_and_writes_nothing(tmp_path: Path) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    with (tmp_path / LOG_NAME).open("ab") as f:
        f.write(b'{"path":"t2m"')

    def snapshot() -> dict[str, tuple[int, int, int]]:
        return {p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.iterdir()}

    before = snapshot()
    with DiskCache(tmp_path, persist=True, readonly=True, fingerprints={PATH: FP_A}) as c:
        assert c.dropped == {"torn": 1}
        assert c.lookup(PATH, 0, SHAPES, np.float32) is not None
        assert c.lookup(PATH, 5, SHAPES, np.float32) is None
        err = c.miss_error(PATH, 5)
        assert isinstance(err, CacheMissError) and isinstance(err, KeyError)
        assert "'t2m' chunk 5" in str(err) and "no entry" in str(err)
        assert c.lookup(PATH, 0, SHAPES, np.int16) is None
        assert "dtype" in str(c.miss_error(PATH, 0))
        with pytest.raises(PermissionError, match="readonly"):
            c.begin(PATH, 5, 2, STORED, np.float32)
    assert snapshot() == before


def _valid_log(tmp_path: Path) -> list[bytes]:
    """A base log holding one entry (a second writer, alone, folds the first one's segment into it)."""
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    _writer(tmp_path).close()
    return _log_lines(tmp_path)


def _entry(**changes) -> bytes:
    rec = {
        "path": PATH,
        "chunk": 3,
        "file": _name(3),
        "n_tiles": 1,
        "tile_shapes": [[4, 5, 4]],
        "dtype": "<f4",
        "fingerprint": FP_A,
        "nbytes": 448,
        "crc32c": 0,
        "t": 1,
    }
    rec.update(changes)
    return json.dumps(rec).encode()


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        ("garbage header", lambda h, e: [b"\x00\xffnot a header", *e]),
        ("foreign header", lambda h, e: [b'{"format":"other","version":1}', *e]),
        ("interior truncated line", lambda h, e: [h, b'{"path":"t2m","chu', *e]),
        ("interior wrong field", lambda h, e: [h, _entry(chunk=-1), *e]),
        ("interior extra field", lambda h, e: [h, _entry(extra=1), *e]),
        ("checksum out of range", lambda h, e: [h, _entry(crc32c=1 << 32), *e]),
        ("final line with its newline", lambda h, e: [h, *e, b'{"path":"t2m"']),
        ("relative escape", lambda h, e: [h, *e, _entry(file="../escape.npy")]),
        ("subdirectory", lambda h, e: [h, *e, _entry(file="sub/x.npy")]),
        ("absolute", lambda h, e: [h, *e, _entry(file="/etc/passwd")]),
        ("not a tile file", lambda h, e: [h, *e, _entry(file=LOG_NAME)]),
        ("shared file", lambda h, e: [h, *e, _entry(file=json.loads(e[0])["file"])]),
    ],
)
def test_corruption_always_raises(tmp_path: Path, case: str, edit) -> None:
    d = tmp_path / "cache"
    header, *entries = _valid_log(d)
    (d / LOG_NAME).write_bytes(b"\n".join(edit(header, entries)) + b"\n")
    (tmp_path / "escape.npy").write_bytes(b"must survive")
    files = _npy_files(d)
    for kw in ({}, {"reset_stale": True}):
        # a stale fingerprint too: corruption must win over reset_stale, deleting nothing
        with pytest.raises(CacheCorruptError, match=LOG_NAME):
            DiskCache(d, persist=True, fingerprints={PATH: FP_B}, **kw)
    assert _npy_files(d) == files and (tmp_path / "escape.npy").exists()


def test_an_empty_log_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / LOG_NAME).write_bytes(b"")
    with pytest.raises(CacheCorruptError, match="no complete header"):
        _writer(tmp_path, reset_stale=True)


def test_another_log_version_is_stale_as_a_whole(tmp_path: Path) -> None:
    header, *entries = _valid_log(tmp_path)
    (tmp_path / LOG_NAME).write_bytes(b'{"format":"insitubatch-cache","version":0}\n' + b"\n".join(entries) + b"\n")
    with pytest.raises(StaleCacheError, match="version 0"):
        _writer(tmp_path)
    with _writer(tmp_path, reset_stale=True) as c:
        assert c.entries() == {} and _npy_files(tmp_path) == set()
    assert _log_lines(tmp_path) == [header]


# ---------------------------------------------------------------------------
# fingerprints


class Scale:
    """A class-based chunk transform with an optional explicit identity."""

    def __init__(self, factor: float, cache_key: str | None = None) -> None:
        self.factor = factor
        self.cache_key = cache_key

    def __call__(self, chunk):
        return chunk


def _identity(chunk):
    return chunk


def _make_scaler(k: float):
    def scaler(chunk):
        return chunk if k else None

    return scaler


def test_editing_a_scoped_transform_invalidates_only_its_array(tmp_path: Path) -> None:
    def pipeline(version: str):
        return [applies([PATH], Scale(2.0, cache_key=version)), _identity]

    old = array_fingerprints(pipeline("stats-v1"), [PATH, "u10"])
    new = array_fingerprints(pipeline("stats-v2"), [PATH, "u10"])
    assert old[PATH] != new[PATH] and old["u10"] == new["u10"]
    with DiskCache(tmp_path, persist=True, fingerprints=old) as c:
        for chunk in range(2):
            _put(c, PATH, chunk, _tiles(SHAPES))
            _put(c, "u10", chunk, _tiles(SHAPES))
    with pytest.raises(StaleCacheError) as info:
        DiskCache(tmp_path, persist=True, fingerprints=new)
    assert "'t2m'" in str(info.value) and "u10" not in str(info.value) and "reset_stale_cache=True" in str(info.value)
    # an array this run does not read is neither checked nor touched
    with DiskCache(tmp_path, persist=True, fingerprints={"u10": new["u10"]}) as c:
        assert len(c.entries()) == 4 and c.dropped == {}
    with DiskCache(tmp_path, persist=True, fingerprints=new, reset_stale=True) as c:
        assert c.dropped == {"stale": 2}
        assert set(c.entries()) == {("u10", 0), ("u10", 1)}
        assert c.lookup("u10", 1, SHAPES, np.float32) is not None
    assert _npy_files(tmp_path) == {_name(i, "u10", new["u10"]) for i in range(2)}
    assert len(_logged(tmp_path)) == 2
    with DiskCache(tmp_path, persist=True, fingerprints=new) as c:  # the reset is not re-read
        assert c.dropped == {}


def test_a_readonly_reader_of_a_stale_cache_is_told_what_works_there(tmp_path: Path) -> None:
    """reset_stale_cache=True is refused under readonly_cache=True, so the message must not advise it alone."""
    old, new = {PATH: "0123456789abcdef"}, {PATH: "fedcba9876543210"}
    with DiskCache(tmp_path, persist=True, fingerprints=old) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    with pytest.raises(StaleCacheError) as info:
        DiskCache(tmp_path, persist=True, readonly=True, fingerprints=new)
    message = str(info.value)
    assert "'t2m'" in message and "readonly_cache reader never writes" in message
    assert "writing run (persist=True, reset_stale_cache=True" in message and "another cache_dir" in message
    # the advice works: a writer resets the stale array, then the reader opens
    with DiskCache(tmp_path, persist=True, fingerprints=new, reset_stale=True) as c:
        assert c.dropped == {"stale": 1}
    with DiskCache(tmp_path, persist=True, readonly=True, fingerprints=new) as c:
        assert len(c.entries()) == 0


def pipeline_fingerprint(transforms) -> str:
    """The fingerprint of one ordered pipeline: ``array_fingerprints`` for an array every transform reaches."""
    return array_fingerprints(list(transforms), ["a"])["a"]


def test_fingerprint_rules() -> None:
    # pinned: a change here silently invalidates every user's persisted cache (bump FINGERPRINT_FORMAT)
    assert pipeline_fingerprint([]) == pipeline_fingerprint(()) == EMPTY_PIPELINE_FINGERPRINT
    transforms = [applies(["a"], Scale(1.0)), _identity]
    assert array_fingerprints(transforms, ["a", "b"]) == {
        "a": pipeline_fingerprint(transforms),
        "b": pipeline_fingerprint([_identity]),
    }
    # cache_key is authoritative: different code, same key, same identity
    assert pipeline_fingerprint([Scale(1.0, "k")]) == pipeline_fingerprint([Scale(5.0, "k")])
    assert pipeline_fingerprint([Scale(1.0, "k")]) != pipeline_fingerprint([Scale(1.0, "j")])
    # a Scoped wrapper contributes its inner transform; order matters
    assert pipeline_fingerprint([applies(["a"], Scale(1.0))]) == pipeline_fingerprint([Scale(1.0)])
    assert pipeline_fingerprint([Scale(1.0), _identity]) != pipeline_fingerprint([_identity, Scale(1.0)])
    # cloudpickle sees instance state, arrays included, and closure constants
    assert pipeline_fingerprint([Scale(1.0)]) != pipeline_fingerprint([Scale(2.0)])
    big = np.arange(5000.0)
    scaled = Scale(1.0)
    scaled.mean = big
    other = Scale(1.0)
    other.mean = big.copy()
    other.mean[2500] = -1.0  # invisible to repr, which summarises the middle away
    assert pipeline_fingerprint([scaled]) != pipeline_fingerprint([other])
    assert pipeline_fingerprint([_make_scaler(1.0)]) != pipeline_fingerprint([_make_scaler(2.0)])
    assert pipeline_fingerprint([_make_scaler(1.0)]) == pipeline_fingerprint([_make_scaler(1.0)])
    with pytest.raises(TypeError, match="cache_key"):
        pipeline_fingerprint([Scale(1.0, cache_key=3)])


_STABILITY_SCRIPT = """
import crc32c
import numpy as np
from insitubatch.cache.fingerprint import array_fingerprints
TAGS = {"alpha", "beta", "gamma", "delta"}
class Norm:  # defined in __main__: cloudpickle pickles it by value
    def __init__(self):
        self.mean = np.arange(3000.0)
        self.names = {"u", "v", "w", "t2m"}
    def __call__(self, chunk):
        return chunk if "alpha" in TAGS else None
print(array_fingerprints([Norm()], ["a"])["a"])
"""


def test_fingerprint_is_stable_across_processes() -> None:
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _STABILITY_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=True,
        )
        outs.append(proc.stdout.strip())
    assert outs[0] == outs[1] and len(outs[0]) == 16


def test_source_fallback_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # `import cloudpickle` now raises ImportError
    monkeypatch.setattr(fp_mod, "_source_fallback_warned", False)
    with pytest.warns(UserWarning, match="cannot see closures") as record:
        by_source = pipeline_fingerprint([_identity])
        pipeline_fingerprint([Scale(1.0)])
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # the source hash sees the body and the instance config, not a closure constant
        assert pipeline_fingerprint([Scale(1.0)]) != pipeline_fingerprint([Scale(2.0)])
        assert pipeline_fingerprint([_make_scaler(1.0)]) == pipeline_fingerprint([_make_scaler(2.0)])
        assert pipeline_fingerprint([_make_scaler(1.0)]) != by_source
        assert pipeline_fingerprint([Scale(1.0, "k")]) == pipeline_fingerprint([Scale(3.0, "k")])


# ---------------------------------------------------------------------------
# spill, eviction, arguments


def test_spill_files_go_on_evict_and_close_persisted_ones_stay(tmp_path: Path) -> None:
    spill_dir, keep_dir = tmp_path / "spill", tmp_path / "keep"
    with DiskCache(spill_dir, persist=False, fingerprints={}) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
        view = _put(c, PATH, 1, _tiles(SHAPES, seed=5))[0]
        assert _npy_files(spill_dir) == {spill_basename(PATH, i, c.token) for i in range(2)}
        c.evict(PATH, 0)
        c.evict(PATH, 0)
        assert _npy_files(spill_dir) == {spill_basename(PATH, 1, c.token)}
        assert c.lookup(PATH, 0, SHAPES, np.float32) is None
        assert not (spill_dir / LOG_NAME).exists()
    assert not spill_dir.exists()  # its files went, and so did the directory it made
    np.testing.assert_array_equal(view, _tiles(SHAPES, seed=5)[0])  # an unlinked file's view stays valid
    with _writer(keep_dir) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
        c.evict(PATH, 0)
        assert c.mapped_bytes == 0
        assert c.lookup(PATH, 0, SHAPES, np.float32) is not None and c.revived == 1
    assert _npy_files(keep_dir) == {_name(0)}


def test_a_spill_cache_leaves_no_directory_it_made(tmp_path: Path) -> None:
    made = tmp_path / "made" / "spill"
    with DiskCache(made, persist=False, fingerprints={}) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    assert not made.exists() and (tmp_path / "made").exists()  # what it made, not what was there

    given = tmp_path / "given"
    given.mkdir()
    (given / "notes.txt").write_text("the user's")
    first = DiskCache(given, persist=False, fingerprints={})
    second = DiskCache(given, persist=False, fingerprints={})
    _put(first, PATH, 0, _tiles(SHAPES))
    first.close()
    assert (given / SHARED_DIR).is_dir()  # the second writer's segment is still in it
    _put(second, PATH, 1, _tiles(SHAPES))
    second.close()
    assert sorted(p.name for p in given.iterdir()) == ["notes.txt"]  # the last one out took the lock file too

    kept = tmp_path / "kept"
    with _writer(kept) as c:  # a persisted cache keeps its directory, of course
        _put(c, PATH, 0, _tiles(SHAPES))
    with DiskCache(kept, persist=False, fingerprints={}):
        pass
    assert _npy_files(kept) == {_name(0)} and (kept / LOG_NAME).exists()


def test_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="readonly_cache=True reads a persisted cache: pass persist=True"):
        DiskCache(tmp_path, persist=False, readonly=True, fingerprints={})
    with pytest.raises(ValueError, match="reset_stale"):
        DiskCache(tmp_path, persist=True, readonly=True, reset_stale=True, fingerprints={})
    with pytest.raises(ValueError, match="16 lowercase hex"):
        DiskCache(tmp_path, persist=True, fingerprints={PATH: "XYZ"})
    with pytest.raises(FileNotFoundError, match="warm it"):
        DiskCache(tmp_path / "absent", persist=True, readonly=True, fingerprints={})
    with pytest.raises(ValueError, match="disk_bytes=0"):
        DiskCache(tmp_path, persist=True, fingerprints={}, disk_bytes=0)
    with pytest.raises(ValueError, match="on_corrupt_cache='ignore' must be one of"):
        DiskCache(tmp_path, persist=True, fingerprints={}, on_corrupt="ignore")
    with _writer(tmp_path) as c:
        with pytest.raises(KeyError, match="no fingerprint"):
            c.begin("u10", 0, 1, STORED, np.float32)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.lookup(PATH, 0, SHAPES, np.float32)


# ---------------------------------------------------------------------------
# resources


def _held(d: Path) -> tuple[int, int]:
    """(open fds, mapped regions) of this process under ``d``."""
    root = os.path.realpath(d)
    fds = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{name}").startswith(root)
        except OSError:
            pass
    maps = sum(root in line for line in Path("/proc/self/maps").read_text().splitlines())
    return fds, maps


def test_no_fd_or_mapping_outlives_close(tmp_path: Path) -> None:
    tiles = _tiles(SHAPES)
    for i in range(50):
        with DiskCache(tmp_path, persist=bool(i % 2), fingerprints={PATH: FP_A}) as c:
            _put(c, PATH, i % 3, tiles)
            h = c.begin(PATH, 99, 2, STORED, np.float32)  # left pending: close aborts it
            c.write(h, 0, tiles[0])
            if c.persist:
                c.lookup(PATH, i % 3, SHAPES, np.float32)
            assert _held(tmp_path)[0] >= 1  # the lock fd
        assert _held(tmp_path) == (0, 0)
    with _writer(tmp_path) as c:
        kept = c.lookup(PATH, 1, SHAPES, np.float32)
    assert _held(tmp_path) == (0, 1)  # the live view keeps its own mapping, nothing else
    np.testing.assert_array_equal(kept[0], tiles[0])
    del kept
    assert _held(tmp_path) == (0, 0)


# ---------------------------------------------------------------------------
# checksums


def _flip(path: Path, offset: int) -> None:
    """Flip every bit of one byte in place: same size, same inode."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _damage_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]


@pytest.mark.invariant
def test_a_flipped_payload_byte_is_refetched_with_one_warning(tmp_path: Path, caplog) -> None:
    tiles = _tiles(SHAPES)
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, tiles)
        _put(c, PATH, 1, tiles)
    target = tmp_path / _name(0)
    size = target.stat().st_size
    _flip(target, size - 5)  # inside the edge tile's position, past the header
    assert target.stat().st_size == size
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(tmp_path) as c:
        found = c.find(PATH, 0, SHAPES, np.float32)
        assert found.tiles is None and found.claimed  # a miss this writer now makes again
        assert c.rejected == {"checksum": 1}
        (warning,) = _damage_warnings(caplog)
        assert str(target) in warning and "CRC-32C" in warning and "re-fetching" in warning
        assert c.find(PATH, 1, SHAPES, np.float32).tiles is not None  # the undamaged chunk is served
        fresh = _put(c, PATH, 0, tiles)  # the engine's re-fetch
        for v, t in zip(fresh, tiles):
            np.testing.assert_array_equal(v, t)
        assert c.find(PATH, 0, SHAPES, np.float32).tiles is not None
        assert len(_damage_warnings(caplog)) == 1
    with _writer(tmp_path) as c:  # repaired for good: the next run revives it without a word
        np.testing.assert_array_equal(c.lookup(PATH, 0, SHAPES, np.float32)[0], tiles[0])
        assert c.rejected == {}


def test_on_corrupt_raise_names_the_damaged_file(tmp_path: Path) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    target = tmp_path / _name(0)
    _flip(target, target.stat().st_size // 2)
    with _writer(tmp_path, on_corrupt="raise") as c:
        with pytest.raises(CacheCorruptError, match=re.escape(str(target))) as info:
            c.find(PATH, 0, SHAPES, np.float32)
        assert "chunk 0" in str(info.value) and "CRC-32C" in str(info.value)


@pytest.mark.parametrize("where", ["magic", "version", "shape digit", "descr", "padding", "header newline"])
def test_a_flipped_header_byte_is_detected(tmp_path: Path, caplog, where: str) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    target = tmp_path / _name(0)
    header = target.read_bytes()[:128]
    offsets = {
        "magic": 1,
        "version": 6,
        "shape digit": header.index(b"(2, 4") + 1,
        "descr": header.index(b"<f4") + 1,
        "padding": header.index(b"\n") - 2,
        "header newline": header.index(b"\n"),
    }
    _flip(target, offsets[where])
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(tmp_path) as c:
        assert c.lookup(PATH, 0, SHAPES, np.float32) is None
        assert sum(c.rejected.values()) == 1 and set(c.rejected) <= {"file", "checksum"}
        assert len(_damage_warnings(caplog)) == 1


def test_a_block_of_lookups_maps_and_checksums_its_files_in_one_call(
    tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """premap: one kernel call for the block; a damaged file among them is caught; what no find took is unmapped."""
    with _writer(tmp_path) as c:
        for chunk in range(4):
            _put(c, PATH, chunk, _tiles(SHAPES, seed=chunk))
    _flip(tmp_path / _name(2), 300)  # a payload byte: same size, same header
    singles = []
    real_open = reading.open_tile_file
    monkeypatch.setattr(reading, "open_tile_file", lambda *a, **kw: singles.append(a) or real_open(*a, **kw))
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(tmp_path) as c:
        premapped = c.premap([(PATH, chunk) for chunk in (0, 1, 2, 3, 9)])  # chunk 9 was never logged
        assert sorted(premapped) == sorted(_name(k) for k in range(4))
        assert all(f.crc_at_open is not None for _, f in premapped.values())  # none verified yet: all summed
        for chunk in (0, 1, 2):
            found = c.find(PATH, chunk, SHAPES, np.float32, claim=False, premapped=premapped)
            if chunk == 2:
                assert found.tiles is None and c.rejected == {"checksum": 1}
            else:
                for got, want in zip(found.tiles, _tiles(SHAPES, seed=chunk)):
                    np.testing.assert_array_equal(got, want)
        assert singles == [] and list(premapped) == [_name(3)]  # every find took its file from the block
        c.close_premapped(premapped)
        assert premapped == {} and not _mapped(tmp_path / _name(3))
        assert len(_damage_warnings(caplog)) == 1
        # a held chunk is not mapped again; a verified file is not summed again; one not mapped yet is
        c.evict(PATH, 0)
        again = c.premap([(PATH, 0), (PATH, 1), (PATH, 3)])
        assert {n: f.crc_at_open is None for n, (_, f) in again.items()} == {_name(0): True, _name(3): False}
        c.close_premapped(again)


def test_a_file_is_verified_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _writer(tmp_path) as c:
        _put(c, PATH, 0, _tiles(SHAPES))
    calls = []  # every file checksummed: when mapped (open_tile_file(checksum=True)) or after (checksum())
    real_checksum, real_open = TileFile.checksum, reading.open_tile_file

    def counted_open(path, *, checksum=False, **kw):
        calls.extend([Path(path).name] if checksum else [])
        return real_open(path, checksum=checksum, **kw)

    monkeypatch.setattr(TileFile, "checksum", lambda self: calls.append(self.path.name) or real_checksum(self))
    monkeypatch.setattr(reading, "open_tile_file", counted_open)
    with _writer(tmp_path) as c:
        for _ in range(3):  # revived, evicted, revived again (a windowed pass releasing a block)
            assert c.lookup(PATH, 0, SHAPES, np.float32) is not None
            c.evict(PATH, 0)
        assert calls == [_name(0)]
        # an edit in place gives the file a new mtime: checked again, and caught
        _flip(tmp_path / _name(0), 200)
        os.utime(tmp_path / _name(0), ns=(1, 1))
        assert c.lookup(PATH, 0, SHAPES, np.float32) is None and c.rejected == {"checksum": 1}
    calls.clear()
    with _writer(tmp_path) as c:
        c.verify = False  # the bench's switch: no checksum is computed on revive
        c.lookup(PATH, 0, SHAPES, np.float32)
        assert calls == []
