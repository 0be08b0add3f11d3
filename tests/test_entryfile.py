"""Writing one disk-cache entry (xetfs/storage/entryfile.py): whole or not at all, and past the page cache.

Each test writes entries of known bytes and reads them back.  Which bytes
went with ``O_DIRECT`` is seen by a spy on ``os.writev`` that looks at the
descriptor's flags.  Refusals, full disks and slow disks are simulated at
the system-call boundary; the rest runs on the test's own file system,
whose support of ``O_DIRECT`` is probed first.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from xetfs.base.settings import (
    DIRECT_IO_ALIGN,
    DIRECT_IO_MIN_RATE,
    DIRECT_IO_RETRY,
    DIRECT_IO_WINDOW,
    MAX_RUN_BYTES,
    MiB,
)
from xetfs.storage import entryfile
from xetfs.storage.entryfile import write_entry

pytestmark = pytest.mark.unit


def _parts(total: int, cuts: int, seed: int) -> tuple[bytes, list[bytes]]:
    """``total`` random bytes, and the same cut into ``cuts + 1`` parts at random places."""
    rng = random.Random(seed)
    data = rng.randbytes(total)
    at = sorted(rng.sample(range(1, total), min(cuts, total - 1))) if total > 1 else []
    return data, [data[a:b] for a, b in zip([0, *at], [*at, total], strict=True)]


def _takes_o_direct(directory: Path) -> bool:
    fd = os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        os.write(fd, memoryview(mmap.mmap(-1, 4096)))
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(directory / "probe")
    return True


@pytest.fixture
def direct_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A fresh ``O_DIRECT`` state for the test; the sizes of the writes made with ``O_DIRECT`` (a spy)."""
    monkeypatch.setattr(entryfile, "_direct", entryfile._Direct())
    sizes: list[int] = []
    real_writev = os.writev

    def writev(fd: int, buffers: list[memoryview]) -> int:
        n = real_writev(fd, buffers)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            sizes.append(n)
        return n

    monkeypatch.setattr(os, "writev", writev)
    return sizes


@pytest.fixture
def o_direct(tmp_path: Path) -> Path:
    """A directory whose file system takes ``O_DIRECT``."""
    if not _takes_o_direct(tmp_path):
        pytest.skip(f"the file system of {tmp_path} does not take O_DIRECT")
    return tmp_path


def _written(tmp: Path, name: str, parts: list[bytes], *, direct: bool = True) -> bytes:
    """Write an entry, check that its size came back and no temporary file is left: its bytes."""
    size = write_entry(str(tmp / "chunks" / name), parts, tmp, direct=direct)
    assert size == sum(map(len, parts)), size
    assert sorted(p.name for p in tmp.iterdir()) == ["chunks"]
    return (tmp / "chunks" / name).read_bytes()


@pytest.mark.parametrize(("total", "cuts"), [(0, 0), (1, 0), (4095, 3), (4096, 1), (4097, 5), (3 * 65536 + 17, 9),
                                             (5 * MiB, 2), (40_000, 1500)])  # fmt: skip
def test_a_worker_s_entry_goes_whole_its_blocks_with_o_direct(
    o_direct: Path, direct_writes: list[int], total: int, cuts: int
) -> None:
    data, parts = _parts(total, cuts, total)
    assert _written(o_direct, "e", parts) == data
    assert sum(direct_writes) == total // 4096 * 4096 and entryfile._direct.on


def test_the_daemon_s_entries_and_entries_over_a_run_are_ordinary_writes(
    o_direct: Path, direct_writes: list[int]
) -> None:
    data, parts = _parts(70_000, 4, 1)
    assert _written(o_direct, "daemon", parts, direct=False) == data
    big, big_parts = _parts(MAX_RUN_BYTES + 4096, 3, 2)
    assert _written(o_direct, "big", big_parts) == big
    assert direct_writes == [] and entryfile._direct.on


