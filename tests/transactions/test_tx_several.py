"""Several messages in one transaction, against real ``txmq dev`` processes: all visible on COMMIT or none, one
decision and one check-back for all of them, the limits refused before anything of the message is stored, and a
restart in between."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from txmq.client import Admin, LocalTransactionState, Message, MessageExt, TransactionProducer, sync
from txmq.errors import MQBrokerError, MQClientError
from txmq.protocol.record import Prop
from txmq.testing import aeventually

from .helpers import FAST, make_topic, pending_half_offsets, read_topic, unique

C, R, U = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


class Book:
    """The application's "database": transaction id -> decision, written by the local transaction."""

    def __init__(self, decide: LocalTransactionState = C, on_missing: LocalTransactionState = U) -> None:
        self.decide = decide
        self.on_missing = on_missing
        self.book: dict[str, LocalTransactionState] = {}
        self.seen: list[list[bytes]] = []  # what each local transaction saw
        self.checked: list[MessageExt] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, tx: Any, arg: Any) -> LocalTransactionState:
        with self.lock:
            self.seen.append([m.body for m in tx.messages])
            if self.decide is not U:
                self.book[tx.transaction_id] = self.decide
        return self.decide

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.checked.append(message)
            return self.book.get(message.transaction_id or "", self.on_missing)


async def bodies(ns: str, *topics: str) -> Counter[bytes]:
    seen: Counter[bytes] = Counter()
    for topic in topics:
        seen.update(m.body for m in await read_topic(ns, topic))
    return seen


async def producer(ns: str, listener: Any, group: str | None = None, **options: Any) -> TransactionProducer:
    p = TransactionProducer(group or unique("TPG"), ns, listener, instance_name=unique("p"), **{**FAST, **options})
    await p.start()
    return p


