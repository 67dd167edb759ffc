"""A small disk that fills up: a size-limited tmpfs (mounting needs root) and a ballast file that takes its room."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def tmpfs_unavailable() -> str | None:
    """None when this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a size-limited tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not found"
    return None


def mount_tmpfs(where: Path, size_mb: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], check=True)


def umount(where: Path) -> None:
    """Unmount ``where``, waiting a little for files still open (a broker just killed), then lazily."""
    for _ in range(20):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted at ``where`` for the block; see :func:`tmpfs_unavailable` first."""
    mount_tmpfs(where, size_mb)
    try:
        yield where
    finally:
        umount(where)


def fill(ballast: Path, leave: int) -> None:
    """Write (or grow) a ballast file so that about ``leave`` bytes stay free on its file system."""
    free = shutil.disk_usage(ballast.parent).free
    size = max(0, free - leave)
    chunk = b"\0" * (1 << 20)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while size > 0:
            n = min(size, len(chunk))
            try:
                size -= os.write(fd, chunk[:n])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:  # someone took the last bytes meanwhile: full is what was wanted
                    raise
                break
    finally:
        os.close(fd)
