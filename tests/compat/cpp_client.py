"""Pytest-side helper for the official C++ client: runs tests/compat/cpp_driver.py in its own venv.

`run_cpp(args)` runs the driver to completion and returns its JSON events; `start_cpp(args)` starts it in the
background (a push consumer, say) and reads its events as they come. See docs/cpp-client.md.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cpp_driver.py")
SETUP_SCRIPT = REPO_ROOT / ".ci" / "setup-cpp-client.sh"
# TXMQ_CPP_VENV points the tests at another venv; the setup script creates it if needed.
VENV = Path(os.environ.get("TXMQ_CPP_VENV", REPO_ROOT / ".venv-cpp"))
SETUP_TIMEOUT = 600
EX_TEMPFAIL = 75  # the setup script's "could not download" exit code

EXIT_OK = 0
EXIT_CLIENT_ERROR = 1
EXIT_USAGE = 2
EXIT_DEADLINE = 3
EXIT_INCOMPLETE = 4

Event = dict[str, Any]


class CppClientError(AssertionError):
    """The driver exited unexpectedly; the message carries its events, stderr and the C++ log's tail."""

    def __init__(self, message: str, events: list[Event], returncode: int | None) -> None:
        super().__init__(message)
        self.events = events
        self.returncode = returncode


_setup_lock = threading.Lock()


