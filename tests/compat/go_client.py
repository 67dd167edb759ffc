"""Pytest-side helper for the official Go client: builds tests/compat/go (build.sh) and runs its one program.

`run_go(args, timeout)` runs `txmqgo` to completion and returns a `GoRun` (its JSON events, exit code, stderr);
`start_go(args, timeout)` starts it in the background and collects events as they come. Every process has a
deadline and is killed when a test ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

GO_DIR = Path(__file__).resolve().with_name("go")
BUILD_SCRIPT = GO_DIR / "build.sh"
BINARY = GO_DIR / "bin" / "txmqgo"
BUILD_TIMEOUT = 900

Event = dict[str, Any]


def _sources() -> list[Path]:
    return [GO_DIR / "go.mod", GO_DIR / "go.sum", BUILD_SCRIPT, *GO_DIR.joinpath("cmd").rglob("*.go")]


def ensure_binary() -> Path:
    """Build with build.sh when the binary is missing or older than its sources; any build failure fails."""
    if BINARY.exists() and BINARY.stat().st_mtime >= max(p.stat().st_mtime for p in _sources()):
        return BINARY
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{BUILD_SCRIPT} did not finish within {BUILD_TIMEOUT}s", pytrace=False)
    if proc.returncode != 0 or not BINARY.exists():
        output = (proc.stdout + proc.stderr).strip()[-3000:]
        pytest.fail(f"{BUILD_SCRIPT} exited with {proc.returncode}:\n{output}", pytrace=False)
    return BINARY


def parse_events(stdout: str) -> list[Event]:
    events = []
    for line in stdout.splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise AssertionError(f"txmqgo printed a line that is not JSON: {line!r}") from exc
    return events


@dataclass
class GoRun:
    """One txmqgo process: its events so far, and once it ended, its exit code and stderr."""

    args: list[str]
    events: list[Event] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    proc: subprocess.Popen[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _threads: list[threading.Thread] = field(default_factory=list)

    def of(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.get("event") == kind]

    def describe(self) -> str:
        with self._lock:
            tail = self.events[-8:]
        return (
            f"txmqgo {' '.join(self.args[:1])} exit={self.returncode} events[-8:]={tail}\n"
            f"stderr tail:\n{self.stderr[-2000:]}"
        )

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float, count: int = 1) -> list[Event]:
        """Block until ``count`` events match (or fail the test with what was seen)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                with self._lock:
                    matched = [e for e in self.events if predicate(e)]
                if len(matched) >= count:
                    return matched
                if self.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"waited {timeout}s for {count} matching events, saw {len(matched)}: {self.describe()}"
                    )
                self._changed.wait(0.2)

    def wait(self, timeout: float) -> int:
        """Wait for the exit; on timeout kill it and fail."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"txmqgo did not exit within {timeout}s: {self.describe()}") from None
        for thread in self._threads:
            thread.join(10)
        self.returncode = self.proc.returncode
        return self.returncode

    def terminate(self, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _spawn(args: Sequence[str], home: Path) -> GoRun:
    run = GoRun([str(a) for a in args])
    env = dict(os.environ, HOME=str(home), ROCKETMQ_GO_LOG_LEVEL="warn")
    run.proc = subprocess.Popen(
        [str(ensure_binary()), *run.args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )

    def read_stdout() -> None:
        assert run.proc is not None and run.proc.stdout is not None
        for line in run.proc.stdout:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "not_json", "line": line.rstrip("\n")}
            with run._lock:
                run.events.append(event)
            with run._changed:
                run._changed.notify_all()

    def read_stderr() -> None:
        assert run.proc is not None and run.proc.stderr is not None
        for line in run.proc.stderr:
            run.stderr += line

    run._threads = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=read_stderr, daemon=True),
    ]
    for thread in run._threads:
        thread.start()
    return run


@contextmanager
def go_processes() -> Iterator[Callable[[Sequence[str]], GoRun]]:
    """A factory of background txmqgo processes; all still running are killed when the block ends."""
    started: list[GoRun] = []
    with tempfile.TemporaryDirectory(prefix="txmq-go-home-") as home:

        def start(args: Sequence[str]) -> GoRun:
            run = _spawn(args, Path(home))
            started.append(run)
            return run

        try:
            yield start
        finally:
            for run in started:
                run.kill()


def run_go(args: Sequence[str], timeout: float) -> GoRun:
    """Run txmqgo to completion (killed and failed after ``timeout`` seconds)."""
    with go_processes() as start:
        run = start(args)
        run.wait(timeout)
    assert not run.of("not_json"), run.describe()
    return run
