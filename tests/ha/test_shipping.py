"""A master's shipping under back-pressure (txmq.broker.ha.HaMaster with a real store, and a slave speaking the HA
wire on loopback that does not read for a while): the store's writer thread writes straight to the socket until it
fills, the loop and the shipper task take over, and the slave still receives the log byte for byte, in order."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from txmq.broker.ha import HaMaster
from txmq.ha.wire import Accept, Data, MasterFrameDecoder, encode_hello, encode_report
from txmq.protocol.record import MessageRecord

SEGMENT = 4 << 20


@pytest.fixture
async def master(make_master: Callable[[int], Awaitable[HaMaster]]) -> HaMaster:
    ha = await make_master(SEGMENT)
    return ha


def _records(start: int, n: int) -> list[MessageRecord]:
    return [
        MessageRecord(
            topic="T",
            body=(b"%08d" % i) * 128,  # 1 KiB
            queue_id=i % 4,
            sys_flag=0,
            born_timestamp=1_700_000_000_000,
            born_host=("10.1.2.3", 40000),
            store_host=("10.9.8.7", 10911),
            properties={},
        )
        for i in range(start, start + n)
    ]


async def test_a_slave_that_reads_late_still_gets_the_log_byte_for_byte(master: HaMaster) -> None:
    store = master.store
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the master's writes fill it at once
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", master.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(encode_hello("b", SEGMENT, replica_addr="127.0.0.1:20911") + encode_report(0))
    for _ in range(500):
        if master.slaves() and master.slaves()[0]["state"] == "streaming":
            break
        await asyncio.sleep(0.01)
    # About 6 MiB appended while the slave reads nothing (in groups from the loop, so the writer thread ships).
    for batch in range(60):
        results = await asyncio.gather(*(store.put(r) for r in _records(batch * 100, 100)))
        assert all(r.ok for r in results)
    end = store.max_physical_offset()
    assert end > SEGMENT  # a segment's end-of-file blank is shipped too
    decoder = MasterFrameDecoder()
    received = bytearray()
    while len(received) < end:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert data, "the master closed the link"
        for frame in decoder.feed(data):
            assert isinstance(frame, (Accept, Data)), frame
            if isinstance(frame, Data) and frame.data:
                assert frame.offset == len(received), "bytes out of order or twice"
                received += frame.data
        writer.write(encode_report(len(received)))  # moves the master's window
    assert len(received) == end
    for start in range(0, end, SEGMENT):
        size = min(SEGMENT, end - start)
        assert bytes(received[start : start + size]) == store.read_bytes(start, size)
    writer.close()
