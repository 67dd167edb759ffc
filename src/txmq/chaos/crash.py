"""The crash campaign: a real ``txmq dev`` (default settings, so SYNC_FLUSH) under load is killed with SIGKILL at
random moments and restarted on the same data, N times; then the messages are counted in OpenChaos's categories.

Load in every trial, all against the same broker:

* plain sends by txmq's ``Producer`` (several concurrent senders, no retries, so a body is sent once);
* plain sync sends by the official C++ client (``tests/compat/cpp_driver.py`` in its own venv), when present;
* orderly sends: per sharding key one sender, one message at a time, stopping at the first failure;
* transactions whose local transaction is a sqlite transaction (``DatabaseTransactionListener``): a quarter is
  declined (the work raises, ROLLBACK), and an eighth answers UNKNOWN after its database commit or rollback, as a
  producer whose END_TRANSACTION is lost would, so checks have work in every campaign;
* a concurrent push consumer (plain and transactional topics) and an orderly one (the orderly topic).

After the last restart a producer of the transactional group answers the checks until nothing is in doubt, the
consumers drain, and the store is read back. Counted:

* lost: an acknowledged send, or a transaction whose database commit happened, missing from the store or never
  delivered to its consumer group;
* duplicated: a body stored twice (every sender sends a body once); redeliveries to a consumer are reported apart,
  as at-least-once allows them;
* reordered: within one sharding key, a stored order, or a first-delivery order, that differs from the send order;
* unexpected: a stored body nobody sent, or a declined (rolled-back) transaction's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txmq.chaos.common import create_topics, read_topic
from txmq.chaos.report import PartResult
from txmq.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.client.localtx import DatabaseTransactionListener, LocalTransactionLog
from txmq.testing import DevCluster

log = logging.getLogger("txmq.chaos")

PLAIN, ORDERED, TX = "ChaosPlain", "ChaosOrdered", "ChaosTx"
TX_GROUP = "ChaosTxProducers"
PLAIN_GROUP, ORDERED_GROUP = "ChaosPlainConsumers", "ChaosOrderedConsumers"
QUEUES = 4
ORDER_KEYS = 8
PLAIN_SENDERS = 4
TX_SENDERS = 3
FAST = {
    "rebalance_interval": 1.0,
    "poll_name_server_interval": 2.0,
    "heartbeat_interval": 2.0,
    "persist_consumer_offset_interval": 0.5,
}
# Checks come every second so that in-doubt transactions are settled in seconds; everything else is the default.
BROKER_CONF = {
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
}
DRAIN_PATIENCE = 150.0  # seconds without a new delivery before the drain gives up
GRACE_PERIOD = 3.0  # seconds a missing database row still means "maybe not committed yet"


@dataclass
class CrashSettings:
    trials: int = 25
    load_min: float = 0.2  # seconds of load before the kill, drawn uniformly
    load_max: float = 1.2
    seed: int = 20261125
    cpp: bool = True  # use the official C++ client when its venv is found
    settle_timeout: float = 120.0


def find_cpp_driver() -> tuple[Path, Path] | None:
    """(python of the C++ client's venv, cpp_driver.py) when both exist: a checkout with .venv-cpp, or
    TXMQ_CPP_VENV naming the venv."""
    repo = Path(__file__).resolve().parents[3]
    driver = repo / "tests" / "compat" / "cpp_driver.py"
    venv = Path(os.environ.get("TXMQ_CPP_VENV", repo / ".venv-cpp"))
    python = venv / "bin" / "python"
    if driver.exists() and python.exists():
        return python, driver
    return None


@dataclass
class Ledger:
    """What the senders know: what they tried and what the broker acknowledged."""

    tried: set[bytes] = field(default_factory=set)
    acked: set[bytes] = field(default_factory=set)
    ordered_acked: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    next_seq: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    tx_tried: set[bytes] = field(default_factory=set)
    tx_declined: set[bytes] = field(default_factory=set)
    send_failures: int = 0
    cpp_acked: int = 0


class Deliveries:
    """Every message handed to a consumer's listener, in order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, bytes]] = []
        self.distinct: set[bytes] = set()  # kept as they come: the drain checks it often, at no cost per message

    def add(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            self.items.extend((m.topic, m.body) for m in msgs)
            self.distinct.update(m.body for m in msgs)

    def missing(self, want: set[bytes]) -> int:
        with self.lock:
            return len(want - self.distinct)

    def snapshot(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.items)


def _tx_fate(body: bytes) -> tuple[bool, bool]:
    """(declined, silent) for a transaction body: a quarter declined, an eighth answering UNKNOWN."""
    h = hashlib.blake2s(body, digest_size=2).digest()
    return h[0] % 4 == 0, h[1] % 8 == 0


class Declined(Exception):
    """The business work refuses the order: the local transaction rolls back."""


class ChaosTxListener:
    """The sqlite-backed listener, answering UNKNOWN for the "silent" eighth after doing its work."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.checks = Counter[str]()
        self.lock = threading.Lock()
        with contextlib.closing(self._connect()) as conn, conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (body BLOB PRIMARY KEY)")
        self.inner = DatabaseTransactionListener(
            self._connect, self._work, LocalTransactionLog(grace_period=GRACE_PERIOD), prune_interval=None
        )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=30, isolation_level="IMMEDIATE")

    @staticmethod
    def _work(conn: sqlite3.Connection, message: Any, arg: Any) -> None:
        if _tx_fate(message.body)[0]:
            raise Declined(message.body)
        conn.execute("INSERT INTO orders (body) VALUES (?)", (message.body,))

    def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
        state = self.inner.execute_local_transaction(message, arg)
        return LocalTransactionState.UNKNOWN if _tx_fate(message.body)[1] else state

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        state = self.inner.check_local_transaction(message)
        with self.lock:
            self.checks[state.name] += 1
        return state

    def committed(self) -> set[bytes]:
        with contextlib.closing(self._connect()) as conn:
            return {bytes(row[0]) for row in conn.execute("SELECT body FROM orders")}


class CppProducer:
    """The official C++ client sending sync messages in a child process; acknowledged bodies are read from its
    ``sent`` lines."""

    def __init__(self, python: Path, driver: Path, namesrv: str, prefix: str) -> None:
        self.prefix = prefix
        self.acked: list[bytes] = []
        self.proc = subprocess.Popen(
            [
                str(python),
                str(driver),
                "produce",
                "--namesrv",
                namesrv,
                "--topic",
                PLAIN,
                "--count",
                "1000000",
                "--mode",
                "sync",
                "--group",
                "ChaosCppProducers",
                "--body-prefix",
                prefix,
                "--retry-times",
                "0",
                "--send-timeout-ms",
                "1000",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut by the kill: not known to be acknowledged
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "sent" and event.get("status") == "OK":
                self.acked.append(f"{self.prefix}{event['i']}".encode())

    def stop(self) -> list[bytes]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.reader.join(10)
        return list(self.acked)


class Trial:
    """The clients of one trial, started against a running broker and stopped after it was killed."""

    def __init__(
        self,
        number: int,
        namesrv: str,
        ledger: Ledger,
        listener: ChaosTxListener,
        consumed: Deliveries,
        ordered: Deliveries,
    ) -> None:
        self.n = number
        self.ns = namesrv
        self.ledger = ledger
        self.listener = listener
        self.consumed = consumed
        self.ordered = ordered
        self.stop = asyncio.Event()
        self.clients: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, cpp: tuple[Path, Path] | None) -> CppProducer | None:
        tag = f"t{self.n}"
        producer = Producer(
            "ChaosProducers",
            self.ns,
            instance_name=f"p{tag}",
            retry_times_when_send_failed=0,
            send_msg_timeout=2,
            **FAST,
        )
        ordered = Producer(
            "ChaosOrderedProducers",
            self.ns,
            instance_name=f"o{tag}",
            retry_times_when_send_failed=0,
            send_msg_timeout=2,
            **FAST,
        )
        txp = TransactionProducer(
            TX_GROUP,
            self.ns,
            self.listener,
            instance_name=f"x{tag}",
            retry_times_when_send_failed=0,
            send_msg_timeout=2,
            **FAST,
        )
        plain_c = PushConsumer(
            PLAIN_GROUP,
            self.ns,
            instance_name=f"c{tag}",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            pull_time_delay_when_exception=0.3,
            **FAST,
        )
        plain_c.subscribe(PLAIN)
        plain_c.subscribe(TX)
        plain_c.register_listener(self._concurrent)
        ordered_c = PushConsumer(
            ORDERED_GROUP,
            self.ns,
            instance_name=f"oc{tag}",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            pull_time_delay_when_exception=0.3,
            lock_max_live_seconds=6,
            **FAST,
        )
        ordered_c.subscribe(ORDERED)
        ordered_c.register_listener(self._orderly, orderly=True)
        cpp_producer = CppProducer(*cpp, self.ns, f"cpp-{self.n}-") if cpp else None
        for client in (producer, ordered, txp, plain_c, ordered_c):
            try:
                await asyncio.wait_for(client.start(), 15)
            except Exception as exc:  # the kill may come while they start: that is one of the moments
                log.info("trial %d: a client did not start: %r", self.n, exc)
            self.clients.append(client)
        self.tasks += [asyncio.ensure_future(self._plain(producer, w)) for w in range(PLAIN_SENDERS)]
        self.tasks += [asyncio.ensure_future(self._ordered(ordered, k)) for k in range(ORDER_KEYS)]
        self.tasks += [asyncio.ensure_future(self._tx(txp, w)) for w in range(TX_SENDERS)]
        return cpp_producer

    def _concurrent(self, msgs: list[MessageExt]) -> ConsumeStatus:
        self.consumed.add(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def _orderly(self, msgs: list[MessageExt], context: Any = None) -> ConsumeOrderlyStatus:
        self.ordered.add(msgs)
        return ConsumeOrderlyStatus.SUCCESS

    async def _plain(self, producer: Producer, w: int) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"plain-{self.n}-{w}-{i}".encode()
            i += 1
            self.ledger.tried.add(body)
            try:
                await producer.send(Message(PLAIN, body))
            except Exception:
                self.ledger.send_failures += 1
                return
            self.ledger.acked.add(body)

    async def _ordered(self, producer: Producer, key: int) -> None:
        while not self.stop.is_set():
            seq = self.ledger.next_seq[key]
            self.ledger.next_seq[key] = seq + 1
            body = f"ord-{key}-{seq}".encode()
            self.ledger.tried.add(body)
            try:
                await producer.send_orderly(Message(ORDERED, body, keys=str(key)), key)
            except Exception:
                # Stop: a timed-out send may still be stored later, and a next send would then race it.
                self.ledger.send_failures += 1
                return
            self.ledger.acked.add(body)
            self.ledger.ordered_acked[key].append(seq)

    async def _tx(self, producer: TransactionProducer, w: int) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"tx-{self.n}-{w}-{i}".encode()
            i += 1
            self.ledger.tx_tried.add(body)
            if _tx_fate(body)[0]:
                self.ledger.tx_declined.add(body)
            try:
                await producer.send_message_in_transaction(Message(TX, body), None)
            except Exception:
                self.ledger.send_failures += 1
                return

    async def finish(self, cpp: CppProducer | None) -> None:
        self.stop.set()
        if cpp is not None:
            acked = cpp.stop()
            self.ledger.tried.update(acked)
            self.ledger.acked.update(acked)
            self.ledger.cpp_acked += len(acked)
            # A C++ send in flight at the kill may be stored although its line never came: it was tried.
            self.ledger.tried.update(f"{cpp.prefix}{i}".encode() for i in range(len(acked), len(acked) + 64))
        _done, pending = await asyncio.wait(self.tasks, timeout=30)
        for task in pending:
            task.cancel()
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown(), 10)


async def _settle(cluster: DevCluster, listener: ChaosTxListener, timeout: float) -> int:
    """Answer checks until the broker holds nothing in doubt; returns how many were still in doubt at the end."""
    checker = TransactionProducer(TX_GROUP, cluster.namesrv_addr, listener, instance_name="chaos-checker", **FAST)
    async with checker, Admin(cluster.namesrv_addr, instance_name="chaos-settle") as admin:
        deadline = time.monotonic() + timeout
        while True:
            pending = await admin.list_transactions(group=TX_GROUP, limit=10000)
            if not pending or time.monotonic() > deadline:
                return len(pending)
            await asyncio.sleep(0.5)


async def _drain(
    cluster: DevCluster, consumed: Deliveries, ordered: Deliveries, want: dict[str, set[bytes]], timeout: float
) -> None:
    """Run the consumer groups until they were given every stored message (or made no progress for ``timeout``)."""
    ns = cluster.namesrv_addr
    plain_c = PushConsumer(PLAIN_GROUP, ns, instance_name="drain-c", **FAST)
    plain_c.subscribe(PLAIN)
    plain_c.subscribe(TX)

    def concurrent(msgs: list[MessageExt]) -> ConsumeStatus:
        consumed.add(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def orderly(msgs: list[MessageExt], context: Any = None) -> ConsumeOrderlyStatus:
        ordered.add(msgs)
        return ConsumeOrderlyStatus.SUCCESS

    plain_c.register_listener(concurrent)
    ordered_c = PushConsumer(ORDERED_GROUP, ns, instance_name="drain-oc", lock_max_live_seconds=6, **FAST)
    ordered_c.subscribe(ORDERED)
    ordered_c.register_listener(orderly, orderly=True)
    async with plain_c, ordered_c:
        # Wait as long as the groups make progress (a long campaign leaves a large backlog, and every kill took
        # back the offsets committed since the broker's last offset flush), up to ``timeout`` without progress.
        # The check reads the deliveries' running sets: rebuilding sets of millions of deliveries here (as this
        # did) held the event loop for seconds at a time on a loaded machine, starving the consumers it waits for.
        last_progress, last_seen = time.monotonic(), -1
        want_plain, want_ordered = want[PLAIN] | want[TX], want[ORDERED]
        while time.monotonic() - last_progress < timeout:
            seen = len(consumed.distinct) + len(ordered.distinct)
            if seen != last_seen:
                if not consumed.missing(want_plain) and not ordered.missing(want_ordered):
                    return
                last_seen, last_progress = seen, time.monotonic()
            await asyncio.sleep(0.5)


def _seq_of(body: bytes) -> tuple[int, int]:
    _, key, seq = body.decode().split("-")
    return int(key), int(seq)


def count_anomalies(
    result: PartResult,
    ledger: Ledger,
    stored: dict[str, list[MessageExt]],
    committed: set[bytes],
    consumed: list[tuple[str, bytes]],
    ordered: list[tuple[str, bytes]],
) -> None:
    result.zero("lost", "not_delivered", "duplicated", "reordered", "unexpected", "in_doubt_left")
    bodies = {topic: Counter(m.body for m in msgs) for topic, msgs in stored.items()}
    in_store = set(bodies[PLAIN]) | set(bodies[ORDERED])
    for body in sorted(ledger.acked - in_store):
        result.fail("lost", f"acknowledged send {body.decode()} is not in the store")
    for topic in (PLAIN, ORDERED, TX):
        for body, n in bodies[topic].items():
            if n > 1:
                result.fail("duplicated", f"{body.decode()} is stored {n} times in {topic}")
    for body in sorted((set(bodies[PLAIN]) | set(bodies[ORDERED])) - ledger.tried):
        result.fail("unexpected", f"{body!r} is stored but nobody sent it")
    # Transactions: committed in the database <=> visible, once.
    tx_visible = set(bodies[TX])
    for body in sorted(committed - tx_visible):
        result.fail("lost", f"transaction {body.decode()} committed in the database but is not delivered")
    for body in sorted(tx_visible - committed):
        why = "declined (rolled back)" if body in ledger.tx_declined else "not committed in the database"
        result.fail("unexpected", f"transaction {body!r} is visible although {why}")
    for body in sorted(committed & ledger.tx_declined):
        result.fail("unexpected", f"declined transaction {body.decode()} has a database row")
    # What the consumer groups were given.
    given = Counter(b for _t, b in consumed)
    given_ordered = Counter(b for _t, b in ordered)
    for body in sorted((ledger.acked & set(bodies[PLAIN])) - set(given)):
        result.fail("not_delivered", f"{body.decode()} is stored but was never delivered to {PLAIN_GROUP}")
    for body in sorted(committed - set(given)):
        result.fail("not_delivered", f"committed transaction {body.decode()} was never delivered to {PLAIN_GROUP}")
    for body in sorted(ledger.acked & set(bodies[ORDERED]) - set(given_ordered)):
        result.fail("not_delivered", f"{body.decode()} is stored but was never delivered to {ORDERED_GROUP}")
    for body in sorted(set(given) - set(bodies[PLAIN]) - tx_visible):
        result.fail("unexpected", f"{body!r} was delivered but is not a stored message")
    # Order within a sharding key: in its queue, and in what the orderly consumer saw first.
    stored_seqs: dict[int, list[int]] = defaultdict(list)
    for m in stored[ORDERED]:
        key, seq = _seq_of(m.body)
        stored_seqs[key].append(seq)
    for key, seqs in stored_seqs.items():
        for a, b in itertools.pairwise(seqs):
            if b <= a:
                result.fail("reordered", f"key {key}: stored seq {b} after {a}")
    queues_of_key: dict[int, set[int]] = defaultdict(set)
    for m in stored[ORDERED]:
        queues_of_key[_seq_of(m.body)[0]].add(m.queue_id)
    for key, qids in queues_of_key.items():
        if len(qids) > 1:
            result.fail("reordered", f"key {key} is spread over queues {sorted(qids)}")
    first_seen: dict[int, list[int]] = defaultdict(list)
    seen: set[bytes] = set()
    for _t, body in ordered:
        if body in seen:
            continue
        seen.add(body)
        key, seq = _seq_of(body)
        first_seen[key].append(seq)
    for key, seqs in first_seen.items():
        for a, b in itertools.pairwise(seqs):
            if b <= a:
                result.fail("reordered", f"key {key}: the orderly consumer got seq {b} first after {a}")
    result.info.update(
        acknowledged_sends=len(ledger.acked),
        acknowledged_by_cpp_client=ledger.cpp_acked,
        stored_unacknowledged=len(in_store - ledger.acked),
        failed_sends=ledger.send_failures,
        transactions_tried=len(ledger.tx_tried),
        transactions_committed=len(committed),
        transactions_declined=len(ledger.tx_declined),
        redelivered_plain=sum(n - 1 for n in given.values() if n > 1),
        redelivered_ordered=sum(n - 1 for n in given_ordered.values() if n > 1),
    )


async def run_crash_campaign(settings: CrashSettings, work_dir: Path, progress: Any = None) -> PartResult:
    result = PartResult("crash")
    started = time.monotonic()
    rng = random.Random(settings.seed)
    work_dir.mkdir(parents=True, exist_ok=True)
    cpp = find_cpp_driver() if settings.cpp else None
    result.info["cpp_client"] = "yes" if cpp else "no (venv or driver not found)"
    cluster = DevCluster(work_dir / "crash-cluster", dict(BROKER_CONF))
    ledger = Ledger()
    listener = ChaosTxListener(work_dir / "orders.db")
    consumed, ordered = Deliveries(), Deliveries()
    kills = 0
    moments: Counter[str] = Counter()
    try:
        cluster.start(timeout=60)
        await create_topics(cluster.namesrv_addr, {PLAIN: QUEUES, ORDERED: QUEUES, TX: QUEUES})
        for n in range(1, settings.trials + 1):
            trial = Trial(n, cluster.namesrv_addr, ledger, listener, consumed, ordered)
            early = rng.random() < 0.15  # some kills land while the clients are still starting
            start_task = asyncio.ensure_future(trial.start(cpp))
            if early:
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                moments["while clients start"] += 1
            else:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(start_task), 30)
                await asyncio.sleep(rng.uniform(settings.load_min, settings.load_max))
                moments["under load"] += 1
            cluster.kill()
            kills += 1
            cpp_producer = None
            with contextlib.suppress(Exception):
                cpp_producer = await asyncio.wait_for(start_task, 60)
            await trial.finish(cpp_producer)
            cluster.start(timeout=60)
            if progress:
                progress(f"crash: kill {n}/{settings.trials}, {len(ledger.acked)} acknowledged so far")
        result.info["kills"] = kills
        result.info.update({f"kills {k}": v for k, v in moments.items()})
        in_doubt = await _settle(cluster, listener, settings.settle_timeout)
        result.info["checks_answered"] = dict(listener.checks)
        result.info["checks_answered_total"] = sum(listener.checks.values())
        stored = {t: await read_topic(cluster.namesrv_addr, t) for t in (PLAIN, ORDERED, TX)}
        committed = listener.committed()
        want = {
            PLAIN: {m.body for m in stored[PLAIN]},
            ORDERED: {m.body for m in stored[ORDERED]},
            TX: {m.body for m in stored[TX]},
        }
        drain_started = time.monotonic()
        # No progress for longer than the broker keeps a dead orderly consumer's queue locks (60 s).
        await _drain(cluster, consumed, ordered, want, DRAIN_PATIENCE)
        result.info["drain_seconds"] = round(time.monotonic() - drain_started)
        count_anomalies(result, ledger, stored, committed, consumed.snapshot(), ordered.snapshot())
        if in_doubt:
            result.must_be_zero["in_doubt_left"] = in_doubt
        unhandled = _unhandled_in_log(cluster.log_text())
        result.must_be_zero["broker_unhandled_exceptions"] = len(unhandled)
        if unhandled:
            result.examples["broker_unhandled_exceptions"] = unhandled[:5]
    except Exception as exc:
        log.exception("crash campaign stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
        result.seconds = time.monotonic() - started
    return result


def _unhandled_in_log(text: str) -> list[str]:
    """Lines of the broker log that show an exception nobody handled (a traceback logged by asyncio or by a
    handler's last-resort catch)."""
    marks = (
        "Traceback (most recent call last)",
        "Unhandled exception",
        "Task exception was never retrieved",
        "Exception in callback",
    )
    return [line[:300] for line in text.splitlines() if any(m in line for m in marks)]