@functools.cache
def _prepare_venv() -> tuple[Path | None, int | None, str]:
    """Run the setup script once per process: (python, 0, "") or (None, exit code, what went wrong)."""
    try:
        proc = subprocess.run(
            [str(SETUP_SCRIPT), str(VENV)],
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, None, f"{SETUP_SCRIPT.name} did not finish within {SETUP_TIMEOUT}s"
    if proc.returncode == 0:
        return VENV / "bin" / "python", 0, ""
    output = (proc.stdout + proc.stderr).strip()[-3000:]
    return None, proc.returncode, f"{SETUP_SCRIPT.name} {VENV} exited with {proc.returncode}:\n{output}"


def cpp_python() -> Path:
    """The .venv-cpp interpreter, set up on first use.

    Skips the test only when the package could not be downloaded outside CI; in CI (CI set) every failure fails.
    """
    with _setup_lock:
        python, returncode, problem = _prepare_venv()
    if python is not None:
        return python
    if returncode == EX_TEMPFAIL and not os.environ.get("CI"):
        pytest.skip(f"C++ client unavailable: could not download rocketmq from PyPI (no network?): {VENV}")
    pytest.fail(f"cannot prepare the C++ client venv: {problem}", pytrace=False)


@functools.cache
def _session_home() -> Path:
    # librocketmq writes $HOME/logs/rocketmq-cpp/<pid>_rocketmq-cpp.log.0; keep those out of the real home.
    home = Path(tempfile.mkdtemp(prefix="txmq-cpp-home-"))
    if not os.environ.get("TXMQ_KEEP_CPP_LOGS"):
        atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def _command(args: Sequence[str]) -> list[str]:
    return [str(cpp_python()), str(DRIVER), *map(str, args)]


def _environment(home: Path | None, env: dict[str, str] | None) -> dict[str, str]:
    result = dict(os.environ)
    result.update(env or {})
    result["HOME"] = str(home or _session_home())
    result["PYTHONUNBUFFERED"] = "1"
    return result


def _with_deadline(args: Sequence[str], timeout: float | None) -> list[str]:
    """Give the driver a watchdog that fires before our own timeout, so failures come back as JSON."""
    args = [str(a) for a in args]
    if timeout is None or "--deadline" in args or not args or args[0] == "info":
        return args
    return [*args, "--deadline", f"{max(1.0, timeout - min(5.0, timeout * 0.2)):g}"]


def parse_events(stdout: str) -> list[Event]:
    events = []
    for line in stdout.splitlines():
        if line.strip():
            events.append(_parse_line(line))
    return events


def _parse_line(line: str) -> Event:
    try:
        event = json.loads(line)
    except ValueError:
        return {"event": "stdout", "line": line}
    return event if isinstance(event, dict) else {"event": "stdout", "line": line}


def _log_tail(events: list[Event], lines: int = 30) -> str:
    for event in events:
        log = event.get("log")
        if log and Path(log).exists():
            tail = Path(log).read_text(errors="replace").splitlines()[-lines:]
            return f"\n--- tail of {log}:\n" + "\n".join(tail)
    return ""


def _describe_failure(what: str, events: list[Event], stderr: str) -> str:
    shown = "\n".join(json.dumps(e) for e in events[-20:])
    return f"{what}\n--- last events:\n{shown}\n--- stderr:\n{stderr.strip()[-2000:]}{_log_tail(events)}"


def run_cpp(
    args: Sequence[str],
    timeout: float = 60.0,
    *,
    check: bool = True,
    expect_returncode: int | None = None,
    home: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[Event]:
    """Run the driver to completion and return its events (one dict per JSON line).

    With check (the default) a non-zero exit raises CppClientError; pass expect_returncode to require another one
    (EXIT_INCOMPLETE, say). Unless args carry --deadline, the driver's watchdog is set just below timeout.
    """
    command = _command(_with_deadline(args, timeout))
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_environment(home, env),
            start_new_session=True,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the driver already
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        events = parse_events(stdout)
        raise CppClientError(
            _describe_failure(f"cpp_driver {' '.join(map(str, args))} still running after {timeout}s", events, stderr),
            events,
            None,
        ) from None
    events = parse_events(proc.stdout)
    wanted = EXIT_OK if expect_returncode is None else expect_returncode
    if (check or expect_returncode is not None) and proc.returncode != wanted:
        raise CppClientError(
            _describe_failure(
                f"cpp_driver {' '.join(map(str, args))} exited with {proc.returncode}, expected {wanted}",
                events,
                proc.stderr,
            ),
            events,
            proc.returncode,
        )
    return events


class CppProcess:
    """A driver running in the background. Events are read on a thread as they are printed."""

    def __init__(self, args: Sequence[str], *, home: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.args = [str(a) for a in args]
        # A file, not a pipe: nobody reads stderr while the driver runs, and a full pipe would block it.
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="txmq-cpp-stderr-")  # noqa: SIM115 (closed in close())
        self._events: list[Event] = []
        self._changed = threading.Condition()
        self._eof = False
        self.proc = subprocess.Popen(
            _command(self.args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            env=_environment(home, env),
            start_new_session=True,
        )
        _live.add(self)
        self._reader = threading.Thread(target=self._read, name=f"cpp-driver-{self.proc.pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                event = _parse_line(line)
                with self._changed:
                    self._events.append(event)
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    @property
    def events(self) -> list[Event]:
        with self._changed:
            return list(self._events)

    def received(self) -> list[Event]:
        return [e for e in self.events if e.get("event") == "received"]

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def wait_for(self, match: str | Callable[[Event], bool], timeout: float = 30.0, count: int = 1) -> list[Event]:
        """Wait until `count` events match (an event name or a predicate); return the matches.

        Raises CppClientError if the driver exits or the time runs out first.
        """
        predicate = (lambda e: e.get("event") == match) if isinstance(match, str) else match
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [e for e in self._events if predicate(e)]
                if len(found) >= count:
                    return found
                remaining = end - time.monotonic()
                if self._eof or remaining <= 0:
                    break
                self._changed.wait(remaining)
        why = "the driver exited" if self._eof else f"nothing matched within {timeout}s"
        raise CppClientError(
            _describe_failure(
                f"waiting for {count} x {match!r}: {why} ({len(found)} found)", self.events, self.stderr()
            ),
            self.events,
            self.returncode,
        )

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the driver to exit by itself (after --expect or --timeout); kill it if it does not."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise CppClientError(
                _describe_failure(f"cpp_driver did not exit within {timeout}s", self.events, self.stderr()),
                self.events,
                None,
            ) from None
        self._reader.join(5)
        _live.discard(self)
        return code

    def stop(self, timeout: float = 20.0) -> list[Event]:
        """Ask the driver to stop (SIGTERM: it shuts the client down and prints its summary); kill it if needed."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(5)
        _live.discard(self)
        return self.events

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the driver leads its own session
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        _live.discard(self)

    def close(self) -> None:
        self.stop(timeout=10.0)
        self._stderr.close()

    def __enter__(self) -> CppProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_live: set[CppProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        process.kill()


def start_cpp(args: Sequence[str], *, home: Path | None = None, env: dict[str, str] | None = None) -> CppProcess:
    """Start the driver in the background. Stop it with .stop() or use it as a context manager; whatever is
    still running is killed when the test session ends (and the driver exits by itself if pytest dies)."""
    return CppProcess(args, home=home, env=env)


@contextmanager
def cpp_processes() -> Iterator[Callable[..., CppProcess]]:
    """Yield a start_cpp that stops every process it started on exit. As a fixture:

    @pytest.fixture
    def cpp():
        with cpp_processes() as start:
            yield start
    """
    started: list[CppProcess] = []

    def start(args: Sequence[str], **kwargs: Any) -> CppProcess:
        process = start_cpp(args, **kwargs)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.close()
