"""Damaged commit-log files: a record whose body bits were flipped, bytes in the middle that are no record, a segment
cut short. Nothing damaged is served, every other record is, the damage is reported with its offsets, and
``txmq admin store verify`` lists it."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_store import SEGMENT, crash_image, make_record, segment_names

from txmq.cli import main as cli_main
from txmq.errors import CorruptStoreError
from txmq.protocol.record import body_len_pos, decode_records
from txmq.protocol.record.layout import QUEUE_OFFSET_POS
from txmq.store.message_store import MessageStore, PutResult
from txmq.store.verify import verify_directory

MakeStore = Callable[..., MessageStore]
BODY = 900  # about 70 records per 64 KiB segment


def fill(store: MessageStore, count: int, start: int = 0) -> list[PutResult]:
    out = []
    for i in range(start, start + count):
        body = f"m{i:05d}|".encode() + bytes((i + j) % 251 for j in range(BODY))
        out.append(store.put_sync(make_record("T", 0, body, keys=f"k{i}")))
    return out


def flip_body(root: Path, result: PutResult) -> int:
    """Flip two bits in the body of the record ``result`` names; returns the offset of the flipped byte."""
    phys = result.physical_offset
    at = phys + body_len_pos(0) + 4 + 100  # IPv4 hosts (make_record): the body starts after BODYLEN
    path = root / "commitlog" / f"{phys - phys % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(at % SEGMENT)
        byte = f.read(1)[0]
        f.seek(at % SEGMENT)
        f.write(bytes([byte ^ 0x21]))
    return at


def smash_frame(root: Path, result: PutResult) -> None:
    """Overwrite the first 40 bytes of a record (TOTALSIZE, magic, offsets): it is no record any more."""
    phys = result.physical_offset
    path = root / "commitlog" / f"{phys - phys % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(phys % SEGMENT)
        f.write(b"\xee" * 40)


def pull_all(store: MessageStore) -> tuple[list[bytes], int]:
    """Every body a consumer of T:0 gets from offset 0, and the offset it ends at."""
    bodies: list[bytes] = []
    offset = 0
    while offset < store.max_offset("T", 0):
        got = store.get_messages("T", 0, offset, 7, None, None, None)
        bodies += [r.body for r in decode_records(got.body)] if got.buffers else []
        assert got.next_begin_offset > offset, got
        offset = got.next_begin_offset
    return bodies, offset


def sent_bodies(acked: list[PutResult], store: MessageStore) -> list[bytes]:
    return [store.read_message(r.physical_offset, r.size).body for r in acked]  # type: ignore[union-attr]


def test_flipped_body_after_a_clean_stop_is_never_served(
    make_store: MakeStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    acked = fill(store, 200)
    bodies = sent_bodies(acked, store)
    store.shutdown()
    root = tmp_path / "store"
    victim = acked[40]  # in the first segment: a clean start does not scan it
    assert victim.physical_offset < SEGMENT
    flip_body(root, victim)
    caplog.set_level(logging.ERROR, logger="txmq.store")
    # Without the scrub, only the reads can notice: each checks the record it serves.
    store = make_store(root=root, scrub_commit_log_on_start=False)
    assert store.recovery is not None and store.recovery.mode == "clean"
    got, end = pull_all(store)
    assert end == 200
    assert got == bodies[:40] + bodies[41:]  # the damaged one skipped, every later one served
    assert store.read_record(victim.physical_offset, victim.size) is None
    assert store.read_message(victim.physical_offset) is None
    assert store.query_by_key("T", "k40", 10) == []
    assert store.query_by_key("T", "k41", 10) == [acked[41].physical_offset]
    assert store.get_messages("T", 0, 40, 1, None, None, None).buffers == []  # moves past it: next offset 41
    assert store.get_messages("T", 0, 40, 1, None, None, None).next_begin_offset == 41
    first_segment = str(root / "commitlog" / segment_names(root)[0])
    lines = [r.getMessage() for r in caplog.records if str(victim.physical_offset) in r.getMessage()]
    assert len(lines) == 1 and "not served" in lines[0] and first_segment in lines[0]  # logged once
    assert store.stats()["damaged_reads_skipped"] >= 5
    assert store.damage.ranges == []
    store.shutdown()

    # The background scrub reports it at start with its offsets and file, and records it.
    caplog.clear()
    store = make_store(root=root)
    assert store.scrubber is not None and store.scrubber.join(30)
    lines = [r.getMessage() for r in caplog.records if str(victim.physical_offset) in r.getMessage()]
    assert any("damaged" in m and first_segment in m for m in lines)
    assert [(d.start, d.end, d.kind) for d in store.damage.ranges] == [
        (victim.physical_offset, victim.physical_offset + victim.size, "record")
    ]
    assert store.stats()["damaged_ranges"] == 1
    on_disk = [json.loads(line) for line in (root / "damaged").read_text().splitlines()]
    assert on_disk[0]["start"] == victim.physical_offset and on_disk[0]["file"] == first_segment
    store.shutdown()

    # Known at the next start without a scrub; still never served.
    store = make_store(root=root, scrub_commit_log_on_start=False)
    assert [d.start for d in store.damage.ranges] == [victim.physical_offset]
    assert pull_all(store)[0] == bodies[:40] + bodies[41:]


def test_damage_while_open_is_not_served(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store(scrub_commit_log_on_start=False)
    acked = fill(store, 100)
    bodies = sent_bodies(acked, store)
    for i in (3, 4, 50, 99):  # neighbours read in one slice, and the last record
        flip_body(tmp_path / "store", acked[i])
    got, end = pull_all(store)
    assert end == 100
    assert got == [b for i, b in enumerate(bodies) if i not in (3, 4, 50, 99)]
    assert store.stats()["damaged_reads_skipped"] == 4


def test_flipped_body_after_a_crash_keeps_the_later_records(
    make_store: MakeStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    acked = fill(store, 200)
    bodies = sent_bodies(acked, store)
    image = crash_image(store, tmp_path / "image")  # abort marker present: crash recovery verifies the log
    victim = acked[190]  # in the last segment, inside the range recovery scans
    flip_body(image, victim)
    caplog.set_level(logging.ERROR, logger="txmq.store")
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info is not None and info.mode == "crash"
    assert info.truncated_at == -1 and info.log_end == store.max_physical_offset()
    assert [(d.start, d.kind) for d in info.damaged] == [(victim.physical_offset, "record")]
    assert any(str(victim.physical_offset) in r.getMessage() for r in caplog.records)
    got, end = pull_all(recovered)
    assert end == 200 and got == bodies[:190] + bodies[191:]
    # The log goes on after the damage: new sends get the next queue offsets.
    assert recovered.put_sync(make_record("T", 0, b"after")).queue_offset == 200


def test_bytes_that_are_no_record_in_the_middle_are_skipped_after_a_crash(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    acked = fill(store, 200)
    bodies = sent_bodies(acked, store)
    image = crash_image(store, tmp_path / "image")
    victim = acked[185]
    smash_frame(image, victim)
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info is not None and info.truncated_at == -1
    # The damaged range runs from the smashed record to the next sound one.
    assert [(d.start, d.end, d.kind) for d in info.damaged] == [
        (victim.physical_offset, acked[186].physical_offset, "range")
    ]
    got, end = pull_all(recovered)
    assert end == 200 and got == bodies[:185] + bodies[186:]
    assert recovered.read_record(victim.physical_offset, victim.size) is None


def test_a_flipped_queue_offset_after_a_crash_keeps_the_later_records(
    make_store: MakeStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """QUEUEOFFSET lies outside the body's CRC: a record whose frame is sound but whose queue offset disagrees with
    its queue is damaged. Recovery records it, keeps its offset in the queue (reads skip it) and the records after
    it, instead of cutting the log there."""
    store = make_store()
    acked = fill(store, 200)
    bodies = sent_bodies(acked, store)
    image = crash_image(store, tmp_path / "image")
    victim = acked[187]
    phys = victim.physical_offset
    path = image / "commitlog" / f"{phys - phys % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(phys % SEGMENT + QUEUE_OFFSET_POS + 7)  # the low byte of the big-endian QUEUEOFFSET
        low = f.read(1)[0]
        f.seek(phys % SEGMENT + QUEUE_OFFSET_POS + 7)
        f.write(bytes([low ^ 0x40]))
    caplog.set_level(logging.ERROR, logger="txmq.store")
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info is not None and info.mode == "crash"
    assert info.truncated_at == -1 and info.log_end == store.max_physical_offset()
    assert [(d.start, d.end, d.kind) for d in info.damaged] == [(phys, phys + victim.size, "record")]
    assert "queue offset" in info.damaged[0].reason
    got, end = pull_all(recovered)
    assert end == 200 and got == bodies[:187] + bodies[188:]
    assert recovered.put_sync(make_record("T", 0, b"after")).queue_offset == 200


def test_a_torn_tail_is_still_cut(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 100)
    image = crash_image(store, tmp_path / "image")
    smash_frame(image, acked[-1])  # nothing sound after it
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info is not None and info.damaged == [] and info.truncated_at == acked[-1].physical_offset
    assert recovered.max_offset("T", 0) == 99


def test_a_segment_cut_short_in_the_middle_refuses_to_start_naming_the_offsets(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    fill(store, 200)
    store.shutdown()
    root = tmp_path / "store"
    names = segment_names(root)
    assert len(names) >= 3
    victim = root / "commitlog" / names[1]
    os.truncate(victim, 1000)
    start = int(names[1])
    with pytest.raises(CorruptStoreError) as err:
        MessageStore(store.config).open()
    assert str(victim) in str(err.value) and f"[{start + 1000}, {start + SEGMENT})" in str(err.value)
    report = verify_directory(str(root / "commitlog"))
    assert (start + 1000, start + SEGMENT, "missing") in [(d.start, d.end, d.kind) for d in report.damage]


def test_verify_command_lists_damage_with_offsets(
    make_store: MakeStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store()
    acked = fill(store, 200)
    store.shutdown()
    root = tmp_path / "store"
    clean = tmp_path / "clean"
    shutil.copytree(root, clean)
    assert cli_main(["admin", "store", "verify", "--data", str(clean)]) == 0
    out = capsys.readouterr().out
    assert "200 sound records" in out and "no damage found" in out

    flip_body(root, acked[10])
    smash_frame(root, acked[120])
    assert cli_main(["admin", "store", "verify", "--data", str(root)]) == 1
    out = capsys.readouterr().out
    first = root / "commitlog" / f"{acked[10].physical_offset - acked[10].physical_offset % SEGMENT:020d}"
    assert f"DAMAGED [{acked[10].physical_offset}, {acked[11].physical_offset}) in {first}" in out
    assert f"DAMAGED [{acked[120].physical_offset}, {acked[121].physical_offset})" in out
    assert "198 sound records" in out and "2 damaged ranges" in out
    assert cli_main(["admin", "store", "verify", "--data", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [d["kind"] for d in report["damaged"]] == ["record", "range"]


def test_reads_unchecked_when_turned_off_still_skip_recorded_damage(make_store: MakeStore, tmp_path: Path) -> None:
    """checkCRCOnRead=false trades the per-read check for speed; damage on record (recovery, scrub) stays unserved."""
    store = make_store(scrub_commit_log_on_start=False, check_crc_on_read=False)
    acked = fill(store, 60)
    bodies = sent_bodies(acked, store)
    flip_body(tmp_path / "store", acked[7])
    served = store.get_messages("T", 0, 0, 32, None, None, None)
    assert served.message_count == 32  # the damaged one too: nothing checked it
    assert decode_records(served.body, check_crc=False)[7].body != bodies[7]
    store.shutdown()
    store = make_store(root=tmp_path / "store", check_crc_on_read=False)  # the scrub records it
    assert store.scrubber is not None and store.scrubber.join(30)
    assert pull_all(store)[0] == bodies[:7] + bodies[8:]


def test_record_damage_sees_every_byte_of_the_frame_and_body() -> None:
    from txmq.protocol.record import encode_record, record_damage, stamp_record

    data = encode_record(make_record("T", 0, b"0123456789" * 10, tags="x"))
    stamp_record(data, 0, 5, 4096, 1)
    rec = bytes(data)
    assert record_damage(rec, 0, len(rec), 4096) is None
    body_at = body_len_pos(0) + 4
    # TOTALSIZE, magic, BODYCRC, PHYSICALOFFSET, BODYLEN and the body: any flipped bit there is seen.
    covered = [*range(0, 12), *range(28, 36), *range(body_len_pos(0), body_at + 100)]
    for at in covered:
        for bit in (0, 7):
            bad = bytearray(rec)
            bad[at] ^= 1 << bit
            assert record_damage(bytes(bad), 0, len(rec), 4096) is not None, (at, bit)
    assert record_damage(rec, 0, len(rec), 4097) is not None  # not where its queue entry says


def test_the_scrub_walk_in_chunks_finds_what_one_walk_finds(make_store: MakeStore, tmp_path: Path) -> None:
    from txmq.store.verify import VerifyReport, verify_buffer

    store = make_store()
    acked = fill(store, 60)
    store.shutdown()
    root = tmp_path / "store"
    flip_body(root, acked[5])
    smash_frame(root, acked[30])
    data = (root / "commitlog" / segment_names(root)[0]).read_bytes()
    whole, chunked = VerifyReport("w"), VerifyReport("c")
    verify_buffer(data, 0, "seg", 0, len(data), True, whole)
    pauses: list[int] = []
    verify_buffer(data, 0, "seg", 0, len(data), True, chunked, chunk=4096, pause=lambda: bool(pauses.append(1)))
    assert len(pauses) > 5
    assert [(d.start, d.end, d.kind) for d in chunked.damage] == [(d.start, d.end, d.kind) for d in whole.damage]
    assert [d.start for d in whole.damage] == [acked[5].physical_offset, acked[30].physical_offset]
    assert (chunked.records, chunked.bytes, chunked.end) == (whole.records, whole.bytes, whole.end)
