"""The transaction table without IO: inputs in, effects out. Half messages are built in memory; what the table would
read from disk is a small object that records whether it was asked."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import MessageRecord, Prop
from txmq.protocol.topics import TRANS_HALF_TOPIC
from txmq.txn import records
from txmq.txn.effects import AppendJournal, DecisionRequest, Discard, Reply, SendCheck, StoreDecision
from txmq.txn.history import TransactionRecord
from txmq.txn.journal import parse_journal
from txmq.txn.model import By, Decision, TxState
from txmq.txn.table import TransactionTable, TxSettings

HOST = ("127.0.0.1", 10911)
T0 = 1_700_000_000_000


class Disk:
    """What the driver would read: nothing is on disk here beyond the table's own window."""

    def __init__(self, decisions: dict[int, str] | None = None) -> None:
        self.decisions = decisions or {}
        self.asked: list[int] = []

    def decision_on_disk(self, phys: int, half: MessageRecord) -> str | None:
        self.asked.append(phys)
        return self.decisions.get(phys)

    def record_at(self, phys: int) -> TransactionRecord | None:
        return None


def half(phys: int, queue_offset: int, *, group: str = "PG", key: str | None = None, at: int = T0) -> MessageRecord:
    record = MessageRecord(
        topic="Orders",
        body=b"order-%d" % phys,
        queue_id=2,
        born_timestamp=at,
        store_host=HOST,
        properties={Prop.PGROUP: group, Prop.UNIQ_KEY: key or f"K{phys}", Prop.TRAN_MSG: "true"},
    )
    records.make_half(record)
    record.physical_offset, record.queue_offset, record.store_timestamp, record.store_size = phys, queue_offset, at, 200
    return record


def request(h: MessageRecord, decision: Decision, by: By = By.PRODUCER) -> DecisionRequest:
    return DecisionRequest(h.physical_offset, decision, by, "PG", h.queue_offset, h.properties[Prop.UNIQ_KEY])


def table(**overrides: int) -> TransactionTable:
    return TransactionTable(dataclasses.replace(TxSettings(), **overrides), HOST)


def test_a_half_message_is_fresh_until_decided_and_a_commit_waits_for_its_copy() -> None:
    t = table()
    h = half(1000, 0)
    t.prepared(h)
    assert t.in_doubt == 1 and list(t.fresh) == [1000] and t.history.records == {}
    effect = t.decide(request(h, Decision.COMMIT), h, Disk(), T0 + 5)
    assert isinstance(effect, StoreDecision) and effect.decision == Decision.COMMIT and effect.rec is None
    assert 1000 not in t.decided and t.in_doubt == 1  # a COMMIT counts once its copy is stored
    t.applied(effect, 5000, T0 + 7)
    assert t.decided[1000] == Decision.COMMIT and t.in_doubt == 0
    assert t.history.known_decision(1000) == (True, Decision.COMMIT)
    assert t.counter_values()["commits"] == 1


def test_a_rollback_is_applied_when_accepted() -> None:
    t = table()
    h = half(1000, 0)
    t.prepared(h)
    effect = t.decide(request(h, Decision.ROLLBACK), h, Disk(), T0 + 5)
    assert isinstance(effect, StoreDecision) and t.decided[1000] == Decision.ROLLBACK and t.in_doubt == 0


@pytest.mark.parametrize(
    ("first", "second", "by", "code"),
    [
        (Decision.COMMIT, Decision.COMMIT, By.PRODUCER, ResponseCode.SUCCESS),
        (Decision.COMMIT, Decision.ROLLBACK, By.CHECK, ResponseCode.SYSTEM_ERROR),
        (Decision.ROLLBACK, Decision.COMMIT, By.PRODUCER, ResponseCode.SYSTEM_ERROR),
        (Decision.ROLLBACK, Decision.ROLLBACK, By.OPERATOR, ResponseCode.TRANSACTION_FAILED),
    ],
)
def test_the_first_decision_wins(first: Decision, second: Decision, by: By, code: int) -> None:
    t = table()
    h = half(1000, 0)
    t.prepared(h)
    effect = t.decide(request(h, first), h, Disk(), T0)
    assert isinstance(effect, StoreDecision)
    t.applied(effect, 5000 if first == Decision.COMMIT else None, T0)
    again = t.decide(request(h, second, by), h, Disk(), T0 + 1)
    assert isinstance(again, Reply) and again.code == code
    assert t.decided[1000] == first


def test_a_request_that_names_the_half_message_wrongly_is_refused() -> None:
    t = table()
    h = half(1000, 0)
    t.prepared(h)
    wrong_group = dataclasses.replace(request(h, Decision.COMMIT), group="OTHER")
    wrong_offset = dataclasses.replace(request(h, Decision.COMMIT), queue_offset=9)
    for req, remark in ((wrong_group, "The producer group wrong"), (wrong_offset, "offset wrong")):
        effect = t.decide(req, h, Disk(), T0)
        assert isinstance(effect, Reply) and effect.code == ResponseCode.SYSTEM_ERROR and remark in str(effect.remark)
    missing = t.decide(request(h, Decision.COMMIT), None, Disk(), T0)
    assert isinstance(missing, Reply) and missing.remark == "Find prepared transaction message failed"
    assert t.in_doubt == 1 and t.decided == {}


