"""The check rules, pruning and the listener of ``txmq.client.localtx``, over a real SQLite file and a real
PostgreSQL server (psycopg 3). Time comes from a FakeClock."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from db_harness import connect, execute, query
from txmq.client import LocalTransactionState, Message, MessageExt
from txmq.client.localtx import DatabaseTransactionListener, LocalTransactionLog, transaction_id_of
from txmq.errors import MQClientError
from txmq.protocol.record import Prop
from txmq.testing import FakeClock

C, R, U = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
GRACE = 30.0
KEEP = 3600.0
GROUP = "OrderService"


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database spec for :func:`db_harness.connect`: an SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'app.db'}"
    return f"postgresql:{request.getfixturevalue('postgres_db')}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def advance(clock: FakeClock, seconds: float) -> None:
    asyncio.run(clock.advance(seconds))


def tx_log(clock: FakeClock, **options: Any) -> LocalTransactionLog:
    return LocalTransactionLog(**{"grace_period": GRACE, "keep": KEEP, "clock": clock, **options})


def sent(tid: str, group: str = GROUP) -> Message:
    """A message as ``execute_local_transaction`` gets it (after the half message was stored)."""
    msg = Message("Orders", b"order")
    msg.properties.update({Prop.UNIQ_KEY: tid, Prop.TRANSACTION_ID: tid, Prop.PGROUP: group})
    return msg


def checked(tid: str, born_ms: int, group: str = GROUP) -> MessageExt:
    """A message as ``check_local_transaction`` gets it: the half message with its born time."""
    props = {Prop.UNIQ_KEY: tid, Prop.TRANSACTION_ID: tid, Prop.PGROUP: group}
    return MessageExt("Orders", b"order", properties=props, born_timestamp=born_ms)


def committed_row(db: str, log: LocalTransactionLog, tid: str, group: str = GROUP) -> None:
    conn = connect(db)
    try:
        log.create_table(conn)
        log.record(conn, tid, group)
        conn.commit()
    finally:
        conn.close()


def state(db: str, log: LocalTransactionLog, message: MessageExt) -> LocalTransactionState:
    conn = connect(db)
    try:
        log.create_table(conn)
        return log.check(conn, message)
    finally:
        conn.close()


def tid() -> str:
    return uuid.uuid4().hex.upper()


# -- the rules ---------------------------------------------------------------------------------------------------


def test_a_row_means_commit_at_any_age(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    committed_row(db, log, t)
    answers = [state(db, log, checked(t, born))]
    for seconds in (GRACE, KEEP):
        advance(clock, seconds)
        answers.append(state(db, log, checked(t, born)))
    assert answers == [C, C, C]


def test_no_row_is_unknown_within_the_grace_period_then_rollback(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    committed_row(db, log, tid())  # someone else's transaction: the table is not empty
    t = tid()
    born = clock.now_ms()
    answers = [state(db, log, checked(t, born))]
    advance(clock, GRACE - 0.001)
    answers.append(state(db, log, checked(t, born)))
    advance(clock, 0.001)
    answers.append(state(db, log, checked(t, born)))
    assert answers == [U, U, R]


def test_no_row_past_keep_is_unknown_since_the_row_may_have_been_pruned(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    advance(clock, KEEP - 1)
    before = state(db, log, checked(t, born))
    advance(clock, 1)
    assert (before, state(db, log, checked(t, born))) == (R, U)
    assert state(db, tx_log(clock, keep=None), checked(t, born)) == R  # rows never pruned: absence is final


def test_no_born_time_is_unknown(db: str, clock: FakeClock) -> None:
    advance(clock, KEEP / 2)
    assert state(db, tx_log(clock), checked(tid(), 0)) == U


def test_rows_belong_to_their_producer_group(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    committed_row(db, log, t, group="Billing")
    advance(clock, GRACE)
    assert state(db, log, checked(t, born, group="Billing")) == C
    assert state(db, log, checked(t, born, group=GROUP)) == R


def test_an_uncommitted_row_is_unknown_until_its_commit(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    committed_row(db, log, tid())
    slow = connect(db)  # a local transaction whose commit is slow: its row is written, not committed
    try:
        log.record(slow, t, GROUP)
        advance(clock, GRACE / 2)
        during = state(db, log, checked(t, born))
        slow.commit()
    finally:
        slow.close()
    assert (during, state(db, log, checked(t, born))) == (U, C)


def test_prune_deletes_only_rows_older_than_keep(db: str, clock: FakeClock) -> None:
    log = tx_log(clock)
    old, new = tid(), tid()
    born = clock.now_ms()
    committed_row(db, log, old)
    advance(clock, 10)
    committed_row(db, log, new)
    advance(clock, KEEP - 5)  # old is KEEP + 5 s old, new KEEP - 5 s
    conn = connect(db)
    try:
        assert log.prune(conn) == 1
        assert log.prune(conn) == 0
    finally:
        conn.close()
    assert query(db, "SELECT transaction_id FROM txmq_transactions") == [(new,)]
    assert state(db, log, checked(new, born + 10_000)) == C
    conn = connect(db)
    try:
        assert LocalTransactionLog(keep=None).prune(conn) == 0
    finally:
        conn.close()


def test_table_name_and_periods_are_validated() -> None:
    with pytest.raises(MQClientError, match="identifier"):
        LocalTransactionLog(table="t; DROP TABLE orders")
    with pytest.raises(MQClientError, match="longer than grace_period"):
        LocalTransactionLog(grace_period=60, keep=60)
    with pytest.raises(MQClientError, match="paramstyle"):
        LocalTransactionLog(paramstyle="dollar")


@pytest.mark.parametrize("style", ["qmark", "numeric", "named"])
def test_every_sqlite_parameter_style(style: str, tmp_path: Path, clock: FakeClock) -> None:
    db = f"sqlite:{tmp_path / 'styles.db'}"
    log = tx_log(clock, paramstyle=style, table="txmq_tx_styles")
    t = tid()
    born = clock.now_ms()
    committed_row(db, log, t)
    advance(clock, GRACE)
    assert (state(db, log, checked(t, born)), state(db, log, checked(tid(), born))) == (C, R)


def test_transaction_id_is_the_one_the_producer_saw() -> None:
    msg = checked("UNIQ", 1)
    msg.properties[Prop.TRANSACTION_ID] = "TX-OF-SEVERAL"
    assert transaction_id_of(msg) == "TX-OF-SEVERAL"
    del msg.properties[Prop.TRANSACTION_ID]
    assert transaction_id_of(msg) == "UNIQ"
    with pytest.raises(MQClientError, match="no transaction id"):
        transaction_id_of(Message("Orders", b""))


# -- the listener ------------------------------------------------------------------------------------------------


class Declined(Exception):
    pass


def orders_table(db: str) -> None:
    execute(db, "CREATE TABLE orders (id INTEGER PRIMARY KEY)")


def insert_order(conn: Any, message: Message, order: dict[str, Any]) -> None:
    """The application's business write; it never commits."""
    conn.cursor().execute(f"INSERT INTO orders (id) VALUES ({int(order['id'])})")
    if order.get("declined"):
        raise Declined(f"payment for order {order['id']} declined")


