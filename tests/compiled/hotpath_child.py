"""The tools of tests/compiled: ``Interpreted``, a child process that runs ``hotpath_ops`` on the ``.py`` sources,
and ``require_compiled``. (Not in conftest.py: test files import them, and several test folders have a conftest.)"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import txmq
from txmq import _hotpath

HERE = Path(__file__).resolve().parent
SRC = Path(txmq.__file__).resolve().parent.parent  # the checkout (or site-packages) this test process imports
_LEN = struct.Struct(">I")


class Interpreted:
    """``hotpath_ops`` in a child process with ``TXMQ_PURE_PYTHON=1``: ``call(name, *args)`` answers as
    ``hotpath_ops.run`` does, from the ``.py`` sources."""

    def __init__(self) -> None:
        env = {**os.environ, "TXMQ_PURE_PYTHON": "1", "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "hotpath_ops.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )

    def _ask(self, name: str, args: tuple[Any, ...]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps((name, args))
        self.proc.stdin.write(_LEN.pack(len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(4)
        if len(head) < 4:
            raise RuntimeError(f"the interpreted child exited with {self.proc.wait()}")
        return pickle.loads(self.proc.stdout.read(_LEN.unpack(head)[0]))

    def call(self, name: str, *args: Any) -> Any:
        return self._ask(name, args)

    def build(self) -> dict[str, Any]:
        return self._ask("build", ())  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def require_compiled() -> None:
    """Skips unless this process runs the compiled hot path; with ``TXMQ_REQUIRE_COMPILED=1`` (CI) fails instead,
    unless ``TXMQ_PURE_PYTHON`` asked for the interpreted sources."""
    if _hotpath.STATE.compiled:
        return
    if _hotpath.forced():
        pytest.skip("TXMQ_PURE_PYTHON is set: this process runs the interpreted sources by request")
    why = f"the hot path is {_hotpath.STATE.describe()}"
    if os.environ.get("TXMQ_REQUIRE_COMPILED") == "1":
        pytest.fail(f"TXMQ_REQUIRE_COMPILED=1 but {why}")
    pytest.skip(why)
