"""PinnedBufferPool: aligned arrays, lifetime-safe reuse, no leaks, one warning when it cannot lock."""

from __future__ import annotations

import gc
import os
import resource
import warnings

import numpy as np
import pytest

from insitubatch._ext.pinned import HostBuffer
from insitubatch.adapters.pinned import PAGE_SIZE, PinnedBufferPool


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def pool():
    with PinnedBufferPool(lock=False, register_cuda=False) as p:
        yield p


@pytest.fixture
def memlock_limit():
    """Set the soft ``RLIMIT_MEMLOCK`` for one test (the hard limit never changes)."""
    saved = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def set_soft(nbytes: int) -> None:
        hard = saved[1]
        if hard != resource.RLIM_INFINITY and nbytes > hard:
            raise RuntimeError(f"the hard RLIMIT_MEMLOCK ({hard}) is below {nbytes}: guard the test with _MEMLOCK_ROOM")
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (nbytes, hard))

    yield set_soft
    resource.setrlimit(resource.RLIMIT_MEMLOCK, saved)


def _locked_now() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmLck:"))


@pytest.mark.parametrize(
    ("shape", "dtype"), [((8, 721, 1440), "f4"), ((256, 64, 32), "f4"), ((3,), "u1"), ((0, 5), "f8"), (7, "c16")]
)
def test_buffers_are_page_aligned_c_contiguous_arrays(pool: PinnedBufferPool, shape, dtype) -> None:
    a = pool.acquire(shape, dtype)
    assert a.shape == ((shape,) if isinstance(shape, int) else shape) and a.dtype == np.dtype(dtype)
    assert a.ctypes.data % PAGE_SIZE == 0
    assert a.flags.c_contiguous and a.flags.writeable
    a[...] = 1
    assert (a == 1).all()


def test_a_released_buffer_is_reused_once_nothing_views_it(pool: PinnedBufferPool) -> None:
    a = pool.acquire((64, 32), "f4")
    address = a.ctypes.data
    pool.release(a)
    del a
    b = pool.acquire((64, 32), "f4")
    assert b.ctypes.data == address
    pool.release(b)
    del b
    c = pool.acquire((2, 64, 16), "f4")  # same bytes, another shape: same buffer
    assert c.ctypes.data == address


def test_a_batch_kept_alive_is_never_overwritten(pool: PinnedBufferPool) -> None:
    first = pool.acquire((16, 16), "i4")
    first[...] = 1
    kept_slice = first[3:5]
    pool.release(first)
    del first  # the consumer still holds a slice of the batch
    second = pool.acquire((16, 16), "i4")
    second[...] = 2
    assert not np.shares_memory(second, kept_slice)
    assert (kept_slice == 1).all()


def test_a_batch_exported_to_torch_by_dlpack_is_never_overwritten(pool: PinnedBufferPool) -> None:
    torch = pytest.importorskip("torch")
    batch = pool.acquire((4, 8), "f4")
    batch[...] = 1
    tensor = torch.from_dlpack(batch)
    pool.release(batch)
    del batch
    gc.collect()
    later = pool.acquire((4, 8), "f4")
    later[...] = 2
    assert later.ctypes.data != tensor.data_ptr()
    assert bool((tensor == 1).all())
    del later
    address = tensor.data_ptr()
    del tensor
    assert pool.acquire((4, 8), "f4").ctypes.data == address  # free again once torch let go


def test_release_refuses_foreign_or_twice_released_arrays(pool: PinnedBufferPool) -> None:
    with pytest.raises(ValueError, match="not acquired from this PinnedBufferPool"):
        pool.release(np.zeros(4))
    a = pool.acquire(4, "f8")
    pool.release(a)
    with pytest.raises(ValueError, match="already released"):
        pool.release(a)
    with PinnedBufferPool(lock=False, register_cuda=False) as other:
        b = other.acquire(4, "f8")
        with pytest.raises(ValueError, match="not acquired from this"):
            pool.release(b)


