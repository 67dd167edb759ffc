"""The client's own work per send and per transaction: txmq's asyncio client against a real ``txmq dev``.

The peer harness (``bench/peers/harness/txmq_bench.py``) drives txmq with this client, which used about 30 us of CPU
per send there: at 128 in flight on a 2-core machine the client is half of the bottleneck. This measures the client
process alone, with the broker in another process (``txmq dev``, SYNC_FLUSH, started here on free loopback ports
unless ``--namesrv`` names a running one), and the same calls as the harness: ``Producer.send`` with 1 or N
coroutines in flight (``x1``, ``x128``), and ``TransactionProducer.send_message_in_transaction`` with K in flight
(``tx16``: half message, a no-op local transaction answering COMMIT, oneway END_TRANSACTION).

Each measurement runs a child process that warms up (route, connection, 300 operations), then does ``--count``
operations and prints their CPU time (the client process's, all threads) and rate. With ``--instructions`` the child
runs twice under valgrind's callgrind, with few and with more operations, and the difference per operation is the
client's instructions per send or per transaction: the broker is not instrumented, and the machine's load does not
reach the count (how responses fall into reads still moves it by a little: take the median of a few runs).

    PYTHONPATH=src .venv/bin/python bench/bench_client_cpu.py [--modes x1,x128,tx16] [--count 20000] [--runs 3]
    PYTHONPATH=src .venv/bin/python bench/bench_client_cpu.py --instructions [--count 3000] [--runs 3]

``--loop asyncio`` runs the client on asyncio's own loop instead of uvloop (the harness uses uvloop when present).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BODY = os.urandom(1024)
TOPIC = "BenchClientCpu"
TX_TOPIC = "BenchClientCpuTx"
WARMUP = 300


def _parse_mode(mode: str) -> tuple[str, int]:
    found = re.fullmatch(r"(x|tx)(\d+)", mode)
    if found is None:
        raise SystemExit(f"unknown mode {mode!r}: x<N> (sends, N in flight) or tx<N> (transactions)")
    return ("tx" if found.group(1) == "tx" else "send"), int(found.group(2))


class _NoOp:
    async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        from txmq.client import LocalTransactionState

        return LocalTransactionState.COMMIT

    async def check_local_transaction(self, message: Any) -> Any:
        from txmq.client import LocalTransactionState

        return LocalTransactionState.COMMIT


async def _child(mode: str, count: int, namesrv: str) -> dict[str, Any]:
    from txmq.client import Message, Producer, TransactionProducer

    kind, window = _parse_mode(mode)
    if kind == "tx":
        producer: Any = TransactionProducer(f"bench_client_tx_{window}", namesrv, _NoOp())
        topic = TX_TOPIC

        async def op() -> None:
            await producer.send_message_in_transaction(Message(topic, BODY))

    else:
        producer = Producer(f"bench_client_{window}", namesrv)
        topic = TOPIC

        async def op() -> None:
            await producer.send(Message(topic, BODY))

    await producer.start()
    left = 0

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await op()

    left = WARMUP
    await asyncio.gather(*(worker() for _ in range(window)))
    left = count
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await producer.shutdown()
    return {"mode": mode, "count": count, "cpu_us": cpu / count * 1e6, "rate": count / wall}


def _child_cmd(mode: str, count: int, namesrv: str, loop: str) -> list[str]:
    return [sys.executable, __file__, "--child", mode, "--count", str(count), "--namesrv", namesrv, "--loop", loop]


def run_child(mode: str, count: int, namesrv: str, loop: str) -> dict[str, Any]:
    out = subprocess.run(_child_cmd(mode, count, namesrv, loop), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def instructions(mode: str, count: int, namesrv: str, loop: str) -> float:
    """Client instructions per operation: two callgrind runs of the child, and the difference between them."""
    counts = []
    small = max(count // 5, 100)
    for n in (small, count):
        with tempfile.TemporaryDirectory(prefix="txmq-bench-client-cg-") as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    *_child_cmd(mode, n, namesrv, loop),
                ],
                capture_output=True,
                text=True,
            )
        found = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or found is None:
            raise SystemExit(f"callgrind run failed ({out.returncode}):\n{out.stdout[-1000:]}\n{out.stderr[-3000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (count - small)


async def _create_topics(namesrv: str) -> None:
    from txmq.client import Admin

    admin = Admin(namesrv)
    await admin.start()
    try:
        info = await admin.cluster_info()
        cluster = next(iter(info.clusters))
        for topic in (TOPIC, TX_TOPIC):
            await admin.create_topic(topic, cluster=cluster, read_queue_nums=4, write_queue_nums=4)
    finally:
        await admin.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="x1,x128,tx16")
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="operations measured per run (default 20000, 3000 with --instructions; x1 and tx modes use a fifth of it)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--instructions", action="store_true", help="count the client's instructions under callgrind")
    parser.add_argument("--namesrv", help="a running txmq's name server (default: start `txmq dev` here)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        if args.loop == "uvloop":
            try:
                import uvloop

                uvloop.install()
            except ImportError:
                pass
        print(json.dumps(asyncio.run(_child(args.child, args.count, args.namesrv))), flush=True)
        return

    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    count = args.count or (3000 if args.instructions else 20000)
    cluster = None
    namesrv = args.namesrv
    tmp = None
    if namesrv is None:
        from txmq.testing import DevCluster

        tmp = tempfile.mkdtemp(prefix="txmq-bench-client-")
        cluster = DevCluster(Path(tmp), conf={"grpcListenPort": "0", "metricsPort": "0"}).start()
        namesrv = cluster.namesrv_addr
    import txmq._hotpath as hotpath

    print(f"client hot path: {hotpath.STATE.describe()}; loop {args.loop}; load {os.getloadavg()[0]:.2f}", flush=True)
    try:
        asyncio.run(_create_topics(namesrv))
        for mode in args.modes.split(","):
            kind, window = _parse_mode(mode)
            n = count if (kind == "send" and window > 1) else max(count // 5, 500)
            unit = "transaction" if kind == "tx" else "send"
            if args.instructions:
                values = [instructions(mode, n, namesrv, args.loop) for _ in range(args.runs)]
                shown = ", ".join(f"{v:,.0f}" for v in values)
                print(f"{mode}: {statistics.median(values):,.0f} instructions per {unit} (runs: {shown})", flush=True)
            else:
                rows = [run_child(mode, n, namesrv, args.loop) for _ in range(args.runs)]
                cpu = statistics.median(r["cpu_us"] for r in rows)
                rate = statistics.median(r["rate"] for r in rows)
                shown = "; ".join(f"{r['cpu_us']:.1f} us, {r['rate']:,.0f}/s" for r in rows)
                print(
                    f"{mode}: {cpu:.1f} us client CPU per {unit}, {rate:,.0f} {unit}s/s "
                    f"(medians of {len(rows)}: {shown}); load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
