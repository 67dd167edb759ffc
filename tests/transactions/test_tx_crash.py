"""Crash tests: kill -9 the broker around transaction decisions, restart it on the same data, and check that no
committed message is lost or stored twice, no rolled-back message is ever visible, and in-doubt ones are checked
again.

What "visible" means here is read straight from the broker over the wire after the restart: every message of the
real topic from offset 0 (a PullConsumer), and the half/op queues for what is still in doubt.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from txmq.broker.config import BrokerConfig
from txmq.client import LocalTransactionState, Message, TransactionProducer
from txmq.protocol.record import MessageRecord, Prop, TransactionType, decode_offset_msg_id, with_transaction_type
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore
from txmq.testing import aeventually

from .helpers import FAST, BookListener, make_topic, pending_half_offsets, read_topic, unique

pytestmark = pytest.mark.slow

C, R, U = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


async def settled(ns: str, topic: str, committed: set[bytes], timeout: float = 90) -> Counter[bytes]:
    """Wait until nothing is in doubt and every committed body is stored; returns the real topic's bodies."""
    seen: Counter[bytes] = Counter()

    async def done() -> bool:
        nonlocal seen
        seen = Counter(m.body for m in await read_topic(ns, topic))
        pending = await pending_half_offsets(ns)
        assert not pending and committed <= set(seen), (
            f"in doubt: {sorted(pending)[:10]}, missing {committed - set(seen)}"
        )
        return True

    await aeventually(done, "every transaction settled", timeout=timeout, interval=0.5, retry_on=(AssertionError,))
    return seen


def assert_exactly(seen: Counter[bytes], committed: set[bytes]) -> None:
    assert set(seen) == committed, f"extra {set(seen) - committed}, missing {committed - set(seen)}"
    assert [b for b, n in seen.items() if n > 1] == []


async def test_kill_between_prepare_and_end_transaction(make_cluster: Any) -> None:
    cluster = make_cluster(name="a")
    ns = cluster.namesrv_addr
    topic = await make_topic(ns)
    gate = asyncio.Event()
    entered: set[bytes] = set()
    gated = {f"gate-{i}".encode(): (C if i % 2 == 0 else R) for i in range(10)}
    book = dict(gated)

    class Listener(BookListener):
        async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            if message.body.startswith(b"gate"):
                entered.add(message.body)
                await gate.wait()
            return super().execute_local_transaction(message, arg)

    listener = Listener(lambda b: gated.get(b, C if b.startswith(b"pre-commit") else R), book)
    async with TransactionProducer(unique("TPG"), ns, listener, instance_name=unique("p"), **FAST) as producer:
        for i in range(5):
            await producer.send_message_in_transaction(Message(topic, f"pre-commit-{i}".encode()))
            await producer.send_message_in_transaction(Message(topic, f"pre-rollback-{i}".encode()))
        tasks = [asyncio.ensure_future(producer.send_message_in_transaction(Message(topic, body))) for body in gated]
        await aeventually(lambda: entered == set(gated), "every gated half message to be stored", timeout=30)
        cluster.kill()  # prepared and acknowledged, END_TRANSACTION not sent yet
        gate.set()
        results = await asyncio.gather(*tasks)  # END_TRANSACTION cannot reach the dead broker: logged, not raised
        assert [r.local_transaction_state for r in results] == list(gated.values())
        cluster.start()
        committed = {f"pre-commit-{i}".encode() for i in range(5)} | {b for b, s in gated.items() if s is C}
        seen = await settled(ns, topic, committed)
        assert listener.checked_bodies() >= set(gated)  # every in-doubt one was checked after the restart
    assert_exactly(seen, committed)


async def test_kill_between_commit_copy_and_op_marker(make_cluster: Any) -> None:
    cluster = make_cluster(name="b")
    ns = cluster.namesrv_addr
    topic = await make_topic(ns)
    bodies = [f"b-{i}".encode() for i in range(8)]
    first = BookListener(lambda _b: U)
    async with TransactionProducer(unique("TPG"), ns, first, instance_name=unique("p1"), **FAST) as producer:
        group = producer.group
        results = [await producer.send_message_in_transaction(Message(topic, b, keys=[b.decode()])) for b in bodies]
    cluster.kill()
    # The crash window of a COMMIT: the committed copy is stored, its op marker is not. Reproduce it in the dead
    # broker's store, the way the broker itself writes that copy.
    conf = BrokerConfig.from_file(cluster.data_dir / "broker.conf")
    conf.store_path_root_dir = str(cluster.data_dir / "store")
    store = MessageStore(
        StoreConfig.from_properties({**conf.store_properties(), "messageDelayLevel": conf.message_delay_level})
    )
    await asyncio.to_thread(store.open)
    try:
        for result in results[:4]:
            half = store.read_message(decode_offset_msg_id(result.offset_msg_id)[1])
            assert half is not None and half.properties[Prop.REAL_TOPIC] == topic
            props = {
                k: v for k, v in half.properties.items() if k not in (Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRAN_MSG)
            }
            copy = MessageRecord(
                topic=topic,
                body=half.body,
                queue_id=int(half.properties[Prop.REAL_QID]),
                flag=half.flag,
                sys_flag=with_transaction_type(half.sys_flag, TransactionType.COMMIT),
                born_timestamp=half.born_timestamp,
                born_host=half.born_host,
                store_host=half.store_host,
                prepared_transaction_offset=half.physical_offset,
                properties=props,
            )
            assert (await store.put(copy)).ok
    finally:
        await asyncio.to_thread(store.shutdown)
    cluster.start()
    # After the restart the group's database says every transaction committed.
    second = BookListener(book=dict.fromkeys(bodies, C))
    async with TransactionProducer(group, ns, second, instance_name=unique("p2"), **FAST):
        seen = await settled(ns, topic, set(bodies))
        assert second.checked_bodies() == set(bodies[4:])  # the half-committed ones were repaired, not re-checked
    assert_exactly(seen, set(bodies))


async def test_kill_during_a_check_round(make_cluster: Any) -> None:
    cluster = make_cluster(name="c")
    ns = cluster.namesrv_addr
    topic = await make_topic(ns)
    count = 400
    bodies = [f"c-{i}".encode() for i in range(count)]
    book = {b: (C if i % 2 == 0 else R) for i, b in enumerate(bodies)}
    first = BookListener(lambda _b: U)
    async with TransactionProducer(unique("TPG"), ns, first, instance_name=unique("p1"), **FAST) as producer:
        group = producer.group
        for start in range(0, count, 50):
            await asyncio.gather(
                *(producer.send_message_in_transaction(Message(topic, b)) for b in bodies[start : start + 50])
            )

    class Slow(BookListener):
        def check_local_transaction(self, message: Any) -> LocalTransactionState:
            import time

            time.sleep(0.005)  # keep checks flowing for a while: the kill lands in the middle of them
            return super().check_local_transaction(message)

    checker = Slow(book=book)
    async with TransactionProducer(group, ns, checker, instance_name=unique("p2"), check_threads=2, **FAST) as p:
        await aeventually(lambda: len(checker.checked) >= count // 4, "checks to start flowing", timeout=60)
        cluster.kill()
        at_kill = len(checker.checked)
        assert at_kill < count, "every check was answered before the kill; nothing was in flight"
        cluster.start()
        seen = await settled(ns, topic, {b for b, s in book.items() if s is C}, timeout=120)
        assert len(checker.checked) > at_kill  # in-doubt ones were checked again after the restart
        assert checker.checked_bodies() == set(bodies)
        assert p.checks_answered > 0
    assert_exactly(seen, {b for b, s in book.items() if s is C})
