"""A Spark standalone cluster and a Spark Connect server on this machine, started from the pyspark installation.

``txmq spark cluster`` runs them for a person; tests/spark uses them as fixtures. The master and workers are
pyspark's own ``spark-class org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker`` on loopback with
ports the JVMs pick (read back from their logs); the Connect server is ``sbin/start-connect-server.sh --wait``. Each
runs in its own process group with a private ``SPARK_CONF_DIR`` and log folder, and without the caller's
``PYTHONPATH``, so an executor imports only what its Python environment and the shipped files hold.

Nothing here imports pyspark's Python API (only its installation folder is looked up).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_CONNECT_STARTED = re.compile(r"Spark Connect server started at: (\S+)")
# Variables that would let a worker's Python see the caller's modules or settings.
_SCRUBBED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "PYTHONSTARTUP")


def spark_home() -> Path:
    """``$SPARK_HOME``, else the folder of the installed pyspark (which holds bin/, sbin/ and jars/)."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    from pyspark.find_spark_home import _find_spark_home  # a small module: no JVM, no pyspark.sql

    return Path(_find_spark_home())


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without PYTHONPATH and PYSPARK_* (see the module doc), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """One Spark JVM (or launcher script) in its own process group, its output in ``log``."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    lines: list[str] = field(default_factory=list)

    def start(self) -> Daemon:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "wb")  # noqa: SIM115 - the pump thread closes it
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

        def pump(proc: subprocess.Popen[bytes]) -> None:
            assert proc.stdout is not None
            with out:
                for raw in proc.stdout:
                    out.write(raw)
                    out.flush()
                    self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

        threading.Thread(target=pump, args=(self.proc,), daemon=True, name=f"spark-{self.name}").start()
        return self

    def wait_for(self, found: Callable[[str], str | None], timeout: float) -> str:
        """The first non-None ``found(line)`` over the output; fails with the output's tail on exit or timeout."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            while seen < len(self.lines):
                hit = found(self.lines[seen])
                seen += 1
                if hit is not None:
                    return hit
            assert self.proc is not None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.proc.poll() is not None else f"not ready after {timeout:.0f}s"
                tail = "\n".join(self.lines[-30:])
                raise RuntimeError(f"spark {self.name} {why} (log {self.log}):\n{tail}")
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            except ProcessLookupError:
                pass
        # Executors and Python workers the JVM started sit in the same group; none may outlive it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _base_env(work_dir: Path, daemon_memory: str, extra: dict[str, str] | None) -> dict[str, str]:
    conf_dir = work_dir / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the user's applies
    conf_dir.mkdir(parents=True, exist_ok=True)
    return clean_env(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work_dir / "logs"),
            "SPARK_PID_DIR": str(work_dir / "pids"),
            "SPARK_DAEMON_MEMORY": daemon_memory,
            **(extra or {}),
        }
    )


@dataclass
class StandaloneCluster:
    """A standalone master and ``workers`` workers (``cores`` cores and ``memory`` for executors each) on loopback."""

    work_dir: Path
    workers: int = 1
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    env: dict[str, str] = field(default_factory=dict)
    master: Daemon | None = None
    worker_daemons: list[Daemon] = field(default_factory=list)
    master_url: str = ""

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = _base_env(self.work_dir, self.daemon_memory, self.env)
        env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
        spark_class = str(spark_home() / "bin" / "spark-class")
        try:
            cmd = [spark_class, MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
            self.master = Daemon("master", cmd, env, self.work_dir / "logs" / "master.out").start()
            self.master_url = self.master.wait_for(lambda line: _first(_MASTER_URL, line), timeout)
            self.master.wait_for(lambda line: "elected leader" if "elected leader" in line else None, timeout)
            for i in range(self.workers):
                work = self.work_dir / f"worker-{i}"
                cmd = [spark_class, WORKER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
                cmd += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work), self.master_url]
                self.worker_daemons.append(
                    Daemon(f"worker-{i}", cmd, env, self.work_dir / "logs" / f"w{i}.out").start()
                )
            for daemon in self.worker_daemons:
                daemon.wait_for(
                    lambda line: "registered" if "Successfully registered with master" in line else None, timeout
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for daemon in self.worker_daemons:
            daemon.stop()
        self.worker_daemons = []
        if self.master is not None:
            self.master.stop()
            self.master = None

    def executor_logs(self) -> list[Path]:
        """The executors' stderr files (``worker-N/<app>/<executor>/stderr``), for a test's failure message."""
        return sorted(self.work_dir.glob("worker-*/*/*/stderr"))


@dataclass
class ConnectServer:
    """A Spark Connect server (``sc://127.0.0.1:port``) whose own Spark runs on ``master``; its Python workers run
    ``python`` (``PYSPARK_PYTHON``)."""

    work_dir: Path
    python: str
    master: str = "local[2]"
    port: int = 0
    conf: dict[str, str] = field(default_factory=dict)
    daemon_memory: str = "1g"
    daemon: Daemon | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ConnectServer:
        if not self.port:
            self.port = free_port()
        env = _base_env(self.work_dir, self.daemon_memory, {"PYSPARK_PYTHON": self.python, "SPARK_NO_DAEMONIZE": "1"})
        cmd = [str(spark_home() / "sbin" / "start-connect-server.sh"), "--wait", "--master", self.master]
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.driver.memory": self.daemon_memory,
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.warehouse.dir": str(self.work_dir / "warehouse"),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={self.work_dir}",
            **self.conf,
        }
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        self.daemon = Daemon("connect", cmd, env, self.work_dir / "logs" / "connect.out").start()
        try:
            self.daemon.wait_for(lambda line: _first(_CONNECT_STARTED, line), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None


def _first(pattern: re.Pattern[str], line: str) -> str | None:
    found = pattern.search(line)
    return found.group(1) if found else None
