"""``txmq demo orders``: the seeds' motivating example, an order service that publishes "order created" exactly when
its database insert commits.

Each order is inserted into an SQLite ``orders`` table inside the local transaction of a transactional message,
together with its row in ``txmq_transactions`` (:mod:`txmq.client.localtx`), which is what check-backs read:

* most orders commit, and the message is committed with them;
* some fail (payment declined): the insert is rolled back, and so is the message, which nobody ever sees;
* some "crash" between the database commit and END_TRANSACTION (the listener commits, then answers UNKNOWN, as a
  process dying at that moment would leave it): the broker checks back, the check finds the row, and the message is
  committed then;
* a few "crash" before the database commit: the check finds no row; it answers UNKNOWN during the grace period
  (the commit might still be on its way), then ROLLBACK.

A consumer builds the downstream view (a ``shipments`` table, one row per delivery). At the end the demo reconciles
the two tables: every committed order delivered once, nothing extra, nothing missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txmq.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
    TransactionProducer,
)
from txmq.client.localtx import DatabaseTransactionListener, LocalTransactionLog

FIRST_ORDER = 9527
GRACE_PERIOD = 3.0  # seconds; the embedded broker checks every second
Out = Callable[[str], None]


def outcome_of(order_id: int) -> str:
    """The scripted fate of an order: ``ok``; ``declined`` (rolled back); ``crash`` (the service dies after its
    database commit, a check-back commits the message); ``lost`` (it dies before, a check-back rolls it back)."""
    n = order_id - FIRST_ORDER
    if n % 5 == 3:
        return "declined"
    if n % 7 == 2:
        return "crash"
    if n % 11 == 6:
        return "lost"
    return "ok"


class PaymentDeclined(Exception):
    pass


class OrderDatabase:
    """The order service's own database (SQLite, one connection per call so any thread may use it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.closing(self.connect()) as db, db:
            db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT, amount INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS shipments (order_id INTEGER, msg_id TEXT)")

    def connect(self) -> sqlite3.Connection:
        # IMMEDIATE: a transaction takes the write lock at its first write, so concurrent writers wait, never fail.
        return sqlite3.connect(self.path, timeout=30, isolation_level="IMMEDIATE")

    def insert_order(self, conn: sqlite3.Connection, message: Message, order: dict[str, Any]) -> None:
        """The business write of the local transaction (the listener commits it); a declined payment raises."""
        conn.execute(
            "INSERT INTO orders (id, item, amount) VALUES (?, ?, ?)", (order["id"], order["item"], order["amount"])
        )
        if outcome_of(order["id"]) == "declined":
            raise PaymentDeclined(f"payment for order {order['id']} declined")

    def record_shipment(self, order_id: int, msg_id: str) -> None:
        with contextlib.closing(self.connect()) as db, db:
            db.execute("INSERT INTO shipments (order_id, msg_id) VALUES (?, ?)", (order_id, msg_id))

    def count(self, table: str) -> int:
        with contextlib.closing(self.connect()) as db:
            return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def order_ids(self) -> set[int]:
        with contextlib.closing(self.connect()) as db:
            return {row[0] for row in db.execute("SELECT id FROM orders")}

    def shipments(self) -> Counter[int]:
        with contextlib.closing(self.connect()) as db:
            return Counter(row[0] for row in db.execute("SELECT order_id FROM shipments"))


