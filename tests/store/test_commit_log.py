"""Commit-log segment files on their own: naming, preallocation, reads, verification scans, truncation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from helpers_store import make_record

from txmq.errors import CorruptStoreError
from txmq.protocol.record import decode_record, encode_blank, encode_record, stamp_record
from txmq.store.commit_log import CommitLog, ScanResult, segment_name
from txmq.store.config import Preallocate

SEG = 8192


def append(log: CommitLog, pos: int, body: bytes, topic: str = "T") -> tuple[int, int]:
    """Write one record at ``pos`` the way the append pipeline does (blank + next segment when it does not fit)."""
    buf = encode_record(make_record(topic, 0, body))
    seg = log.segment_for_write(pos)
    if pos + len(buf) + 8 > seg.end:
        log.write(seg, pos - seg.start, [encode_blank(seg.end - pos)])
        pos = seg.end
        seg = log.segment_for_write(pos)
    stamp_record(buf, 0, 0, pos, 1)
    log.write(seg, pos - seg.start, [buf])
    return pos, len(buf)


def fill(log: CommitLog, count: int, size: int = 700) -> list[tuple[int, int]]:
    out = []
    pos = 0
    for i in range(count):
        phys, n = append(log, pos, bytes([i % 251]) * size)
        out.append((phys, n))
        pos = phys + n
    return out


def scan_all(log: CommitLog, start: int = 0) -> tuple[list[int], ScanResult]:
    res = ScanResult(start)
    seen = [fields[0] for fields in log.scan(start, result=res)]
    return seen, res


@pytest.mark.parametrize("mode", list(Preallocate))
def test_segments_are_named_by_start_offset_and_preallocated(tmp_path: Path, mode: Preallocate) -> None:
    log = CommitLog(str(tmp_path), SEG, mode)
    log.load()
    recs = fill(log, 30)
    names = sorted(os.listdir(tmp_path))
    assert names == [segment_name(i * SEG) for i in range(len(names))] and len(names) >= 3
    assert names[1] == "00000000000000008192"
    assert all(os.path.getsize(tmp_path / n) == SEG for n in names)
    for phys, size in recs:
        assert decode_record(log.read(phys, size)).physical_offset == phys
    log.close()


def test_reads_and_merged_neighbours(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 30)
    assert log.read_size(recs[3][0]) == recs[3][1]
    assert log.read_record(recs[3][0]).body == bytes([3]) * 700
    assert log.read_record(recs[3][0] + 1) is None
    assert log.read(10 * SEG, 10) is None  # no such segment
    assert log.read(SEG - 4, 8) is None  # would cross a segment end
    merged = log.read_many(recs[:12])
    # Records in one segment come back as one slice; each segment boundary starts a new one.
    assert len(merged) == len({p // SEG for p, _ in recs[:12]})
    assert b"".join(merged) == b"".join(log.read(p, n) for p, n in recs[:12])
    log.close()


def test_scan_yields_every_record_across_blanks_and_stops_at_zeros(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 30)
    seen, res = scan_all(log)
    assert seen == [p for p, _ in recs]
    assert res.clean_end and res.reason == "end of data" and res.end == recs[-1][0] + recs[-1][1]
    assert res.records == 30 and res.bytes == sum(n for _, n in recs)
    seen_from_middle, _ = scan_all(log, recs[17][0])
    assert seen_from_middle == [p for p, _ in recs[17:]]
    log.close()


def _corrupt(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("magic", "garbage header"),
        ("crc", "body CRC mismatch"),
        ("body", "body CRC mismatch"),
        ("size_big", "impossible record size"),
        ("size_small", "impossible record size"),
        ("phys", "PHYSICALOFFSET"),
        ("topic_len", "topic length"),
        ("body_len", "does not fit"),
        ("props_len", "do not add up"),
    ],
)
def test_scan_stops_at_the_first_damaged_record(tmp_path: Path, what: str, reason: str) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 8)
    phys, size = recs[5]
    path = tmp_path / segment_name(0)
    body_len_pos = phys + 84
    patch = {
        "magic": (phys + 4, b"\x00\x00\x00\x01"),
        "crc": (phys + 8, b"\x00\x00\x00\x01"),
        "body": (body_len_pos + 4 + 100, b"\xff"),
        "size_big": (phys, struct.pack(">i", SEG)),
        "size_small": (phys, struct.pack(">i", 12)),
        "phys": (phys + 28, struct.pack(">q", phys + 1)),
        "topic_len": (body_len_pos + 4 + 700, b"\x00"),
        "body_len": (body_len_pos, struct.pack(">i", 100_000)),
        "props_len": (phys + size - 2, b"\x00\x07"),
    }[what]
    _corrupt(path, *patch)
    seen, res = scan_all(log)
    assert seen == [p for p, _ in recs[:5]]
    assert res.end == phys and not res.clean_end and reason in res.reason
    log.close()


def test_scan_rejects_a_blank_with_the_wrong_size(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 20)
    last_in_first = max(p + n for p, n in recs if p < SEG)
    _corrupt(tmp_path / segment_name(0), last_in_first, struct.pack(">i", 9))
    seen, res = scan_all(log)
    assert seen[-1] < SEG and res.end == last_in_first and "blank" in res.reason
    log.close()


def test_truncate_zeroes_the_tail_and_deletes_later_segments(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 30)
    cut = recs[4][0]
    segments_before = sorted(os.listdir(tmp_path))
    first, zeroed, deleted = log.truncate(cut)
    blank_end = max(p + n for p, n in recs if p < SEG) + 8  # the last non-zero byte is the blank's header
    assert first == cut and zeroed == blank_end - cut
    assert [os.path.basename(d) for d in deleted] == segments_before[1:]
    assert sorted(os.listdir(tmp_path)) == [segment_name(0)]
    assert (tmp_path / segment_name(0)).read_bytes()[cut:] == bytes(SEG - cut)
    seen, res = scan_all(log)
    assert seen == [p for p, _ in recs[:4]] and res.clean_end
    assert log.truncate(cut) == (cut, 0, [])  # nothing left to cut
    log.close()


def test_load_extends_a_short_last_segment(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 20)
    log.close()
    last = sorted(os.listdir(tmp_path))[-1]
    os.truncate(tmp_path / last, 100)
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    assert os.path.getsize(tmp_path / last) == SEG
    seen, res = scan_all(log)
    assert seen == [p for p, _ in recs if p < int(last)] and res.end == int(last) and not res.clean_end
    log.close()


def test_load_refuses_files_it_cannot_trust(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    fill(log, 40)
    log.close()
    names = sorted(os.listdir(tmp_path))
    assert len(names) >= 4

    os.truncate(tmp_path / names[1], 100)
    with pytest.raises(CorruptStoreError, match="not the last segment"):
        CommitLog(str(tmp_path), SEG).load()
    os.truncate(tmp_path / names[1], SEG)

    os.rename(tmp_path / names[2], tmp_path / "moved")
    with pytest.raises(CorruptStoreError, match="not contiguous"):
        CommitLog(str(tmp_path), SEG).load()
    os.rename(tmp_path / "moved", tmp_path / names[2])

    with pytest.raises(CorruptStoreError, match="segment size"):
        CommitLog(str(tmp_path), SEG * 2).load()
    with pytest.raises(CorruptStoreError, match="segment size"):
        CommitLog(str(tmp_path), SEG // 2).load()

    (tmp_path / "123").write_bytes(b"")
    with pytest.raises(CorruptStoreError, match="20 digits"):
        CommitLog(str(tmp_path), SEG).load()
    os.unlink(tmp_path / "123")
    (tmp_path / "notes.txt").write_bytes(b"")
    log = CommitLog(str(tmp_path), SEG)
    log.load()  # unrelated files are ignored
    assert len(log.segments) == len(names)
    log.close()


def test_delete_segment_never_takes_the_active_one(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    recs = fill(log, 30)
    first, last = log.segments[0], log.segments[-1]
    with pytest.raises(ValueError, match="active"):
        log.delete_segment(last)
    log.delete_segment(first)
    assert log.min_offset == SEG and not os.path.exists(first.path)
    assert log.read(recs[0][0], recs[0][1]) is None
    assert log.first_store_timestamp(log.segments[0]) == 1
    log.close()


def test_zero_mode_prepares_the_next_segment_in_the_background(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG, Preallocate.ZERO)
    log.load()
    first = log.segment_for_write(0)
    log.maybe_prepare(100)  # less than half full: nothing yet
    assert log.wait_prepared() and os.listdir(tmp_path) == [segment_name(0)]
    log.maybe_prepare(SEG // 2)
    assert log.wait_prepared()
    assert sorted(os.listdir(tmp_path)) == [segment_name(0), segment_name(SEG) + ".alloc"]
    prepared = tmp_path / (segment_name(SEG) + ".alloc")
    assert prepared.read_bytes() == bytes(SEG)
    inode = prepared.stat().st_ino
    second = log.segment_for_write(SEG)  # the roll takes the prepared file instead of allocating
    assert second is not first and os.stat(second.path).st_ino == inode
    assert sorted(os.listdir(tmp_path)) == [segment_name(0), segment_name(SEG)]
    log.maybe_prepare(SEG + SEG // 2)
    assert log.wait_prepared()
    log.close()  # an unused prepared file is removed on close
    assert sorted(os.listdir(tmp_path)) == [segment_name(0), segment_name(SEG)]


def test_load_removes_an_unfinished_preparation(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SEG, Preallocate.ZERO)
    log.load()
    fill(log, 5)
    log.close()
    (tmp_path / (segment_name(SEG) + ".alloc")).write_bytes(bytes(100))  # a crash while zero-filling
    log = CommitLog(str(tmp_path), SEG, Preallocate.ZERO)
    log.load()
    assert os.listdir(tmp_path) == [segment_name(0)]
    log.close()


def _syscalls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the commit log's pwritev calls (with their flags) and fdatasyncs, still doing them."""
    calls: list[str] = []
    pwritev, fdatasync = os.pwritev, os.fdatasync

    def recording_pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        calls.append(f"pwritev flags={flags}")
        return pwritev(fd, buffers, offset, flags)

    def recording_fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        fdatasync(fd)

    monkeypatch.setattr(os, "pwritev", recording_pwritev)
    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    return calls


