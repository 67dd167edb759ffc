"""A replica's epoch file (``<storePathRootDir>/epochFile``, as RocketMQ 5's controller mode keeps one): one line
per epoch its commit log holds bytes of, ``epoch startOffset``, oldest first. Rewritten atomically."""

from __future__ import annotations

import os
from pathlib import Path

from txmq.errors import CorruptStoreError
from txmq.ha.election import EpochEntry


def epoch_file_path(store_root: str) -> Path:
    return Path(store_root) / "epochFile"


def read_epochs(store_root: str) -> list[EpochEntry]:
    path = epoch_file_path(store_root)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    entries: list[EpochEntry] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            epoch, start = (int(x) for x in line.split())
        except ValueError:
            raise CorruptStoreError(f"{path}:{n}: {line!r} is not 'epoch startOffset'") from None
        if entries and epoch <= entries[-1].epoch:
            raise CorruptStoreError(f"{path}:{n}: epoch {epoch} does not follow epoch {entries[-1].epoch}")
        entries.append(EpochEntry(epoch, start))
    return entries


def write_epochs(store_root: str, entries: list[EpochEntry]) -> None:
    path = epoch_file_path(store_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write("".join(f"{e.epoch} {e.start_offset}\n" for e in entries))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