def listener(db: str, log: LocalTransactionLog, work: Callable[..., Any] = insert_order, **options: Any) -> Any:
    return DatabaseTransactionListener(lambda: connect(db), work, log, **options)


def test_listener_commits_the_work_and_the_row_together(db: str, clock: FakeClock) -> None:
    orders_table(db)
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    lst = listener(db, log)
    assert lst.execute_local_transaction(sent(t), {"id": 1}) == C
    assert query(db, "SELECT id FROM orders") == [(1,)]
    assert query(db, "SELECT transaction_id, producer_group FROM txmq_transactions") == [(t, GROUP)]
    advance(clock, GRACE)
    assert lst.check_local_transaction(checked(t, born)) == C


def test_listener_rolls_back_the_work_and_the_row_on_an_exception(db: str, clock: FakeClock) -> None:
    orders_table(db)
    log = tx_log(clock)
    t = tid()
    born = clock.now_ms()
    lst = listener(db, log)
    assert lst.execute_local_transaction(sent(t), {"id": 2, "declined": True}) == R
    assert query(db, "SELECT id FROM orders") == []
    assert query(db, "SELECT transaction_id FROM txmq_transactions") == []
    early = lst.check_local_transaction(checked(t, born))
    advance(clock, GRACE)
    assert (early, lst.check_local_transaction(checked(t, born))) == (U, R)


