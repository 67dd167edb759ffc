"""Transactional messages on an in-process broker driven by a FakeClock: prepare, END_TRANSACTION, checks, restart."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from txmq.broker.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from txmq.net import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.record import (
    MessageRecord,
    TransactionType,
    decode_offset_msg_id,
    decode_record,
    decode_records,
    encode_properties,
)
from txmq.testing import InProcessBroker, aeventually
from txmq.txn.records import commit_copy

COMMIT = 8
ROLLBACK = 12
_uniq = itertools.count(1)


class Harness(InProcessBroker):
    """A broker on loopback (restartable on the same store) plus raw producer connections."""

    def __init__(self, root: Path) -> None:
        super().__init__(
            root,
            {"transaction_time_out": 6_000, "transaction_check_interval": 10_000, "transaction_check_max": 3},
        )

    @property
    def svc(self) -> Any:
        assert self.broker is not None
        return self.broker.transactions

    async def producer(self, group: str = "PG") -> Producer:
        producer = Producer(self, group)
        producer.conn = await self.connect(producer.on_request)
        await producer.heartbeat()
        return producer

    async def tick(self, seconds: int) -> None:
        """Advance the fake clock one second at a time, letting each check round finish."""
        await self.advance(seconds, step=1)

    def messages(self, topic: str, queue_id: int = 0) -> list[MessageRecord]:
        assert self.broker is not None and self.broker.store is not None
        result = self.broker.store.get_messages(topic, queue_id, 0, 1000)
        return decode_records(result.body) if result.buffers else []


class Producer:
    def __init__(self, harness: Harness, group: str) -> None:
        self.h = harness
        self.group = group
        self.conn: Connection = None  # type: ignore[assignment]
        self.checks: list[RemotingCommand] = []

    def on_request(self, _conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.checks.append(cmd)

    async def heartbeat(self) -> None:
        body = orjson.dumps({"clientID": f"P-{self.group}", "producerDataSet": [{"groupName": self.group}]})
        resp = await self.conn.request(RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), timeout=5)
        assert resp.code == ResponseCode.SUCCESS

    async def prepare(self, topic: str, body: bytes, **props: str) -> Prepared:
        uniq = f"UNIQ{next(_uniq):028d}"
        all_props = {"TRAN_MSG": "true", "PGROUP": self.group, "UNIQ_KEY": uniq, "TAGS": "T", **props}
        header = SendMessageRequestHeader(
            producerGroup=self.group,
            topic=topic,
            queueId=1,
            sysFlag=int(TransactionType.PREPARED),
            bornTimestamp=self.h.clock.now_ms(),
            properties=encode_properties(all_props),
        )
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body)
        resp = await self.conn.request(cmd, timeout=5)
        return Prepared(resp, uniq)

    def end_cmd(self, p: Prepared, decision: int, *, oneway: bool, from_check: bool = False) -> RemotingCommand:
        header = EndTransactionRequestHeader(
            producerGroup=self.group,
            tranStateTableOffset=p.queue_offset,
            commitLogOffset=p.phys,
            commitOrRollback=decision,
            fromTransactionCheck=from_check,
            msgId=p.uniq,
            transactionId=p.uniq,
        )
        return RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext(), oneway=oneway)

    async def end(self, p: Prepared, decision: int) -> RemotingCommand:
        return await self.conn.request(self.end_cmd(p, decision, oneway=False), timeout=5)


class Prepared:
    def __init__(self, resp: RemotingCommand, uniq: str) -> None:
        self.resp = resp
        self.uniq = uniq
        if resp.code == ResponseCode.SUCCESS:
            self.queue_offset = int(resp.ext_fields["queueOffset"])
            self.phys = decode_offset_msg_id(resp.ext_fields["msgId"])[1]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.start()
    yield harness
    await harness.stop()


async def pull_real(h: Harness, topic: str, queue_id: int = 1) -> list[MessageRecord]:
    conn = await h.connect()
    header = PullMessageRequestHeader(
        consumerGroup="CG",
        topic=topic,
        queueId=queue_id,
        queueOffset=0,
        maxMsgNums=32,
        sysFlag=0x4,
        commitOffset=0,
        suspendTimeoutMillis=0,
        subscription="*",
    )
    resp = await conn.request(RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext()), timeout=5)
    return decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []


# -- prepare -----------------------------------------------------------------------------------------------------------


async def test_prepare_is_stored_in_the_half_topic_and_invisible(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"hello", KEYS="order-1")
    resp = prep.resp
    assert resp.code == ResponseCode.SUCCESS
    assert resp.ext_fields["queueId"] == "1" and resp.ext_fields["queueOffset"] == "0"
    assert resp.ext_fields["MSG_REGION"] == "DefaultRegion" and resp.ext_fields["TRACE_ON"] == "true"
    assert await pull_real(h, "TxTopic") == []
    [half] = h.messages(TRANS_HALF_TOPIC)
    assert half.physical_offset == prep.phys and half.queue_offset == prep.queue_offset
    assert half.properties["REAL_TOPIC"] == "TxTopic" and half.properties["REAL_QID"] == "1"
    assert half.properties["PGROUP"] == "PG" and half.transaction_type == TransactionType.NOT_TYPE
    cfg = h.broker.topics.get(TRANS_HALF_TOPIC)
    assert cfg is not None and cfg.queue_count == 1 and cfg.perm == 6
    [pending] = h.svc.pending_transactions()
    assert pending["uniqKey"] == prep.uniq and pending["checks"] == 0 and pending["producerGroup"] == "PG"
    assert h.svc.retention_guard() == prep.phys


async def test_prepare_refused_when_rejected_or_over_the_backlog(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.start(reject_transaction_message=True)
    try:
        p = await h.producer()
        prep = await p.prepare("TxTopic", b"x")
        assert prep.resp.code == ResponseCode.NO_PERMISSION and "transaction" in prep.resp.remark
        await h.stop()
        await h.start(reject_transaction_message=False, max_pending_transactions=2)
        p = await h.producer()
        assert (await p.prepare("TxTopic", b"1")).resp.code == ResponseCode.SUCCESS
        assert (await p.prepare("TxTopic", b"2")).resp.code == ResponseCode.SUCCESS
        refused = (await p.prepare("TxTopic", b"3")).resp
        assert refused.code == ResponseCode.SYSTEM_BUSY
        assert refused.remark.startswith("[TXMQ] too many in-doubt transactions")
        assert len(h.messages(TRANS_HALF_TOPIC)) == 2
    finally:
        await h.stop()


# -- END_TRANSACTION ---------------------------------------------------------------------------------------------------


async def test_commit_delivers_once_even_when_sent_twice(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"pay", KEYS="order-7")
    p.conn.send_oneway(p.end_cmd(prep, COMMIT, oneway=True))
    await aeventually(lambda: prep.phys in h.svc.table.decided, "the commit is applied")
    again = await p.end(prep, COMMIT)
    assert again.code == ResponseCode.SUCCESS
    p.conn.send_oneway(p.end_cmd(prep, COMMIT, oneway=True))
    delivered = await pull_real(h, "TxTopic")
    assert [m.body for m in delivered] == [b"pay"]
    msg = delivered[0]
    assert msg.transaction_type == TransactionType.COMMIT
    assert msg.prepared_transaction_offset == prep.phys
    assert "REAL_TOPIC" not in msg.properties and "REAL_QID" not in msg.properties
    assert "TRAN_MSG" not in msg.properties
    assert msg.properties["UNIQ_KEY"] == prep.uniq and msg.properties["KEYS"] == "order-7"
    [op] = h.messages(TRANS_OP_HALF_TOPIC)
    assert op.tags == "d" and op.body == str(prep.queue_offset).encode()
    # As RocketMQ: no UNIQ_KEY of its own. No KEYS either: a COMMIT's marker is found from its copy.
    assert "UNIQ_KEY" not in op.properties and "KEYS" not in op.properties
    assert h.svc.pending == {}
    # Concurrent duplicates deliver nothing more either.
    prep2 = await p.prepare("TxTopic", b"twice")
    answers = await asyncio.gather(*(p.end(prep2, COMMIT) for _ in range(5)))
    assert all(a.code == ResponseCode.SUCCESS for a in answers)
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"pay", b"twice"]


async def test_rollback_is_never_visible_and_conflicts_are_refused(h: Harness) -> None:
    p = await h.producer()
    rolled = await p.prepare("TxTopic", b"nope")
    assert (await p.end(rolled, ROLLBACK)).code == ResponseCode.SUCCESS
    assert await pull_real(h, "TxTopic") == []
    conflict = await p.end(rolled, COMMIT)
    assert conflict.code == ResponseCode.SYSTEM_ERROR and "already decided as ROLLBACK" in conflict.remark
    assert await pull_real(h, "TxTopic") == []
    committed = await p.prepare("TxTopic", b"yes")
    assert (await p.end(committed, COMMIT)).code == ResponseCode.SUCCESS
    refused = await p.end(committed, ROLLBACK)
    assert refused.code == ResponseCode.SYSTEM_ERROR and "already decided as COMMIT" in refused.remark
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"yes"]
    # The decisions survive a restart (rebuilt from the op markers).
    await h.restart()
    p = await h.producer()
    assert (await p.end(rolled, COMMIT)).code == ResponseCode.SYSTEM_ERROR
    assert (await p.end(committed, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"yes"]


async def test_end_transaction_validates_group_and_offsets(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"x")
    wrong_group = p.end_cmd(prep, COMMIT, oneway=False)
    wrong_group.ext_fields["producerGroup"] = "OTHER"
    resp = await p.conn.request(wrong_group, timeout=5)
    assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "The producer group wrong"
    wrong_offset = p.end_cmd(prep, COMMIT, oneway=False)
    wrong_offset.ext_fields["tranStateTableOffset"] = "99"
    resp = await p.conn.request(wrong_offset, timeout=5)
    assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "The transaction state table offset wrong"
    missing = p.end_cmd(prep, COMMIT, oneway=False)
    missing.ext_fields["commitLogOffset"] = str(prep.phys + 7)
    resp = await p.conn.request(missing, timeout=5)
    assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "Find prepared transaction message failed"
    unknown = await p.end(prep, 0)
    assert unknown.code == ResponseCode.SUCCESS
    assert await pull_real(h, "TxTopic") == [] and prep.phys in h.svc.pending


# -- checks ------------------------------------------------------------------------------------------------------------


async def test_check_schedule_then_discard_after_the_max(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"doubt", KEYS="k")
    half_before = len(h.messages(TRANS_HALF_TOPIC))
    await h.tick(5)
    assert p.checks == []
    await h.tick(2)  # 7 s > transactionTimeOut 6 s
    assert len(p.checks) == 1
    check = p.checks[0]
    assert check.is_oneway
    hdr = CheckTransactionStateRequestHeader.from_ext(check.ext_fields)
    assert hdr.tranStateTableOffset == prep.queue_offset and hdr.commitLogOffset == prep.phys
    assert hdr.msgId == prep.uniq and hdr.transactionId == prep.uniq
    assert hdr.offsetMsgId == prep.resp.ext_fields["msgId"]
    body = decode_record(check.body)
    assert body.topic == "TxTopic" and body.queue_id == 1 and body.body == b"doubt"
    assert body.properties["PGROUP"] == "PG" and body.properties["TRANSACTION_CHECK_TIMES"] == "1"
    await h.tick(8)  # the first check went out at 6 s
    assert len(p.checks) == 1
    await h.tick(1)  # interval 10 s after the first check
    assert len(p.checks) == 2
    await h.tick(10)
    assert len(p.checks) == 3
    # Checks do not re-append the half message.
    assert len(h.messages(TRANS_HALF_TOPIC)) == half_before
    assert h.messages(TRANS_CHECK_MAX_TIME_TOPIC) == []
    await h.tick(10)  # transactionCheckMax (3) reached: discarded, no fourth check
    assert len(p.checks) == 3
    [discarded] = h.messages(TRANS_CHECK_MAX_TIME_TOPIC)
    assert discarded.body == b"doubt" and discarded.properties["REAL_TOPIC"] == "TxTopic"
    assert discarded.properties["UNIQ_KEY"] == prep.uniq and discarded.properties["KEYS"] == "k"
    assert h.svc.pending == {} and h.svc.table.decided[prep.phys] == "DISCARD"
    await h.tick(30)
    assert len(p.checks) == 3
    assert await pull_real(h, "TxTopic") == []
    # The producer can still decide later: a late COMMIT is applied.
    assert (await p.end(prep, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"doubt"]


async def test_immunity_property_delays_the_first_check(h: Harness) -> None:
    p = await h.producer()
    await p.prepare("TxTopic", b"slow", CHECK_IMMUNITY_TIME_IN_SECONDS="20")
    await h.tick(19)
    assert p.checks == []
    await h.tick(2)
    assert len(p.checks) == 1


async def test_the_producers_check_times_property_counts_toward_the_max(h: Harness) -> None:
    """RocketMQ counts on from a TRANSACTION_CHECK_TIMES the producer set (needDiscard): under transactionCheckMax=3,
    a half message that says 2 gets one check (numbered 3), then is discarded; one that says 3 gets none. The count
    survives a restart."""
    p = await h.producer()
    once = await p.prepare("TxTopic", b"once", TRANSACTION_CHECK_TIMES="2")
    await p.prepare("TxTopic", b"never", TRANSACTION_CHECK_TIMES="3")
    await p.prepare("TxTopic", b"garbage", TRANSACTION_CHECK_TIMES="x")  # unreadable: counted from zero
    await h.restart()
    p = await h.producer()
    await h.tick(7)
    bodies = {decode_record(c.body).body: decode_record(c.body).properties["TRANSACTION_CHECK_TIMES"] for c in p.checks}
    assert bodies == {b"once": "3", b"garbage": "1"}
    assert [m.body for m in h.messages(TRANS_CHECK_MAX_TIME_TOPIC)] == [b"never"]
    await h.tick(10)
    assert sorted(m.body for m in h.messages(TRANS_CHECK_MAX_TIME_TOPIC)) == [b"never", b"once"]
    assert once.phys not in h.svc.pending and len(h.svc.pending) == 1


async def test_no_producer_online_means_no_check_counted(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"orphan")
    p.conn.close()
    await aeventually(lambda: not h.broker.clients.producer_channels("PG"), "the producer is gone")
    await h.tick(60)  # far past the timeout and several intervals: waiting, not counted, not discarded
    [status] = h.svc.pending_transactions()
    assert status["checks"] == 0 and status["waitingForProducer"] is True
    assert h.messages(TRANS_CHECK_MAX_TIME_TOPIC) == []
    p2 = await h.producer()
    await h.tick(10)
    assert len(p2.checks) == 1
    assert h.svc.pending[prep.phys].checks == 1


async def test_answering_a_check_resolves_the_transaction(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"checked")
    await h.tick(7)
    [check] = p.checks
    hdr = CheckTransactionStateRequestHeader.from_ext(check.ext_fields)
    answer = EndTransactionRequestHeader(
        producerGroup="PG",
        tranStateTableOffset=hdr.tranStateTableOffset,
        commitLogOffset=hdr.commitLogOffset,
        commitOrRollback=COMMIT,
        fromTransactionCheck=True,
        msgId=hdr.msgId,
        transactionId=hdr.transactionId,
    )
    p.conn.send_oneway(RemotingCommand.request(RequestCode.END_TRANSACTION, answer.to_ext(), oneway=True))
    await aeventually(lambda: prep.phys not in h.svc.pending, "the check answer is applied")
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"checked"]
    await h.tick(30)
    assert len(p.checks) == 1


async def test_restart_resumes_the_check_schedule(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"survivor")
    decided = await p.prepare("TxTopic", b"gone")
    assert (await p.end(decided, ROLLBACK)).code == ResponseCode.SUCCESS
    await h.tick(7)
    await h.tick(10)
    assert len(p.checks) == 2
    await h.restart()
    assert list(h.svc.pending) == [prep.phys]
    assert h.svc.pending[prep.phys].checks == 2
    p = await h.producer()
    await h.tick(9)
    assert len(p.checks) == 1  # the third and last check
    assert CheckTransactionStateRequestHeader.from_ext(p.checks[0].ext_fields).tranStateTableOffset == 0
    assert decode_record(p.checks[0].body).properties["TRANSACTION_CHECK_TIMES"] == "3"
    await h.tick(10)
    assert len(p.checks) == 1
    assert [m.body for m in h.messages(TRANS_CHECK_MAX_TIME_TOPIC)] == [b"survivor"]
    assert h.svc.pending == {}


async def test_a_bad_record_does_not_stall_the_round(h: Harness) -> None:
    p = await h.producer()
    bad = await p.prepare("TxTopic", b"bad")
    good = await p.prepare("TxTopic", b"good")
    h.svc.pending[bad.phys].phys += 3  # the entry now points into the middle of a record
    h.svc.pending[bad.phys].size = 0
    await h.tick(7)
    [check] = p.checks
    assert CheckTransactionStateRequestHeader.from_ext(check.ext_fields).commitLogOffset == good.phys
    assert h.svc.pending[bad.phys].checks == 0
    await h.tick(10)
    assert len(p.checks) == 2


async def test_unexpected_half_record_is_skipped_on_rebuild(h: Harness) -> None:
    p = await h.producer()
    store = h.broker.store
    stray = MessageRecord(topic=TRANS_HALF_TOPIC, body=b"stray", store_host=h.broker.store_host)
    assert (await store.put(stray)).ok
    good = await p.prepare("TxTopic", b"good")
    await h.restart()
    assert list(h.svc.pending) == [good.phys]
    p = await h.producer()
    await h.tick(7)
    assert len(p.checks) == 1


async def test_crash_between_commit_and_op_marker_does_not_deliver_twice(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"once", KEYS="k1")
    no_key = await p.prepare("TxTopic", b"no-uniq", UNIQ_KEY="")  # an empty value is not written
    delayed = await p.prepare("TxTopic", b"later", DELAY="3")  # its copy waits in the schedule topic
    svc = h.svc
    store = h.broker.store
    # Simulate the crash window: the committed copies are stored, the op markers never written.
    for prepared in (prep, no_key, delayed):
        half = store.read_message(prepared.phys)
        assert ("UNIQ_KEY" in half.properties) is (prepared is not no_key)
        record = commit_copy(half, svc.store_host)
        if "DELAY" in record.properties:
            record = h.broker.schedule.redirect(record, record.properties["DELAY"])
        assert (await store.put(record)).ok
    assert len(await pull_real(h, "TxTopic")) == 2
    await h.restart()
    assert h.svc.pending == {}
    assert [h.svc.table.decided[x.phys] for x in (prep, no_key, delayed)] == ["COMMIT"] * 3
    assert len(h.messages(TRANS_OP_HALF_TOPIC)) == 3
    p = await h.producer()
    await h.tick(30)
    assert p.checks == []
    assert (await p.end(prep, COMMIT)).code == ResponseCode.SUCCESS
    assert (await p.end(delayed, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"once", b"no-uniq", b"later"]


async def test_retention_guard_is_lowest_pending(h: Harness) -> None:
    p = await h.producer()
    first = await p.prepare("TxTopic", b"1")
    second = await p.prepare("TxTopic", b"2")
    assert h.broker.store.retention.guard_offset() <= first.phys
    assert (await p.end(first, ROLLBACK)).code == ResponseCode.SUCCESS
    assert h.svc.retention_guard() == second.phys
    assert (await p.end(second, COMMIT)).code == ResponseCode.SUCCESS
    assert h.svc.retention_guard() == 2**63 - 1


# -- several messages in one transaction ---------------------------------------------------------------------------


async def prepare_several(p: Producer, bodies: list[bytes], topic: str = "TxTopic") -> list[Prepared]:
    """The messages of one transaction; its id is the first one's UNIQ_KEY."""
    out: list[Prepared] = []
    for seq, body in enumerate(bodies):
        tx_id = out[0].uniq if out else ""
        prepared = await p.prepare(topic, body, TXMQ_TX_ID=tx_id, TXMQ_TX_SEQ=str(seq)) if out else None
        if prepared is None:  # the first: its UNIQ_KEY, made by prepare(), becomes the transaction id
            uniq = f"UNIQ{next(_uniq):028d}"
            prepared = await p.prepare(topic, body, UNIQ_KEY=uniq, TXMQ_TX_ID=uniq, TXMQ_TX_SEQ="0")
            prepared.uniq = uniq
        assert prepared.resp.code == ResponseCode.SUCCESS, prepared.resp.remark
        out.append(prepared)
    return out