def test_an_old_decision_is_asked_of_the_disk_only_past_the_window() -> None:
    t = table(decided_max=1)
    a, b = half(1000, 0), half(2000, 1)
    disk = Disk({1000: Decision.COMMIT})
    for h in (a, b):
        t.prepared(h)
        effect = t.decide(request(h, Decision.COMMIT), h, disk, T0)
        assert isinstance(effect, StoreDecision)
        t.applied(effect, h.physical_offset + 10_000, T0)
    assert list(t.decided) == [2000] and t.decided.evicted_max == 1000
    t.history.light.clear()  # the history window forgot it too: only the disk knows
    again = t.decide(request(a, Decision.ROLLBACK), a, disk, T0)
    assert isinstance(again, Reply) and again.code == ResponseCode.SYSTEM_ERROR and disk.asked == [1000]
    disk.asked.clear()
    t.decide(request(b, Decision.COMMIT), b, disk, T0)
    assert disk.asked == []


def test_checks_come_due_then_the_broker_gives_up() -> None:
    t = table(timeout_ms=6_000, check_interval_ms=60_000, check_max=2)
    h = half(1000, 0)
    t.prepared(h)
    assert t.due(T0 + 500, ()) == []  # still fresh
    assert t.due(T0 + 5_999, ()) == []  # its record is built a second later; first due at the timeout
    [due] = t.due(T0 + 6_000, ())
    assert isinstance(due, SendCheck) and due.rec.phys == 1000 and t.history.get(1000) is due.rec
    assert t.due(T0 + 6_000, {1000}) == []  # nothing twice
    line = t.check_sent(due.rec, T0 + 6_000)
    assert isinstance(line, AppendJournal) and parse_journal(line.line.encode()).attempts[1000][0].sent_ms == T0 + 6_000
    [due] = t.due(T0 + 66_000, ())
    t.check_not_sent(due.rec, T0 + 66_000)  # no producer online: waits, not counted
    assert due.rec.waiting_for_producer and due.rec.checks == 1
    [due] = t.due(T0 + 126_000, ())
    t.check_sent(due.rec, T0 + 126_000)
    [due] = t.due(T0 + 186_000, ())
    assert isinstance(due, Discard)
    assert t.discarding(due.rec) and t.decided[1000] == Decision.DISCARD
    t.resolve(due.rec, Decision.DISCARD, By.BROKER, "COPY", T0 + 186_000)
    assert due.rec.state is TxState.DISCARDED and t.discarded_now == 1
    # DISCARD is not a decision: a late COMMIT applies.
    late = t.decide(request(h, Decision.COMMIT), h, Disk(), T0 + 200_000)
    assert isinstance(late, StoreDecision)
    t.applied(late, 9000, T0 + 200_000)
    assert due.rec.state is TxState.COMMITTED and t.discarded_now == 0


def test_only_a_discarded_transaction_can_be_resumed() -> None:
    t = table(check_max=0)
    h = half(1000, 0)
    t.prepared(h)
    [due] = t.due(T0 + 7_000, ())
    rec = due.rec
    refusal = t.may_resume(rec)
    assert isinstance(refusal, Reply) and refusal.code == ResponseCode.TRANSACTION_FAILED
    assert t.discarding(rec)
    t.resolve(rec, Decision.DISCARD, By.BROKER, None, T0 + 7_000)
    assert t.may_resume(rec) is None
    t.resumed([rec], T0 + 8_000)
    assert rec.state is TxState.PREPARED and rec.checks == 0 and 1000 not in t.decided and t.pending() == {1000: rec}


def test_the_fresh_halves_are_bounded_in_bytes() -> None:
    t = table(fresh_max_bytes=2500)
    for i in range(5):
        h = half(1000 * (i + 1), i)
        h.body = b"x" * 1000
        t.prepared(h)
    assert list(t.fresh) == [4000, 5000] and t.fresh_bytes == 2000
    assert sorted(t.pending_records) == [1000, 2000, 3000]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from([Decision.COMMIT, Decision.ROLLBACK])), max_size=40))
def test_every_transaction_ends_with_its_first_decision(steps: list[tuple[int, Decision]]) -> None:
    t = table()
    halves = [half(1000 * (i + 1), i) for i in range(8)]
    for h in halves:
        t.prepared(h)
    first: dict[int, Decision] = {}
    for i, decision in steps:
        h = halves[i]
        effect = t.decide(request(h, decision), h, Disk(), T0)
        if isinstance(effect, StoreDecision):
            assert h.physical_offset not in first
            first[h.physical_offset] = decision
            t.applied(effect, 50_000 + i if decision == Decision.COMMIT else None, T0)
        else:
            assert effect.code == (ResponseCode.SUCCESS if first[h.physical_offset] == decision else 1)
    assert dict(t.decided) == first
    assert t.in_doubt == 8 - len(first)
    assert t.retention_guard() == min({h.physical_offset for h in halves} - set(first), default=2**63 - 1)
    assert all(h.topic == TRANS_HALF_TOPIC for h in halves)
