"""Child process for the kill -9 tests: appends in SYNC mode and prints one line per acknowledged record.

    python helpers_crash_child.py <store root> <seed> [SYNC_FLUSH|ASYNC_FLUSH]

Prints ``ready`` once the store is open, then for every acknowledged record
``<phys> <queue offset> <topic> <queue id> <size> <sys flag> <sha1 of body>``, flushing stdout after each line, so
every line the parent reads describes a record the store promised to keep.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from helpers_store import make_record, small_config

from txmq.store.config import FlushDiskType
from txmq.store.message_store import MessageStore

SEGMENT = 256 * 1024


async def main(root: str, seed: int, flush: str) -> None:
    cfg = small_config(root, mapped_file_size_commit_log=SEGMENT, flush_interval_consume_queue=50)
    cfg.flush_disk_type = FlushDiskType(flush)
    store = MessageStore(cfg)
    await store.start()
    out = sys.stdout
    out.write("ready\n")
    out.flush()

    async def appender(n: int) -> None:
        rnd = random.Random(seed * 1000 + n)
        i = 0
        while True:
            body = rnd.randbytes(rnd.choice([10, 100, 1000, 5000, rnd.randint(1, 20000)]))
            sys_flag = 0x4 if rnd.random() < 0.1 else 0  # some half messages: no queue entry
            rec = make_record(
                rnd.choice(["A", "B"]), rnd.randint(0, 2), body, uniq=f"{seed}-{n}-{i}", sys_flag=sys_flag
            )
            if rnd.random() < 0.1:
                batch = [rec, make_record(rec.topic, rec.queue_id, body[:50])]
                pairs = list(zip(await store.put_many(batch), batch, strict=True))
            else:
                pairs = [(await store.put(rec), rec)]
            for result, r in pairs:
                if not result.ok:
                    raise SystemExit(f"put failed: {result}")
                out.write(
                    f"{result.physical_offset} {result.queue_offset} {r.topic} {r.queue_id} {result.size} "
                    f"{r.sys_flag} {hashlib.sha1(r.body).hexdigest()}\n"
                )
            out.flush()
            i += 1

    await asyncio.gather(*(appender(n) for n in range(8)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "SYNC_FLUSH"))
