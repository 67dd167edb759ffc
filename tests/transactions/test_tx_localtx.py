"""Check-backs answered from the application's database (``txmq.client.localtx``) with real processes: a
``txmq dev`` broker, producer processes of one group killed with SIGKILL (``localtx_child.py``), and the database
shared between them (an SQLite file, or a private PostgreSQL server).

What the broker decided, and who decided it, is read from its transaction history (``Admin.transaction``); what
consumers can see, from the real topic itself. Each order body is inserted into the application's ``orders`` table
in the same database transaction as its ``txmq_transactions`` row.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from db_harness import connect, execute, query
from txmq.client import Admin, LocalTransactionState, Message, sync
from txmq.client.localtx import DatabaseTransactionListener
from txmq.testing import aeventually

from .helpers import make_topic, read_topic, unique

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("localtx_child.py")
TESTS = Path(__file__).parent.parent
C, R = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
LONG_GRACE = "600"  # no check may answer ROLLBACK while the test runs
SHORT_GRACE = "2"  # a missing row means ROLLBACK two seconds after the half message was born


class Child:
    """A ``localtx_child.py`` process; its stdout lines are collected as they come."""

    def __init__(self, *args: str) -> None:
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    async def line(self, prefix: str) -> str:
        def found() -> str | None:
            assert self.proc.poll() is None or any(x.startswith(prefix) for x in self.lines), "\n".join(self.lines)
            return next((x for x in list(self.lines) if x.startswith(prefix)), None)

        return await aeventually(found, f"a line {prefix!r} from {self.proc.args[2]}", timeout=60)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def children() -> Any:
    made: list[Child] = []

    def start(*args: str) -> Child:
        made.append(Child(*args))
        return made[-1]

    yield start
    for child in made:
        child.kill()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The order service's database, with its ``orders`` table."""
    if request.param == "sqlite":
        spec = f"sqlite:{tmp_path / 'orders.db'}"
    else:
        spec = f"postgresql:{request.getfixturevalue('postgres_db')}"
    execute(spec, "CREATE TABLE orders (body VARCHAR(64) PRIMARY KEY)")
    return spec


async def decided(ns: str, tid: str, state: str) -> dict[str, Any]:
    """The broker's record of transaction ``tid``, once it is in ``state``."""
    async with Admin(ns, instance_name=unique("admin")) as admin:

        async def reached() -> dict[str, Any] | None:
            detail = await admin.transaction(tid)
            assert detail["state"] in ("PREPARED", state), detail
            return detail if detail["state"] == state else None

        return await aeventually(reached, f"transaction {tid} {state}", timeout=60, interval=0.2)


async def transaction(ns: str, tid: str) -> dict[str, Any]:
    async with Admin(ns, instance_name=unique("admin")) as admin:
        return await admin.transaction(tid)


