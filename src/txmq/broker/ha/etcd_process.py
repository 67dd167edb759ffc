"""A private single-member etcd (Debian's ``etcd-server``) on free loopback ports: the controller of ``txmq dev
--replicas N --controller``, of controller-mode tests and of the failover campaign (re-exported by txmq.testing).
``etcd_binary()`` is None when etcd is not installed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )


@dataclass
class EtcdServer:
    data_dir: Path
    client_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 20.0) -> EtcdServer:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (Debian: apt-get install etcd-server)")
        from txmq.testing._processes import free_port

        self.client_port = self.client_port or free_port()
        peer_port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                binary,
                "--name",
                "txmq-test",
                "--data-dir",
                str(self.data_dir / "member"),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.client_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.client_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"txmq-test=http://127.0.0.1:{peer_port}",
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {(self.data_dir / 'etcd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.client_port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
