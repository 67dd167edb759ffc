"""``record_starts`` (the ranges' first records, found on the Spark driver) and ``decode_properties`` against
simple reference versions: the former chains by TOTALSIZE through a buffer of more than one of its 16 MiB pieces,
given as bytes, bytearray or an mmap; the latter splits and partitions the way RocketMQ's string2messageProperties
does."""

from __future__ import annotations

import mmap
import random
import struct
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from txmq.protocol.record import decode_properties, record_starts
from txmq.protocol.record.layout import MAGIC_CODE, MIN_RECORD_SIZE

HEAD = struct.Struct(">iI")


def chain(sizes: list[int]) -> bytearray:
    """Records that are only a TOTALSIZE and the magic code, then filler (all record_starts reads)."""
    out = bytearray()
    for size in sizes:
        out += HEAD.pack(size, MAGIC_CODE) + bytes(size - 8)
    return out


def reference(starts: list[int], end: int, points: list[int]) -> list[int]:
    """The first start at or past each point, or -1 past the last record (``end`` where the chain breaks)."""
    out = []
    for point in points:
        found = next((s for s in starts if s >= point), None)
        out.append(found if found is not None and found < end else -1)
    return out


def test_record_starts_over_more_than_one_piece() -> None:
    rng = random.Random(7)
    sizes = [rng.randint(MIN_RECORD_SIZE, 9000) for _ in range(8000)]  # about 36 MiB: three pieces
    buf = chain(sizes)
    starts, pos = [], 0
    for size in sizes:
        starts.append(pos)
        pos += size
    total = pos
    buf += bytes(4096)  # zeros after the last record: the chain ends there
    points = [*sorted(rng.sample(range(total + 2000), 300)), total + 3000]
    expected = reference([*starts, total], total + 1, points)  # the zeros' start is reached, nothing past it
    assert record_starts(bytes(buf), points) == expected
    assert record_starts(buf, points) == expected
    with tempfile.TemporaryFile() as f:
        f.write(buf)
        f.flush()
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert record_starts(mm, points) == expected
            assert record_starts(mm, points[100:], start=starts[50]) == expected[100:]


def test_record_starts_stops_at_garbage_and_at_the_end() -> None:
    buf = chain([200, 300]) + HEAD.pack(5, MAGIC_CODE) + chain([400])  # a size below the minimum
    assert record_starts(bytes(buf), [0, 1, 201, 450, 501, 600]) == [0, 200, 500, 500, -1, -1]
    buf = chain([200]) + HEAD.pack(300, 0x12345678) + bytes(292)  # another magic
    assert record_starts(bytes(buf), [150, 201]) == [200, -1]
    assert record_starts(bytes(chain([200])) + bytes(5), [201]) == [-1]  # fewer than 8 bytes left
    assert record_starts(b"", [0, 5]) == [0, -1]


def split_partition(text: str) -> dict[str, str]:
    result = {}
    for item in text.split("\x02"):
        key, sep, value = item.partition("\x01")
        if len(item) >= 3 and sep and key and value:
            result[key] = value
    return result


@given(st.text(alphabet="ab\x01\x02é", max_size=40))
def test_decode_properties_reads_items_as_split_and_partition_do(text: str) -> None:
    assert decode_properties(text) == split_partition(text)
