"""Replication benchmark: SYNC_MASTER with one slave against a single broker (``txmq dev``), 1 KiB sends from txmq's
asyncio client at 1 and 128 in flight, in one run. The slave is a broker process of its own (``txmq broker``, as on
its own machine: brokerRole=SLAVE, brokerId=1, haMasterAddress); ``--one-process`` runs ``txmq dev --replicas 1``
instead, where master and slave share one process, one event loop and one GIL. Both setups run side by side for the
whole run and take turns in short phases (the order flips every round), so that a busy machine's drift hits both
alike; the table gives the medians and the median of the rounds' ratios (target of issue 21: at least 0.7). On one
machine master and slave still share the disk and the two cores. Not a test: nothing here asserts a time.

    .venv/bin/python bench/bench_replication.py [--seconds 2] [--rounds 7] [--inflight 1,128] [--one-process]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import send_phase
from cluster_harness import DevCluster, ExtraBroker
from txmq.client import Message, Producer
from txmq.client.message import MessageQueue, SendStatus
from txmq.net import install_event_loop

CONF = {"grpcListenPort": "0", "mappedFileSizeCommitLog": str(256 * 1024 * 1024)}


class DevWithReplica(DevCluster):
    def _command(self, conf_path: Path) -> list[str]:
        return [*super()._command(conf_path), "--replicas", "1"]


KINDS = ("single", "sync-master+slave")


class MasterAndSlave:
    """A SYNC_MASTER (``txmq dev``) and its slave in a process of its own (``txmq broker``)."""

    def __init__(self, folder: Path) -> None:
        self.master = DevCluster(folder / "master", {**CONF, "brokerRole": "SYNC_MASTER"})
        self.slave: ExtraBroker | None = None
        self.folder = folder

    @property
    def namesrv_addr(self) -> str:
        return self.master.namesrv_addr

    def start(self) -> MasterAndSlave:
        self.master.start()
        try:
            self._start_slave()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_slave(self) -> None:
        slave_conf = {
            **CONF,
            "brokerName": "broker-a",  # txmq dev's
            "brokerId": "1",
            "brokerRole": "SLAVE",
            "haMasterAddress": f"127.0.0.1:{self.master.broker_port + 1}",  # haListenPort: listenPort + 1
            "metricsPort": "0",
        }
        self.slave = ExtraBroker(self.folder / "slave", slave_conf, namesrv_port=self.master.namesrv_port).start()
        asyncio.run(in_sync(self.namesrv_addr))

    def stop(self) -> None:
        for broker in (self.slave, self.master):
            if broker is not None:
                broker.stop()


async def in_sync(namesrv: str, timeout: float = 30.0) -> None:
    """Until a send is acknowledged by master and slave (SEND_OK rather than SLAVE_NOT_AVAILABLE)."""
    producer = Producer("bench_repl_sync", namesrv)
    await producer.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = await producer.send(Message("BenchRepl", b"x"), queue=MessageQueue("BenchRepl", "broker-a", 0))
            if result.status is SendStatus.SEND_OK:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the slave never caught up: {result.status}")
            await asyncio.sleep(0.1)
    finally:
        await producer.shutdown()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pids(cluster: Any) -> list[int]:
    """The processes whose CPU counts as the setup's (the master's and, in its own process, the slave's)."""
    brokers = [cluster.master, cluster.slave] if isinstance(cluster, MasterAndSlave) else [cluster]
    return [b.proc.pid for b in brokers if b is not None and b.proc is not None]


async def run(clusters: dict[str, Any], inflights: list[int], seconds: float, rounds: int) -> dict[Any, Any]:
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for n in range(rounds):
        for inflight in inflights:
            for kind in KINDS if n % 2 == 0 else reversed(KINDS):
                pids = broker_pids(clusters[kind])
                cpu: dict[str, list[float]] = {}

                def marks(at: str, pids: list[int] = pids, cpu: dict[str, list[float]] = cpu) -> None:
                    cpu[at] = [cpu_seconds(pid) for pid in pids]
                    cpu[at + "-client"] = [cpu_seconds(os.getpid())]  # this process: the client's side

                phase = await send_phase(clusters[kind].namesrv_addr, "BenchRepl", inflight, seconds, marks)
                # Broker CPU per message: the first process's (the master's) and all of them (with the slave's).
                used = [b - a for a, b in zip(cpu["start"], cpu["end"], strict=True)]
                phase["cpu_us"] = used[0] / phase["msgs"] * 1e6
                phase["cpu_all_us"] = sum(used) / phase["msgs"] * 1e6
                phase["cpu_client_us"] = (cpu["end-client"][0] - cpu["start-client"][0]) / phase["msgs"] * 1e6
                results.setdefault((kind, inflight), []).append(phase)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inflight", default="1,128")
    parser.add_argument("--one-process", action="store_true", help="the slave in the master's process (txmq dev)")
    args = parser.parse_args()
    inflights = [int(x) for x in args.inflight.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="txmq-bench-repl-", dir=Path(__file__).parent) as tmp:
        clusters: dict[str, DevCluster | MasterAndSlave] = {}
        try:
            # The pair first: its slave takes the master's port + 10, which the single broker's free ports then avoid.
            pair = DevWithReplica(Path(tmp) / "pair", dict(CONF)) if args.one_process else MasterAndSlave(Path(tmp))
            clusters["sync-master+slave"] = pair.start()
            clusters["single"] = DevCluster(Path(tmp) / "single", dict(CONF)).start()
            install_event_loop()
            results = asyncio.run(run(clusters, inflights, args.seconds, args.rounds))
        finally:
            for cluster in clusters.values():
                cluster.stop()
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    where = "in the master's process" if args.one_process else "in a process of its own"
    print(f"{args.rounds} rounds of {args.seconds} s per setup and in-flight count; the slave {where}")
    print(
        "| in flight | setup | msg/s (median) | p50 ms | p99 ms | median ratio of the rounds "
        "| broker CPU per msg, us (master; with the slave) | client CPU per msg, us |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for inflight in inflights:
        singles = results["single", inflight]
        for kind in KINDS:
            runs = results[kind, inflight]
            rate = statistics.median(r["rate"] for r in runs)
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            ratio = statistics.median(r["rate"] / b["rate"] for r, b in zip(runs, singles, strict=True))
            cpu = statistics.median(r["cpu_us"] for r in runs)
            cpu_all = statistics.median(r["cpu_all_us"] for r in runs)
            cpu_client = statistics.median(r["cpu_client_us"] for r in runs)
            row = f"| {inflight} | {kind} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {ratio:.2f}"
            print(f"{row} | {cpu:.0f}; {cpu_all:.0f} | {cpu_client:.0f} |")


if __name__ == "__main__":
    main()