def test_no_leak_over_ten_thousand_cycles(pool: PinnedBufferPool) -> None:
    shape = (16, 1024)  # 64 KiB: a leak would add 640 MB of resident memory
    for i in range(100):  # warm up allocator and interpreter caches
        a = pool.acquire(shape, "f4")
        a[...] = i
        pool.release(a)
        del a
    gc.collect()
    rss = _rss_bytes()
    for i in range(10_000):
        a = pool.acquire(shape, "f4")
        a[...] = i  # touch every page, so a leaked buffer would show in RSS
        pool.release(a)
        del a
    for _ in range(1_000):  # never released: freed when the last view dies
        b = pool.acquire(shape, "u1")
        b[...] = 1
        del b
    gc.collect()
    assert _rss_bytes() - rss < 8 * 2**20
    assert pool.nbytes <= 2 * 64 * 1024


def test_close_frees_idle_buffers_and_is_idempotent() -> None:
    pool = PinnedBufferPool(lock=False, register_cuda=False)
    held = pool.acquire(1 << 20, "u1")
    idle = pool.acquire(1 << 20, "u1")
    pool.release(idle)
    del idle
    assert pool.nbytes == 2 << 20
    pool.close()
    pool.close()
    assert pool.closed and pool.nbytes == 1 << 20  # the held one lives while viewed
    held[...] = 3
    del held
    assert pool.nbytes == 0
    with pytest.raises(ValueError, match="closed"):
        pool.acquire(4, "u1")


def test_rejects_what_cannot_live_in_a_host_buffer(pool: PinnedBufferPool) -> None:
    with pytest.raises(ValueError, match="only fixed-size dtypes"):
        pool.acquire(3, object)
    with pytest.raises(ValueError, match="must be >= 0"):
        pool.acquire((2, -1), "f4")
    with pytest.raises(ValueError, match="power of two"):
        HostBuffer(4096, 3000)


def test_host_buffer_counts_the_views_that_hold_it() -> None:
    buf = HostBuffer(PAGE_SIZE, PAGE_SIZE)
    view = np.frombuffer(memoryview(buf), np.uint8)
    assert buf.exports == 1 and buf.address % PAGE_SIZE == 0
    del view
    assert buf.exports == 0


_HARD_MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
# room to raise the soft limit 1 MiB above what the process already locks
_MEMLOCK_ROOM = _HARD_MEMLOCK == resource.RLIM_INFINITY or _HARD_MEMLOCK >= _locked_now() + (1 << 20)


@pytest.mark.skipif(not _MEMLOCK_ROOM, reason="the hard RLIMIT_MEMLOCK leaves no room to lock a test buffer")
def test_buffers_are_locked_while_the_limit_allows(memlock_limit) -> None:
    memlock_limit(_locked_now() + (1 << 20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with PinnedBufferPool(lock=True, register_cuda=False) as pool:
            a = pool.acquire(256 * 1024, "u1")
            assert pool.locked_bytes == 256 * 1024
            assert _locked_now() >= 256 * 1024
            pool.release(a)
            del a
    gc.collect()


def test_past_the_memlock_limit_one_warning_then_plain_memory(memlock_limit) -> None:
    memlock_limit(_locked_now() + 64 * 1024)
    with PinnedBufferPool(lock=True, register_cuda=False) as pool:
        with pytest.warns(RuntimeWarning, match="RLIMIT_MEMLOCK") as record:
            big = [pool.acquire(1 << 20, "u1") for _ in range(3)]
        assert len(record) == 1
        assert pool.locked_bytes == 0
        for a in big:
            a[...] = 5
            assert a.ctypes.data % PAGE_SIZE == 0


def test_register_cuda_true_needs_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # a GPU machine: registration must work
        with PinnedBufferPool(register_cuda=True) as pool:
            assert torch.from_dlpack(pool.acquire((1024,), "f4")).is_pinned()
        return
    with pytest.raises(ValueError, match="register_cuda=True needs torch built with CUDA"):
        PinnedBufferPool(register_cuda=True)


def test_a_pool_buffer_is_a_batch_buffer_for_gather(pool: PinnedBufferPool) -> None:
    from insitubatch._engine.tiles.kernels import coalesce_runs, gather

    tiles = [np.arange(4 * 6, dtype="f4").reshape(4, 6) + 100 * k for k in range(3)]
    batch = pool.acquire((5, 6), "f4")
    rows = [(2, 1), (0, 3), (1, 0), (2, 2), (0, 0)]  # (tile, row) in batch order
    runs = coalesce_runs([t for t, _ in rows], [r for _, r in rows], range(5))
    gather(batch, tiles, np.zeros((3, 1), np.intp), runs)
    np.testing.assert_array_equal(batch, np.stack([tiles[t][r] for t, r in rows]))