async def test_three_messages_on_two_topics_commit_together(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    orders, stock = await make_topic(ns), await make_topic(ns)
    book = Book(C)
    p = await producer(ns, book)
    try:
        async with p.transaction("order-1") as tx:
            await tx.send(Message(orders, b"created"))
            await tx.send(Message(stock, b"reserved-a"))
            await tx.send(Message(stock, b"reserved-b"))
        assert tx.state is C and tx.result is not None and tx.result.transaction_id == tx.transaction_id
        assert book.seen == [[b"created", b"reserved-a", b"reserved-b"]]  # the listener saw the whole transaction
        assert {r.message_queue.broker_name for r in tx.results} == {tx.results[0].message_queue.broker_name}
        # Acknowledged by the broker: visible now, every message once.
        assert await bodies(ns, orders, stock) == Counter([b"created", b"reserved-a", b"reserved-b"])
        delivered = await read_topic(ns, stock)
        assert {m.properties[Prop.TX_ID] for m in delivered} == {tx.transaction_id}
        assert sorted(m.properties[Prop.TX_SEQ] for m in delivered) == ["1", "2"]
        async with Admin(ns, instance_name=unique("a")) as admin:
            shown = await admin.transaction(tx.transaction_id)
        assert shown["state"] == "COMMITTED" and len(shown["messages"]) == 3
        assert [m["state"] for m in shown["messages"]] == ["COMMITTED"] * 3
        assert [m["topic"] for m in shown["messages"]] == [orders, stock, stock]
    finally:
        await p.shutdown()


async def test_a_rolled_back_transaction_shows_nothing_and_an_exception_rolls_back(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = await make_topic(ns)
    book = Book(R)
    p = await producer(ns, book)
    try:
        async with p.transaction() as tx:
            for i in range(3):
                await tx.send(Message(topic, b"no-%d" % i))
        assert tx.state is R
        with pytest.raises(ZeroDivisionError):
            async with p.transaction() as failed:
                await failed.send(Message(topic, b"boom-0"))
                await failed.send(Message(topic, b"boom-1"))
                1 / 0  # noqa: B018
        assert failed.state is R
        book.decide = C
        async with p.transaction() as kept:
            await kept.send(Message(topic, b"yes"))
        assert await bodies(ns, topic) == Counter([b"yes"])
        async with Admin(ns, instance_name=unique("a")) as admin:  # the cluster is shared: ask about these only
            for ended, state in ((tx, "ROLLED_BACK"), (failed, "ROLLED_BACK"), (kept, "COMMITTED")):
                shown = await admin.transaction(ended.transaction_id or "")
                assert [m["state"] for m in shown["messages"]] == [state] * len(ended.results)
    finally:
        await p.shutdown()


async def test_one_check_back_decides_the_whole_transaction(make_cluster: Any) -> None:
    cluster = make_cluster()
    ns = cluster.namesrv_addr
    a, b = await make_topic(ns), await make_topic(ns)
    book = Book(U, on_missing=U)  # the local transaction says nothing yet: the broker asks later
    p = await producer(ns, book)
    try:
        async with p.transaction() as tx:
            await tx.send(Message(a, b"a-0"))
            await tx.send(Message(b, b"b-1"))
            await tx.send(Message(a, b"a-2"))
        assert tx.state is U
        # A restart in between: the broker rebuilds the transaction from its three half messages, as one.
        cluster.kill()
        cluster.start()
        assert await bodies(ns, a, b) == Counter()
        with book.lock:
            book.book[tx.transaction_id or ""] = C
        await aeventually(lambda: book.checked, "a check-back", timeout=30, interval=0.2)
        await aeventually(
            lambda: _all_visible(ns, (a, b), 3),
            "the checked transaction visible",
            timeout=30,
            retry_on=(AssertionError,),
        )
        assert await bodies(ns, a, b) == Counter([b"a-0", b"b-1", b"a-2"])
        checked = {(m.transaction_id, m.properties.get(Prop.TX_MESSAGES)) for m in book.checked}
        assert checked == {(tx.transaction_id, "3")}  # one check covers them all: only the first message is asked
        assert not await pending_half_offsets(ns)
    finally:
        await p.shutdown()


async def _all_visible(ns: str, topics: tuple[str, ...], n: int) -> bool:
    assert sum((await bodies(ns, *topics)).values()) == n
    return True


async def test_too_many_messages_are_refused_before_they_are_stored(make_cluster: Any) -> None:
    cluster = make_cluster({"transactionMaxMessages": "3"})
    ns = cluster.namesrv_addr
    topic = await make_topic(ns)
    p = await producer(ns, Book(C))
    try:
        with pytest.raises(MQBrokerError, match="transactionMaxMessages=3"):
            async with p.transaction() as tx:
                for i in range(4):
                    await tx.send(Message(topic, b"m-%d" % i))
        assert len(tx.results) == 3 and tx.state is R
        p.max_messages_per_transaction = 2  # the client's own limit is checked before anything is sent
        with pytest.raises(MQClientError, match="already holds 2 messages"):
            async with p.transaction() as tx2:
                for i in range(3):
                    await tx2.send(Message(topic, b"n-%d" % i))
        assert len(tx2.results) == 2
        assert await bodies(ns, topic) == Counter() and not await pending_half_offsets(ns)
    finally:
        await p.shutdown()


async def test_a_topic_on_another_broker_is_refused(make_cluster: Any, add_broker: Any) -> None:
    cluster = make_cluster()
    ns = cluster.namesrv_addr
    add_broker(cluster, "broker-b")
    here, there = unique("Here"), unique("There")
    async with Admin(ns, instance_name=unique("a")) as admin:
        info = await admin.cluster_info()
        addrs = {name: ids[0] for name, ids in info.broker_addrs.items()}
        assert len(addrs) == 2, addrs
        (first, second) = sorted(addrs)
        await admin.create_topic(here, broker_addr=addrs[first])
        await admin.create_topic(there, broker_addr=addrs[second])
        for topic in (here, there):
            await aeventually(lambda t=topic: admin.topic_route(t), f"a route for {topic}", retry_on=(Exception,))
    p = await producer(ns, Book(C))
    try:
        with pytest.raises(MQClientError, match="go to one broker"):
            async with p.transaction() as tx:
                await tx.send(Message(here, b"here"))
                await tx.send(Message(there, b"there"))
        assert len(tx.results) == 1 and tx.state is R
        assert await bodies(ns, here, there) == Counter()
    finally:
        await p.shutdown()


def test_the_blocking_api_runs_the_local_transaction_in_the_callers_thread(txmq_cluster: Any) -> None:
    import asyncio

    ns = txmq_cluster.namesrv_addr
    topic = asyncio.run(make_topic(ns))
    threads: list[int] = []

    class Listener(Book):
        def execute_local_transaction(self, tx: Any, arg: Any) -> LocalTransactionState:
            threads.append(threading.get_ident())
            assert isinstance(tx, sync.Transaction) and arg == "arg"
            return super().execute_local_transaction(tx, arg)

    with sync.TransactionProducer(unique("TPG"), ns, Listener(C), instance_name=unique("p"), **FAST) as p:
        with p.transaction("arg") as tx:
            tx.send(Message(topic, b"one"))
            tx.send(Message(topic, b"two"))
        assert tx.state is C and threads == [threading.get_ident()]
    assert asyncio.run(bodies(ns, topic)) == Counter([b"one", b"two"])
