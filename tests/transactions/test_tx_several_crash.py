"""Several messages per transaction through kill -9: a real ``txmq dev`` under a load of three-message transactions
(two topics) is killed with SIGKILL at random moments and restarted on the same data, ``TXMQ_SEVERAL_CRASH_TRIALS``
times (20 by default; 200 or more in a dedicated run). After every restart:

* each transaction is entirely visible or not visible at all;
* no message is visible twice;
* every transaction whose COMMIT the broker acknowledged is visible.

At the end the producer group answers the checks, and every transaction whose local transaction committed is
visible, the others never.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from txmq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.protocol.record import Prop
from txmq.testing import aeventually

from .helpers import FAST, make_topic, pending_half_offsets, read_topic, unique

pytestmark = pytest.mark.slow

TRIALS = int(os.environ.get("TXMQ_SEVERAL_CRASH_TRIALS", "20"))
IN_FLIGHT = 6
C, R = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK


class Book:
    """The producers' database: which transactions' local transactions committed."""

    def __init__(self) -> None:
        self.committed: set[str] = set()

    def execute_local_transaction(self, tx: Any, arg: Any) -> LocalTransactionState:
        self.committed.add(tx.transaction_id)
        return C

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return C if message.transaction_id in self.committed else R


async def visible(ns: str, topics: tuple[str, str]) -> tuple[dict[str, set[int]], Counter[bytes]]:
    """Transaction id -> the places of its visible messages, and how often each body is visible."""
    by_tx: dict[str, set[int]] = defaultdict(set)
    seen: Counter[bytes] = Counter()
    for topic in topics:
        for m in await read_topic(ns, topic):
            by_tx[m.properties[Prop.TX_ID]].add(int(m.properties[Prop.TX_SEQ]))
            seen[m.body] += 1
    return by_tx, seen


def check_invariants(by_tx: dict[str, set[int]], seen: Counter[bytes], acked: set[str], trial: int) -> None:
    partial = {t: sorted(s) for t, s in by_tx.items() if s != {0, 1, 2}}
    assert not partial, f"after kill {trial}: partly visible transactions {partial}"
    assert [b for b, n in seen.items() if n > 1] == [], f"after kill {trial}: messages visible twice"
    missing = acked - set(by_tx)
    assert not missing, f"after kill {trial}: acknowledged COMMITs not visible: {sorted(missing)[:5]}"


async def load(producer: TransactionProducer, topics: tuple[str, str], acked: set[str], stop: asyncio.Event) -> None:
    """Transactions of three messages, IN_FLIGHT at a time, until ``stop`` or the broker dies."""

    async def one(n: int) -> None:
        while not stop.is_set():
            try:
                async with producer.transaction() as tx:
                    for seq, topic in enumerate((topics[0], topics[1], topics[0])):
                        await tx.send(Message(topic, f"{n}-{seq}-{random.random()}".encode()))
            except Exception:
                return  # the broker is gone
            assert tx.transaction_id is not None
            acked.add(tx.transaction_id)  # END_TRANSACTION COMMIT answered SUCCESS

    await asyncio.gather(*(one(n) for n in range(IN_FLIGHT)))


@pytest.mark.timeout(max(300, 15 * TRIALS))
async def test_kill_9_under_a_load_of_several_message_transactions(make_cluster: Any) -> None:
    cluster = make_cluster(name="several")
    ns = cluster.namesrv_addr
    topics = (await make_topic(ns), await make_topic(ns))
    book = Book()
    group = unique("TPG")
    acked: set[str] = set()
    rng = random.Random(int(os.environ.get("TXMQ_CRASH_SEED", "20261125")))
    for trial in range(1, TRIALS + 1):
        producer = TransactionProducer(
            group, ns, book, instance_name=unique("p"), retry_times_when_send_failed=0, send_msg_timeout=2, **FAST
        )
        await producer.start()
        stop = asyncio.Event()
        running = asyncio.ensure_future(load(producer, topics, acked, stop))
        await asyncio.sleep(rng.uniform(0.05, 0.6))
        cluster.kill()
        stop.set()
        await asyncio.wait_for(running, 30)
        await producer.shutdown()
        cluster.start()
        by_tx, seen = await visible(ns, topics)
        check_invariants(by_tx, seen, acked, trial)
    assert acked, "no transaction was acknowledged in any trial: the load never ran"
    # The group answers the checks now: whatever was in doubt is decided by its local transaction.
    async with TransactionProducer(group, ns, book, instance_name=unique("checker"), **FAST):

        async def settled() -> bool:
            assert not await pending_half_offsets(ns)
            return True

        await aeventually(settled, "nothing in doubt", timeout=120, interval=0.5, retry_on=(AssertionError,))
    by_tx, seen = await visible(ns, topics)
    check_invariants(by_tx, seen, acked, TRIALS)
    assert set(by_tx) == book.committed & set(by_tx) and set(by_tx) >= acked
    assert set(by_tx) <= book.committed  # never a transaction whose local transaction did not commit
    print(
        f"{TRIALS} kills: {len(acked)} acknowledged COMMITs, {len(book.committed)} local commits, "
        f"{len(by_tx)} transactions visible ({sum(seen.values())} messages), none partly, none twice"
    )
