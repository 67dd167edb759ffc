"""The gRPC door against the 4.x door, in one run, on one real `txmq dev` process (1 KiB messages, SYNC flush), each
door driven by official clients of the same language:

* ``txmq``:  4.x door, txmq's own asyncio client (bench_e2e.send_phase), in this process;
* ``py5``:   5.x door, the official Python client `rocketmq-python-client` 5.1.2 (.venv-py5, py5_bench_child.py);
* ``raw``:   5.x door, txmq's generated stubs on grpc.aio in this process (the door without a client's own cost);
* ``java4``: 4.x door, the official Java remoting client 4.9.8 (tests/compat/java, ``Main bench --mode publish``);
* ``java5``: 5.x door, the official Java gRPC client 5.2.0 (tests/compat/java5, ``Main bench``).

Every client sends from N threads/tasks synchronously (N in flight) for ``--seconds``. For each window: msg/s, p50/p99
latency, the broker's CPU per message (utime + stime of the `txmq dev` process from /proc, sampled at the window's
start and end lines) and the client's own CPU per message (its process CPU over the window). ``--rounds`` repeats
everything; the table shows medians and each 5.x row's ratio to the 4.x row of the same language (py5 and raw against
txmq's client, java5 against java4). ``--profile DIR`` records the broker with py-spy (``PY_SPY`` or py-spy on PATH)
during each window of the first round (``PY_SPY_FLAGS="--native --gil"`` adds py-spy flags). Not a test.

    PYTHONPATH=src .venv/bin/python bench/bench_grpc.py [--seconds 5] [--inflight 1,128] [--rounds 3]
        [--clients txmq,py5,raw,java4,java5] [--receive] [--profile DIR] [--out FILE]
    PYTHONPATH=src .venv/bin/python bench/bench_grpc.py --summarize FILE... (medians of windows written by --out)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import _percentile, send_phase
from cluster_harness import DevCluster
from txmq.client.sync import Admin
from txmq.net import install_event_loop

ROOT = Path(__file__).resolve().parent.parent
PY5 = Path(os.environ.get("TXMQ_PY5_VENV", ROOT / ".venv-py5")) / "bin" / "python"
JAVA4_DIR = ROOT / "tests" / "compat" / "java"
JAVA5_DIR = ROOT / "tests" / "compat" / "java5"
LOADGEN_JVM = ["-Xms512m", "-Xmx512m", "-XX:+UseParallelGC"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BASELINE = {"py5": "txmq", "raw": "txmq", "java5": "java4"}
LABELS = {
    "txmq": "4.x door, txmq's client",
    "java4": "4.x door, official Java 4.9.8",
    "py5": "5.x door, official Python 5.1.2",
    "raw": "5.x door, raw grpc.aio stub",
    "java5": "5.x door, official Java 5.2.0",
}
Marks = Callable[[str], None]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


class BrokerMeter:
    """The broker's CPU between a window's "start" and "end" marks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.at: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.at[phase] = cpu_seconds(self.pid)

    def seconds(self) -> float:
        return self.at["end"] - self.at["start"]


def in_process(run: Callable[[Marks], Any], meter: BrokerMeter) -> dict[str, Any]:
    """A client in this process: its CPU is this process's over the window."""
    cpu: dict[str, float] = {}

    def marks(phase: str) -> None:
        cpu[phase] = time.process_time()
        meter.mark(phase)

    result = dict(asyncio.run(run(marks)))
    result["client_cpu_s"] = cpu["end"] - cpu["start"]
    return result