class OrderListener(DatabaseTransactionListener):
    """The order service's transaction listener: the order and its ``txmq_transactions`` row are written in one
    database transaction, and check-backs read that table (:mod:`txmq.client.localtx`). The scripted crashes
    answer UNKNOWN as a process dying at that moment would leave it."""

    def __init__(self, db: OrderDatabase, out: Out, grace_period: float) -> None:
        super().__init__(db.connect, db.insert_order, LocalTransactionLog(grace_period=grace_period))
        self.out = out
        self.checks: dict[int, LocalTransactionState] = {}  # order -> the last answer to a check
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, order: dict[str, Any]) -> LocalTransactionState:
        order_id = order["id"]
        if outcome_of(order_id) == "lost":
            self.out(f"  order {order_id}: the service 'crashed' before its database commit")
            return LocalTransactionState.UNKNOWN
        state = super().execute_local_transaction(message, order)
        if state is LocalTransactionState.ROLLBACK:
            self.out(f"  order {order_id}: payment declined; database rolled back -> ROLLBACK")
        elif outcome_of(order_id) == "crash":
            self.out(
                f"  order {order_id}: committed in the database, then the service 'crashed' before END_TRANSACTION"
            )
            return LocalTransactionState.UNKNOWN
        else:
            self.out(f"  order {order_id}: committed in the database -> COMMIT")
        return state

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        order_id = int(message.keys[0])
        state = super().check_local_transaction(message)
        with self.lock:
            self.checks[order_id] = state
        seen = {
            LocalTransactionState.COMMIT: "found in txmq_transactions -> COMMIT",
            LocalTransactionState.UNKNOWN: "not in txmq_transactions, within the grace period -> UNKNOWN",
            LocalTransactionState.ROLLBACK: "not in txmq_transactions after the grace period -> ROLLBACK",
        }[state]
        self.out(f"  check-back for order {order_id}: {seen}")
        return state

    def settled(self, lost: set[int]) -> bool:
        """Every order lost before its commit has been rolled back by a check."""
        with self.lock:
            return all(self.checks.get(o) is LocalTransactionState.ROLLBACK for o in lost)


@dataclass
class Reconciliation:
    orders: set[int]
    delivered: Counter[int]
    declined: set[int]
    checked: dict[int, LocalTransactionState] = field(default_factory=dict)
    recorded: int = 0  # rows in txmq_transactions

    @property
    def missing(self) -> set[int]:
        return self.orders - set(self.delivered)

    @property
    def extra(self) -> set[int]:
        return set(self.delivered) - self.orders

    @property
    def duplicated(self) -> set[int]:
        return {o for o, n in self.delivered.items() if n > 1}

    def answered(self, state: LocalTransactionState) -> int:
        """Orders whose last check-back answer was ``state``."""
        return sum(1 for s in self.checked.values() if s is state)

    @property
    def inconsistencies(self) -> int:
        unrecorded = abs(self.recorded - len(self.orders))  # a row exactly for each committed order
        return len(self.missing) + len(self.extra) + len(self.duplicated) + unrecorded


@contextlib.asynccontextmanager
async def embedded_cluster(data_dir: Path) -> AsyncIterator[str]:
    """A name server and a broker in this process (like ``txmq dev``) with one-second transaction checks."""
    from txmq.broker.broker import Broker
    from txmq.broker.config import BrokerConfig
    from txmq.namesrv.server import NameServer

    ns = NameServer()
    ns_port = await ns.start("127.0.0.1", 0)
    config = BrokerConfig(
        listen_port=0,
        broker_ip1="127.0.0.1",
        grpc_listen_port=0,
        metrics_port=0,
        namesrv_addr=f"127.0.0.1:{ns_port}",
        store_path_root_dir=str(data_dir / "store"),
        transaction_time_out=1000,
        transaction_check_interval=1000,
        mapped_file_size_commit_log=64 * 1024 * 1024,  # a demo needs no 1 GiB segment
    )
    broker = Broker(config)
    try:
        await broker.start("127.0.0.1")
        yield f"127.0.0.1:{ns_port}"
    finally:
        await broker.close()
        await ns.close()


