"""``txmq demo orders``: the seeds' motivating example, an order service that publishes "order created" exactly when
its database insert commits.

Each order is inserted into an SQLite ``orders`` table inside the local transaction of a transactional message:

* most orders commit, and the message is committed with them;
* some fail (payment declined): the insert is rolled back, and so is the message, which nobody ever sees;
* some "crash" between the database commit and END_TRANSACTION (the listener commits, then answers UNKNOWN, as a
  process dying at that moment would leave it): the broker checks back, the check finds the order in the database,
  and the message is committed then;
* a few "crash" before the database commit: the check finds no order, and the message is rolled back.

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

FIRST_ORDER = 9527
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
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT, amount INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS shipments (order_id INTEGER, msg_id TEXT)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def create_order(self, order_id: int, item: str, amount: int) -> None:
        """Insert the order in one database transaction; a declined payment rolls it back."""
        db = self._connect()
        try:
            db.execute("BEGIN")
            db.execute("INSERT INTO orders (id, item, amount) VALUES (?, ?, ?)", (order_id, item, amount))
            if outcome_of(order_id) == "declined":
                raise PaymentDeclined(f"payment for order {order_id} declined")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def has_order(self, order_id: int) -> bool:
        with contextlib.closing(self._connect()) as db:
            return db.execute("SELECT 1 FROM orders WHERE id = ?", (order_id,)).fetchone() is not None

    def record_shipment(self, order_id: int, msg_id: str) -> None:
        with contextlib.closing(self._connect()) as db:
            db.execute("INSERT INTO shipments (order_id, msg_id) VALUES (?, ?)", (order_id, msg_id))

    def order_ids(self) -> set[int]:
        with contextlib.closing(self._connect()) as db:
            return {row[0] for row in db.execute("SELECT id FROM orders")}

    def shipments(self) -> Counter[int]:
        with contextlib.closing(self._connect()) as db:
            return Counter(row[0] for row in db.execute("SELECT order_id FROM shipments"))


class OrderListener:
    """The transaction listener of the order service."""

    def __init__(self, db: OrderDatabase, out: Out) -> None:
        self.db = db
        self.out = out
        self.checks: list[int] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, order: dict[str, Any]) -> LocalTransactionState:
        order_id = order["id"]
        if outcome_of(order_id) == "lost":
            self.out(f"  order {order_id}: the service 'crashed' before its database commit")
            return LocalTransactionState.UNKNOWN
        try:
            self.db.create_order(order_id, order["item"], order["amount"])
        except PaymentDeclined as exc:
            self.out(f"  order {order_id}: {exc}; database rolled back -> ROLLBACK")
            return LocalTransactionState.ROLLBACK
        if outcome_of(order_id) == "crash":
            self.out(
                f"  order {order_id}: committed in the database, then the service 'crashed' before END_TRANSACTION"
            )
            return LocalTransactionState.UNKNOWN
        self.out(f"  order {order_id}: committed in the database -> COMMIT")
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        order_id = int(message.keys[0])
        found = self.db.has_order(order_id)
        with self.lock:
            self.checks.append(order_id)
        verdict = "COMMIT" if found else "ROLLBACK"
        self.out(f"  check-back for order {order_id}: {'found' if found else 'not found'} in the database -> {verdict}")
        return LocalTransactionState.COMMIT if found else LocalTransactionState.ROLLBACK


@dataclass
class Reconciliation:
    orders: set[int]
    delivered: Counter[int]
    declined: set[int]
    checked: list[int] = field(default_factory=list)

    @property
    def missing(self) -> set[int]:
        return self.orders - set(self.delivered)

    @property
    def extra(self) -> set[int]:
        return set(self.delivered) - self.orders

    @property
    def duplicated(self) -> set[int]:
        return {o for o, n in self.delivered.items() if n > 1}

    @property
    def inconsistencies(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.duplicated)


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
    listener = OrderListener(db, out)
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
        out(f"waiting for delivery of {len(committed)} committed orders (in-doubt ones wait for a check-back)...")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while set(db.shipments()) < committed and loop.time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # room for a duplicate or a stray message to arrive, if there were one
    finally:
        await producer.shutdown()
        await consumer.shutdown()
    with listener.lock:
        checked = list(listener.checks)
    return Reconciliation(db.order_ids(), db.shipments(), declined, checked)


def report(rec: Reconciliation, count: int, out: Out) -> None:
    out("")
    out("reconciliation")
    rows = [
        ("orders placed", count),
        ("declined, rolled back", len(rec.declined)),
        ("lost before the DB commit", f"{len(set(rec.checked) - rec.orders)} (rolled back by check-back)"),
        ("committed in the database", len(rec.orders)),
        ("  of which by check-back", len(set(rec.checked) & rec.orders)),
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