@pytest.mark.skipif(not getattr(os, "RWF_DSYNC", 0), reason="no pwritev2 RWF_DSYNC on this platform")
def test_a_durable_write_is_one_pwritev_with_rwf_dsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    seg = log.segment_for_write(0)
    calls = _syscalls(monkeypatch)
    log.write(seg, 0, [b"a" * 100, b"b" * 50], durable=True)
    log.write(seg, 150, [b"c" * 10])
    assert calls == [f"pwritev flags={os.RWF_DSYNC}", "pwritev flags=0"]
    assert log.read(0, 160) == b"a" * 100 + b"b" * 50 + b"c" * 10
    log.close()


def test_a_durable_write_falls_back_to_fdatasync_when_the_kernel_refuses_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    seg = log.segment_for_write(0)
    log._dsync = 0x7FFF0000  # a flag the kernel does not know: EINVAL or EOPNOTSUPP
    calls = _syscalls(monkeypatch)
    log.write(seg, 0, [b"x" * 64], durable=True)
    assert calls == ["pwritev flags=2147418112", "pwritev flags=0", "fdatasync"]
    calls.clear()
    log.write(seg, 64, [b"y" * 64], durable=True)  # remembered: no second try of the flag
    assert calls == ["pwritev flags=0", "fdatasync"] and log._dsync == 0
    assert log.read(0, 128) == b"x" * 64 + b"y" * 64
    log.close()


def test_a_short_durable_write_is_finished_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = CommitLog(str(tmp_path), SEG)
    log.load()
    seg = log.segment_for_write(0)
    calls = _syscalls(monkeypatch)
    pwritev = os.pwritev

    def short(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        return pwritev(fd, [bytes(buffers[0][:10])], offset, flags)  # only 10 bytes went through

    monkeypatch.setattr(os, "pwritev", short)
    log.write(seg, 0, [b"z" * 300, b"w" * 20], durable=True)
    assert calls[-1] == "fdatasync"
    assert log.read(0, 320) == b"z" * 300 + b"w" * 20
    log.close()
