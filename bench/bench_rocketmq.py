"""txmq side by side with Apache RocketMQ 5.5.0 (issue 24), in one run on one machine, with one load generator.

Brokers: ``txmq dev`` (its defaults: SYNC_FLUSH), RocketMQ SYNC_FLUSH and RocketMQ ASYNC_FLUSH (its default, for
reference), all on loopback with their data in one temporary folder on the same disk. The publish and tx windows are
driven by bench/loadgen (``--loadgen go``, the default): txmq-loadgen, a Go program that writes the Java client's
requests itself over one connection, at a fraction of the Java client's CPU, so that on two cores the generator does
not set the pace. ``--loadgen java`` drives them with the Java client (rocketmq-client 4.9.8) in one JVM per window
(``txmq.compat.Main bench`` in tests/compat/java, Bench.java), which also reads the consume rate and the end-to-end
latency in every run.

Per round, the windows alternate broker by broker (txmq, RocketMQ SYNC, RocketMQ ASYNC, txmq, ...), and the brokers
not measured are paused (SIGSTOP). Publish of 1 KiB bodies with 1 and 128 sending threads; transactions (half + a
no-op local transaction + COMMIT) with 16, on a second instance of each broker (warmed up by an unrecorded transaction
window, as every broker is by an unrecorded publish window); the consume rate (a push consumer reading the x128
window's topic from its first offset); end-to-end latency (sync sends paced over 64 threads, a push consumer in the
same JVM) at half of the broker's publish x128 rate in that round. Around each window the broker's CPU time (utime +
stime) and memory are read from /proc: txmq's is the ``txmq dev`` process (name server and broker in one),
RocketMQ's the broker JVM alone; the generator's CPU comes from the children's rusage. Medians over the rounds and
txmq / RocketMQ SYNC ratios are printed as a Markdown table; every window goes to bench/out/rocketmq-*.jsonl.
``--profile-txmq DIR`` samples txmq with py-spy during round 0's publish x128 and tx x16 windows and prints where the
time goes.

Not a test: it prints figures and asserts nothing.

    .venv/bin/python bench/bench_rocketmq.py [--seconds 10] [--rounds 3] [--broker-heap 1g] [--profile-txmq DIR]
    .venv/bin/python bench/bench_rocketmq.py --only-tx --rounds 7   # the transaction windows alone
    .venv/bin/python bench/bench_rocketmq.py --loadgen java          # publish and tx from the Java client too
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.append(str(ROOT / "bench" / "peers" / "rocketmq"))

import apache_rocketmq  # noqa: E402

from cluster_harness import DevCluster  # noqa: E402
from compat.java_client import JAVA_DIR, _built  # noqa: E402
from txmq.client.sync import Admin  # noqa: E402
from txmq.testing import eventually  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The load generator gets a full JIT and a heap that does not make it the bottleneck.
LOADGEN_JVM = ["-Xms1g", "-Xmx1g", "-XX:+UseParallelGC"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def memory_mib(pid: int) -> dict[str, float]:
    """RSS and its parts: anonymous memory (heaps) and file pages (a store that maps its files counts those)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {f"broker{key}MiB": int(status[key].split()[0]) / 1024 for key in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}


LOADGEN_DIR = ROOT / "bench" / "loadgen"
LOADGEN = {"generator": "go"}  # --loadgen


def loadgen_binary() -> Path:
    """bench/loadgen's binary, built when missing or older than its source."""
    binary = LOADGEN_DIR / "bin" / "txmq-loadgen"
    source = LOADGEN_DIR / "main.go"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["bash", str(LOADGEN_DIR / "build.sh")], check=True)
    return binary