def test_listener_rolls_back_a_transaction_that_reaches_its_commit_too_late(db: str, clock: FakeClock) -> None:
    orders_table(db)
    log = tx_log(clock)

    def slow_by(seconds: float) -> Callable[..., None]:
        def work(conn: Any, message: Message, order: dict[str, Any]) -> None:
            insert_order(conn, message, order)
            advance(clock, seconds)

        return work

    in_time = listener(db, log, slow_by(GRACE / 2 - 0.001)).execute_local_transaction(sent(tid()), {"id": 3})
    too_late = listener(db, log, slow_by(GRACE / 2)).execute_local_transaction(sent(tid()), {"id": 4})
    assert (in_time, too_late) == (C, R)
    assert query(db, "SELECT id FROM orders") == [(3,)]
    assert len(query(db, "SELECT transaction_id FROM txmq_transactions")) == 1


def test_listener_refuses_autocommit_connections(db: str, tmp_path: Path, clock: FakeClock) -> None:
    if db.startswith("sqlite"):
        opener: Callable[[], Any] = lambda: sqlite3.connect(tmp_path / "auto.db", isolation_level=None)  # noqa: E731
    else:
        import psycopg

        opener = lambda: psycopg.connect(db.partition(":")[2], autocommit=True)  # noqa: E731
    lst = DatabaseTransactionListener(opener, insert_order, tx_log(clock))
    t = tid()
    assert lst.execute_local_transaction(sent(t), {"id": 5}) == R  # nothing written: the message never goes out
    with pytest.raises(MQClientError, match="hold transactions"):  # a check raising is UNKNOWN: asked again later
        lst.check_local_transaction(checked(t, clock.now_ms()))


def test_listener_rolls_back_when_the_database_cannot_be_reached(clock: FakeClock) -> None:
    def unreachable() -> Any:
        raise sqlite3.OperationalError("unable to open database file")

    lst = DatabaseTransactionListener(unreachable, insert_order, tx_log(clock))
    assert lst.execute_local_transaction(sent(tid()), {"id": 6}) == R
    with pytest.raises(sqlite3.OperationalError):
        lst.check_local_transaction(checked(tid(), clock.now_ms()))


def test_listener_prunes_on_its_schedule(db: str, clock: FakeClock) -> None:
    orders_table(db)
    log = tx_log(clock)
    lst = listener(db, log, prune_interval=2 * KEEP)
    first, second, third = tid(), tid(), tid()
    assert lst.execute_local_transaction(sent(first), {"id": 1}) == C  # the first success prunes (nothing yet)
    advance(clock, KEEP + 1)
    assert lst.execute_local_transaction(sent(second), {"id": 2}) == C  # within prune_interval: no prune
    before = {r[0] for r in query(db, "SELECT transaction_id FROM txmq_transactions")}
    advance(clock, KEEP)
    assert lst.execute_local_transaction(sent(third), {"id": 3}) == C  # prunes first (older than keep) only
    after = {r[0] for r in query(db, "SELECT transaction_id FROM txmq_transactions")}
    assert (before, after) == ({first, second}, {second, third})
