"""Several messages in one transaction against the same messages sent plainly (issue 15's target).

A real ``txmq dev`` (SYNC_FLUSH, 1 KiB bodies, loopback), ``--inflight`` workers. One unit of work is either ten
plain sync sends one after the other, or one transaction of ten messages (ten half messages one after the other, a
no-op local transaction, one acknowledged END_TRANSACTION COMMIT; the COMMIT is answered once every copy is stored, so
the unit ends when a consumer can see all ten). Windows of the two kinds alternate (``--rounds`` of each) and the
medians are compared: the time of a transaction of ten against the time of ten plain sends. Target: at most 1.5.

Not a test: it prints figures and asserts no time.

    .venv/bin/python bench/bench_tx_several.py [--messages 10] [--inflight 16] [--seconds 3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import run
from cluster_harness import DevCluster
from txmq.client import Admin, LocalTransactionState, Message, Producer, TransactionProducer

BODY = b"x" * 1024


class NoOp:
    async def execute_local_transaction(self, tx: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    async def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


async def window(namesrv: str, kind: str, messages: int, inflight: int, seconds: float) -> float:
    """Units of work per second."""
    topic = f"BenchSeveral_{kind}"
    async with Admin(namesrv) as admin:
        info = await admin.cluster_info()
        await admin.create_topic(topic, cluster=next(iter(info.clusters)), read_queue_nums=4, write_queue_nums=4)
    if kind == "tx":
        producer: Producer = TransactionProducer("bench_several_tpg", namesrv, NoOp())
    else:
        producer = Producer("bench_several_pg", namesrv)
    await producer.start()

    async def unit() -> None:
        if kind == "tx":
            async with producer.transaction() as tx:  # type: ignore[attr-defined]
                for _ in range(messages):
                    await tx.send(Message(topic, BODY))
        else:
            for _ in range(messages):
                await producer.send(Message(topic, BODY))

    for _ in range(5):
        await unit()
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await unit()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    await producer.shutdown()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain: list[float] = []
    tx: list[float] = []
    with tempfile.TemporaryDirectory(prefix="txmq-bench-several-") as tmp:
        cluster = DevCluster(Path(tmp), {"flushDiskType": "SYNC_FLUSH"}).start()
        try:
            ns = cluster.namesrv_addr
            run(window(ns, "plain", args.messages, args.inflight, 1.0))  # warm up both kinds
            run(window(ns, "tx", args.messages, args.inflight, 1.0))
            for i in range(args.rounds):
                plain.append(run(window(ns, "plain", args.messages, args.inflight, args.seconds)))
                tx.append(run(window(ns, "tx", args.messages, args.inflight, args.seconds)))
                print(
                    f"round {i + 1}: {plain[-1]:7.1f} x {args.messages} plain sends/s, {tx[-1]:7.1f} transactions of "
                    f"{args.messages}/s, time ratio {plain[-1] / tx[-1]:.2f}",
                    flush=True,
                )
        finally:
            cluster.stop()
    p, t = statistics.median(plain), statistics.median(tx)
    paired = sorted(a / b for a, b in zip(plain, tx, strict=True))
    print(
        f"\n| {args.messages} messages, {args.inflight} in flight | units/s (median) | messages/s |\n|---|---|---|\n"
        f"| {args.messages} plain sends | {p:.1f} | {p * args.messages:.0f} |\n"
        f"| one transaction of {args.messages} | {t:.1f} | {t * args.messages:.0f} |\n\n"
        f"time of a transaction of {args.messages} / time of {args.messages} plain sends: {p / t:.2f} (median rates; "
        f"paired {paired[0]:.2f}-{paired[-1]:.2f}); target at most 1.5"
    )


if __name__ == "__main__":
    main()
