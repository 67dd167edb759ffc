"""Transactional-message benchmark.

1. Throughput through a real ``txmq dev`` process (SYNC flush, 1 KiB bodies, loopback): plain sync sends against
   transactional sends (half message, a no-op local transaction, END_TRANSACTION COMMIT) in the same run, at 1 and
   64 in flight. A transactional window ends only when every committed copy is stored in the real topic, so the
   rate counts messages a consumer can see, not just prepares. Plain and transactional windows alternate
   (``--rounds`` of each, ``--seconds`` long) and the medians are compared: on a shared VM one window can run 20 %
   slow, which a single pair of windows would take for a difference between the two kinds.
2. The cost of one check round: an in-process broker on a FakeClock with N in-doubt half messages (written straight
   into its store before start), a producer connection of the group, all N due. Wall time of the round that sends N
   checks, of the next round (nothing due), and of the start-up rebuild of the pending table.

Not a test: it prints figures and ratios, and asserts no time.

    .venv/bin/python bench/bench_tx.py [--seconds 2] [--rounds 5] [--inflight 1,64] [--pending 100,100000]
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
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    async def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


async def _stored(admin: Admin, topic: str) -> int:
    stats = await admin.topic_stats(topic)
    return sum(t.max_offset - t.min_offset for t in stats.values())


async def throughput(namesrv: str, inflight: int, seconds: float, transactional: bool) -> dict[str, float]:
    kind = "tx" if transactional else "plain"
    topic = f"BenchTx_{kind}_{inflight}"
    admin = Admin(namesrv)
    await admin.start()
    info = await admin.cluster_info()
    await admin.create_topic(topic, cluster=next(iter(info.clusters)), read_queue_nums=4, write_queue_nums=4)
    if transactional:
        producer: Producer = TransactionProducer(f"bench_tpg_{inflight}", namesrv, NoOp())
    else:
        producer = Producer(f"bench_pg_{inflight}", namesrv)
    await producer.start()

    async def one() -> None:
        if transactional:
            await producer.send_message_in_transaction(Message(topic, BODY))  # type: ignore[attr-defined]
        else:
            await producer.send(Message(topic, BODY))

    for _ in range(20):  # warm up: route, connection
        await one()
    before = await _stored(admin, topic)
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            await one()
            sent += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    while await _stored(admin, topic) - before < sent:  # every commit stored (END_TRANSACTION is oneway)
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    await producer.shutdown()
    await admin.shutdown()
    return {"msgs": sent, "rate": sent / elapsed}


def compare(namesrv: str, inflight: int, seconds: float, rounds: int) -> tuple[float, float, list[float]]:
    """Alternating plain and transactional windows: (median plain rate, median transactional rate, the ratios of
    each round's pair, ascending)."""
    run(throughput(namesrv, inflight, min(seconds, 1.0), False))  # warm up both kinds
    run(throughput(namesrv, inflight, min(seconds, 1.0), True))
    plain: list[float] = []
    tx: list[float] = []
    for i in range(rounds):
        plain.append(run(throughput(namesrv, inflight, seconds, False))["rate"])
        tx.append(run(throughput(namesrv, inflight, seconds, True))["rate"])
        print(
            f"in-flight {inflight:3d} round {i + 1}: plain {plain[-1]:7.0f} msg/s, transactional {tx[-1]:7.0f} msg/s, "
            f"ratio {tx[-1] / plain[-1]:.2f}",
            flush=True,
        )
    p, t = statistics.median(plain), statistics.median(tx)
    paired = sorted(b / a for a, b in zip(plain, tx, strict=True))
    print(f"in-flight {inflight:3d}: median plain {p:7.0f} msg/s, transactional {t:7.0f} msg/s, ratio {t / p:.2f}")
    return p, t, paired


async def check_round(root: Path, pending: int) -> dict[str, float]:
    import orjson

    from txmq.broker.broker import Broker
    from txmq.broker.config import BrokerConfig
    from txmq.broker.topics import TRANS_HALF_TOPIC
    from txmq.broker.txn import TransactionService
    from txmq.net import connect
    from txmq.protocol.codes import RequestCode
    from txmq.protocol.frame import RemotingCommand
    from txmq.protocol.record import MessageRecord, Prop
    from txmq.store.config import StoreConfig
    from txmq.store.message_store import MessageStore
    from txmq.testing import FakeClock

    clock = FakeClock()
    config = BrokerConfig(
        listen_port=0,
        broker_ip1="127.0.0.1",
        grpc_listen_port=0,
        store_path_root_dir=str(root / "store"),
        flush_disk_type="ASYNC_FLUSH",
        client_channel_expired_seconds=10**7,
        transaction_time_out=6_000,
        transaction_check_interval=60_000,
        max_pending_transactions=max(pending * 2, 10_000),
    )
    store = MessageStore(
        StoreConfig.from_properties({**config.store_properties(), "messageDelayLevel": config.message_delay_level}),
        clock=clock,
    )
    await store.start()
    now = clock.now_ms()
    for start in range(0, pending, 1000):
        batch = [
            MessageRecord(
                topic=TRANS_HALF_TOPIC,
                body=b"y" * 256,
                queue_id=0,
                born_timestamp=now,
                properties={
                    Prop.REAL_TOPIC: "BenchReal",
                    Prop.REAL_QID: str(i % 4),
                    Prop.PGROUP: "BenchTPG",
                    Prop.UNIQ_KEY: f"BENCH{i:027d}",
                    Prop.TRAN_MSG: "true",
                },
            )
            for i in range(start, min(pending, start + 1000))
        ]
        results = await store.put_many(batch)
        assert all(r.ok for r in results)
    await store.close()

    broker = Broker(config, clock=clock)
    TransactionService.tick_seconds = 10**9  # this benchmark runs the rounds itself (the service starts with start)
    t0 = time.perf_counter()
    await broker.start("127.0.0.1")
    rebuild = time.perf_counter() - t0
    svc = broker.transactions
    assert len(svc.pending) == pending, len(svc.pending)
    received = 0
    all_in = asyncio.Event()

    def on_request(_conn: Any, cmd: RemotingCommand) -> None:
        nonlocal received
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            received += 1
            if received == pending:
                all_in.set()

    conn = await connect("127.0.0.1", config.listen_port, on_request, clock=clock)
    body = orjson.dumps({"clientID": "bench", "producerDataSet": [{"groupName": "BenchTPG"}]})
    await conn.request(RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), timeout=10)
    await clock.advance(7)  # past transactionTimeOut; the check loop is parked, this benchmark runs the rounds
    t0 = time.perf_counter()
    sent = await svc.check_round()
    round_s = time.perf_counter() - t0
    await asyncio.wait_for(all_in.wait(), 300)
    delivered_s = time.perf_counter() - t0
    await clock.advance(1)
    t0 = time.perf_counter()
    idle_sent = await svc.check_round()
    idle_s = time.perf_counter() - t0
    conn.close()
    await broker.close()
    assert sent == pending and idle_sent == 0
    return {"rebuild": rebuild, "round": round_s, "delivered": delivered_s, "idle": idle_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one window")
    parser.add_argument("--rounds", type=int, default=5, help="windows of each kind, alternating")
    parser.add_argument("--inflight", default="1,64")
    parser.add_argument("--pending", default="100,100000")
    args = parser.parse_args()
    rows = []
    if args.inflight:
        with tempfile.TemporaryDirectory(prefix="txmq-bench-tx-") as tmp:
            cluster = DevCluster(Path(tmp), {"flushDiskType": "SYNC_FLUSH"}).start()
            try:
                for n in (int(x) for x in args.inflight.split(",")):
                    rows.append((n, *compare(cluster.namesrv_addr, n, args.seconds, args.rounds)))
            finally:
                cluster.stop()
    rounds = []
    for n in (int(x) for x in args.pending.split(",") if x):
        with tempfile.TemporaryDirectory(prefix="txmq-bench-txcheck-") as tmp:
            r = asyncio.run(check_round(Path(tmp), n))
        rounds.append((n, r))
        print(
            f"{n:7d} in doubt: rebuild {r['rebuild'] * 1000:8.1f} ms, round {r['round'] * 1000:8.1f} ms "
            f"(all {n} checks received after {r['delivered'] * 1000:8.1f} ms), idle round {r['idle'] * 1000:6.2f} ms",
            flush=True,
        )
    if rows:
        print(
            "\n| in flight | plain sync msg/s (median) | transactional msg/s (median) | ratio of medians "
            "| paired ratios, lowest-highest |\n|---|---|---|---|---|"
        )
        for n, plain, tx, paired in rows:
            print(f"| {n} | {plain:.0f} | {tx:.0f} | {tx / plain:.2f} | {paired[0]:.2f}-{paired[-1]:.2f} |")
    if rounds:
        print(
            "\n| in doubt | rebuild at start ms | check round ms (all due) | checks received ms | round, none due ms |"
            "\n|---|---|---|---|---|"
        )
        for n, r in rounds:
            print(
                f"| {n} | {r['rebuild'] * 1000:.1f} | {r['round'] * 1000:.1f} | {r['delivered'] * 1000:.1f} | "
                f"{r['idle'] * 1000:.2f} |"
            )


if __name__ == "__main__":
    main()
