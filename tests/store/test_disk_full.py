"""A full disk (a real size-limited tmpfs; mounting needs root): an append is refused with a clear error and the
store stays open, nothing acknowledged is lost or unreadable, appends resume once space is freed without reopening,
and a store reopened on a full disk opens (its key index catches up later). Found by the fault campaign
(``txmq chaos``, issue 18): the commit log used to fall back to a sparse file, fail in the middle of a write and
refuse every append until restart, and a full disk under the key index failed the store and then its start."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_store import make_record, small_config

from txmq.store.message_store import MessageStore
from txmq.store.writer import PutStatus


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


CQ = 20 * 50_000  # one consume-queue file holds every entry of these tests


def fill(ballast: Path, leave: int) -> None:
    free = shutil.disk_usage(ballast.parent).free
    with open(ballast, "ab") as f:
        f.write(b"\0" * max(0, free - leave))


def put_until_refused(store: MessageStore, start: int) -> tuple[list[tuple[int, int, bytes]], object]:
    acked: list[tuple[int, int, bytes]] = []
    for n in range(start, start + 100_000):
        body = b"%08d" % n + b"x" * 2000
        result = store.put_sync(make_record(body=body, keys=f"k{n}"))
        if result.status is not PutStatus.PUT_OK:
            return acked, result
        acked.append((result.physical_offset, result.size, body))
    raise AssertionError("the disk never filled")


def test_a_full_disk_refuses_appends_clearly_keeps_reads_and_resumes_without_reopening(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    fill(ballast, leave=1 << 20)
    store = MessageStore(
        small_config(small_disk / "store", mapped_file_size_commit_log=128 * 1024, mapped_file_size_consume_queue=CQ)
    ).open()
    try:
        acked, refused = put_until_refused(store, 0)
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE  # type: ignore[attr-defined]
        assert "the disk is full" in (refused.remark or "")  # type: ignore[attr-defined]
        for phys, size, body in acked:
            data = store.read_record(phys, size)
            assert data is not None and body in data
        # (A second refusal is not asserted: the background preparation of the next segment may give up and free
        # the space its partial file held, and then a later segment fits.)
        ballast.unlink()
        resumed = store.put_sync(make_record(body=b"resumed", keys="after"))
        assert resumed.status is PutStatus.PUT_OK
        assert store.query_by_key("T", "after", 10, 0, 2**62) == [resumed.physical_offset]
        assert store.query_by_key("T", f"k{len(acked) - 1}", 10, 0, 2**62) == [acked[-1][0]]
    finally:
        store.shutdown()
