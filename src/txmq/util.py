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


class TableFile:
    """The JSON file a broker table (topics, subscription groups) is written to whole at each change. A write that a
    full disk refuses may be deferred: the table keeps the change in memory, and :attr:`unsaved` tells its owner to
    write again later (the next change does too)."""

    def __init__(self, path: Path | None, what: str) -> None:
        self.path = path
        self.what = what
        self.unsaved = False

    def write(self, value: Callable[[], Any], *, defer_when_full: bool = False) -> None:
        """Write ``value()`` (nothing without a path). ``defer_when_full``: a full disk sets :attr:`unsaved` and logs
        a warning (the first time) instead of raising."""
        if self.path is None:
            return
        try:
            atomic_write_json(self.path, value())
        except OSError as exc:
            if not (defer_when_full and is_disk_full(exc)):
                raise
            if not self.unsaved:  # once, not at every retry while the disk stays full
                log.warning(
                    "%s %s not saved, the disk is full (%s); kept in memory, saved again once there is room",
                    self.what,
                    self.path,
                    exc,
                )
            self.unsaved = True
            return
        if self.unsaved:
            log.info("%s %s saved", self.what, self.path)
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