def child(cmd: list[str], meter: BrokerMeter, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """A client process that prints JSON lines: "window" marks, then its "result" (or a bare figures object)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        result: dict[str, Any] | None = None
        timer = threading.Timer(timeout, proc.kill)
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                if event.get("event") == "window":
                    meter.mark(event["phase"])
                elif event.get("event") in (None, "result"):
                    result = event
            proc.wait()
        finally:
            timer.cancel()
        if result is None or "end" not in meter.at:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd[-6:])} gave no result (exit {proc.returncode}):\n{err.read()[-3000:]}")
    return result


def py5_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HOME"] = tempfile.mkdtemp(prefix="txmq-bench-py5-")  # the client logs under ~/logs
    return env


def py5(*args: str, meter: BrokerMeter | None = None, timeout: float = 300) -> dict[str, Any]:
    cmd = [str(PY5), str(ROOT / "bench" / "py5_bench_child.py"), *args]
    if meter is not None:
        return child(cmd, meter, py5_env(), timeout)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=py5_env(), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.cache
def built(java_dir: Path, marker: str) -> None:
    if not (java_dir / marker).exists():
        subprocess.run(["bash", str(java_dir / "build.sh")], check=True, timeout=900)


def java(java_dir: Path, classes: Path, main: str, args: list[str], meter: BrokerMeter) -> dict[str, Any]:
    home = tempfile.mkdtemp(prefix="txmq-bench-java-")
    cmd = ["java", *LOADGEN_JVM, f"-Duser.home={home}", f"-Drocketmq.client.logRoot={home}"]
    cmd += ["-Drocketmq.client.logLevel=ERROR", "-cp", f"{classes / 'classes'}{os.pathsep}{classes / 'lib'}/*"]
    return child([*cmd, main, *args], meter)


async def raw_stub(endpoint: str, topic: str, inflight: int, seconds: float, marks: Marks) -> dict[str, float]:
    import grpc

    from txmq.door_grpc.pb import definition_pb2 as d
    from txmq.door_grpc.pb import service_pb2 as s
    from txmq.door_grpc.pb import service_pb2_grpc

    body = b"x" * 1024
    counter = 0
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        async def one() -> None:
            nonlocal counter
            counter += 1
            message = d.Message(
                topic=d.Resource(name=topic),
                body=body,
                system_properties=d.SystemProperties(message_id=f"01BENCH{counter:024X}", body_encoding=d.IDENTITY),
            )
            resp = await stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
            assert resp.status.code == d.OK, resp.status

        for _ in range(20):
            await one()
        latencies: list[float] = []
        marks("start")
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await one()
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        elapsed = time.perf_counter() - started
        marks("end")
    return {
        "msgs": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


class Spy:
    """py-spy on the broker for one window (raw samples, one file per window)."""

    def __init__(self, pid: int, out: Path | None) -> None:
        self.proc = None
        if out is not None:
            cmd = [os.environ.get("PY_SPY", "py-spy"), "record", "-p", str(pid), "-r", "200", "-f", "raw"]
            cmd += os.environ.get("PY_SPY_FLAGS", "").split()  # e.g. "--native --gil"
            cmd += ["-o"]
            self.proc = subprocess.Popen([*cmd, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)


def window(cluster: DevCluster, client: str, topic: str, n: int, seconds: float) -> dict[str, Any]:
    meter = BrokerMeter(cluster.proc.pid)  # type: ignore[union-attr]
    if client == "txmq":
        result = in_process(lambda m: send_phase(cluster.namesrv_addr, topic, n, seconds, marks=m), meter)
    elif client == "raw":
        result = in_process(lambda m: raw_stub(cluster.grpc_endpoint, topic, n, seconds, m), meter)
    elif client == "py5":
        args = ["send", "--endpoints", cluster.grpc_endpoint, "--topic", topic, "--inflight", str(n)]
        result = py5(*args, "--seconds", str(seconds), meter=meter)
    elif client == "java4":
        built(JAVA4_DIR, "target/v4/classes/txmq/compat/Bench.class")
        args = ["bench", "--namesrv", cluster.namesrv_addr, "--mode", "publish", "--topic", topic, "--group", topic]
        args += ["--inflight", str(n), "--seconds", str(int(seconds))]
        result = java(JAVA4_DIR, JAVA4_DIR / "target" / "v4", "txmq.compat.Main", args, meter)
        result["msgs"] = result["count"]
        result["rate"] = result["count"] / result["windowSeconds"]
    elif client == "java5":
        built(JAVA5_DIR, "target/classes/txmq/compat5/Bench.class")
        args = ["bench", cluster.grpc_endpoint, topic, str(n), str(seconds)]
        result = java(JAVA5_DIR, JAVA5_DIR / "target", "txmq.compat5.Main", args, meter)
    else:
        raise ValueError(f"unknown client {client}")
    msgs = max(1, int(result["msgs"]))
    return {
        "client": client,
        "inflight": n,
        "msgs": msgs,
        "rate": float(result["rate"]),
        "p50_ms": float(result["p50_ms"]),
        "p99_ms": float(result["p99_ms"]),
        "broker_us": meter.seconds() / msgs * 1e6,
        "client_us": float(result["client_cpu_s"]) / msgs * 1e6,
        "load": os.getloadavg()[0],
    }


def table(windows: list[dict[str, Any]], clients: list[str], inflights: list[int]) -> str:
    """Medians per client and in-flight count; the ratio column is the median of the per-run ratios (a 5.x window
    against the 4.x window of the same language, in flight and run), so both sides of a ratio saw the same load."""
    med: dict[tuple[str, int], dict[str, float]] = {}
    rates = {(w.get("run", ""), w["client"], w["inflight"]): w["rate"] for w in windows}
    for c in clients:
        for n in inflights:
            ws = [w for w in windows if w["client"] == c and w["inflight"] == n]
            if ws:
                keys = ("rate", "p50_ms", "p99_ms", "broker_us", "client_us")
                med[c, n] = {k: statistics.median(w[k] for w in ws) for k in keys}
                med[c, n]["runs"] = len(ws)
                base = BASELINE.get(c)
                paired = [w["rate"] / rates[key] for w in ws if (key := (w.get("run", ""), base, n)) in rates]
                if paired:
                    med[c, n]["ratio"] = statistics.median(paired)
    lines = [
        "| client | in flight | msg/s | p50 ms | p99 ms | broker CPU us/msg | client CPU us/msg "
        "| / 4.x, same language | windows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in inflights:
        for c in clients:
            if (c, n) not in med:
                continue
            m = med[c, n]
            ratio = f"**{m['ratio']:.2f}**" if "ratio" in m else ""
            lines.append(
                f"| {LABELS[c]} | {n} | {m['rate']:,.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                f"{m['broker_us']:.0f} | {m['client_us']:.0f} | {ratio} | {m['runs']:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", default="1,128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="txmq,py5,raw,java4,java5")
    parser.add_argument("--receive", action="store_true", help="then the py5 SimpleConsumer's receive + ack rate")
    parser.add_argument("--profile", type=Path, help="py-spy raw samples of the broker, one file per window")
    parser.add_argument("--out", type=Path, help="append the windows to this JSON-lines file")
    parser.add_argument("--summarize", type=Path, nargs="+", help="only print the medians of these windows files")
    args = parser.parse_args()
    inflights = [int(x) for x in args.inflight.split(",")]
    clients = [c for c in args.clients.split(",") if c]
    if args.summarize:
        windows = [json.loads(line) for f in args.summarize for line in f.read_text().splitlines() if line.strip()]
        print(table(windows, clients, inflights))
        loads = [w["load"] for w in windows]
        print(f"\nload average (1 min) {min(loads):.1f}-{max(loads):.1f} during the windows")
        return
    install_event_loop()
    windows = []
    run = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "out" / f"grpc-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-grpc-") as tmp:
        cluster = DevCluster(Path(tmp), {"mappedFileSizeCommitLog": str(256 * 1024 * 1024)}).start()
        try:
            with Admin(cluster.namesrv_addr) as admin:
                for c in clients:
                    admin.create_topic(f"Bench_{c}", cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
            time.sleep(1.0)
            for r in range(args.rounds):
                for n in inflights:
                    for c in clients:
                        spy_out = args.profile / f"{c}-x{n}.txt" if args.profile and r == 0 else None
                        spy = Spy(cluster.proc.pid, spy_out)  # type: ignore[union-attr]
                        try:
                            w = window(cluster, c, f"Bench_{c}", n, args.seconds)
                        finally:
                            spy.stop()
                        w["round"] = r
                        w["run"] = f"{run}/{r}"
                        windows.append(w)
                        with out.open("a") as f:
                            f.write(json.dumps(w) + "\n")
                        print(
                            f"round {r} {c} x{n}: {w['rate']:,.0f} msg/s p50 {w['p50_ms']:.2f} ms "
                            f"broker {w['broker_us']:.0f} us/msg client {w['client_us']:.0f} us/msg "
                            f"(load {w['load']:.1f})",
                            file=sys.stderr,
                            flush=True,
                        )
            received = None
            if args.receive and "py5" in clients:
                py5_windows = [w for w in windows if w["client"] == "py5"]
                sent = sum(w["msgs"] for w in py5_windows) + 20 * len(py5_windows)
                args5 = ["--endpoints", cluster.grpc_endpoint, "--topic", "Bench_py5", "--count", str(sent)]
                received = py5("receive", *args5, "--seconds", "120")
        finally:
            cluster.stop()
    print(table(windows, clients, inflights))
    print(f"\n{args.rounds} rounds of {args.seconds:g} s windows; windows in {out}")
    if received is not None:
        print(
            f"SimpleConsumer receive + ack (official Python client, batches of 32): {received['rate']:,.0f} msg/s "
            f"({int(received['msgs'])} messages)"
        )


if __name__ == "__main__":
    main()
