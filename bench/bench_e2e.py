"""End-to-end benchmark: a real `txmq dev` process, txmq's own asyncio client, 1 KiB messages over loopback.

Measures send throughput and latency (p50/p99) at 1, 16 and 128 sends in flight, with SYNC and ASYNC flush, then
consume throughput with a pull consumer, and, in the same run, the store alone (a MessageStore in this process with
as many appenders as the largest in-flight count) for comparison. Prints Markdown tables. Not a test: nothing here
asserts a time.

    .venv/bin/python bench/bench_e2e.py [--seconds 5] [--flush SYNC_FLUSH,ASYNC_FLUSH] [--inflight 1,16,128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import store_rate
from cluster_harness import DevCluster
from txmq.client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from txmq.net import install_event_loop
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore

BODY = b"x" * 1024


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def send_phase(
    namesrv: str, topic: str, inflight: int, seconds: float, marks: Callable[[str], None] | None = None
) -> dict[str, float]:
    """``marks("start")``/``marks("end")`` around the measured window (bench_grpc.py samples CPU there)."""
    producer = Producer(f"bench_pg_{inflight}", namesrv)
    await producer.start()
    mq = MessageQueue(topic, "broker-a", 0)
    # Warm up: route, connection, topic creation.
    for _ in range(20):
        await producer.send(Message(topic, BODY), queue=mq)
    latencies: list[float] = []
    if marks is not None:
        marks("start")
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await producer.send(Message(topic, BODY), queue=mq)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    if marks is not None:
        marks("end")
    await producer.shutdown()
    return {
        "msgs": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


async def consume_phase(namesrv: str, topic: str) -> dict[str, float]:
    consumer = PullConsumer("bench_consumer", namesrv)
    await consumer.start()
    mq = MessageQueue(topic, "broker-a", 0)
    offset = await consumer.min_offset(mq)
    end = await consumer.max_offset(mq)
    count = 0
    started = time.perf_counter()
    while offset < end:
        result = await consumer.pull(mq, "*", offset, 32)
        if result.status is not PullStatus.FOUND:
            break
        count += len(result.messages)
        offset = result.next_begin_offset
    elapsed = time.perf_counter() - started
    await consumer.shutdown()
    return {"msgs": count, "rate": count / elapsed if elapsed else float("nan")}


async def store_only(flush: str, appenders: int, seconds: float) -> float:
    """The same 1 KiB records appended straight to a MessageStore (no network, no broker): msg/s."""
    with tempfile.TemporaryDirectory(prefix="txmq-bench-store-", dir=Path(__file__).parent) as tmp:
        store = MessageStore(StoreConfig(store_path_root_dir=tmp, flush_disk_type=flush))
        await store.start()
        try:
            rate, _ = await store_rate(store, appenders, seconds)
        finally:
            await store.close()
    return rate


def run(coro: Any) -> Any:
    """The client side on uvloop too, as txmq's own command-line tools run it."""
    install_event_loop()
    return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flush", default="SYNC_FLUSH,ASYNC_FLUSH")
    parser.add_argument("--inflight", default="1,16,128")
    args = parser.parse_args()
    rows = []
    consume_rows = []
    store_rows = []
    biggest_n = max(int(x) for x in args.inflight.split(","))
    for flush in args.flush.split(","):
        rate = run(store_only(flush, biggest_n, args.seconds))
        store_rows.append((flush, rate))
        print(f"{flush:11s} store only, {biggest_n} appenders: {rate:9.0f} msg/s", flush=True)
        with tempfile.TemporaryDirectory(prefix="txmq-bench-") as tmp:
            cluster = DevCluster(Path(tmp), {"flushDiskType": flush}).start()
            try:
                for n in (int(x) for x in args.inflight.split(",")):
                    topic = f"Bench_{flush}_{n}"
                    r = run(send_phase(cluster.namesrv_addr, topic, n, args.seconds))
                    rows.append((flush, n, r))
                    print(
                        f"{flush:11s} in-flight {n:4d}: {r['rate']:9.0f} msg/s  p50 {r['p50_ms']:6.2f} ms  "
                        f"p99 {r['p99_ms']:6.2f} ms  ({r['msgs']} msgs)",
                        flush=True,
                    )
                biggest = f"Bench_{flush}_{max(int(x) for x in args.inflight.split(','))}"
                c = run(consume_phase(cluster.namesrv_addr, biggest))
                consume_rows.append((flush, c))
                print(f"{flush:11s} consume: {c['rate']:9.0f} msg/s ({c['msgs']} msgs)", flush=True)
            finally:
                cluster.stop()
    print("\n| flush | in flight | msg/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for flush, n, r in rows:
        print(f"| {flush} | {n} | {r['rate']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    print("\n| flush | consume msg/s (pull, 32 per request, one queue) |\n|---|---|")
    for flush, c in consume_rows:
        print(f"| {flush} | {c['rate']:.0f} |")
    print(
        f"\n| flush | store only, {biggest_n} appenders, msg/s | network at {biggest_n} in flight / store |"
        "\n|---|---|---|"
    )
    for flush, rate in store_rows:
        net = next((r["rate"] for f, n, r in rows if f == flush and n == biggest_n), float("nan"))
        print(f"| {flush} | {rate:.0f} | {net / rate:.2f} |")


if __name__ == "__main__":
    main()
