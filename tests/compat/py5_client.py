"""Pytest-side helper for the official RocketMQ 5.x Python client: runs tests/compat/py5_driver.py in its own venv
(``.ci/setup-py5-client.sh``, default ``.venv-py5``; ``TXMQ_PY5_VENV`` points elsewhere) and returns its events."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from .cpp_client import parse_events

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("py5_driver.py")
SETUP_SCRIPT = REPO_ROOT / ".ci" / "setup-py5-client.sh"
VENV = Path(os.environ.get("TXMQ_PY5_VENV", REPO_ROOT / ".venv-py5"))
EX_TEMPFAIL = 75

Event = dict[str, Any]


@functools.cache
def _prepare() -> tuple[Path | None, int, str]:
    proc = subprocess.run([str(SETUP_SCRIPT), str(VENV)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 0:
        return VENV / "bin" / "python", 0, ""
    return None, proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def py5_python() -> Path:
    """The 5.x client's interpreter; skips only when PyPI cannot be reached outside CI."""
    python, code, problem = _prepare()
    if python is not None:
        return python
    if code == EX_TEMPFAIL and not os.environ.get("CI"):
        pytest.skip(f"rocketmq-python-client unavailable (no network?): {problem}")
    pytest.fail(f"cannot prepare the 5.x Python client venv: {problem}", pytrace=False)


@functools.cache
def _home() -> str:
    # The client logs to $HOME/logs/rocketmq_python; keep that out of the real home.
    return tempfile.mkdtemp(prefix="txmq-py5-home-")


def run_py5(args: Sequence[str], timeout: float = 60.0, *, returncode: int = 0) -> list[Event]:
    """Run one scenario to completion; another exit code than ``returncode`` or a timeout fails the test with what
    it printed."""
    env = dict(os.environ, HOME=_home(), PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the client's venv must not see txmq's sources
    try:
        proc = subprocess.run(
            [str(py5_python()), str(DRIVER), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise AssertionError(f"py5_driver {' '.join(map(str, args))} still running after {timeout}s:\n{out}") from None
    events = parse_events(proc.stdout)
    if proc.returncode != returncode:
        raise AssertionError(
            f"py5_driver {' '.join(map(str, args))} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}"
        )
    return events


def of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.get("event") == kind]
