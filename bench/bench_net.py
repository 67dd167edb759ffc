"""Echo throughput of txmq.net on one loopback connection: 1 KiB bodies, 1 / 16 / 128 requests in flight.

Not a test. Prints msg/s per configuration and the ratio to the 1-in-flight figure measured in the same run (this
machine is noisy, so compare ratios). The handler is asynchronous (returns a coroutine), like a broker processor
that hands each append to the store and answers when it completes.

    .venv/bin/python bench/bench_net.py [--seconds 3] [--uvloop] [--sync-handler]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from txmq.net import Connection, Server, connect, install_event_loop
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand

BODY = b"x" * 1024
EXT = {"a": "bench_group", "b": "BenchTopic", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0", "h": "0"}


async def async_echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields={"msgId": "M", "queueId": "0", "queueOffset": "1"})


def sync_echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields={"msgId": "M", "queueId": "0", "queueOffset": "1"})


async def run_one(conn: Connection, in_flight: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, dict(EXT), BODY)
            resp = await conn.request(cmd, timeout=30)
            assert resp.code == 0
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done / (time.perf_counter() - start)


async def main(seconds: float, sync_handler: bool) -> None:
    server = await Server.start("127.0.0.1", 0, sync_echo if sync_handler else async_echo)
    conn = await connect("127.0.0.1", server.port)
    try:
        await run_one(conn, 16, 0.3)  # warm up
        baseline = None
        for in_flight in (1, 16, 128):
            rate = await run_one(conn, in_flight, seconds)
            baseline = baseline or rate
            print(f"in flight {in_flight:4d}: {rate:10,.0f} msg/s  ({rate / baseline:5.2f}x of 1 in flight)")
    finally:
        conn.close()
        await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (install_event_loop)")
    parser.add_argument("--sync-handler", action="store_true", help="handler returns the response directly")
    args = parser.parse_args()
    loop_name = install_event_loop() if args.uvloop else "asyncio"
    handler = "sync" if args.sync_handler else "async"
    print(f"txmq.net echo, 1 KiB bodies, one connection, {loop_name} loop, {handler} handler, {args.seconds:g}s each")
    asyncio.run(main(args.seconds, args.sync_handler))
