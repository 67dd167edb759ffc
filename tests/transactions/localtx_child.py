"""A producer process of the order service whose check-backs read its database (``txmq.client.localtx``).

``python localtx_child.py send NAMESRV GROUP TOPICS DB GRACE BODY WHEN``: sends one transaction with a message
BODY-<i> to each topic of TOPICS (comma-separated; one topic: ``send_message_in_transaction``, several: one
``producer.transaction``). The local transaction inserts the bodies into ``orders`` and, through
``DatabaseTransactionListener``, the transaction's row of ``txmq_transactions``. With WHEN=inside it prints
``IN_TX <tid>`` before the database commit and waits for a line on stdin (the parent kills it there, or writes
``commit``). Once the listener has committed it prints ``DECIDED <tid> <state>`` and hangs, so no END_TRANSACTION
is ever sent: the parent kills it there. Checks that reach this dying process are answered UNKNOWN
(``CHECK <tid> UNKNOW sender``).

``python localtx_child.py check NAMESRV GROUP DB GRACE``: another instance of the same producer group; it sends
nothing and answers checks from the table, printing ``CHECK <tid> <state> checker`` for each. DB is a spec for
``db_harness.connect``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from db_harness import connect
from txmq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.client.localtx import DatabaseTransactionListener, LocalTransactionLog

FAST = {"rebalance_interval": 1.0, "poll_name_server_interval": 2.0, "heartbeat_interval": 2.0}


def say(line: str) -> None:
    print(line, flush=True)


def insert_order(when: str) -> Any:
    def work(conn: Any, message: Any, arg: Any) -> None:
        for m in getattr(message, "messages", [message]):  # a transaction of several messages, or one message
            conn.cursor().execute(f"INSERT INTO orders (body) VALUES ('{m.body.decode()}')")
        if when == "inside":
            say(f"IN_TX {message.transaction_id}")
            sys.stdin.readline()

    return work


class Sender(DatabaseTransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
        state = super().execute_local_transaction(message, arg)
        say(f"DECIDED {message.transaction_id} {state.value}")
        threading.Event().wait()  # the process dies here, before END_TRANSACTION
        return state

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        say(f"CHECK {message.transaction_id} UNKNOW sender")
        return LocalTransactionState.UNKNOWN


class Checker(DatabaseTransactionListener):
    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        state = super().check_local_transaction(message)
        say(f"CHECK {message.transaction_id} {state.value} checker")
        return state


async def main(role: str, args: list[str]) -> None:
    if role == "send":
        namesrv, group, topics, db, grace, body, when = args
    else:
        namesrv, group, db, grace = args
    log = LocalTransactionLog(grace_period=float(grace))
    if role == "send":
        listener: DatabaseTransactionListener = Sender(lambda: connect(db), insert_order(when), log)
    else:
        listener = Checker(lambda: connect(db), insert_order("never"), log)
    async with TransactionProducer(group, namesrv, listener, instance_name=f"{role}-child", **FAST) as producer:
        say("READY")
        if role == "send":
            messages = [Message(t, f"{body}-{i}".encode()) for i, t in enumerate(topics.split(","))]
            if len(messages) == 1:
                await producer.send_message_in_transaction(messages[0])
            else:
                async with producer.transaction() as tx:
                    for m in messages:
                        await tx.send(m)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
