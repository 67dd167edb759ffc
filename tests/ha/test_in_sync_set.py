"""A master's acknowledgements in controller mode (txmq.broker.ha.HaMaster with a real store, and a slave speaking
the HA wire on loopback): who must have a send before it is acknowledged, how a slave joins the in-sync set, and
fencing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from txmq.broker.ha import HaMaster, ReplicaWait
from txmq.clock import SYSTEM_CLOCK
from txmq.ha.wire import Accept, Data, MasterFrameDecoder, encode_hello, encode_report
from txmq.protocol.record import MessageRecord

SEGMENT = 1 << 20
SLAVE = "127.0.0.1:20911"


def _record(i: int) -> MessageRecord:
    return MessageRecord(
        topic="T",
        body=f"m{i}".encode(),
        queue_id=0,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        born_host=("10.1.2.3", 40000),
        store_host=("10.9.8.7", 10911),
        properties={},
    )


@pytest.fixture
async def master(make_master: Callable[[int], Awaitable[HaMaster]]) -> HaMaster:
    ha = await make_master(SEGMENT)
    ha.required = frozenset()  # controller mode, in-sync set of the master alone
    return ha


async def _put(ha: HaMaster, i: int) -> int:
    await ha.store.put(_record(i))
    return ha.store.max_physical_offset()


class _Slave:
    """A slave on the HA wire that reports only when told to."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = MasterFrameDecoder()
        self.received = 0

    @classmethod
    async def connect(cls, ha: HaMaster) -> _Slave:
        reader, writer = await asyncio.open_connection("127.0.0.1", ha.port)
        slave = cls(reader, writer)
        writer.write(encode_hello("b", SEGMENT, replica_addr=SLAVE) + encode_report(0))
        return slave

    async def receive_up_to(self, end: int) -> None:
        while self.received < end:
            for frame in self.decoder.feed(await asyncio.wait_for(self.reader.read(65536), 5)):
                if isinstance(frame, Data) and frame.data:
                    self.received = frame.offset + len(frame.data)
                assert isinstance(frame, (Accept, Data)), frame

    def report(self) -> None:
        self.writer.write(encode_report(self.received))


async def _eventually(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_slave_joins_the_in_sync_set_only_once_it_has_everything_acknowledged(master: HaMaster) -> None:
    end1 = await _put(master, 1)
    assert await master.wait_replicated(end1, 1.0) is ReplicaWait.PUT_OK  # the master alone is the in-sync set
    slave = await _Slave.connect(master)
    await _eventually(lambda: master.slaves() and master.slaves()[0]["replica"] == SLAVE, "the slave greeted")
    await _eventually(lambda: master.slaves()[0]["state"] == "streaming", "the slave reported")
    # Connected but behind what was acknowledged: joining, not in sync; from now on sends wait for it.
    assert master.in_sync_replicas() == frozenset()
    end2 = await _put(master, 2)
    assert await master.wait_replicated(end2, 0.3) is ReplicaWait.FLUSH_SLAVE_TIMEOUT
    await slave.receive_up_to(end2)
    slave.report()
    await _eventually(lambda: master.slaves()[0]["ackedOffset"] == end2, "the report arrived")
    assert master.in_sync_replicas() == frozenset({SLAVE})
    master.set_required(frozenset({SLAVE}))  # the controller published it
    end3 = await _put(master, 3)
    waiting = asyncio.ensure_future(master.wait_replicated(end3, 5.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # the in-sync slave does not have it yet
    await slave.receive_up_to(end3)
    slave.report()
    assert await waiting is ReplicaWait.PUT_OK
    # The slave goes away: it drops out of what the master would publish, but sends wait for it until the
    # controller confirms the smaller set.
    slave.writer.close()
    await _eventually(lambda: not master.slaves(), "the link closed")
    assert master.in_sync_replicas() == frozenset()
    end4 = await _put(master, 4)
    waiting = asyncio.ensure_future(master.wait_replicated(end4, 5.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    master.set_required(frozenset())
    assert await waiting is ReplicaWait.PUT_OK


async def test_a_fenced_master_acknowledges_nothing(master: HaMaster) -> None:
    end = await _put(master, 1)
    master.lease_deadline = SYSTEM_CLOCK.monotonic() - 0.001  # the lease was not renewed in time
    assert master.fence_reason()
    assert await master.wait_replicated(end, 1.0) is ReplicaWait.FENCED
    master.lease_deadline = SYSTEM_CLOCK.monotonic() + 60
    assert await master.wait_replicated(end, 1.0) is ReplicaWait.PUT_OK
    master.set_required(frozenset({SLAVE}))  # a send now waits for a slave that is not there ...
    end2 = await _put(master, 2)
    waiting = asyncio.ensure_future(master.wait_replicated(end2, 5.0))
    await asyncio.sleep(0.05)
    master.fence("another master was elected")  # ... and the fence answers it at once
    assert await waiting is ReplicaWait.FENCED
    master.unfence()
    assert master.fence_reason() == ""


async def test_each_wait_times_out_at_its_own_deadline(master: HaMaster) -> None:
    """One timer serves all the waits: a later wait with a shorter timeout re-arms it for its own deadline."""
    master.set_required(frozenset({SLAVE}))  # every send waits for a slave that is not there
    end = await _put(master, 1)
    long_wait = asyncio.ensure_future(master.wait_replicated(end, 5.0))
    await asyncio.sleep(0.01)
    started = SYSTEM_CLOCK.monotonic()
    assert await master.wait_replicated(end, 0.2) is ReplicaWait.FLUSH_SLAVE_TIMEOUT
    assert SYSTEM_CLOCK.monotonic() - started < 2.0  # not held until the first wait's deadline
    assert not long_wait.done()
    master.set_required(frozenset())
    assert await long_wait is ReplicaWait.PUT_OK
