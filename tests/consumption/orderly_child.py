"""One orderly PushConsumer in its own process, logging each processing's start and end to an append-only file.

Usage: orderly_child.py NAMESRV GROUP TOPIC OUT_FILE LOCK_LIFETIME_S
Every line of OUT_FILE is JSON: {"ev": "start"|"end"|"fail", "q": queue id, "off": queue offset, "t": time_ns,
"pid": pid}. Lines are written with one os.write each (O_APPEND), so a kill -9 loses nothing already written.
A message whose body ends in "7" fails on its first processing here (the queue must suspend and retry it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import orjson

from txmq.client import ConsumeFromWhere, ConsumeOrderlyStatus, PushConsumer

PROCESSING_S = 0.03


async def main() -> None:
    namesrv, group, topic, out, lifetime = sys.argv[1:6]
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()
    failed_once: set[tuple[int, int]] = set()

    def log(ev: str, q: int, off: int) -> None:
        os.write(fd, orjson.dumps({"ev": ev, "q": q, "off": off, "t": time.time_ns(), "pid": pid}) + b"\n")

    async def listener(msgs: list) -> ConsumeOrderlyStatus:
        for m in msgs:
            log("start", m.queue_id, m.queue_offset)
            await asyncio.sleep(PROCESSING_S)
            key = (m.queue_id, m.queue_offset)
            if m.body.endswith(b"7") and key not in failed_once:
                failed_once.add(key)
                log("fail", m.queue_id, m.queue_offset)
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            log("end", m.queue_id, m.queue_offset)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(
        group,
        namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        suspend_current_queue_time=0.2,
        lock_max_live_seconds=float(lifetime),
        rebalance_interval=1.0,
    )
    consumer.subscribe(topic)
    consumer.register_listener(listener, orderly=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    print("ready", flush=True)
    await stop.wait()
    await consumer.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