async def test_several_messages_are_decided_through_the_first_only(h: Harness) -> None:
    p = await h.producer()
    first, second, third = await prepare_several(p, [b"s0", b"s1", b"s2"])
    refused = await p.end(second, COMMIT)
    assert refused.code == ResponseCode.SYSTEM_ERROR and "decided through its first" in (refused.remark or "")
    assert await pull_real(h, "TxTopic") == []
    assert (await p.end(first, COMMIT)).code == ResponseCode.SUCCESS
    assert sorted(m.body for m in await pull_real(h, "TxTopic")) == [b"s0", b"s1", b"s2"]
    assert {h.svc.table.decided[x.phys] for x in (first, second, third)} == {"COMMIT"}
    assert len(h.messages(TRANS_OP_HALF_TOPIC)) == 1  # one marker holds the three decisions
    again = await p.end(first, ROLLBACK)
    assert again.code == ResponseCode.SYSTEM_ERROR and "already decided as COMMIT" in (again.remark or "")


async def test_a_late_or_repeated_message_of_a_transaction_is_refused(h: Harness) -> None:
    p = await h.producer()
    late = await p.prepare("TxTopic", b"late", TXMQ_TX_ID="NO-SUCH-TX", TXMQ_TX_SEQ="1")
    assert late.resp.code == ResponseCode.MESSAGE_ILLEGAL and "is not open" in (late.resp.remark or "")
    first, _second = await prepare_several(p, [b"a", b"b"])
    twice = await p.prepare("TxTopic", b"b-again", TXMQ_TX_ID=first.uniq, TXMQ_TX_SEQ="1")
    assert twice.resp.code == ResponseCode.MESSAGE_ILLEGAL and "already stored" in (twice.resp.remark or "")
    assert (await p.end(first, COMMIT)).code == ResponseCode.SUCCESS
    assert sorted(m.body for m in await pull_real(h, "TxTopic")) == [b"a", b"b"]


