"""Check-backs answered from the application's own database: the ``txmq_transactions`` table.

A transactional producer's local transaction writes one row (transaction id, producer group, created-at) into a
table of the application's database, inside the same database transaction as its business writes. The row exists
exactly when that transaction committed, so a check-back reads it: COMMIT when the row is there; ROLLBACK only once
the transaction is older than a grace period (a commit still in flight shows no row yet); UNKNOWN otherwise.
Works with any DB-API 2.0 connection (tested with sqlite3 and psycopg 3). :class:`LocalTransactionLog` owns the
table and the rules; :class:`DatabaseTransactionListener` is a ready ``TransactionListener`` built on it.
See docs/localtx.md.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
import threading
from collections.abc import Callable
from typing import Any

from txmq.client.local_state import LocalTransactionState
from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import MQClientError
from txmq.protocol.record import Prop

log = logging.getLogger("txmq.client")

__all__ = ["DatabaseTransactionListener", "LocalTransactionLog", "LocalTransactionTooSlow", "transaction_id_of"]

DEFAULT_TABLE = "txmq_transactions"
DEFAULT_GRACE_PERIOD = 60.0
DEFAULT_KEEP = 7 * 24 * 3600.0

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_MARKER = re.compile(r"\{(\w+)\}")

Connection = Any  # a DB-API 2.0 connection; the protocol has no common type


class LocalTransactionTooSlow(MQClientError):
    """The local transaction reached its commit after the time a check-back may already have rolled it back."""


def transaction_id_of(message: Any) -> str:
    """The transaction id the producer saw, of a message (``TRANSACTION_ID``, set on send and on every check, else the
    UNIQ_KEY) or of a transaction of several messages (``Transaction.transaction_id``, which its check carries).

    Everything in the table is keyed by it: a transaction of several messages is one row.
    """
    tid = getattr(message, "transaction_id", None) or getattr(message, "uniq_key", None)
    if not tid:
        raise MQClientError(f"{message!r} carries no transaction id: was it sent by a TransactionProducer?")
    return str(tid)


def _group_of(message: Any) -> str:
    """The producer group (PGROUP) of a message, or of the first message of a transaction of several."""
    first = message.messages[0] if getattr(message, "messages", None) else message
    group = getattr(first, "properties", {}).get(Prop.PGROUP)
    if not group:
        raise MQClientError(f"{message!r} carries no producer group (PGROUP): was it sent by a TransactionProducer?")
    return str(group)


class LocalTransactionLog:
    """The ``txmq_transactions`` table in the application's database, and the rules that answer checks from it.

    ``grace_period`` (seconds) is how long after the half message's born time a missing row still means "maybe not
    committed yet" (UNKNOWN); after it, a missing row means ROLLBACK. It must exceed the longest a local transaction
    takes to commit, plus the clock difference between the producer hosts. ``keep`` (seconds, None: forever) is how
    long rows stay before :meth:`prune` deletes them; a check about a transaction older than that cannot tell a
    pruned row from a missing one and answers UNKNOWN. ``paramstyle`` is the driver's DB-API ``paramstyle``, read
    from the connection's module when not given. Time comes from ``clock`` (``txmq.testing.FakeClock`` in tests).
    """

    def __init__(
        self,
        *,
        table: str = DEFAULT_TABLE,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        keep: float | None = DEFAULT_KEEP,
        clock: Clock = SYSTEM_CLOCK,
        paramstyle: str | None = None,
    ) -> None:
        if not _IDENTIFIER.fullmatch(table):
            raise MQClientError(f"table name {table!r} is not a plain SQL identifier")
        if grace_period <= 0:
            raise MQClientError(f"grace_period must be positive, got {grace_period}")
        if keep is not None and keep <= grace_period:
            raise MQClientError(f"keep ({keep} s) must be longer than grace_period ({grace_period} s)")
        if paramstyle is not None and paramstyle not in _PLACEHOLDERS:
            raise MQClientError(f"paramstyle {paramstyle!r} is not one of {', '.join(_PLACEHOLDERS)}")
        self.table = table
        self.grace_period = grace_period
        self.keep = keep
        self.clock = clock
        self.paramstyle = paramstyle

    # -- the table ----------------------------------------------------------------------------------------------

    def create_table(self, conn: Connection) -> None:
        """Create the table and its index unless the table is there. It ends ``conn``'s open transaction (commit or
        rollback), so call it before the local transaction, not inside it."""
        cur = conn.cursor()
        try:
            # Probe first: an existing table needs no DDL (no write lock in SQLite, no CREATE right in PostgreSQL).
            cur.execute(f"SELECT 1 FROM {self.table} WHERE 1 = 0")
            cur.fetchall()
            conn.rollback()
            return
        except Exception:
            conn.rollback()
        # created_at is milliseconds since the epoch from the helper's clock, as the born time it is compared with:
        # no database time zone or timestamp type differences between drivers.
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " transaction_id VARCHAR(128) NOT NULL,"
            " producer_group VARCHAR(255) NOT NULL,"
            " created_at BIGINT NOT NULL,"
            " PRIMARY KEY (transaction_id, producer_group))",
            f"CREATE INDEX IF NOT EXISTS {self.table}_created_at ON {self.table} (created_at)",
        ]
        for attempt in (1, 2):
            try:
                for sql in statements:
                    cur.execute(sql)
                conn.commit()
                return
            except Exception:
                # Two processes creating the table at once: PostgreSQL can fail the loser despite IF NOT EXISTS.
                conn.rollback()
                if attempt == 2:
                    raise

    def record(self, conn: Connection, transaction_id: str, producer_group: str) -> None:
        """Insert the row for ``transaction_id`` in the caller's open database transaction (no commit here)."""
        self._execute(
            conn,
            "INSERT INTO {table} (transaction_id, producer_group, created_at) VALUES ({tid}, {group}, {now})",
            tid=transaction_id,
            group=producer_group,
            now=self.clock.now_ms(),
        )

    def state(self, conn: Connection, transaction_id: str, producer_group: str, born_ms: int) -> LocalTransactionState:
        """The answer to a check of ``transaction_id``, whose first half message was born at ``born_ms``.

        COMMIT when the row is there; when it is not, UNKNOWN until ``grace_period`` has passed since ``born_ms``
        (and again from ``keep`` on, or when the born time is unknown), ROLLBACK in between.
        """
        cur = self._execute(
            conn,
            "SELECT 1 FROM {table} WHERE transaction_id = {tid} AND producer_group = {group}",
            tid=transaction_id,
            group=producer_group,
        )
        if cur.fetchall():  # all: a finished statement holds no SQLite read lock
            return LocalTransactionState.COMMIT
        if born_ms <= 0:
            return LocalTransactionState.UNKNOWN
        age = (self.clock.now_ms() - born_ms) / 1000
        if age < self.grace_period:
            return LocalTransactionState.UNKNOWN  # its commit may still be on its way
        if self.keep is not None and age >= self.keep:
            log.warning(
                "check of transaction %s (%s): no row, but it is older than keep (%g s) and its row may have been "
                "pruned; answering UNKNOWN, an operator must decide (txmq admin tx resolve)",
                transaction_id,
                producer_group,
                self.keep,
            )
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.ROLLBACK

    def check(self, conn: Connection, message: Any) -> LocalTransactionState:
        """:meth:`state` for the message of a check-back (its transaction id, PGROUP and born time)."""
        return self.state(conn, transaction_id_of(message), _group_of(message), int(message.born_timestamp))

    def prune(self, conn: Connection) -> int:
        """Delete the rows older than ``keep`` and commit; returns how many went (0 when ``keep`` is None)."""
        if self.keep is None:
            return 0
        cur = self._execute(
            conn, "DELETE FROM {table} WHERE created_at < {cutoff}", cutoff=self.clock.now_ms() - int(self.keep * 1000)
        )
        conn.commit()
        return max(0, cur.rowcount)

    # -- SQL ----------------------------------------------------------------------------------------------------

    def _execute(self, conn: Connection, template: str, **values: Any) -> Any:
        """Run ``template`` with its ``{name}`` markers bound in the driver's parameter style."""
        style = self.paramstyle or paramstyle_of(conn)
        names: list[str] = []

        def place(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "table":
                return self.table
            names.append(name)
            return _PLACEHOLDERS[style](name, len(names))

        sql = _MARKER.sub(place, template)
        params: Any = {n: values[n] for n in names} if style == "named" else [values[n] for n in names]
        cur = conn.cursor()
        cur.execute(sql, params)
        return cur


_PLACEHOLDERS: dict[str, Callable[[str, int], str]] = {
    "qmark": lambda _name, _i: "?",
    "numeric": lambda _name, i: f":{i}",
    "named": lambda name, _i: f":{name}",
    "format": lambda _name, _i: "%s",
    "pyformat": lambda _name, _i: "%s",  # pyformat drivers (psycopg) take %s with a sequence as well
}


def paramstyle_of(conn: Connection) -> str:
    """The DB-API ``paramstyle`` of the driver module that made ``conn``."""
    module = sys.modules.get(type(conn).__module__.partition(".")[0])
    style = getattr(module, "paramstyle", None)
    if style not in _PLACEHOLDERS:
        raise MQClientError(
            f"cannot tell the parameter style of {type(conn).__module__}.{type(conn).__qualname__}; "
            "pass paramstyle= to LocalTransactionLog"
        )
    return str(style)


def _autocommits(conn: Connection) -> bool:
    """True for a connection that commits every statement on its own (no transaction would hold our row)."""
    if getattr(conn, "autocommit", None) is True:  # psycopg; sqlite3 from Python 3.12
        return True
    return isinstance(conn, sqlite3.Connection) and conn.isolation_level is None and not conn.in_transaction


class DatabaseTransactionListener:
    """A ``TransactionListener`` whose local transaction is one database transaction that also records its id.

    ``work(conn, message, arg)`` does the application's writes with ``conn`` (from ``connect()``, closed with
    ``close(conn)``, by default ``conn.close()``) and does not commit. The listener writes the row, commits and
    answers COMMIT. An exception from ``work``, or from the row's insert, rolls the database transaction back and
    answers ROLLBACK, as does a connection that cannot be opened or is in autocommit mode. So does reaching the
    commit once half of ``log.grace_period`` has passed since the local transaction began
    (:class:`LocalTransactionTooSlow`), since a check may roll it back from the full grace period on. A failed
    COMMIT statement answers UNKNOWN: the check reads the table. Checks are answered from the table by
    :meth:`LocalTransactionLog.check`. Every ``prune_interval`` seconds (None: never) a successful transaction is
    followed by :meth:`LocalTransactionLog.prune`.

    Plain methods: ``TransactionProducer`` (asyncio) runs them in threads, ``txmq.client.sync.TransactionProducer``
    runs ``execute_local_transaction`` in the sending thread. Connections must not be in autocommit mode. For a
    transaction of several messages (``producer.transaction(arg)``) ``work`` gets the ``Transaction`` (its
    ``messages``) and one row records it; the deadline then counts from the end of its block, so the block itself
    must take well under half the grace period (checks measure from its first message).
    """

    def __init__(
        self,
        connect: Callable[[], Connection],
        work: Callable[[Connection, Any, Any], object],
        log: LocalTransactionLog | None = None,
        *,
        close: Callable[[Connection], object] | None = None,
        prune_interval: float | None = 3600.0,
    ) -> None:
        self.connect = connect
        self.work = work
        self.log = log or LocalTransactionLog()
        self.close = close or (lambda conn: conn.close())
        self.prune_interval = prune_interval
        self._lock = threading.Lock()
        self._table_ready = False
        self._last_prune: float | None = None

    def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
        clock = self.log.clock
        began = clock.monotonic()
        tid = transaction_id_of(message)
        try:
            conn = self._open()
        except Exception as exc:  # nothing was written: the message must not go out
            log.warning("local transaction %s rolled back: no usable database connection: %r", tid, exc)
            return LocalTransactionState.ROLLBACK
        try:
            try:
                self.log.record(conn, tid, _group_of(message))
                self.work(conn, message, arg)
                if clock.monotonic() - began >= self.log.grace_period / 2:
                    raise LocalTransactionTooSlow(
                        f"local transaction {tid} took {clock.monotonic() - began:.1f} s, half its grace period "
                        f"({self.log.grace_period:g} s) or more; rolled back before a check could roll it back"
                    )
            except Exception as exc:
                conn.rollback()
                # A declined order is business as usual; a transaction too slow to commit safely is not.
                level = logging.WARNING if isinstance(exc, LocalTransactionTooSlow) else logging.INFO
                log.log(level, "local transaction %s rolled back: %r", tid, exc)
                return LocalTransactionState.ROLLBACK
            try:
                conn.commit()
            except Exception as exc:
                log.warning("commit of local transaction %s failed (%r); the check-back will read the table", tid, exc)
                return LocalTransactionState.UNKNOWN
            self._prune_if_due(conn)
            return LocalTransactionState.COMMIT
        finally:
            self.close(conn)

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        conn = self._open()
        try:
            state = self.log.check(conn, message)
            conn.rollback()  # end the read transaction (PostgreSQL would keep it open)
            return state
        finally:
            self.close(conn)

    def _open(self) -> Connection:
        conn = self.connect()
        try:
            if _autocommits(conn):
                raise MQClientError(
                    "DatabaseTransactionListener needs connections that hold transactions: sqlite3 without "
                    "isolation_level=None, psycopg with autocommit=False"
                )
            if not self._table_ready:
                self.log.create_table(conn)
                self._table_ready = True
        except BaseException:
            self.close(conn)
            raise
        return conn

    def _prune_if_due(self, conn: Connection) -> None:
        if self.prune_interval is None:
            return
        now = self.log.clock.monotonic()
        with self._lock:
            if self._last_prune is not None and now - self._last_prune < self.prune_interval:
                return
            self._last_prune = now
        try:
            pruned = self.log.prune(conn)
        except Exception as exc:  # the transaction itself committed: never let housekeeping change its answer
            conn.rollback()
            log.warning("pruning %s failed: %r", self.log.table, exc)
            return
        if pruned:
            log.info("pruned %d rows older than %g s from %s", pruned, self.log.keep, self.log.table)
