"""Scrape size and time of ``/metrics`` on a broker with many topics (issue 17: 10 000 topics under 1 MB and 200 ms).

An in-process broker (real store, real sockets) gets one message on each of ``--topics`` topics, a consumer group with
a committed and a pulled offset on each, then ``/metrics`` is fetched over HTTP ``--runs`` times. Prints the body size,
the series count and the median / max fetch time, for the default ``metricsLabelLimit`` and for no limit.

    PYTHONPATH=src python bench/bench_metrics.py --topics 10000
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from txmq.broker.broker import Broker
from txmq.broker.config import BrokerConfig
from txmq.protocol.record import MessageRecord


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return body, time.perf_counter() - t0


async def run(topics: int, runs: int, limit: int | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        port = free_port()
        fields = {
            "listen_port": 0,
            "broker_ip1": "127.0.0.1",
            "grpc_listen_port": 0,
            "metrics_port": port,
            "store_path_root_dir": str(Path(root) / "store"),
            "mapped_file_size_commit_log": 256 << 20,
            "flush_disk_type": "ASYNC_FLUSH",
        }
        if limit is not None:
            fields["metrics_label_limit"] = limit
        broker = Broker(BrokerConfig(**fields))
        await broker.start("127.0.0.1")
        try:
            app = broker.app
            names = [f"BenchTopic{i:06d}" for i in range(topics)]
            for start in range(0, topics, 500):
                futures = [
                    broker.store.put_future(
                        MessageRecord(topic=t, body=b"x" * 64, queue_id=0, store_host=("127.0.0.1", 1))
                    )
                    for t in names[start : start + 500]
                ]
                await asyncio.gather(*futures)
            for i, t in enumerate(names):
                group = f"BenchGroup{i % 100:03d}"
                broker.offsets.commit(group, t, 0, 0)
                app.stats.count_out(t, group, 0, 1, 100, 1)
            url = f"http://127.0.0.1:{port}/metrics"
            times = []
            body = b""
            for _ in range(runs):
                body, seconds = await asyncio.to_thread(fetch, url)
                times.append(seconds)
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            return {
                "bytes": len(body),
                "series": series,
                "median_ms": statistics.median(times) * 1000,
                "max_ms": max(times) * 1000,
            }
        finally:
            await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for label, limit in (("default metricsLabelLimit (200)", None), ("metricsLabelLimit=1000000 (no limit)", 10**6)):
        r = asyncio.run(run(args.topics, args.runs, limit))
        print(
            f"{args.topics} topics, {label}: {r['bytes'] / 1024:.0f} KiB, {r['series']:.0f} series, "
            f"scrape median {r['median_ms']:.0f} ms, max {r['max_ms']:.0f} ms over {args.runs} runs"
        )


if __name__ == "__main__":
    main()
