"""The key index's per-record work: the entries of a group's records, and their writing into a segment's arrays.

Compiled (setup.py ``HOT_MODULES``): it runs for every record a broker stores, on a thread that competes for the GIL
with the event loop and the store's writer. :mod:`txmq.store.key_index` keeps the files, the locking and the
queries, and calls these two functions.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from txmq.store.dispatch import DispatchRequest

Entry = tuple[int, int, int]  # key hash, commit-log offset, store time (ms)


def key_hash(name: str) -> int:
    """64-bit hash of ``topic#key``: crc32 of its UTF-8 bytes in the high half (it also picks the slot), adler32 in
    the low half, so distinct keys meet only on a 64-bit collision."""
    raw = name.encode()
    return (zlib.crc32(raw) << 32) | zlib.adler32(raw)


def key_entries(dispatches: Iterable[DispatchRequest], progress: int, entries: list[Entry]) -> int:
    """Append an entry to ``entries`` for each distinct ``topic#key`` of each record that ends past ``progress``
    (its KEYS tokens and its UNIQ_KEY, hashed by :func:`key_hash`); returns the new progress, the end of the last
    record seen."""
    for d in dispatches:
        end = d.physical_offset + d.size
        if end <= progress:
            continue  # recovery replay of a record already below the durable point
        progress = end
        uniq = d.uniq_key
        keys = d.keys
        if not (uniq or keys) or not d.indexed:
            continue
        prefix = d.topic + "#"
        phys = d.physical_offset
        ts = d.store_timestamp
        if keys:
            names = {prefix + k for k in keys.split(" ") if k}
            if uniq:
                names.add(prefix + uniq)
            for name in names:
                entries.append((key_hash(name), phys, ts))
        elif uniq:
            entries.append((key_hash(prefix + uniq), phys, ts))
    return progress


def write_entries(
    arrays: tuple[memoryview, memoryview, memoryview, memoryview, memoryview],
    slot_count: int,
    entries: list[Entry],
    start: int,
    stop: int,
    count: int,
    low: int,
    high: int,
) -> tuple[int, int, int]:
    """Write ``entries[start:stop]`` as entry numbers ``count + 1`` on into a segment's ``arrays`` (slots, hashes,
    commit-log offsets, store times, previous entry in the slot), each one complete before its slot points at it,
    so that a concurrent query never reads half of one. Returns the new count and store-time range."""
    slots, hashes, phys_at, times, prev = arrays
    i = count
    for k in range(start, stop):
        h, phys, ts = entries[k]
        i += 1
        hashes[i] = h
        phys_at[i] = phys
        times[i] = ts
        slot = (h >> 32) % slot_count
        prev[i] = slots[slot]
        slots[slot] = i
        if ts > high:
            high = ts
        elif ts < low:
            low = ts
    return i, low, high
