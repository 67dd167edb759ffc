"""Replication benchmark: SYNC_MASTER with one slave (``txmq dev --replicas 1``) against a single broker (``txmq
dev``), 1 KiB sends from txmq's asyncio client at 1 and 128 in flight, in one run. Both setups run side by side for
the whole run and take turns in short phases (the order flips every round), so that a busy machine's drift hits
both alike; the table gives the medians and the median of the rounds' ratios (target of issue 21: at least 0.7).
Not a test: nothing here asserts a time.

    .venv/bin/python bench/bench_replication.py [--seconds 2] [--rounds 7] [--inflight 1,128]
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
from cluster_harness import DevCluster
from txmq.net import install_event_loop

CONF = {"grpcListenPort": "0", "mappedFileSizeCommitLog": str(256 * 1024 * 1024)}


class DevWithReplica(DevCluster):
    def _command(self, conf_path: Path) -> list[str]:
        return [*super()._command(conf_path), "--replicas", "1"]


KINDS = ("single", "sync-master+slave")


async def run(clusters: dict[str, DevCluster], inflights: list[int], seconds: float, rounds: int) -> dict[Any, Any]:
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for n in range(rounds):
        for inflight in inflights:
            for kind in KINDS if n % 2 == 0 else reversed(KINDS):
                phase = await send_phase(clusters[kind].namesrv_addr, "BenchRepl", inflight, seconds)
                results.setdefault((kind, inflight), []).append(phase)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inflight", default="1,128")
    args = parser.parse_args()
    inflights = [int(x) for x in args.inflight.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="txmq-bench-repl-", dir=Path(__file__).parent) as tmp:
        clusters: dict[str, DevCluster] = {}
        try:
            # The pair first: its slave takes the master's port + 10, which the single broker's free ports then avoid.
            clusters["sync-master+slave"] = DevWithReplica(Path(tmp) / "pair", dict(CONF)).start()
            clusters["single"] = DevCluster(Path(tmp) / "single", dict(CONF)).start()
            install_event_loop()
            results = asyncio.run(run(clusters, inflights, args.seconds, args.rounds))
        finally:
            for cluster in clusters.values():
                cluster.stop()
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    print(f"{args.rounds} rounds of {args.seconds} s per setup and in-flight count")
    print("| in flight | setup | msg/s (median) | p50 ms | p99 ms | median ratio of the rounds |")
    print("|---|---|---|---|---|---|")
    for inflight in inflights:
        singles = results["single", inflight]
        for kind in KINDS:
            runs = results[kind, inflight]
            rate = statistics.median(r["rate"] for r in runs)
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            ratio = statistics.median(r["rate"] / b["rate"] for r, b in zip(runs, singles, strict=True))
            print(f"| {inflight} | {kind} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