def load(namesrv: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """One load-generator process (txmq-loadgen for publish and tx with --loadgen go, else a JVM); its "result"
    event."""
    mode = args[args.index("--mode") + 1]
    if LOADGEN["generator"] == "go" and mode in ("publish", "tx"):
        cmd = [str(loadgen_binary()), "--namesrv", namesrv, *args]
    else:
        _built()
        out = JAVA_DIR / "target" / "v4"
        log_root = tempfile.mkdtemp(prefix="txmq-bench-java-")
        cmd = ["java", *LOADGEN_JVM, f"-Drocketmq.client.logRoot={log_root}", f"-Duser.home={log_root}"]
        cmd += ["-Drocketmq.client.logLevel=ERROR", "-cp", f"{out / 'classes'}{os.pathsep}{out / 'lib'}/*"]
        cmd += ["txmq.compat.Main", "bench", "--namesrv", namesrv, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "result":
                return event
    raise RuntimeError(f"no result from {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


class Broker:
    """One broker under test. Its processes are paused (SIGSTOP) while another broker's window runs, so that an
    idle broker's background work (RocketMQ's services after a load) costs the measured one nothing."""

    def __init__(self, name: str, cluster: Any, pid: int, groups: list[int]) -> None:
        self.name, self.cluster, self.pid, self.groups = name, cluster, pid, groups
        self.stored_by_publish: dict[int, int] = {}

    def pause(self) -> None:
        for group in self.groups:
            os.killpg(group, signal.SIGSTOP)

    def resume(self) -> None:
        for group in self.groups:
            os.killpg(group, signal.SIGCONT)
        time.sleep(1.0)  # let timers that fired while paused run before the window

    def create_topic(self, topic: str) -> None:
        def create() -> bool:
            with Admin(self.cluster.namesrv_addr) as admin:
                admin.create_topic(topic, cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
            return True

        eventually(create, f"topic {topic} on {self.name}", timeout=30, interval=1.0, retry_on=(Exception,))

    def window(self, *args: str, topic: str | None = None, profile: Path | None = None) -> dict[str, Any]:
        """One load-generator run while this broker alone runs (``topic`` is created first); ``profile``: py-spy
        samples the broker meanwhile into that file (collapsed stacks)."""
        self.resume()
        try:
            if topic:
                self.create_topic(topic)
            spy = None
            if profile is not None:
                cmd = [os.environ.get("PY_SPY", "py-spy"), "record", "-p", str(self.pid), "-r", "200", "-f", "raw"]
                spy = subprocess.Popen([*cmd, "-o", str(profile)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                return self._measure(*args)
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
        finally:
            self.pause()

    def _measure(self, *args: str) -> dict[str, Any]:
        cpu0, children0 = cpu_seconds(self.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
        result = load(self.cluster.namesrv_addr, *args)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        result["brokerCpuSeconds"] = cpu_seconds(self.pid) - cpu0
        # The load generator's JVM: on two cores its share says whether it, not the broker, set the pace.
        result["loadgenCpuSeconds"] = (children.ru_utime + children.ru_stime) - (
            children0.ru_utime + children0.ru_stime
        )
        result.update(memory_mib(self.pid))
        if result.get("count"):
            result["cpuMicrosPerMessage"] = result["brokerCpuSeconds"] / result["count"] * 1e6
        return result


def start_brokers(base: Path, heap: str, kind: str, started: list[Broker]) -> list[Broker]:
    """txmq, RocketMQ SYNC_FLUSH and ASYNC_FLUSH, each started and paused (and added to ``started`` at once, so
    that a failure later still stops it). ``kind`` names the data folders."""
    brokers: list[Broker] = []
    txmq = DevCluster(base / f"txmq-{kind}", {})
    try:
        txmq.start()
    finally:
        if txmq.proc is not None:
            brokers.append(Broker("txmq", txmq, txmq.proc.pid, [txmq.proc.pid]))
            started.append(brokers[-1])
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        rmq = apache_rocketmq.RocketMQCluster(base / f"rocketmq-{flush}-{kind}", flush=flush, broker_heap=heap)
        pids = rmq.start().pids()
        brokers.append(Broker(f"RocketMQ {flush.split('_')[0]}", rmq, pids["broker"], list(pids.values())))
        started.append(brokers[-1])
    for b in brokers:
        b.pause()
    return brokers


def run_round(
    brokers: list[Broker],
    tx_brokers: list[Broker],
    r: int,
    seconds: int,
    record: Any,
    profile_dir: Path | None,
    tx_only: bool = False,
) -> None:
    secs = str(seconds)
    peak: dict[str, float] = {}
    plans = [("publish x1", "publish", "1"), ("publish x128", "publish", "128"), ("tx x16", "tx", "16")]
    if tx_only:
        plans = plans[2:]
    for measure, mode, inflight in plans:
        for b in tx_brokers if mode == "tx" else brokers:
            t = f"Bench_{measure.replace(' ', '_')}_{r}"
            args = ("--mode", mode, "--topic", t, "--group", t, "--inflight", inflight, "--seconds", secs)
            profile = None
            if profile_dir is not None and r == 0 and b.name == "txmq" and inflight != "1":
                profile = profile_dir / f"txmq-{measure.replace(' ', '_')}.collapsed"
            result = b.window(*args, topic=t, profile=profile)
            record(b, measure, r, result)
            if profile is not None:
                print(hot_spots(profile), flush=True)
            if measure == "publish x128":
                peak[b.name] = result["rate"]
                b.stored_by_publish[r] = result["stored"] + 200  # and the warm-up sends
    if tx_only:
        return
    for b in brokers:
        source = f"Bench_publish_x128_{r}"
        expect = str(b.stored_by_publish[r])
        result = b.window("--mode", "consume", "--topic", source, "--group", f"BenchCG_{r}", "--expect", expect)
        record(b, "consume", r, result)
    for b in brokers:
        t = f"Bench_latency_{r}"
        rate = f"{peak[b.name] / 2:.0f}"
        result = b.window("--mode", "latency", "--topic", t, "--group", t, "--rate", rate, "--seconds", secs, topic=t)
        record(b, "e2e at half of peak", r, result)


def _frame(text: str) -> str:
    """ "handle (txmq/broker/send.py:120)" -> "handle (send.py)": one entry per function, whatever the line."""
    name, _, where = text.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1].split(':')[0]})"


def hot_spots(collapsed: Path, top: int = 14) -> str:
    """The functions where the samples of a py-spy collapsed-stack file fall: self (the leaf) and inclusive."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
    lines = [f"{collapsed.name}: {total} samples"]
    for title, table in (("self", own), ("inclusive", inclusive)):
        lines.append(f"  {title}:")
        for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {100 * n / max(total, 1):5.1f} %  {name}")
    return "\n".join(lines)


def summarize(rows: list[dict[str, Any]], names: list[str]) -> str:
    def med(broker: str, measure: str, key: str) -> float | None:
        values = [row[key] for row in rows if row["broker"] == broker and row["measure"] == measure and key in row]
        return statistics.median(values) if values else None

    lines = [
        "| measure | " + " | ".join(names) + " | txmq / RocketMQ SYNC |",
        "|---" * (len(names) + 2) + "|",
    ]

    def line(label: str, measure: str, key: str, fmt: str, ratio: bool = True) -> None:
        values = [med(n, measure, key) for n in names]
        cells = ["" if v is None else format(v, fmt) for v in values]
        r = f"{values[0] / values[1]:.2f}" if ratio and values[0] and values[1] else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {r} |")

    for measure in ("publish x1", "publish x128", "tx x16", "consume"):
        line(f"{measure} (msg/s)", measure, "rate", ",.0f")
    line("e2e p50 at half of peak (ms)", "e2e at half of peak", "p50", ".0f")
    line("e2e p99 at half of peak (ms)", "e2e at half of peak", "p99", ".0f")
    for measure in ("publish x128", "tx x16"):
        line(f"broker CPU per message, {measure} (us)", measure, "cpuMicrosPerMessage", ".0f")
    for measure in ("publish x128", "tx x16"):
        line(f"load generator CPU, {measure} (s per window)", measure, "loadgenCpuSeconds", ".1f", ratio=False)
    line("broker RSS after publish x128 (MiB)", "publish x128", "brokerVmRSSMiB", ".0f")
    line("  of which anonymous (heap)", "publish x128", "brokerRssAnonMiB", ".0f")
    line("  of which file pages (mapped store)", "publish x128", "brokerRssFileMiB", ".0f")
    line("broker peak RSS at the end (VmHWM, MiB)", "e2e at half of peak", "brokerVmHWMMiB", ".0f")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="length of each publish and tx window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker-heap", default=apache_rocketmq.BROKER_HEAP, help="RocketMQ broker's -Xms/-Xmx")
    parser.add_argument("--dir", type=Path, default=None, help="data folder (default: a temporary one)")
    parser.add_argument(
        "--only-tx", action="store_true", help="only the transaction windows (more rounds of them in the same time)"
    )
    parser.add_argument(
        "--loadgen",
        choices=("go", "java"),
        default="go",
        help="the publish and tx windows' generator: bench/loadgen (Go) or the Java client",
    )
    parser.add_argument(
        "--profile-txmq", type=Path, default=None, help="py-spy (or $PY_SPY) samples txmq in round 0 into this folder"
    )
    args = parser.parse_args()
    LOADGEN["generator"] = args.loadgen
    base = args.dir or Path(tempfile.mkdtemp(prefix="txmq-bench-rocketmq-"))
    out = ROOT / "bench" / "out" / f"rocketmq-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def record(b: Broker, measure: str, r: int, result: dict[str, Any]) -> None:
        row = {"broker": b.name, "measure": measure, "round": r, **result}
        rows.append(row)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items() if k != "event"}
        print(f"round {r} {b.name:15} {measure:20} {shown}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the brokers on the way out
    if args.profile_txmq:
        args.profile_txmq.mkdir(parents=True, exist_ok=True)
    # Transactions get brokers of their own: after a burst of transactions RocketMQ 5.5's TransactionalOpBatchService
    # keeps a core busy for minutes, which would otherwise fall on the plain windows that follow.
    started: list[Broker] = []
    try:
        brokers = [] if args.only_tx else start_brokers(base, args.broker_heap, "plain", started)
        tx_brokers = start_brokers(base, args.broker_heap, "tx", started)
        for b in started:  # JIT, page cache and RocketMQ's start-up work: not recorded
            t = "Bench_warmup"
            b.window("--mode", "publish", "--topic", t, "--group", t, "--inflight", "128", "--seconds", "10", topic=t)
        for b in tx_brokers:  # and each broker's transaction path (RocketMQ's JIT of it, txmq's table), unrecorded
            t = "Bench_warmup_tx"
            b.window("--mode", "tx", "--topic", t, "--group", t, "--inflight", "16", "--seconds", "10", topic=t)
        for r in range(args.rounds):
            run_round(brokers, tx_brokers, r, args.seconds, record, args.profile_txmq, args.only_tx)
    finally:
        for b in started:
            b.resume()
            b.cluster.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)  # gigabytes of stores
    print(f"\nwindows: {out}\n")
    print(summarize(rows, ["txmq", "RocketMQ SYNC", "RocketMQ ASYNC"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