async def _create_topic(namesrv: str, topic: str) -> None:
    async with Admin(namesrv, instance_name=f"demo-admin-{uuid.uuid4().hex[:6]}") as admin:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while True:
            info = await admin.cluster_info()
            if info.clusters:
                break
            if loop.time() > deadline:
                raise RuntimeError("no broker registered with the name server")
            await asyncio.sleep(0.1)
        for cluster in info.clusters:
            await admin.create_topic(topic, cluster=cluster, read_queue_nums=4, write_queue_nums=4)
        while True:
            try:
                await admin.topic_route(topic)
                return
            except Exception:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def run_orders(namesrv: str, work_dir: Path, count: int, out: Out, timeout: float = 45.0) -> Reconciliation:
    run = uuid.uuid4().hex[:8]
    topic = f"DemoOrders_{run}"
    db = OrderDatabase(work_dir / "orders.db")
    await _create_topic(namesrv, topic)
    out(f"topic {topic}; order database {db.path}")

    def ship(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            db.record_shipment(int(m.keys[0]), m.msg_id)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"DemoShipping_{run}",
        namesrv,
        instance_name=f"demo-shipping-{run}",
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        rebalance_interval=1.0,
    )
    consumer.subscribe(topic, "OrderCreated")
    consumer.register_listener(ship)
    await consumer.start()
    listener = OrderListener(db, out, GRACE_PERIOD)
    producer = TransactionProducer(
        f"DemoOrderService_{run}", namesrv, listener, instance_name=f"demo-orders-{run}", heartbeat_interval=2.0
    )
    await producer.start()
    declined: set[int] = set()
    try:
        out(f"placing {count} orders, starting with order {FIRST_ORDER}:")
        for order_id in range(FIRST_ORDER, FIRST_ORDER + count):
            order = {"id": order_id, "item": f"item-{order_id % 13}", "amount": 100 + order_id % 900}
            body = f'{{"orderId": {order_id}, "item": "{order["item"]}", "amount": {order["amount"]}}}'
            msg = Message(topic, body, tags="OrderCreated", keys=[str(order_id)])
            result = await producer.send_message_in_transaction(msg, order)
            if result.local_transaction_state is LocalTransactionState.ROLLBACK:
                declined.add(order_id)
        committed = db.order_ids()
        lost = {o for o in range(FIRST_ORDER, FIRST_ORDER + count) if outcome_of(o) == "lost"}
        out(f"waiting for delivery of {len(committed)} committed orders (in-doubt ones wait for a check-back)...")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (set(db.shipments()) >= committed and listener.settled(lost)) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # room for a duplicate or a stray message to arrive, if there were one
    finally:
        await producer.shutdown()
        await consumer.shutdown()
    with listener.lock:
        checked = dict(listener.checks)
    return Reconciliation(db.order_ids(), db.shipments(), declined, checked, db.count("txmq_transactions"))


def report(rec: Reconciliation, count: int, out: Out) -> None:
    out("")
    out("reconciliation")
    rows = [
        ("orders placed", count),
        ("declined, rolled back", len(rec.declined)),
        ("lost before the DB commit", f"{rec.answered(LocalTransactionState.ROLLBACK)} (rolled back by check-back)"),
        ("committed in the database", len(rec.orders)),
        ("  of which by check-back", rec.answered(LocalTransactionState.COMMIT)),
        ("rows in txmq_transactions", rec.recorded),
        ("messages delivered", sum(rec.delivered.values())),
        ("missing (in DB, not delivered)", sorted(rec.missing) or 0),
        ("extra (delivered, not in DB)", sorted(rec.extra) or 0),
        ("delivered more than once", sorted(rec.duplicated) or 0),
    ]
    for label, value in rows:
        out(f"  {label:<32}{value}")
    verdict = "consistent" if rec.inconsistencies == 0 else "INCONSISTENT"
    out(f"reconciliation: {rec.inconsistencies} inconsistencies ({verdict})")


async def main(count: int, namesrv: str | None, out: Out, data_dir: Path | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="txmq-demo-") as tmp:
        work = Path(data_dir) if data_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if namesrv:
            rec = await run_orders(namesrv, work, count, out)
        else:
            async with embedded_cluster(work) as ns:
                out(f"embedded name server {ns} and broker (data in {work}), transaction checks after 1 s")
                rec = await run_orders(ns, work, count, out)
    report(rec, count, out)
    return 0 if rec.inconsistencies == 0 else 1
