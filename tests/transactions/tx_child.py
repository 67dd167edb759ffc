"""A transactional producer process that prepares messages and then hangs inside its local transactions.

``python tx_child.py NAMESRV GROUP TOPIC COUNT``: sends COUNT transactional messages with bodies ``killed-<i>``
concurrently; each local transaction prints ``PREPARED <body> <msg_id>`` and never returns, so no END_TRANSACTION
is ever sent. The parent kills this process with SIGKILL once every line is out. Checks that reach this process
before that are answered UNKNOWN.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from txmq.client import LocalTransactionState, Message, TransactionProducer


class Hang:
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        print(f"PREPARED {message.body.decode()} {message.uniq_key}", flush=True)
        await asyncio.Event().wait()
        return LocalTransactionState.COMMIT  # never reached

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


async def main(namesrv: str, group: str, topic: str, count: int) -> None:
    producer = TransactionProducer(group, namesrv, Hang(), instance_name="child")
    await producer.start()
    await asyncio.gather(
        *(producer.send_message_in_transaction(Message(topic, f"killed-{i}".encode())) for i in range(count))
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