async def test_producer_killed_between_db_commit_and_end_transaction(txmq_cluster: Any, db: str, children: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group, body = await make_topic(ns), unique("LTX"), unique("order")
    sender = children("send", ns, group, topic, db, LONG_GRACE, body, "after")
    tid = (await sender.line("DECIDED")).split()[1]
    assert (await sender.line("DECIDED")).split()[2] == "COMMIT_MESSAGE"  # the database committed
    sender.kill()  # before END_TRANSACTION
    assert query(db, "SELECT body FROM orders") == [(f"{body}-0",)]
    checker = children("check", ns, group, db, LONG_GRACE)  # a second instance of the service
    detail = await decided(ns, tid, "COMMITTED")
    assert detail["resolvedBy"] == "check"
    await checker.line(f"CHECK {tid} COMMIT_MESSAGE checker")  # printed before the answer; read by a thread
    assert Counter(m.body for m in await read_topic(ns, topic)) == {f"{body}-0".encode(): 1}


async def test_several_messages_committed_by_a_check_from_one_row(txmq_cluster: Any, db: str, children: Any) -> None:
    """A transaction of three messages on two topics (``producer.transaction``) is one row; the producer dies
    between its database commit and END_TRANSACTION, and one check of another instance commits all three."""
    ns = txmq_cluster.namesrv_addr
    topics, group, body = [await make_topic(ns), await make_topic(ns)], unique("LTX"), unique("order")
    sent = ",".join([topics[0], topics[1], topics[0]])
    sender = children("send", ns, group, sent, db, LONG_GRACE, body, "after")
    tid = (await sender.line("DECIDED")).split()[1]
    sender.kill()
    assert query(db, "SELECT transaction_id FROM txmq_transactions") == [(tid,)]
    checker = children("check", ns, group, db, LONG_GRACE)
    assert (await decided(ns, tid, "COMMITTED"))["resolvedBy"] == "check"
    await checker.line(f"CHECK {tid} COMMIT_MESSAGE checker")  # printed before the answer; read by a thread
    delivered = Counter(m.body for m in [*await read_topic(ns, topics[0]), *await read_topic(ns, topics[1])])
    assert delivered == {f"{body}-{i}".encode(): 1 for i in range(3)}


async def test_producer_killed_before_db_commit(txmq_cluster: Any, db: str, children: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group, body = await make_topic(ns), unique("LTX"), unique("order")
    sender = children("send", ns, group, topic, db, SHORT_GRACE, body, "inside")
    tid = (await sender.line("IN_TX")).split()[1]  # order and row written, not committed
    sender.kill()
    checker = children("check", ns, group, db, SHORT_GRACE)
    detail = await decided(ns, tid, "ROLLED_BACK")  # once the grace period has passed
    assert detail["resolvedBy"] == "check" and detail["deliveredMsgId"] is None
    await checker.line(f"CHECK {tid} ROLLBACK_MESSAGE checker")  # printed before the answer; read by a thread
    assert await read_topic(ns, topic) == []
    assert query(db, "SELECT body FROM orders") == []
    assert query(db, "SELECT transaction_id FROM txmq_transactions") == []


async def test_slow_commit_is_unknown_then_committed_by_a_check(txmq_cluster: Any, db: str, children: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group, body = await make_topic(ns), unique("LTX"), unique("order")
    checker = children("check", ns, group, db, LONG_GRACE)
    await checker.line("READY")
    sender = children("send", ns, group, topic, db, LONG_GRACE, body, "inside")
    tid = (await sender.line("IN_TX")).split()[1]
    # The database transaction is open: no row yet. Checks come every second, and the table says "not yet".
    assert await checker.line(f"CHECK {tid} ") == f"CHECK {tid} UNKNOW checker"
    assert (await transaction(ns, tid))["state"] == "PREPARED"
    sender.tell("commit")
    assert (await sender.line("DECIDED")).split()[2] == "COMMIT_MESSAGE"  # committed, END_TRANSACTION never sent
    await checker.line(f"CHECK {tid} COMMIT_MESSAGE checker")
    detail = await decided(ns, tid, "COMMITTED")
    assert detail["resolvedBy"] == "check"
    assert "ROLLBACK" not in {entry["answer"] for entry in detail["checkLog"]}
    sender.kill()
    assert Counter(m.body for m in await read_topic(ns, topic)) == {f"{body}-0".encode(): 1}


def test_blocking_producer_commits_with_its_row_and_rolls_back_a_declined_order(txmq_cluster: Any, db: str) -> None:
    """The README's example: the blocking TransactionProducer with the listener, the business write in the
    sending thread."""
    ns = txmq_cluster.namesrv_addr
    topic = asyncio.run(make_topic(ns))

    def place(conn: Any, message: Message, order: dict[str, Any]) -> None:
        conn.cursor().execute(f"INSERT INTO orders (body) VALUES ('{message.body.decode()}')")
        if order["declined"]:
            raise ValueError("payment declined")

    listener = DatabaseTransactionListener(lambda: connect(db), place)
    with sync.TransactionProducer(unique("LTX"), ns, listener, instance_name=unique("p")) as producer:
        ok = producer.send_message_in_transaction(Message(topic, b"ok"), {"declined": False})
        no = producer.send_message_in_transaction(Message(topic, b"no"), {"declined": True})
        assert (ok.local_transaction_state, no.local_transaction_state) == (C, R)
        for result, state in ((ok, "COMMITTED"), (no, "ROLLED_BACK")):
            assert asyncio.run(decided(ns, result.transaction_id, state))["resolvedBy"] == "producer"
    assert query(db, "SELECT body FROM orders") == [("ok",)]
    assert query(db, "SELECT transaction_id FROM txmq_transactions") == [(ok.transaction_id,)]
    assert Counter(m.body for m in asyncio.run(read_topic(ns, topic))) == {b"ok": 1}