async def test_a_commit_cut_short_by_a_crash_is_rolled_forward_at_start(h: Harness) -> None:
    # The crash window: some committed copies are stored, the rest and the op marker are not. At start, any copy of
    # the transaction proves the COMMIT: the missing copies and the marker are written, each message delivered once.
    p = await h.producer()
    preps = await prepare_several(p, [b"r0", b"r1", b"r2", b"r3"])
    store = h.broker.store
    for prepared in preps[:2]:
        assert (await store.put(commit_copy(store.read_message(prepared.phys), h.svc.store_host))).ok
    undecided = await prepare_several(p, [b"u0", b"u1"])  # no copy at all: still in doubt after the restart
    await h.restart()
    assert sorted(m.body for m in await pull_real(h, "TxTopic")) == [b"r0", b"r1", b"r2", b"r3"]
    assert {h.svc.table.decided[x.phys] for x in preps} == {"COMMIT"}
    assert sorted(h.svc.pending) == sorted(x.phys for x in undecided)
    assert list(h.svc.table.groups) == [undecided[0].uniq]
    p = await h.producer()
    await h.tick(30)
    assert [int(c.ext_fields["commitLogOffset"]) for c in p.checks] == [undecided[0].phys] * len(p.checks)
    assert p.checks and all(c.ext_fields.get("msgId") == undecided[0].uniq for c in p.checks)
