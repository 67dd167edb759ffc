"""Transactional messages end to end: txmq.client's TransactionProducer against a real ``txmq dev`` process.

The session cluster's broker.conf sets transactionTimeOut=1000 and transactionCheckInterval=1000, so check-backs
arrive within seconds. Waits are condition polls with generous caps, never timing assertions.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from txmq.client import (
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    SendStatus,
    TransactionProducer,
    sync,
)
from txmq.protocol.record import Prop, TransactionType, decode_offset_msg_id
from txmq.testing import aeventually, eventually

from .helpers import FAST, BookListener, Collector, make_topic, start_consumer, unique

pytestmark = pytest.mark.slow

C, R, U = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
CHILD = Path(__file__).with_name("tx_child.py")


def by_prefix(body: bytes) -> LocalTransactionState:
    kind = body.split(b"-")[0]
    if kind == b"boom":
        raise RuntimeError("the local transaction failed")
    return {b"commit": C, b"rollback": R, b"unknown": U}[kind]


async def test_commit_once_rollback_never_unknown_resolved_by_check(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = await make_topic(ns)
    collector = Collector()
    consumer = await start_consumer(ns, topic, collector)
    # The "database": unknown-* and boom-even committed locally, boom-odd rolled back; execute does not say so.
    book = {f"unknown-{i}".encode(): C for i in range(5)}
    book |= {f"boom-{i}".encode(): (C if i % 2 == 0 else R) for i in range(4)}
    listener = BookListener(by_prefix, book)
    bodies = [f"{kind}-{i}".encode() for kind in ("commit", "rollback", "unknown") for i in range(5)]
    bodies += [f"boom-{i}".encode() for i in range(4)]
    try:
        async with TransactionProducer(unique("TPG"), ns, listener, instance_name=unique("p"), **FAST) as producer:
            results = {}
            for body in bodies:
                results[body] = await producer.send_message_in_transaction(Message(topic, body, tags="tx"), arg=body)
            for body, result in results.items():
                assert result.status is SendStatus.SEND_OK and result.send_status is SendStatus.SEND_OK
                assert result.msg_id and result.transaction_id == result.msg_id and result.offset_msg_id
                assert result.message_queue.topic == topic
                expected = U if body.startswith((b"unknown", b"boom")) else by_prefix(body)
                assert result.local_transaction_state is expected, body
            committed = {b for b in bodies if b.startswith((b"commit", b"unknown"))} | {b"boom-0", b"boom-2"}
            assert len(committed) == 5 + 5 + 2
            await aeventually(lambda: set(collector.body_counts()) >= committed, "every committed message", timeout=60)
            # The in-doubt ones were resolved by checks; decided ones need none.
            assert listener.checked_bodies() >= {b for b in bodies if b.startswith((b"unknown", b"boom"))}
            checked = listener.checked[0]
            assert checked.topic == topic and checked.properties[Prop.PGROUP] == producer.group
            assert checked.transaction_id == checked.msg_id == results[checked.body].msg_id
            assert producer.checks_answered >= 9
        await asyncio.sleep(1.5)  # room for a duplicate or a stray rollback to show up, if there were one
    finally:
        await consumer.shutdown()
    counts = collector.body_counts()
    assert set(counts) == committed
    assert [b for b, n in counts.items() if n > 1] == []
    for m in collector.messages:
        assert m.msg_id == results[m.body].msg_id  # the consumer sees the producer's message id
        assert Prop.TRAN_MSG not in m.properties and m.tags == "tx"
        assert m.sys_flag & 0xC == TransactionType.COMMIT
        assert m.prepared_transaction_offset == decode_offset_msg_id(results[m.body].offset_msg_id)[1]


async def test_async_listener_and_exception_means_unknown(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = await make_topic(ns, queues=2)
    collector = Collector()
    consumer = await start_consumer(ns, topic, collector)
    seen_args: list[Any] = []

    class AsyncListener:
        async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            seen_args.append(arg)
            if arg == "fail":
                raise ValueError("database is down")
            return "COMMIT_MESSAGE"  # RocketMQ's name, as a string, is understood too

        async def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    try:
        async with TransactionProducer(unique("TPG"), ns, AsyncListener(), instance_name=unique("p"), **FAST) as p:
            ok = await p.send_message_in_transaction(Message(topic, b"async-ok"), "ok")
            failed = await p.send_message_in_transaction(Message(topic, b"async-fail"), "fail")
            assert ok.local_transaction_state is C and LocalTransactionState.COMMIT_MESSAGE is C
            assert failed.local_transaction_state is U
            await aeventually(
                lambda: set(collector.body_counts()) == {b"async-ok", b"async-fail"}, "both messages", timeout=60
            )
            assert p.checks_answered >= 1
        await asyncio.sleep(1)
    finally:
        await consumer.shutdown()
    assert seen_args == ["ok", "fail"]
    assert collector.body_counts() == {b"async-ok": 1, b"async-fail": 1}


def test_blocking_producer_runs_the_local_transaction_in_the_calling_thread(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = asyncio.run(make_topic(ns, queues=2))
    collector = Collector()
    threads: list[int] = []

    class Listener(BookListener):
        def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            threads.append(threading.get_ident())
            return super().execute_local_transaction(message, arg)

    listener = Listener(lambda b: C if b.endswith(b"0") else R)
    consumer = sync.PushConsumer(
        unique("CG"), ns, instance_name=unique("c"), consume_from_where=ConsumeFromWhere.FIRST_OFFSET, **FAST
    )
    consumer.subscribe(topic)
    consumer.register_listener(collector)
    with consumer:
        with sync.TransactionProducer(unique("TPG"), ns, listener, instance_name=unique("p"), **FAST) as producer:
            results = [
                producer.send_message_in_transaction(Message(topic, f"blocking-{i}".encode())) for i in range(20)
            ]
        assert [r.local_transaction_state for r in results] == [C if i % 10 == 0 else R for i in range(20)]
        assert threads == [threading.get_ident()] * 20
        eventually(
            lambda: set(collector.body_counts()) == {b"blocking-0", b"blocking-10"},
            "both committed messages",
            timeout=60,
        )
        time.sleep(1)
    assert collector.body_counts() == {b"blocking-0": 1, b"blocking-10": 1}


async def test_producer_killed_after_prepare_is_resolved_by_another_instance(txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = await make_topic(ns)
    group = unique("TPG")
    count = 10
    child = subprocess.Popen(
        [sys.executable, str(CHILD), ns, group, topic, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    prepared: dict[bytes, str] = {}
    try:
        assert child.stdout is not None
        while len(prepared) < count:
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
            assert line, f"the child exited early: {child.wait(10)} {child.stderr.read() if child.stderr else ''}"
            _, body, msg_id = line.split()
            prepared[body.encode()] = msg_id
    finally:
        child.kill()  # SIGKILL: no END_TRANSACTION, no unregister
        child.wait(10)
    assert child.returncode == -9
    collector = Collector()
    consumer = await start_consumer(ns, topic, collector)
    # The survivor never sent these messages; its database says even ones committed, odd ones rolled back.
    book = {f"killed-{i}".encode(): (C if i % 2 == 0 else R) for i in range(count)}
    listener = BookListener(book=book)
    committed = {b for b, s in book.items() if s is C}
    try:
        async with TransactionProducer(group, ns, listener, instance_name=unique("survivor"), **FAST) as survivor:
            await aeventually(
                lambda: listener.checked_bodies() == set(book), "checks of every orphaned message", timeout=60
            )
            await aeventually(lambda: set(collector.body_counts()) == committed, "the committed orphans", timeout=60)
            assert survivor.checks_answered >= count
            assert {m.body: m.msg_id for m in listener.checked} == prepared
        await asyncio.sleep(1.5)
    finally:
        await consumer.shutdown()
    assert collector.body_counts() == dict.fromkeys(committed, 1)
    assert {m.body: m.msg_id for m in collector.messages} == {b: prepared[b] for b in committed}
