"""The gRPC door against the 4.x door, in one run, on one real `txmq dev` process (1 KiB messages, SYNC flush):

* 4.x door: txmq's own asyncio client (bench_e2e.send_phase) at 1 and 128 sends in flight;
* 5.x door, official client: `rocketmq-python-client` 5.1.2 (in .venv-py5, bench/py5_bench_child.py) at 1 and 128
  in flight, and its SimpleConsumer's receive+ack rate;
* 5.x door, raw stub: txmq's generated stubs on grpc.aio, 1 and 128 SendMessage in flight (the door without the
  official client's own cost).

Prints a Markdown table with each row's ratio to the 4.x door at the same in-flight count. Not a test.

    .venv/bin/python bench/bench_grpc.py [--seconds 5] [--inflight 1,128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import _percentile, send_phase
from cluster_harness import DevCluster
from txmq.net import install_event_loop

ROOT = Path(__file__).resolve().parent.parent
PY5 = Path(os.environ.get("TXMQ_PY5_VENV", ROOT / ".venv-py5")) / "bin" / "python"


def py5(*args: str, timeout: float = 300) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HOME"] = tempfile.mkdtemp(prefix="txmq-bench-py5-")
    proc = subprocess.run(
        [str(PY5), str(ROOT / "bench" / "py5_bench_child.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def raw_stub(endpoint: str, topic: str, inflight: int, seconds: float) -> dict[str, float]:
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
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await one()
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        elapsed = time.perf_counter() - started
    return {
        "msgs": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", default="1,128")
    args = parser.parse_args()
    install_event_loop()
    inflights = [int(x) for x in args.inflight.split(",")]
    rows: list[tuple[str, int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="txmq-bench-grpc-") as tmp:
        cluster = DevCluster(Path(tmp), {"mappedFileSizeCommitLog": str(256 * 1024 * 1024)}).start()
        try:
            for n in inflights:
                rows.append(
                    (
                        "4.x door, txmq client",
                        n,
                        asyncio.run(send_phase(cluster.namesrv_addr, "Bench4", n, args.seconds)),
                    )
                )
                rows.append(
                    (
                        "5.x door, official Python client",
                        n,
                        py5(
                            "send",
                            "--endpoints",
                            cluster.grpc_endpoint,
                            "--topic",
                            "Bench5",
                            "--inflight",
                            str(n),
                            "--seconds",
                            str(args.seconds),
                        ),
                    )
                )
                rows.append(
                    (
                        "5.x door, raw grpc.aio stub",
                        n,
                        asyncio.run(raw_stub(cluster.grpc_endpoint, "BenchRaw", n, args.seconds)),
                    )
                )
            sent = sum(int(r[2]["msgs"]) for r in rows if r[0].startswith("5.x door, official")) + 20 * len(inflights)
            received = py5(
                "receive",
                "--endpoints",
                cluster.grpc_endpoint,
                "--topic",
                "Bench5",
                "--count",
                str(sent),
                "--seconds",
                "120",
            )
        finally:
            cluster.stop()
    base = {n: r[2]["rate"] for r in rows for n in [r[1]] if r[0].startswith("4.x")}
    print("| path | in flight | msg/s | p50 ms | p99 ms | / 4.x door |")
    print("|---|---|---|---|---|---|")
    for name, n, r in rows:
        print(
            f"| {name} | {n} | {r['rate']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['rate'] / base[n]:.2f} |"
        )
    print(
        f"\nSimpleConsumer receive + ack (official Python client, batches of 32): {received['rate']:,.0f} msg/s "
        f"({int(received['msgs'])} messages)"
    )


if __name__ == "__main__":
    main()