def test_a_write_while_the_buffer_is_in_use_goes_as_usual(o_direct: Path, direct_writes: list[int]) -> None:
    data, parts = _parts(70_000, 4, 3)
    with entryfile._direct._lock:  # (another thread's write)
        assert _written(o_direct, "e", parts) == data
    assert direct_writes == []
    assert _written(o_direct, "f", parts) == data and direct_writes == [70_000 // 4096 * 4096]


def test_a_file_system_without_o_direct_is_asked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_writes: list[int]
) -> None:
    asked = []
    real_fcntl = fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            asked.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    data, parts = _parts(70_000, 4, 4)
    assert _written(tmp_path, "e", parts) == data and _written(tmp_path, "f", parts) == data
    assert len(asked) == 1 and entryfile._direct.refused and direct_writes == []


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.EOPNOTSUPP, errno.EIO])
def test_a_direct_write_refused_midway_is_written_again_as_usual(
    o_direct: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    monkeypatch.setattr(entryfile, "_direct", entryfile._Direct())
    real_writev = os.writev

    def writev(fd: int, buffers: list[memoryview]) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            real_writev(fd, [buffers[0][:4096]])  # (a block went: it must not stay)
            raise OSError(refusal, os.strerror(refusal))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    data, parts = _parts(3 * 4096 + 5, 2, 5)
    assert _written(o_direct, "e", parts) == data and entryfile._direct.refused
    assert _written(o_direct, "f", parts) == data


@pytest.mark.parametrize("direct", [True, False])
def test_a_full_disk_fails_the_entry_and_leaves_nothing(
    o_direct: Path, monkeypatch: pytest.MonkeyPatch, direct_writes: list[int], direct: bool
) -> None:
    def full(fd: int, buffers: list[memoryview]) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    got = write_entry(str(o_direct / "c" / "e"), [b"x" * 9000], o_direct, direct=direct)
    assert isinstance(got, OSError) and got.errno == errno.ENOSPC
    assert [p.name for p in o_direct.iterdir()] == ["c"] and not (o_direct / "c" / "e").exists()
    assert entryfile._direct.on  # (a full disk says nothing of O_DIRECT)


def _clocked(monkeypatch: pytest.MonkeyPatch, seconds: list[float]) -> None:
    """Each direct write "takes" the next of ``seconds``; windows of 4 MiB, and 3 MiB as usual when slow."""
    ticks = iter([t for took in seconds for t in (0.0, took)])
    monkeypatch.setattr(entryfile, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    monkeypatch.setattr(entryfile, "DIRECT_IO_WINDOW", 4 * MiB)
    monkeypatch.setattr(entryfile, "DIRECT_IO_RETRY", 3 * MiB)


def test_a_disk_slower_than_the_network_gets_ordinary_writes_for_a_while(
    o_direct: Path, monkeypatch: pytest.MonkeyPatch, direct_writes: list[int]
) -> None:
    _clocked(monkeypatch, [0.1] * 4 + [0.001] * 5)  # 1 MiB in 0.1 s: 10 MiB/s, a window of 4 writes
    data, parts = _parts(MiB, 1, 6)
    for k in range(4):
        assert _written(o_direct, f"slow{k}", parts) == data
    assert len(direct_writes) == 4 and not entryfile._direct.on
    for k in range(3):  # as usual, until 3 MiB went so
        assert _written(o_direct, f"usual{k}", parts) == data
    assert len(direct_writes) == 4 and not entryfile._direct.on
    for k in range(5):  # then tried again, and judged again: fast
        assert _written(o_direct, f"again{k}", parts) == data
    assert len(direct_writes) == 9 and entryfile._direct.on


def test_one_slow_write_in_a_fast_window_keeps_o_direct(
    o_direct: Path, monkeypatch: pytest.MonkeyPatch, direct_writes: list[int]
) -> None:
    _clocked(monkeypatch, [0.001, 0.02, 0.001, 0.001] * 2)  # (a write that waited for the interpreter)
    data, parts = _parts(MiB, 1, 7)
    for k in range(8):
        assert _written(o_direct, f"e{k}", parts) == data
    assert len(direct_writes) == 8 and entryfile._direct.on


def test_the_disk_cache_page_states_these_settings() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "remote.md").read_text().split())
    for said in (f"each {DIRECT_IO_WINDOW // MiB} MiB of them, ran slower than {DIRECT_IO_MIN_RATE // MiB} MiB/s",
                 f"the next {DIRECT_IO_RETRY // 2**30} GiB", f"one {MAX_RUN_BYTES // MiB} MiB buffer",
                 f"{DIRECT_IO_ALIGN // 1024} KiB blocks"):  # fmt: skip
        assert said in text, said
