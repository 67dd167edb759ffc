"""The official C++ client (PyPI ``rocketmq``) consumes committed transactional messages like any others.

The C++ client has no transactional producer, so txmq.client's TransactionProducer sends; the C++ push consumer
must see each committed message once (and its tag and keys) and never a rolled-back or still-pending one.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest

from compat.cpp_client import cpp_processes
from txmq.client import LocalTransactionState, Message, TransactionProducer
from txmq.testing import aeventually

from .helpers import FAST, BookListener, make_topic, unique

pytestmark = pytest.mark.slow

C, R, U = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


@pytest.fixture
def cpp() -> Iterator[Any]:
    with cpp_processes() as start:
        yield start


async def test_cpp_push_consumer_sees_committed_transactional_messages(txmq_cluster: Any, cpp: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = await make_topic(ns)
    decide = {b"c": C, b"r": R, b"u": U}
    # u-* stay UNKNOWN at first; the check then commits the even ones and rolls back the odd ones.
    book = {f"u-{i}".encode(): (C if i % 2 == 0 else R) for i in range(6)}
    in_doubt = set(book)
    listener = BookListener(lambda b: decide[b[:1]], book)
    bodies = [f"{k}-{i}".encode() for k in ("c", "r", "u") for i in range(6)]
    committed = {b.decode() for b in bodies if b.startswith(b"c") or book.get(b) is C}
    async with TransactionProducer(unique("TPG"), ns, listener, instance_name=unique("p"), **FAST) as producer:
        for body in bodies:
            await producer.send_message_in_transaction(
                Message(topic, body, tags="TagTx", keys=[f"key-{body.decode()}"])
            )
        await aeventually(
            lambda: listener.checked_bodies() >= in_doubt, "the checks of the in-doubt messages", timeout=60
        )
        consumer = cpp(
            [
                "consume",
                "--namesrv",
                ns,
                "--topic",
                topic,
                "--group",
                unique("cppg"),
                "--expect",
                str(len(committed)),
                "--timeout",
                "90",
                "--linger",
                "2",
            ]
        )
        assert consumer.wait(150) == 0, consumer.events[-3:]
    received = consumer.received()
    counts = collections.Counter(e["body"] for e in received)
    assert set(counts) == committed
    assert [b for b, n in counts.items() if n > 1] == []
    assert all(e["tags"] == "TagTx" and e["topic"] == topic for e in received)
