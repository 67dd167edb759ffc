"""Apache RocketMQ itself, the reference broker txmq is compared with (issue 24): fetch, start, stop.

    python bench/peers/rocketmq/apache_rocketmq.py fetch
    python bench/peers/rocketmq/apache_rocketmq.py start --dir /tmp/rmq [--namesrv-port 9876] [--broker-port 10911]
                                                  [--flush SYNC_FLUSH|ASYNC_FLUSH] [--proxy] [-c broker.conf]
    python bench/peers/rocketmq/apache_rocketmq.py stop --dir /tmp/rmq

`fetch` copies the pinned release (pom.xml beside this file) with its dependencies into target/lib (git-ignored) with
Maven; a registry that cannot be reached fails it. `start` runs the name server and the broker (or, with --proxy,
ProxyStartup in local mode: the broker and the gRPC front in one JVM) as process groups of their own, waits until the
broker is registered with the name server, prints the addresses and leaves them running; `stop` ends both groups.
From Python (the tests, the benchmark), :class:`RocketMQCluster` does the same and mirrors the test harness's
``DevCluster``: ``start()``, ``stop()``, ``kill()``, ``namesrv_addr``, ``broker_addr``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB = HERE / "target" / "lib"
VERSION = "5.5.0"  # the newest 5.x whose broker, name server and proxy all resolve from Maven Central here
CLUSTER = "DefaultCluster"
BROKER_NAME = "broker-a"

# Sized for a 2-core, 24 GiB machine shared with other test runs (RocketMQ's scripts ask for 8 GiB and 4 GiB).
BROKER_HEAP = "1g"
NAMESRV_HEAP = "256m"
_JVM_COMMON = [
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    # The store unmaps files and reads direct buffers through JDK internals.
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
]


def fetch(quiet: bool = True) -> Path:
    """Resolve the pinned artifacts into target/lib (Maven's cache makes later runs take seconds)."""
    if (LIB / f"rocketmq-broker-{VERSION}.jar").exists() and (LIB / f"rocketmq-proxy-{VERSION}.jar").exists():
        return LIB
    cmd = ["mvn", "-B", "-Dstyle.color=never", *(["-q"] if quiet else [])]
    cmd += ["-f", str(HERE / "pom.xml"), "dependency:copy-dependencies", f"-DoutputDirectory={LIB}"]
    cmd += ["-DincludeScope=runtime", f"-Drocketmq.version={VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not (LIB / f"rocketmq-broker-{VERSION}.jar").exists():
        raise RuntimeError(f"fetching Apache RocketMQ {VERSION} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return LIB


def free_port(below: int = 2, above: int = 1) -> int:
    """A loopback port that is free with ``below`` ports under it and ``above`` over it (the broker also listens
    on listenPort - 2, its fast channel, and listenPort + 1, HA)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port - below < 1024 or port + above > 65535:
            continue
        try:
            for p in range(port - below, port + above + 1):
                with socket.socket() as s2:
                    s2.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port range found")


def _request(addr: str, code: int, ext: dict[str, str] | None = None, timeout: float = 3.0) -> tuple[int, bytes]:
    """One remoting request, its response code and body (the frame codec is txmq's, when importable)."""
    from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame

    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(encode_frame(RemotingCommand.request(code, ext or {})))
        decoder = FrameDecoder()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection")
            frames = decoder.feed(chunk)
            if frames:
                return frames[0].code, frames[0].body


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the whole group (RocketMQ's shutdown hooks flush and unregister), SIGKILL after ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


_running: list[subprocess.Popen[bytes]] = []


@atexit.register
def _leave_nothing_behind() -> None:
    for proc in _running:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class RocketMQCluster:
    """A name server and a broker (or the proxy in local mode) of Apache RocketMQ, data under ``data_dir``.

    ``conf`` holds broker.conf entries (RocketMQ's key names) laid over the defaults below; ``flush`` is
    ``flushDiskType``. ``detach=True`` (the command line) leaves the processes running when Python exits.
    """

    data_dir: Path
    conf: dict[str, str] = field(default_factory=dict)
    namesrv_port: int = 0
    broker_port: int = 0
    flush: str = "ASYNC_FLUSH"  # RocketMQ's default
    proxy: bool = False
    proxy_port: int = 0  # the proxy's remoting port; its gRPC port is proxy_port + 1
    broker_heap: str = BROKER_HEAP
    detach: bool = False
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def home(self) -> Path:
        """ROCKETMQ_HOME: BrokerStartup refuses to start without it; the ACL file is read from its conf/."""
        return self.data_dir / "home"

    def broker_conf(self) -> dict[str, str]:
        store = self.data_dir / "store"
        conf = {
            "brokerClusterName": CLUSTER,
            "brokerName": BROKER_NAME,
            "brokerId": "0",
            "brokerRole": "ASYNC_MASTER",
            "brokerIP1": "127.0.0.1",
            "listenPort": str(self.broker_port),
            "namesrvAddr": self.namesrv_addr,
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "flushDiskType": self.flush,
            "autoCreateTopicEnable": "true",
        }
        conf.update(self.conf)
        return conf

    def _java(self, heap: str, main: str, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        classpath = f"{fetch()}{os.sep}*"
        cmd = ["java", f"-Xms{heap}", f"-Xmx{heap}", *_JVM_COMMON, f"-Duser.home={self.data_dir}"]
        cmd += [f"-Drocketmq.home.dir={self.home}", "-cp", classpath, main, *args]
        env = dict(os.environ, ROCKETMQ_HOME=str(self.home))
        out = open(self.data_dir / f"{log_name}.out", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        self.procs[log_name] = proc
        if not self.detach:
            _running.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> RocketMQCluster:
        fetch()
        self.namesrv_port = self.namesrv_port or free_port(0, 0)
        self.broker_port = self.broker_port or free_port()
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        namesrv_conf = self.data_dir / "namesrv.conf"
        namesrv_conf.write_text(f"listenPort={self.namesrv_port}\n")
        broker_conf = self.data_dir / "broker.conf"
        broker_conf.write_text("".join(f"{k}={v}\n" for k, v in self.broker_conf().items()))
        deadline = time.monotonic() + timeout
        self._java(NAMESRV_HEAP, "org.apache.rocketmq.namesrv.NamesrvStartup", ["-c", str(namesrv_conf)], "namesrv")
        self._wait(lambda: _request(self.namesrv_addr, 106)[0] == 0, deadline, "the name server")
        if self.proxy:
            self.proxy_port = self.proxy_port or free_port(0, 1)
            proxy_conf = self.data_dir / "rmq-proxy.json"
            proxy_conf.write_text(
                json.dumps(
                    {
                        "rocketMQClusterName": CLUSTER,
                        "namesrvAddr": self.namesrv_addr,
                        "remotingListenPort": self.proxy_port,
                        "grpcServerPort": self.proxy_port + 1,
                    }
                )
            )
            args = ["-pm", "local", "-bc", str(broker_conf), "-pc", str(proxy_conf), "-n", self.namesrv_addr]
            self._java(self.broker_heap, "org.apache.rocketmq.proxy.ProxyStartup", args, "broker")
        else:
            args = ["-c", str(broker_conf), "-n", self.namesrv_addr]
            self._java(self.broker_heap, "org.apache.rocketmq.broker.BrokerStartup", args, "broker")
        self._wait(self._registered, deadline, "the broker's registration")
        if self.proxy:  # the proxy opens its ports once its broker is up
            self._wait(lambda: _listening(self.proxy_port) and _listening(self.proxy_port + 1), deadline, "the proxy")
        return self

    def _registered(self) -> bool:
        code, body = _request(self.namesrv_addr, 106)  # GET_BROKER_CLUSTER_INFO
        return code == 0 and f":{self.broker_port}".encode() in body

    def _wait(self, ready: object, deadline: float, what: str) -> None:
        assert callable(ready)
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    self.kill()
                    raise RuntimeError(f"RocketMQ's {name} exited {proc.returncode} before {what}:\n{self.output()}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"RocketMQ: no sign of {what} in time:\n{self.output()}")

    def output(self, lines: int = 40) -> str:
        text = []
        for name in ("namesrv", "broker"):
            path = self.data_dir / f"{name}.out"
            if path.exists():
                text.append(f"--- {name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(text)

    def log_text(self) -> str:
        """The broker's own log (logback, under user.home), for a look after a test."""
        path = self.data_dir / "logs" / "rocketmqlogs" / "broker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self, timeout: float = 20.0) -> None:
        """The broker first (it unregisters), then the name server; each group SIGKILLed if it lingers."""
        for name in ("broker", "namesrv"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _kill_group(proc, timeout)

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs.clear()


def _group_gone(pgid: int, timeout: float) -> bool:
    """Whether process group ``pgid`` has no process left within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _stop_recorded(data_dir: Path, timeout: float = 20.0) -> None:
    state = data_dir / "pids.json"
    if not state.exists():
        return
    for pid in json.loads(state.read_text()).values():
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        if not _group_gone(pid, timeout):
            os.killpg(pid, signal.SIGKILL)
            # SIGKILL is not instant: the group is gone once the kernel has torn it down and init has reaped it.
            if not _group_gone(pid, 30.0):
                raise SystemExit(f"process group {pid} still there 30 s after SIGKILL")
    state.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="resolve the pinned artifacts into target/lib")
    start = sub.add_parser("start", help="start a name server and a broker, return once registered")
    stop = sub.add_parser("stop", help="stop what `start` started in --dir")
    for p in (start, stop):
        p.add_argument("--dir", type=Path, required=True, help="data, logs and the pid file")
    start.add_argument("--namesrv-port", type=int, default=0)
    start.add_argument("--broker-port", type=int, default=0)
    start.add_argument("--flush", choices=("SYNC_FLUSH", "ASYNC_FLUSH"), default="ASYNC_FLUSH")
    start.add_argument("--proxy", action="store_true", help="ProxyStartup in local mode (adds the gRPC front)")
    start.add_argument("--proxy-port", type=int, default=0)
    start.add_argument("--broker-heap", default=BROKER_HEAP)
    start.add_argument("-c", "--conf", type=Path, help="broker.conf entries laid over the defaults")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch(quiet=False))
        return 0
    if args.command == "stop":
        _stop_recorded(args.dir.resolve())
        return 0
    data_dir = args.dir.resolve()
    _stop_recorded(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    conf = {}
    if args.conf:
        for line in args.conf.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                conf[key.strip()] = value.strip()
    cluster = RocketMQCluster(
        data_dir,
        conf,
        namesrv_port=args.namesrv_port,
        broker_port=args.broker_port,
        flush=args.flush,
        proxy=args.proxy,
        proxy_port=args.proxy_port,
        broker_heap=args.broker_heap,
        detach=True,
    ).start()
    (data_dir / "pids.json").write_text(json.dumps(cluster.pids()))
    print(f"namesrv {cluster.namesrv_addr} broker {cluster.broker_addr} flush {cluster.flush}", end="")
    print(f" proxy 127.0.0.1:{cluster.proxy_port} grpc 127.0.0.1:{cluster.proxy_port + 1}" if args.proxy else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
