"""Operator control of transactions on an in-process broker with a FakeClock: history, admin requests, counters."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_transactions import COMMIT, ROLLBACK, Harness, Prepared, Producer, pull_real

from txmq.broker.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_OP_HALF_TOPIC
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import encode_offset_msg_id
from txmq.testing import aeventually
from txmq.txn import TX_TRANSITIONS, IllegalTransactionTransition, TxState, next_state

LIST = TxmqRequestCode.TXMQ_LIST_TRANSACTIONS
GET = TxmqRequestCode.TXMQ_GET_TRANSACTION
RESOLVE = TxmqRequestCode.TXMQ_RESOLVE_TRANSACTION
RESUME = TxmqRequestCode.TXMQ_RESUME_TRANSACTION
COUNTERS = TxmqRequestCode.TXMQ_TRANSACTION_COUNTERS


async def call(h: Harness, code: int, body: Any = None, raw: bytes | None = None) -> tuple[RemotingCommand, Any]:
    conn = await h.connect()
    payload = raw if raw is not None else orjson.dumps(body if body is not None else {})
    resp = await conn.request(RemotingCommand.request(code, {}, payload), timeout=5)
    conn.close()
    return resp, (orjson.loads(resp.body) if resp.body else None)


async def show(h: Harness, ident: str) -> dict[str, Any]:
    resp, data = await call(h, GET, {"id": ident})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return data["transaction"]


async def answer_check(p: Producer, prep: Prepared, decision: int) -> RemotingCommand:
    """END_TRANSACTION as a check answer (decision 0 = UNKNOWN), sent as a request so that it has been applied."""
    return await p.conn.request(p.end_cmd(prep, decision, oneway=False, from_check=True), timeout=5)


@pytest.fixture
async def h(tmp_path: Path) -> Any:
    harness = Harness(tmp_path)
    await harness.start()
    yield harness
    await harness.stop()


# -- states ------------------------------------------------------------------------------------------------------------


@given(st.sampled_from(list(TxState)), st.sampled_from(list(TxState)))
def test_state_transitions_are_checked(old: TxState, new: TxState) -> None:
    allowed = new in TX_TRANSITIONS[old]
    if allowed:
        assert next_state(old, new) is new
    else:
        with pytest.raises(IllegalTransactionTransition, match=f"{old.value} transaction cannot become {new.value}"):
            next_state(old, new)
    # Decisions are final; only a discarded transaction can go back to PREPARED.
    if old in (TxState.COMMITTED, TxState.ROLLED_BACK):
        assert not allowed
    if new is TxState.PREPARED:
        assert allowed == (old is TxState.DISCARDED)


# -- list and show -----------------------------------------------------------------------------------------------------


async def test_list_filters_and_show_by_every_kind_of_id(h: Harness) -> None:
    p = await h.producer("PG")
    q = await h.producer("PG2")
    old = await p.prepare("TopicA", b"old")
    await h.tick(3)
    a = await p.prepare("TopicB", b"a")
    b = await q.prepare("TopicA", b"b")
    resp, data = await call(h, LIST)
    assert resp.code == ResponseCode.SUCCESS
    assert data["total"] == 3 and data["brokerName"] == h.broker.config.broker_name
    assert [t["uniqKey"] for t in data["transactions"]] == [old.uniq, a.uniq, b.uniq]  # oldest first
    row = data["transactions"][0]
    assert row["state"] == "PREPARED" and row["producerGroup"] == "PG" and row["topic"] == "TopicA"
    assert row["ageMs"] == 3000 and row["checks"] == 0 and row["halfMsgId"] == old.resp.ext_fields["msgId"]
    _, data = await call(h, LIST, {"group": "PG"})
    assert [t["uniqKey"] for t in data["transactions"]] == [old.uniq, a.uniq]
    _, data = await call(h, LIST, {"topic": "TopicA"})
    assert [t["uniqKey"] for t in data["transactions"]] == [old.uniq, b.uniq]
    _, data = await call(h, LIST, {"olderThanMs": 2000})
    assert [t["uniqKey"] for t in data["transactions"]] == [old.uniq]
    _, data = await call(h, LIST, {"group": "PG", "topic": "TopicA", "olderThanMs": 2000})
    assert [t["uniqKey"] for t in data["transactions"]] == [old.uniq]
    _, data = await call(h, LIST, {"limit": 1})
    assert data["total"] == 3 and len(data["transactions"]) == 1
    # Decided transactions leave the in-doubt list.
    assert (await p.end(a, COMMIT)).code == ResponseCode.SUCCESS
    _, data = await call(h, LIST)
    assert {t["uniqKey"] for t in data["transactions"]} == {old.uniq, b.uniq}

    # show: by UNIQ_KEY, by the half message's msgId, by the delivered message's msgId.
    by_uniq = await show(h, a.uniq)
    assert by_uniq["state"] == "COMMITTED" and by_uniq["resolvedBy"] == "producer"
    assert by_uniq["producerGroup"] == "PG" and by_uniq["topic"] == "TopicB" and by_uniq["queueId"] == 1
    assert by_uniq["preparedAt"] == h.clock.now_ms() and by_uniq["resolvedAt"] == h.clock.now_ms()
    [delivered] = await pull_real(h, "TopicB")
    delivered_id = encode_offset_msg_id(delivered.store_host, delivered.physical_offset)
    assert by_uniq["deliveredMsgId"] == delivered_id
    assert await show(h, a.resp.ext_fields["msgId"]) == by_uniq
    assert await show(h, delivered_id.lower()) == by_uniq
    # A transaction id other than the UNIQ_KEY (END_TRANSACTION's transactionId) is an id too.
    end = p.end_cmd(old, ROLLBACK, oneway=False)
    end.ext_fields["transactionId"] = "order-9527"
    assert (await p.conn.request(end, timeout=5)).code == ResponseCode.SUCCESS
    by_tid = await show(h, "order-9527")
    assert by_tid["uniqKey"] == old.uniq and by_tid["transactionId"] == "order-9527"
    assert by_tid["state"] == "ROLLED_BACK" and by_tid["deliveredMsgId"] is None
    # Unknown ids and bad requests get clear answers, and the broker keeps serving.
    resp, _ = await call(h, GET, {"id": "NO-SUCH-TX"})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND and "NO-SUCH-TX" in resp.remark
    resp, _ = await call(h, GET, {"id": "0" * 32})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    resp, _ = await call(h, GET, {})
    assert resp.code == ResponseCode.SYSTEM_ERROR and '"id"' in resp.remark
    resp, _ = await call(h, LIST, raw=b"{not json")
    assert resp.code == ResponseCode.SYSTEM_ERROR and "not JSON" in resp.remark
    resp, _ = await call(h, LIST, {"olderThanMs": "soon"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "olderThanMs" in resp.remark
    resp, _ = await call(h, LIST, {"states": ["MAYBE"]})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "MAYBE" in resp.remark
    assert (await call(h, LIST))[0].code == ResponseCode.SUCCESS


async def test_listing_by_state_includes_transactions_decided_at_once(h: Harness) -> None:
    # Most transactions are decided milliseconds after their prepare and never get a record in memory; listing
    # resolved states still finds them (their record is rebuilt from the half message), with the filters applied.
    p = await h.producer("PG")
    quick = await p.prepare("TopicA", b"quick")
    other = await p.prepare("TopicB", b"other")
    rolled = await p.prepare("TopicA", b"rolled")
    slow = await p.prepare("TopicA", b"slow")
    for prep, decision in ((quick, COMMIT), (other, COMMIT), (rolled, ROLLBACK)):
        assert (await p.end(prep, decision)).code == ResponseCode.SUCCESS
    assert h.svc.table.history.records == {}  # all three are light entries
    _, data = await call(h, LIST, {"states": ["COMMITTED"]})
    assert data["total"] == 2 and [t["uniqKey"] for t in data["transactions"]] == [quick.uniq, other.uniq]
    _, data = await call(h, LIST, {"states": ["COMMITTED", "ROLLED_BACK"], "topic": "TopicA"})
    assert [(t["uniqKey"], t["state"]) for t in data["transactions"]] == [
        (quick.uniq, "COMMITTED"),
        (rolled.uniq, "ROLLED_BACK"),
    ]
    _, data = await call(h, LIST)  # the default stays the in-doubt ones
    assert [t["uniqKey"] for t in data["transactions"]] == [slow.uniq]


async def test_history_lists_every_check_with_its_answer(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"doubt")
    t0 = h.clock.now_ms()
    await h.tick(7)
    assert len(p.checks) == 1
    first = await show(h, prep.uniq)
    assert first["checkLog"] == [{"sentAt": t0 + 6000, "answer": None, "answeredAt": None}]
    await h.tick(2)
    assert (await answer_check(p, prep, 0)).code == ResponseCode.SUCCESS  # UNKNOWN
    await h.tick(8)
    assert len(p.checks) == 2
    await h.tick(1)
    assert (await answer_check(p, prep, COMMIT)).code == ResponseCode.SUCCESS
    t = await show(h, prep.uniq)
    assert t["state"] == "COMMITTED" and t["resolvedBy"] == "check" and t["resolvedAt"] == t0 + 18000
    assert t["checkLog"] == [
        {"sentAt": t0 + 6000, "answer": "UNKNOWN", "answeredAt": t0 + 9000},
        {"sentAt": t0 + 16000, "answer": "COMMIT", "answeredAt": t0 + 18000},
    ]
    [delivered] = await pull_real(h, "TxTopic")
    assert t["deliveredMsgId"] == encode_offset_msg_id(delivered.store_host, delivered.physical_offset)
    assert t["historyComplete"] is True
    # The half topic did not grow per check: the history lives in the journal.
    journal = (h.root / "store" / "config" / "transactionJournal.log").read_text()
    assert journal.splitlines() == [
        f"C {prep.phys} {t0 + 6000}",
        f"A {prep.phys} {t0 + 9000} UNKNOWN",
        f"C {prep.phys} {t0 + 16000}",
    ]  # the last answer is flushed with the next round or at close


# -- operator resolution -----------------------------------------------------------------------------------------------


async def test_operator_resolution_follows_first_decision_wins(h: Harness) -> None:
    p = await h.producer()
    to_commit = await p.prepare("TxTopic", b"by hand")
    to_roll = await p.prepare("TxTopic", b"never")
    resp, data = await call(h, RESOLVE, {"id": to_commit.uniq, "decision": "commit"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert data["transaction"]["state"] == "COMMITTED" and data["transaction"]["resolvedBy"] == "operator"
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"by hand"]
    # Anything after the first decision is refused: the operator again (either way), the producer the other way.
    resp, data = await call(h, RESOLVE, {"id": to_commit.uniq, "decision": "COMMIT"})
    assert resp.code == ResponseCode.TRANSACTION_FAILED and "already decided as COMMIT by operator" in resp.remark
    resp, _ = await call(h, RESOLVE, {"id": to_commit.resp.ext_fields["msgId"], "decision": "ROLLBACK"})
    assert resp.code == ResponseCode.TRANSACTION_FAILED and "ROLLBACK refused" in resp.remark
    refused = await p.end(to_commit, ROLLBACK)
    assert refused.code == ResponseCode.SYSTEM_ERROR and "already decided as COMMIT" in refused.remark
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"by hand"]
    # The producer decides first: the operator is refused.
    assert (await p.end(to_roll, ROLLBACK)).code == ResponseCode.SUCCESS
    resp, data = await call(h, RESOLVE, {"id": to_roll.uniq, "decision": "commit"})
    assert resp.code == ResponseCode.TRANSACTION_FAILED and "already decided as ROLLBACK by producer" in resp.remark
    assert data["transaction"]["state"] == "ROLLED_BACK"
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"by hand"]
    resp, _ = await call(h, RESOLVE, {"id": to_roll.uniq, "decision": "maybe"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "COMMIT or ROLLBACK" in resp.remark
    resp, _ = await call(h, RESOLVE, {"id": "GONE", "decision": "commit"})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND and "GONE" in resp.remark
    # The operator's decision is on disk like any other: a restart keeps it.
    [op_commit, _op_rollback] = h.messages(TRANS_OP_HALF_TOPIC)
    assert op_commit.properties["TXMQ_BY"] == "operator" and "KEYS" not in op_commit.properties
    await h.restart()
    t = await show(h, to_commit.uniq)
    assert t["state"] == "COMMITTED" and t["resolvedBy"] == "operator"


async def test_operator_rollback_of_a_pending_transaction_stops_its_checks(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"stuck")
    await h.tick(7)
    assert len(p.checks) == 1
    resp, data = await call(h, RESOLVE, {"id": prep.uniq, "decision": "rollback"})
    assert resp.code == ResponseCode.SUCCESS and data["transaction"]["state"] == "ROLLED_BACK"
    assert prep.phys not in h.svc.pending
    await h.tick(30)
    assert len(p.checks) == 1
    assert await pull_real(h, "TxTopic") == []
    # The producer's late answer to the check is refused.
    late = await answer_check(p, prep, COMMIT)
    assert late.code == ResponseCode.SYSTEM_ERROR and "already decided as ROLLBACK" in late.remark


# -- discard and resume ------------------------------------------------------------------------------------------------


async def test_resume_puts_a_discarded_transaction_back_under_checks(h: Harness) -> None:
    p = await h.producer()
    prep = await p.prepare("TxTopic", b"abandoned")
    await h.tick(7 + 10 + 10 + 10)  # three checks (transactionCheckMax=3), then the discard
    assert len(p.checks) == 3 and h.svc.table.decided[prep.phys] == "DISCARD"
    [copy] = h.messages(TRANS_CHECK_MAX_TIME_TOPIC)
    copy_id = encode_offset_msg_id(copy.store_host, copy.physical_offset)
    t = await show(h, prep.uniq)
    assert t["state"] == "DISCARDED" and t["discardedMsgId"] == copy_id and len(t["checkLog"]) == 3
    assert t["nextCheckAt"] is None
    _, data = await call(h, LIST)
    assert [(r["uniqKey"], r["state"]) for r in data["transactions"]] == [(prep.uniq, "DISCARDED")]
    _, data = await call(h, LIST, {"states": ["PREPARED"]})
    assert data["transactions"] == []
    assert await show(h, copy_id) == t  # the TRANS_CHECK_MAX_TIME_TOPIC copy's msgId finds it too

    resp, data = await call(h, RESUME, {"id": prep.uniq})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    t = data["transaction"]
    assert t["state"] == "PREPARED" and t["resumedAt"] == [h.clock.now_ms()] and t["checksTowardMax"] == 0
    assert prep.phys in h.svc.pending and prep.phys not in h.svc.table.decided
    await h.tick(1)
    assert len(p.checks) == 4  # checked again at once
    assert p.checks[-1].ext_fields["commitLogOffset"] == str(prep.phys)
    resp, _ = await call(h, RESUME, {"id": prep.uniq})
    assert resp.code == ResponseCode.TRANSACTION_FAILED and "PREPARED" in resp.remark

    # A restart keeps it pending (the resume is on disk), with its whole history.
    await h.restart()
    assert prep.phys in h.svc.pending and h.svc.pending[prep.phys].checks == 1
    t = await show(h, prep.uniq)
    assert t["state"] == "PREPARED" and len(t["checkLog"]) == 4 and t["discardedMsgId"] == copy_id
    assert len(t["resumedAt"]) == 1
    p = await h.producer()
    await h.tick(10)
    assert len(p.checks) == 1
    assert (await answer_check(p, prep, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"abandoned"]
    resp, _ = await call(h, RESUME, {"id": prep.uniq})
    assert resp.code == ResponseCode.TRANSACTION_FAILED and "COMMITTED" in resp.remark


# -- counters ----------------------------------------------------------------------------------------------------------


async def test_counters_and_runtime_info(h: Harness) -> None:
    p = await h.producer()
    committed = await p.prepare("TxTopic", b"1")
    rolled = await p.prepare("TxTopic", b"2")
    by_hand = await p.prepare("TxTopic", b"3")
    doubt = await p.prepare("TxTopic", b"4")
    await h.tick(2)
    assert (await p.end(committed, COMMIT)).code == ResponseCode.SUCCESS
    await h.tick(2)
    assert (await p.end(rolled, ROLLBACK)).code == ResponseCode.SUCCESS
    assert (await p.end(rolled, COMMIT)).code == ResponseCode.SYSTEM_ERROR
    await h.tick(6)
    assert len(p.checks) == 2  # by_hand and doubt
    resp, _ = await call(h, RESOLVE, {"id": by_hand.uniq, "decision": "commit"})
    assert resp.code == ResponseCode.SUCCESS
    assert (await answer_check(p, doubt, 0)).code == ResponseCode.SUCCESS
    await h.tick(30)  # doubt: checks 2 and 3, then discarded
    _, data = await call(h, COUNTERS)
    assert data["counters"]["discardedNow"] == 1 and data["counters"]["inDoubt"] == 0
    resp, _ = await call(h, RESUME, {"id": doubt.uniq})
    assert resp.code == ResponseCode.SUCCESS
    resp, data = await call(h, COUNTERS)
    assert resp.code == ResponseCode.SUCCESS
    c = data["counters"]
    assert c["halfMessages"] == 4 and c["commits"] == 2 and c["rollbacks"] == 1
    assert c["checksSent"] == 4 and c["checkAnswers"] == 1 and c["discards"] == 1 and c["resumes"] == 1
    assert c["operatorResolutions"] == 1 and c["refusedDecisions"] == 1
    assert c["inDoubt"] == 1 and c["discardedNow"] == 0
    # Time to resolution: 2 s, 4 s and 10 s.
    assert c["resolutionSamples"] == 3
    assert (c["resolutionP50Ms"], c["resolutionP99Ms"], c["resolutionMaxMs"]) == (4000, 10000, 10000)
    conn = await h.connect()
    info = await conn.request(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout=5)
    table = orjson.loads(info.body)["table"]
    assert table["tx.commits"] == "2" and table["tx.inDoubt"] == "1" and table["tx.resolutionMaxMs"] == "10000"
    assert table["tx.discards"] == "1" and table["tx.checksSent"] == "4"


# -- restart -----------------------------------------------------------------------------------------------------------


async def test_restart_keeps_history_and_old_ones_are_read_from_disk(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.start(extra={"transactionHistoryMax": "1"})
    try:
        p = await h.producer()
        first = await p.prepare("TxTopic", b"first")
        second = await p.prepare("TxTopic", b"second")
        pending = await p.prepare("TxTopic", b"pending")
        t0 = h.clock.now_ms()
        await h.tick(7)
        assert len(p.checks) == 3
        assert (await answer_check(p, first, ROLLBACK)).code == ResponseCode.SUCCESS
        assert (await answer_check(p, pending, 0)).code == ResponseCode.SUCCESS
        assert (await p.end(second, COMMIT)).code == ResponseCode.SUCCESS
        before = {prep.uniq: await show(h, prep.uniq) for prep in (second, pending)}
        # A torn journal line (a crash while appending) is ignored.
        await h.stop()
        with open(tmp_path / "store" / "config" / "transactionJournal.log", "a") as f:
            f.write("C 12")
        await h.start()
        for uniq, shown in before.items():
            assert await show(h, uniq) == shown
        t = before[pending.uniq]
        assert t["state"] == "PREPARED" and t["checkLog"] == [
            {"sentAt": t0 + 6000, "answer": "UNKNOWN", "answeredAt": t0 + 7000}
        ]
        # Only the last resolved transaction is kept in memory (transactionHistoryMax=1); the older one is rebuilt
        # from its half message and op marker, without its check history.
        assert first.phys not in h.svc.table.history.records and second.phys in h.svc.table.history.records
        old = await show(h, first.uniq)
        assert old["state"] == "ROLLED_BACK" and old["resolvedBy"] == "check" and old["resolvedAt"] == t0 + 7000
        assert old["historyComplete"] is False and old["checkLog"] == []
        assert await show(h, first.resp.ext_fields["msgId"]) == old
        resp, _ = await call(h, RESOLVE, {"id": first.uniq, "decision": "commit"})
        assert resp.code == ResponseCode.TRANSACTION_FAILED and "already decided as ROLLBACK" in resp.remark
        p = await h.producer()
        await h.tick(10)
        assert len(p.checks) == 1  # the pending one: its second check, on schedule
        await aeventually(lambda: len(h.svc.pending[pending.phys].check_log) == 2, "the check is in the history")
    finally:
        await h.stop()


async def test_a_commit_read_back_from_disk_names_the_message_it_delivered(tmp_path: Path) -> None:
    # The committed copy and its op marker are stored in one append; the marker's TXMQ_COPY_MSG_ID is filled in by
    # the writer. A transaction no longer held in memory is rebuilt from that marker.
    h = Harness(tmp_path)
    await h.start(extra={"transactionHistoryMax": "1"})
    try:
        p = await h.producer()
        preps = [await p.prepare("TxTopic", f"m{i}".encode()) for i in range(3)]
        for prep in preps:
            assert (await p.conn.request(p.end_cmd(prep, COMMIT, oneway=False), timeout=5)).code == 0
        delivered = {
            r.body: encode_offset_msg_id(r.store_host, r.physical_offset) for r in await pull_real(h, "TxTopic")
        }
        assert len(delivered) == 3
        await h.restart()
        for i, prep in enumerate(preps):
            assert prep.phys not in h.svc.table.history.records or i == 2
            shown = await show(h, prep.uniq)
            assert shown["state"] == "COMMITTED" and shown["deliveredMsgId"] == delivered[f"m{i}".encode()]
    finally:
        await h.stop()


async def test_decisions_beyond_the_window_are_read_from_their_markers(tmp_path: Path) -> None:
    # transactionDecidedMax bounds the decisions held in memory; an older one is looked up in its op marker, so the
    # first decision still wins and nothing is delivered twice.
    h = Harness(tmp_path)
    await h.start(extra={"transactionDecidedMax": "2", "transactionHistoryMax": "1"})
    try:
        p = await h.producer()
        committed = await p.prepare("TxTopic", b"committed")
        rolled = await p.prepare("TxTopic", b"rolled")
        assert (await p.end(committed, COMMIT)).code == ResponseCode.SUCCESS
        assert (await p.end(rolled, ROLLBACK)).code == ResponseCode.SUCCESS
        for i in range(3):
            later = await p.prepare("TxTopic", f"later-{i}".encode())
            assert (await p.end(later, COMMIT)).code == ResponseCode.SUCCESS
        table = h.svc.table
        assert len(table.decided) == 2 and committed.phys not in table.decided and rolled.phys not in table.decided
        assert committed.phys not in table.history.records and rolled.phys not in table.history.records
        again = await p.end(committed, COMMIT)
        assert again.code == ResponseCode.SUCCESS and "already committed; nothing done" in again.remark
        conflict = await p.end(committed, ROLLBACK)
        assert conflict.code == ResponseCode.SYSTEM_ERROR and "already decided as COMMIT" in conflict.remark
        conflict = await p.end(rolled, COMMIT)
        assert conflict.code == ResponseCode.SYSTEM_ERROR and "already decided as ROLLBACK" in conflict.remark
        bodies = [m.body for m in await pull_real(h, "TxTopic")]
        assert bodies == [b"committed", b"later-0", b"later-1", b"later-2"]
        assert (await show(h, committed.uniq))["state"] == "COMMITTED"
        assert (await show(h, rolled.uniq))["state"] == "ROLLED_BACK"
        resp, _ = await call(h, RESOLVE, {"id": rolled.uniq, "decision": "commit"})
        assert resp.code == ResponseCode.TRANSACTION_FAILED and "already decided as ROLLBACK" in resp.remark
        # A restart keeps only the newest decisions in memory too.
        await h.restart()
        assert len(h.svc.table.decided) == 2
        p = await h.producer()
        assert (await p.end(committed, ROLLBACK)).code == ResponseCode.SYSTEM_ERROR
        assert [m.body for m in await pull_real(h, "TxTopic")] == bodies
    finally:
        await h.stop()


@pytest.fixture
async def forgetful(tmp_path: Path) -> Any:
    """A broker that keeps one resolved transaction in memory and never reads the op queue backwards: older ones are
    shown through the key index alone."""
    harness = Harness(tmp_path)
    await harness.start(extra={"transactionHistoryMax": "1"})
    harness.svc.lookups.op_scan_limit = 0
    yield harness
    await harness.stop()


async def test_decisions_of_one_event_loop_turn_share_one_op_marker(forgetful: Harness) -> None:
    # As RocketMQ 5 batches op messages: the decisions that arrive together are stored in one append, their
    # committed copies first and then one marker listing them all, which the rebuild reads back decision by decision.
    # The marker lists the UNIQ_KEYs of its ROLLBACKs for the key index; a COMMIT's marker is found from its copy.
    h = forgetful
    p = await h.producer()
    preps = [await p.prepare("TxTopic", f"m{i}".encode()) for i in range(5)]
    decisions = [COMMIT, ROLLBACK, COMMIT, COMMIT, ROLLBACK]
    commands = [p.end_cmd(prep, d, oneway=False) for prep, d in zip(preps, decisions, strict=True)]
    outcomes = [h.broker.app.end_transaction.handle(None, cmd) for cmd in commands]  # one event-loop turn
    answers = [await outcome for outcome in outcomes]
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 5
    [op] = h.messages(TRANS_OP_HALF_TOPIC)
    assert op.body == b",".join(str(prep.queue_offset).encode() for prep in preps)
    assert op.properties["TXMQ_DECISION"] == "COMMIT,ROLLBACK,COMMIT,COMMIT,ROLLBACK"
    assert op.properties["TXMQ_HALF_PHYS"] == ",".join(str(prep.phys) for prep in preps)
    assert op.properties["KEYS"] == f"{preps[1].uniq} {preps[4].uniq}"
    delivered = await pull_real(h, "TxTopic")
    assert [m.body for m in delivered] == [b"m0", b"m2", b"m3"]
    host = ("127.0.0.1", h.broker.config.listen_port)
    copy_ids = [encode_offset_msg_id(host, m.physical_offset) for m in delivered]
    assert op.properties["TXMQ_COPY_MSG_ID"] == f"{copy_ids[0]},,{copy_ids[1]},{copy_ids[2]},"
    for restart in (False, True):
        if restart:
            await h.restart()
        shown = [await show(h, prep.uniq) for prep in preps]
        assert [t["state"] for t in shown] == ["COMMITTED", "ROLLED_BACK", "COMMITTED", "COMMITTED", "ROLLED_BACK"]
        assert [t.get("deliveredMsgId") for t in shown] == [copy_ids[0], None, copy_ids[1], copy_ids[2], None]
        assert [t["resolvedBy"] for t in shown] == ["producer"] * 5
        assert h.svc.pending == {}
    p = await h.producer()
    assert (await p.end(preps[1], COMMIT)).code == ResponseCode.SYSTEM_ERROR  # the first decision still wins
    assert (await p.end(preps[0], COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"m0", b"m2", b"m3"]


async def test_an_old_delayed_commit_is_shown_from_its_schedule_topic_copy(forgetful: Harness) -> None:
    # A delayed message's committed copy waits in SCHEDULE_TOPIC_XXXX, right before its marker; the real topic has
    # nothing yet.
    h = forgetful
    p = await h.producer()
    delayed = await p.prepare("TxTopic", b"later", DELAY="3")
    other = await p.prepare("TxTopic", b"now")
    assert (await p.end(delayed, COMMIT)).code == ResponseCode.SUCCESS
    assert (await p.end(other, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"now"]
    for restart in (False, True):
        if restart:
            await h.restart()
        t = await show(h, delayed.uniq)
        assert t["state"] == "COMMITTED" and t["resolvedBy"] == "producer" and t["deliveredMsgId"]


async def test_a_refused_copy_does_not_fail_the_decisions_stored_with_it(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One append is stored or refused whole; a COMMIT whose copy the store refuses is retried alone, so the other
    # decisions of its event-loop turn still go through, and it stays in doubt.
    store = h.broker.store
    real_put = store.put_many_future

    def put_many_future(records: list[Any], **kw: Any) -> Any:
        if any(r.body == b"bad" for r in records):
            fut = asyncio.get_running_loop().create_future()
            fut.set_result([store._refused("MESSAGE_ILLEGAL", "refused by the test")] * len(records))
            return fut
        return real_put(records, **kw)

    monkeypatch.setattr(store, "put_many_future", put_many_future)
    p = await h.producer()
    preps = [await p.prepare("TxTopic", body) for body in (b"good-1", b"bad", b"good-2")]
    outcomes = [h.broker.app.end_transaction.handle(None, p.end_cmd(prep, COMMIT, oneway=False)) for prep in preps]
    answers = [await outcome for outcome in outcomes]
    assert [a.code for a in answers] == [ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL, ResponseCode.SUCCESS]
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"good-1", b"good-2"]
    assert list(h.svc.pending) == [preps[1].phys]
    assert len(h.messages(TRANS_OP_HALF_TOPIC)) == 2


@pytest.mark.parametrize("oneway", [False, True], ids=["request", "oneway"])
async def test_a_failing_append_settles_every_decision_of_its_turn(
    h: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, oneway: bool
) -> None:
    store = h.broker.store
    real_put = store.put_many_future

    def broken(records: list[Any], **kw: Any) -> Any:
        raise RuntimeError("the test breaks the store")

    p = await h.producer()
    preps = [await p.prepare("TxTopic", body) for body in (b"a", b"b")]
    monkeypatch.setattr(store, "put_many_future", broken)
    outcomes = [h.broker.app.end_transaction.handle(None, p.end_cmd(prep, COMMIT, oneway=oneway)) for prep in preps]
    if oneway:
        # Nobody waits for a oneway decision: the failure is logged, per half message, when the turn's batch fails.
        assert outcomes == [None, None]
        await aeventually(lambda: h.svc.writer.idle, "the turn's decisions are handed over")
        failed = [r for r in caplog.records if "a oneway END_TRANSACTION about half message" in r.getMessage()]
        assert sorted(r.getMessage().split()[-2] for r in failed) == sorted(str(prep.phys) for prep in preps)
    else:
        for outcome in outcomes:
            with pytest.raises(RuntimeError, match="breaks the store"):
                await outcome
    await asyncio.sleep(0)  # the futures' done callbacks run
    assert not h.svc.busy  # nothing stays locked: the next decision about them goes through
    assert len(h.svc.pending) == 2  # and nothing was decided
    monkeypatch.setattr(store, "put_many_future", real_put)
    assert [(await p.end(prep, COMMIT)).code for prep in preps] == [ResponseCode.SUCCESS] * 2
    assert [m.body for m in await pull_real(h, "TxTopic")] == [b"a", b"b"]


async def test_the_check_schedule_stays_near_the_pending_size(h: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A decided transaction leaves its entry in the check schedule (a heap); once such entries are most of it, the
    # schedule is rebuilt from the pending table, and the transactions still in doubt keep their due times.
    h.svc.table.settings = dataclasses.replace(h.svc.table.settings, heap_slack=4)
    p = await h.producer()
    doubt = await p.prepare("TxTopic", b"doubt")
    for i in range(40):
        prep = await p.prepare("TxTopic", b"quick-%d" % i)
        assert (await p.end(prep, COMMIT)).code == ResponseCode.SUCCESS
        assert h.svc.table.schedule_size <= 2 * 2 + 4 + 1  # at most two pending here; without the rebuild it reaches 41
    assert list(h.svc.pending) == [doubt.phys]
    await h.tick(7)  # past transactionTimeOut: the one in doubt is checked, once
    assert len(p.checks) == 1
    hdr = p.checks[0].ext_fields
    assert int(hdr["commitLogOffset"]) == doubt.phys


async def test_half_messages_kept_for_end_transaction_are_bounded_in_bytes(
    h: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # END_TRANSACTION finds a recent half message in memory; what memory holds is bounded in count and in body bytes
    # (4 MiB bodies are allowed), and an older half message is read back from the store.
    h.svc.table.settings = dataclasses.replace(h.svc.table.settings, fresh_max_bytes=2500)
    p = await h.producer()
    preps = [await p.prepare("TxTopic", bytes([65 + i]) * 1000) for i in range(5)]
    assert list(h.svc.table.fresh) == [preps[3].phys, preps[4].phys]
    assert h.svc.table.fresh_bytes == 2000
    for prep in preps:
        assert (await p.end(prep, COMMIT)).code == ResponseCode.SUCCESS
    assert [m.body[:1] for m in await pull_real(h, "TxTopic")] == [b"A", b"B", b"C", b"D", b"E"]
    assert h.svc.table.fresh == {} and h.svc.table.fresh_bytes == 0


async def test_a_transaction_decided_at_once_gets_no_record_until_shown(h: Harness) -> None:
    # The usual transaction is decided milliseconds after its prepare: the broker builds no record for it, keeps a
    # compact history entry, and rebuilds the record from the half message when it is shown, with nothing missing.
    p = await h.producer()
    quick = await p.prepare("TxTopic", b"quick")
    slow = await p.prepare("TxTopic", b"slow")
    assert h.svc.table.history.records == {} and list(h.svc.table.fresh) == [quick.phys, slow.phys]
    assert h.svc.counter_values()["inDoubt"] == 2
    assert h.svc.retention_guard() == quick.phys
    assert (await p.end(quick, COMMIT)).code == ResponseCode.SUCCESS
    assert h.svc.table.history.records == {} and list(h.svc.table.fresh) == [slow.phys]
    counters = h.svc.counter_values()
    assert counters["commits"] == 1 and counters["resolutionSamples"] == 1 and counters["inDoubt"] == 1
    # Still undecided at the first round a second later: it gets its record, and is checked on schedule.
    await h.tick(1)
    table = h.svc.table
    assert list(table.pending_records) == [slow.phys] and table.fresh == {}
    assert list(table.history.records) == [slow.phys]
    t = await show(h, quick.uniq)
    [delivered] = await pull_real(h, "TxTopic")
    assert t["state"] == "COMMITTED" and t["resolvedBy"] == "producer" and t["producerGroup"] == "PG"
    assert t["deliveredMsgId"] == encode_offset_msg_id(delivered.store_host, delivered.physical_offset)
    assert t["historyComplete"] is True and t["checkLog"] == []
    await h.tick(6)
    assert len(p.checks) == 1
    assert (await answer_check(p, slow, ROLLBACK)).code == ResponseCode.SUCCESS
    assert (await show(h, slow.uniq))["checkLog"][0]["answer"] == "ROLLBACK"
