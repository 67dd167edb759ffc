"""Small helpers shared across packages: atomic file writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson


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
