"""Small helpers shared across packages: atomic file writes."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from txmq.errors import is_disk_full

log = logging.getLogger("txmq")

V = TypeVar("V")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content, never a mix."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_json(path: str | os.PathLike[str], value: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS), durable=durable)


def write_json_unless_full(path: str | os.PathLike[str], value: Any, *, what: str) -> bool:
    """Write ``value`` as :func:`atomic_write_json` does and return True; when the disk is full, log a warning and
    return False instead of raising, for a caller that keeps the change in memory and writes it again later."""
    try:
        atomic_write_json(path, value)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        log.warning("%s not saved, the disk is full (%s); kept in memory, saved again once there is room", what, exc)
        return False
    return True


class TableFile:
    """The JSON file a broker table (topics, subscription groups) is written to whole at each change. A write that a
    full disk refuses may be deferred: the table keeps the change in memory, and :attr:`unsaved` tells its owner to
    write again later (the next change does too)."""

    def __init__(self, path: Path | None, what: str) -> None:
        self.path = path
        self.what = what
        self.unsaved = False

    def write(self, value: Callable[[], Any], *, defer_when_full: bool = False) -> None:
        """Write ``value()`` (nothing without a path). ``defer_when_full``: a full disk logs a warning and sets
        :attr:`unsaved` instead of raising."""
        if self.path is None:
            return
        if defer_when_full:
            self.unsaved = not write_json_unless_full(self.path, value(), what=f"{self.what} {self.path}")
        else:
            atomic_write_json(self.path, value())
            self.unsaved = False


def change_or_restore(table: dict[str, V], key: str, value: V | None, write: Callable[[], None]) -> V | None:
    """Set ``table[key]`` to ``value`` (remove it when None) and call ``write``; when ``write`` raises, put back what
    was there and raise. Returns what was there; removing a missing key writes nothing."""
    old = table.get(key)
    if value is None:
        if old is None:
            return None
        del table[key]
    else:
        table[key] = value
    try:
        write()
    except BaseException:
        if old is None:
            del table[key]
        else:
            table[key] = old
        raise
    return old
