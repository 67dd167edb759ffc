"""Replication benchmark: SYNC_MASTER with one slave (``txmq dev --replicas 1``) against a single broker (``txmq
dev``), 1 KiB sends from txmq's asyncio client at 1 and 128 in flight, in one run. Both run the same number of rounds,
alternating, and the table gives medians and the ratio (target of issue 21: at least 0.7). Not a test: nothing here
asserts a time.

    .venv/bin/python bench/bench_replication.py [--seconds 5] [--rounds 3] [--inflight 1,128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import send_phase
from cluster_harness import DevCluster
from txmq.net import install_event_loop

CONF = {"grpcListenPort": "0", "mappedFileSizeCommitLog": str(256 * 1024 * 1024)}


class DevWithReplica(DevCluster):
    def _command(self, conf_path: Path) -> list[str]:
        return [*super()._command(conf_path), "--replicas", "1"]


def measure(kind: str, inflight: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="txmq-bench-repl-", dir=Path(__file__).parent) as tmp:
        cls = DevWithReplica if kind == "sync-master+slave" else DevCluster
        cluster = cls(Path(tmp), dict(CONF)).start()
        try:
            install_event_loop()
            return asyncio.run(send_phase(cluster.namesrv_addr, "BenchRepl", inflight, seconds))
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inflight", default="1,128")
    args = parser.parse_args()
    kinds = ("single", "sync-master+slave")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for inflight in (int(x) for x in args.inflight.split(",")):
            for kind in kinds:
                results.setdefault((kind, inflight), []).append(measure(kind, inflight, args.seconds))
    print("| in flight | setup | msg/s (median) | p50 ms | p99 ms | ratio to single |")
    print("|---|---|---|---|---|---|")
    for inflight in (int(x) for x in args.inflight.split(",")):
        base = statistics.median(r["rate"] for r in results["single", inflight])
        for kind in kinds:
            runs = results[kind, inflight]
            rate = statistics.median(r["rate"] for r in runs)
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            print(f"| {inflight} | {kind} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
