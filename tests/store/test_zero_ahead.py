"""Zero-ahead (Preallocate.ZERO): a fallocate'd segment is zero-filled ahead of the writer, never over its bytes.

The point is the writer's fdatasync: writing into fallocate'd (unwritten) blocks makes each fdatasync convert extents
and commit the filesystem's journal. Where the filesystem reports extents (FIEMAP), the tests check that the blocks
the writer reaches were already written; everywhere they check that no zero ever lands on a written byte.
"""

from __future__ import annotations

import fcntl
import os
import random
import struct
import threading
import time
from pathlib import Path

import pytest

from txmq.store import commit_log as commit_log_module
from txmq.store.commit_log import CommitLog
from txmq.store.config import Preallocate

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800


def unwritten_extents(fd: int, start: int, length: int) -> list[tuple[int, int]] | None:
    """(offset, length) of the unwritten extents in ``[start, start + length)``; None without FIEMAP."""
    count = 512
    buf = bytearray(struct.pack("=QQIIII", start, length, FIEMAP_FLAG_SYNC, 0, count, 0) + bytes(56 * count))
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
    except OSError:
        return None
    mapped = struct.unpack_from("=I", buf, 20)[0]
    out = []
    for i in range(mapped):
        logical, _physical, size = struct.unpack_from("=QQQ", buf, 32 + 56 * i)
        flags = struct.unpack_from("=I", buf, 32 + 56 * i + 40)[0]
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            out.append((logical, size))
    return out


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of one page and a short distance, so that the zeroer and the writer meet often."""
    monkeypatch.setattr(commit_log_module, "ZERO_AHEAD_CHUNK", 4096)
    monkeypatch.setattr(commit_log_module, "ZERO_AHEAD_MIN", 16384)
    monkeypatch.setattr(commit_log_module, "ZERO_AHEAD_MAX", 65536)


def test_the_blocks_ahead_of_the_writer_are_written_before_it_gets_there(tmp_path: Path) -> None:
    seg_size = 64 << 20
    log = CommitLog(str(tmp_path), seg_size, Preallocate.ZERO)
    log.load()
    seg = log.segment_for_write(0)  # no prepared file yet: fallocate'd
    before = unwritten_extents(seg.fd, 0, seg_size)
    if not before:
        log.close()
        pytest.skip("this filesystem reports no unwritten extents after fallocate (or has no FIEMAP)")
    data = os.urandom(1000)
    pos = 0
    for _ in range(3000):  # ~3 MB: the distance grows past ZERO_AHEAD_MIN
        log.write(seg, pos, [data])
        pos += len(data)
        assert max(seg.zeroed, seg.zero_target) >= pos  # zeroed, or asked for (a chunk may end past the target)
    assert log.wait_zeroed(30)
    assert seg.high == pos and seg.zeroed >= pos + commit_log_module.ZERO_AHEAD_MIN // 2
    after = unwritten_extents(seg.fd, 0, seg_size)
    assert after is not None
    assert all(start >= seg.zeroed for start, _ in after), (after, seg.zeroed)
    assert log.zero_ahead_chunks >= 1
    assert os.pread(seg.fd, pos, 0) == data * 3000
    assert os.pread(seg.fd, seg.zeroed - pos, pos) == bytes(seg.zeroed - pos)
    log.close()


def test_zeros_never_land_on_written_bytes(tmp_path: Path, small_steps: None) -> None:
    seg_size = 4 << 20
    log = CommitLog(str(tmp_path), seg_size, Preallocate.ZERO)
    log.load()
    seg = log.segment_for_write(0)
    rng = random.Random(7)
    expected = bytearray()
    while len(expected) < seg_size - 70_000:
        group = [rng.randbytes(rng.randint(1, 9000)) for _ in range(rng.randint(1, 4))]
        log.write(seg, len(expected), group)
        expected += b"".join(group)
        time.sleep(0)  # let the zeroer in between writes
    assert log.wait_zeroed(30)
    assert log.zero_ahead_chunks >= 1  # the zeroer ran alongside the writer (how often depends on the scheduler)
    assert os.pread(seg.fd, len(expected), 0) == bytes(expected)
    assert os.pread(seg.fd, seg.zeroed - len(expected), len(expected)) == bytes(seg.zeroed - len(expected))
    log.close()


def test_only_zero_mode_zero_fills_ahead_and_a_prepared_segment_needs_none(tmp_path: Path) -> None:
    for mode in (Preallocate.FALLOCATE, Preallocate.NONE):
        log = CommitLog(str(tmp_path / mode.value), 1 << 20, mode)
        log.load()
        seg = log.segment_for_write(0)
        log.write(seg, 0, [b"x" * 5000])
        assert log.wait_zeroed() and seg.zeroed == 0 and log.zero_ahead_chunks == 0
        log.close()
    log = CommitLog(str(tmp_path / "zero"), 1 << 20, Preallocate.ZERO)
    log.load()
    seg = log.segment_for_write(0)
    log.maybe_prepare(1 << 19)
    assert log.wait_prepared()
    second = log.segment_for_write(1 << 20)  # renamed from the zero-filled file
    assert second.zeroed == second.size
    log.write(second, 0, [b"y" * 5000])
    assert log.wait_zeroed() and log.zero_ahead_chunks == 0
    log.close()


def test_close_stops_the_zeroer_and_a_reopened_segment_is_zero_filled_from_its_end(
    tmp_path: Path, small_steps: None
) -> None:
    log = CommitLog(str(tmp_path), 8 << 20, Preallocate.ZERO)
    log.load()
    seg = log.segment_for_write(0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def closer() -> None:
        stop.wait()
        try:
            log.close()
        except BaseException as exc:  # pragma: no cover - the failure this test looks for
            errors.append(exc)

    thread = threading.Thread(target=closer)
    thread.start()
    log.write(seg, 0, [b"a" * 100_000])  # asks for 64 KiB of zeros past it
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and not errors and log.wait_zeroed(0)
    assert seg.closed
    with open(tmp_path / "00000000000000000000", "rb") as fh:
        assert fh.read(100_000) == b"a" * 100_000
    reopened = CommitLog(str(tmp_path), 8 << 20, Preallocate.ZERO)
    reopened.load()
    last = reopened.segments[-1]
    assert last.zeroed == 0 and last.high == 0  # unknown after a restart: the first write claims its end
    reopened.write(last, 100_000, [b"b" * 10])
    assert reopened.wait_zeroed(10)
    assert last.high == 100_010 and last.zeroed >= 100_010
    assert os.pread(last.fd, 100_010, 0) == b"a" * 100_000 + b"b" * 10
    reopened.close()


def test_a_zeroer_that_fails_gives_up_on_that_segment_and_writes_go_on(
    tmp_path: Path, small_steps: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def full(fd: int, pos: int, count: int) -> None:
        calls.append(pos)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(commit_log_module, "_pwrite_zeros", full)
    log = CommitLog(str(tmp_path), 1 << 20, Preallocate.ZERO)
    log.load()
    seg = log.segment_for_write(0)
    for i in range(50):
        log.write(seg, i * 1000, [bytes([i]) * 1000])
        assert log.wait_zeroed(10)
    assert len(calls) == 1 and log.zero_ahead_chunks == 0  # tried once, not once per write
    assert [r.getMessage() for r in caplog.records if "zero-ahead" in r.getMessage()] == [
        "commit log: zero-ahead in Segment(00000000000000000000) stopped: [Errno 28] No space left on device"
    ]
    assert os.pread(seg.fd, 50_000, 0) == b"".join(bytes([i]) * 1000 for i in range(50))
    log.close()
