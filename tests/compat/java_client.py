"""Pytest-side runner for the official Java client scenarios in tests/compat/java (see its pom.xml).

`run_java(line, scenario, ...)` runs one scenario JVM to the end and returns its JSON events; `JavaProcess` starts one
in the background (a consumer, a producer to be killed) and collects its events as they come. `line` is "v4"
(rocketmq-client 4.9.8) or "v5" (5.5.0, the same remoting client's current release).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

JAVA_DIR = Path(__file__).resolve().parent / "java"
LINES = ("v4", "v5")
Event = dict[str, Any]
# Small, quick-starting JVMs: two cores run a broker and several clients at once.
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms32m", "-Xmx256m", "-Xshare:auto"]


def _fresh() -> bool:
    """Both lines built, and not older than any source (a stale build would lack new scenarios)."""
    newest_source = max(p.stat().st_mtime for p in (JAVA_DIR / "src").rglob("*.java"))
    mains = [JAVA_DIR / "target" / line / "classes" / "txmq" / "compat" / "Main.class" for line in LINES]
    return all(m.exists() and m.stat().st_mtime >= newest_source for m in mains)


@functools.cache
def _built() -> None:
    """Build both lines once per test run if build.sh has not (CI runs it before pytest). A failure fails. One
    builder at a time: two pytest-xdist workers copying the same jars into target/ broke Maven's copy."""
    import fcntl

    if _fresh():
        return
    (JAVA_DIR / "target").mkdir(exist_ok=True)
    with open(JAVA_DIR / "target" / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _fresh():  # the other worker built it while this one waited
            return
        proc = subprocess.run(["bash", str(JAVA_DIR / "build.sh")], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/compat/java/build.sh failed:\n{(proc.stdout + proc.stderr)[-4000:]}")


_log_root = tempfile.mkdtemp(prefix="txmq-java-logs-")


def java_command(line: str, scenario: str, args: Sequence[str]) -> list[str]:
    _built()
    out = JAVA_DIR / "target" / line
    classpath = f"{out / 'classes'}{os.pathsep}{out / 'lib'}/*"
    return [
        "java",
        *JVM_FLAGS,
        f"-Drocketmq.client.logRoot={_log_root}",
        # 5.x logs to ~/logs/rocketmqlogs whatever logRoot says, and broadcasting offsets go to ~/.rocketmq_offsets.
        f"-Duser.home={_log_root}",
        "-Drocketmq.client.logLevel=WARN",
        "-cp",
        classpath,
        "txmq.compat.Main",
        scenario,
        *args,
    ]


class JavaProcess:
    """A scenario JVM in the background; its stdout JSON lines become ``events``."""

    def __init__(self, line: str, scenario: str, args: Sequence[str]) -> None:
        self.command = java_command(line, scenario, args)
        self.events: list[Event] = []
        self.other: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            text = raw.strip()
            if not text:
                continue
            try:
                event = json.loads(text)
            except ValueError:
                self.other.append(text)
                continue
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.other.append(raw.rstrip())

    def named(self, name: str) -> list[Event]:
        with self._changed:
            return [e for e in self.events if e["event"] == name]

    def wait_for(self, predicate: Callable[[list[Event]], bool], timeout: float, what: str = "") -> list[Event]:
        """Wait until ``predicate(events)`` holds; fails with the output so far when it never does."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.events):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    if predicate(self.events):
                        break
                    raise AssertionError(f"Java scenario never showed {what or predicate}:\n{self.describe()}")
                self._changed.wait(min(remaining, 0.2))
            return list(self.events)

    def wait_event(self, name: str, timeout: float = 60.0) -> Event:
        events = self.wait_for(lambda evs: any(e["event"] == name for e in evs), timeout, f"a {name!r} event")
        return next(e for e in events if e["event"] == name)

    def finish(self, timeout: float = 120.0) -> list[Event]:
        """Wait for the JVM to exit by itself; it must exit 0."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"Java scenario did not finish in {timeout}s:\n{self.describe()}") from None
        for t in self._threads:
            t.join(10)
        if code != 0:
            raise AssertionError(f"Java scenario exited {code}:\n{self.describe()}")
        return list(self.events)

    def kill(self) -> None:
        """SIGKILL, no shutdown hooks: the JVM vanishes as a crashed application would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def describe(self) -> str:
        events = "\n".join(json.dumps(e)[:400] for e in self.events[-30:])
        other = "\n".join(self.other[-40:])
        return f"$ {' '.join(self.command[-12:])}\nevents:\n{events}\nother output:\n{other}"


def run_java(line: str, scenario: str, *args: str, timeout: float = 120.0) -> list[Event]:
    return JavaProcess(line, scenario, args).finish(timeout)


def named(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e["event"] == name]
