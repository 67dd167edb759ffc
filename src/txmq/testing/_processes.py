"""Real txmq processes on free loopback ports: ``txmq dev`` (a name server and a broker) and extra brokers, for
integration tests and the fault campaign (``txmq chaos``). ``kill()`` is SIGKILL, ``start()`` restarts on the same
data and ports."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_LINE = "txmq dev is running"
_RANDOM = random.Random()  # its own: a test that seeds the random module must not make ports repeat
_GIVEN: set[int] = set()  # the ports free_port() handed out in this process


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``), 32768 when it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_share() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker, from the variables it sets (the processes a test starts inherit
    them); (0, 1) outside one."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(name[2:]) if name.startswith("gw") else 0
    except ValueError:
        return 0, 1
    return (index % count, count) if count > 1 else (0, 1)


def free_port() -> int:
    """A port that is free now, and whose neighbour (the broker's HA port) is free too.

    Chosen below the kernel's ephemeral range: a port the kernel hands out for ``bind(0)`` can be taken, between
    this check and the broker's bind, as the local port of some client's outgoing connection (a Java client's, a
    second broker's registration), which made a broker fail to start with "address already in use".

    A free port is only free until someone binds it, so two test processes that run at once must not choose from
    the same ports: each pytest-xdist worker has its own share of the even pairs (port, port + 1), and a process
    never hands out a pair twice (a killed broker's ports stay its own for its restart). Two workers once picked
    the same port, and a client talked to another worker's /metrics server."""
    high = min(_ephemeral_low(), 65000) - 2
    if high < 11000:  # an unusual ephemeral range: no room below it
        high = 64998
    index, count = _worker_share()
    for _ in range(1000):
        port = _RANDOM.randint(5000, high // 2) * 2  # even: the pairs never overlap
        if (port // 2) % count != index or port in _GIVEN:
            continue
        try:
            with socket.socket() as s, socket.socket() as s2:
                s.bind(("127.0.0.1", port))
                s2.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        _GIVEN.add(port)
        return port
    raise RuntimeError("no free port pair found")


@dataclass
class DevCluster:
    """``txmq dev`` in a child process. ``kill()`` is SIGKILL; ``start()`` reuses the same data and ports."""

    data_dir: Path
    conf: dict[str, str] = field(default_factory=dict)
    namesrv_port: int = 0
    broker_port: int = 0
    grpc_port: int = 0  # the gRPC door's port (a free one is picked); set conf grpcListenPort=0 to turn it off
    metrics_port: int = 0  # /metrics (a free one is picked); set conf metricsPort=0 to turn it off
    proc: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def grpc_endpoint(self) -> str:
        """What a RocketMQ 5 client is given as its endpoints."""
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 30.0) -> DevCluster:
        if not self.namesrv_port:
            self.namesrv_port = free_port()
        if not self.broker_port:
            self.broker_port = free_port()
        if not self.grpc_port and self.conf.get("grpcListenPort") != "0":
            self.grpc_port = free_port()
        if not self.metrics_port and self.conf.get("metricsPort") != "0":
            self.metrics_port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf_path = self.data_dir / "broker.conf"
        conf = {**self.conf, "grpcListenPort": str(self.grpc_port), "metricsPort": str(self.metrics_port)}
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        cmd = self._command(conf_path)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        ready = threading.Event()

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.output.append(line.rstrip("\n"))
                if self.ready_line in line:
                    ready.set()

        threading.Thread(target=pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.output[-40:])
                self.stop()
                raise RuntimeError(f"{cmd[3:5]} did not start:\n{tail}")
        self._wait_for_route(self._ready_topic(), deadline)
        return self

    ready_line = READY_LINE

    def _ready_topic(self) -> str:
        # TBW102 exists only with autoCreateTopicEnable; the cluster's own topic is there either way.
        auto_create = self.conf.get("autoCreateTopicEnable", "true").lower() != "false"
        return "TBW102" if auto_create else self.conf.get("brokerClusterName", "DefaultCluster")

    def _txmq(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "txmq", "--log-file", str(self.data_dir / "txmq.log"), *args]

    def _command(self, conf_path: Path) -> list[str]:
        return self._txmq(
            "dev",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--namesrv-port",
            str(self.namesrv_port),
            "--broker-port",
            str(self.broker_port),
            "-c",
            str(conf_path),
        )

    def _wait_for_route(self, topic: str, deadline: float) -> None:
        """The broker registers asynchronously; wait until the name server can route its topics."""
        from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame

        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", self.namesrv_port), timeout=2) as s:
                s.sendall(encode_frame(RemotingCommand.request(105, {"topic": topic})))
                decoder = FrameDecoder()
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    frames = decoder.feed(chunk)
                    if frames:
                        if frames[0].code == 0:
                            return
                        break
            time.sleep(0.05)
        raise RuntimeError("the broker never registered with the name server")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush, no abort-marker removal."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                code = self.proc.wait(10)
        self.proc = None
        return code

    def log_text(self) -> str:
        path = self.data_dir / "txmq.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class ExtraBroker(DevCluster):
    """One more broker (``txmq broker``) that registers with a running cluster's name server (``namesrv_port``);
    its ``conf`` names it (``brokerName``)."""

    ready_line = "txmq broker "

    def _ready_topic(self) -> str:
        return self.conf["brokerName"]  # brokerTopicEnable: each broker routes a topic named after itself

    def _command(self, conf_path: Path) -> list[str]:
        return self._txmq(
            "broker",
            "-c",
            str(conf_path),
            "--host",
            "127.0.0.1",
            "-n",
            self.namesrv_addr,
            "-p",
            str(self.broker_port),
            "--store",
            str(self.data_dir / "store"),
        )


@dataclass
class NameServerProcess:
    """``txmq namesrv`` in a child process on a free loopback port (output to ``log_path``); ``stop()`` is SIGKILL."""

    log_path: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> NameServerProcess:
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "txmq", "namesrv", "--host", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the name server did not start; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
