"""Storing decisions: one append per event-loop turn, and one decision at a time per half message.

:class:`Turns` serialises what happens to one half message (a decision being stored, an operator's resume): the
next waits for the previous to settle. :class:`DecisionWriter` gathers the decisions of one event-loop turn and stores
them in one append, their committed copies first and then one op marker that holds them all (RocketMQ 5 batches op
messages the same way). The writer fills each copy's offset into the marker's ``TXMQ_COPY_MSG_ID`` list. The copies
come first: a torn tail can only lose the marker, which the start-up rebuild repairs (a COMMIT from its copy; a
ROLLBACK is checked again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txmq._hotpath import reduce_by_fields
from txmq.broker.stored import put_status_code
from txmq.protocol.codes import ResponseCode
from txmq.protocol.op_marker import OP_TAG, PROP_COPY_MSG_ID
from txmq.protocol.record import MessageRecord, encode_offset_msg_id
from txmq.txn import records
from txmq.txn.effects import StoreDecision
from txmq.txn.table import TransactionTable

if TYPE_CHECKING:
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")

MARKER_DECISIONS = 128  # decisions one op marker holds at most (its properties stay far below 32 KiB)
Answer = tuple[int, str | None]
DONE: Answer = (ResponseCode.SUCCESS, None)


class Turns:
    """Half commit-log offsets with a decision or resume in progress, and who waits for each."""

    def __init__(self) -> None:
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}

    def __contains__(self, phys: object) -> bool:
        return phys in self._waiters

    def __len__(self) -> int:
        return len(self._waiters)

    def take(self, phys: int) -> bool:
        """Take the turn of ``phys`` when nobody holds it."""
        if phys in self._waiters:
            return False
        self._waiters[phys] = []
        return True

    async def wait_and_take(self, phys: int) -> None:
        waiters = self._waiters
        while (queue := waiters.get(phys)) is not None:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue.append(turn)
            await turn
        waiters[phys] = []

    def release(self, phys: int) -> None:
        queue = self._waiters.pop(phys, None)
        if queue:
            for turn in queue:
                if not turn.done():
                    turn.set_result(None)


@dataclass(slots=True, init=False)
class Queued:
    """A decision waiting for its op marker (and, for a COMMIT, its copy) to be stored."""

    d: StoreDecision
    copy: MessageRecord | None  # the committed copy, or None for a ROLLBACK
    answer: asyncio.Future[Answer] | None  # None: nobody waits (a oneway END_TRANSACTION)
    holds_turn: Turns | None  # settling it ends the half message's turn there
    unit: list[Queued] | None = None  # the decisions of one transaction of several messages: stored together

    # Written out so that mypyc compiles it (one per decision); tests/protocol/test_constructors.py holds it to the
    # fields.
    def __init__(
        self,
        d: StoreDecision,
        copy: MessageRecord | None,
        answer: asyncio.Future[Answer] | None,
        holds_turn: Turns | None,
        unit: list[Queued] | None = None,
    ) -> None:
        self.d = d
        self.copy = copy
        self.answer = answer
        self.holds_turn = holds_turn
        self.unit = unit

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)


class DecisionWriter:
    def __init__(
        self,
        store: MessageStore,
        table: TransactionTable,
        now_ms: Callable[[], int],
        store_host: tuple[str, int],
        op_topic_ready: Callable[[], None],
    ) -> None:
        self.store = store
        self.table = table
        self.now_ms = now_ms
        self.store_host = store_host
        self.op_topic_ready = op_topic_ready
        # A SYNC_MASTER's decisions are settled (answered, their turn ended) only once a slave has them: set by the
        # broker (txmq.broker.ha.gate.ReplicaGate); None or not waiting: settled when stored.
        self.gate: Any = None
        self._replicating: set[asyncio.Future[Any]] = set()
        self._queue: list[Queued] = []
        self._placeholder = encode_offset_msg_id(store_host, 0)  # offsetMsgId the writer replaces with the copy's

    @property
    def idle(self) -> bool:
        return not self._queue

    def queue(self, q: Queued) -> None:
        """Decisions are stored once per event-loop turn, up to MARKER_DECISIONS together."""
        batch = self._queue
        batch.append(q)
        if len(batch) == 1:
            asyncio.get_running_loop().call_soon(self._store_queued)
        elif len(batch) >= MARKER_DECISIONS:
            self._store_queued()

    def queue_together(self, items: list[Queued]) -> None:
        """The decisions about the messages of one transaction: in one append, whatever else the turn holds."""
        if self._queue and len(self._queue) + len(items) > MARKER_DECISIONS:
            self._store_queued()
        for q in items:
            q.unit = items
        batch = self._queue
        if not batch:
            asyncio.get_running_loop().call_soon(self._store_queued)
        batch.extend(items)
        if len(batch) >= MARKER_DECISIONS:
            self._store_queued()

    def _store_queued(self) -> None:
        batch, self._queue = self._queue, []
        if batch:
            self._store(batch)

    def _store(self, batch: list[Queued]) -> None:
        try:
            self._append(batch)
        except Exception as exc:  # every answer must settle, or its half message would stay locked in its turn
            log.exception("storing %d transaction decision(s) failed", len(batch))
            for q in batch:
                settle(q, exc)

    def _append(self, batch: list[Queued]) -> None:
        """The marker lists the UNIQ_KEYs (KEYS, for the key index) of its ROLLBACK decisions only: a COMMIT's
        marker is found from its copy (see StoreLookups._marker_after_copy), which spares the index one entry per
        commit."""
        placeholder = self._placeholder
        copies = [q.copy for q in batch if q.copy is not None]
        self.op_topic_ready()
        marker = records.decision_marker(
            [
                (q.d.queue_offset, q.d.phys, q.d.decision, q.d.by, placeholder, None)
                if q.copy is not None
                else (q.d.queue_offset, q.d.phys, q.d.decision, q.d.by, None, q.d.uniq_key)
                for q in batch
            ],
            self.now_ms(),
            self.store_host,
        )
        stored = self.store.put_many_future([*copies, marker], link=PROP_COPY_MSG_ID if copies else None)
        stored.add_done_callback(lambda done: self._stored(batch, done))

    def _stored(self, batch: list[Queued], done: asyncio.Future[list[Any]]) -> None:
        if done.cancelled() or done.exception() is not None:
            failure = asyncio.CancelledError() if done.cancelled() else done.exception()
            assert failure is not None
            for q in batch:
                settle(q, failure)
            return
        results = done.result()
        marked = results[-1]  # an append is stored whole or refused whole
        code = put_status_code(marked)
        if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
            units = _units(batch)
            if len(units) > 1 and code == ResponseCode.MESSAGE_ILLEGAL:
                for unit in units:  # one record the store refuses must not fail the others: each on its own
                    self._store(unit)
                return
            for q in batch:
                if q.copy is not None:
                    log.error("committing half message at %d failed: %s", q.d.phys, marked)
                    settle(q, (code, f"storing the committed message failed: {marked.status.value}"))
                else:
                    marker_stored(marked, OP_TAG, q.d.decision, q.d.phys)
                    settle(q, DONE)
            return
        gate = self.gate
        if gate is not None and gate.waits:
            waiting = asyncio.ensure_future(gate.replicated())
            self._replicating.add(waiting)
            waiting.add_done_callback(lambda w: self._replicated(batch, results, w))
            return
        self._settle_stored(batch, results, DONE)

    def _replicated(self, batch: list[Queued], results: list[Any], waiting: asyncio.Future[Any]) -> None:
        self._replicating.discard(waiting)
        if waiting.cancelled() or waiting.exception() is not None:
            failure = asyncio.CancelledError() if waiting.cancelled() else waiting.exception()
            assert failure is not None
            for q in batch:
                settle(q, failure)
            return
        self._settle_stored(batch, results, replica_answer(waiting.result(), self.gate))

    def _settle_stored(self, batch: list[Queued], results: list[Any], answer: Answer) -> None:
        copy_results = iter(results)
        table = self.table
        now = self.now_ms()
        for q in batch:
            try:
                if q.copy is not None:
                    table.applied(q.d, next(copy_results).physical_offset, now)
            except Exception as exc:
                log.exception("recording the decision about half message %d failed", q.d.phys)
                settle(q, exc)
            else:
                settle(q, answer)


def replica_answer(outcome: Any, gate: Any) -> Answer:
    """The answer to a decision stored on a SYNC_MASTER, from how its wait for the slave ended (the decision is
    stored on the master whatever the answer)."""
    name = outcome.value
    if name == "PUT_OK":
        return DONE
    if name == "FLUSH_SLAVE_TIMEOUT":
        ms = gate.config.sync_flush_timeout
        return (
            ResponseCode.FLUSH_SLAVE_TIMEOUT,
            f"decision stored on the master, but no slave confirmed it within {ms} ms",
        )
    if name == "SLAVE_NOT_AVAILABLE":
        return ResponseCode.SLAVE_NOT_AVAILABLE, "decision stored on the master, but no slave is in sync (SYNC_MASTER)"
    refusal = gate.refusal()
    return ResponseCode.SERVICE_NOT_AVAILABLE, (
        f"the decision may be lost: {refusal[1] if refusal else 'this master was fenced while it waited'}"
    )


def _units(batch: list[Queued]) -> list[list[Queued]]:
    """``batch`` cut into what must be stored together: a decision alone, or one transaction's decisions."""
    out: list[list[Queued]] = []
    seen: set[int] = set()
    for q in batch:
        if q.unit is None:
            out.append([q])
        elif id(q.unit) not in seen:
            seen.add(id(q.unit))
            out.append(q.unit)
    return out


def settle(q: Queued, result: Answer | BaseException) -> None:
    """Tell whoever waits for ``q`` (a oneway END_TRANSACTION has nobody: a failure is logged), and end the half
    message's turn when ``q`` holds it."""
    answer = q.answer
    if answer is None:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.error("a oneway END_TRANSACTION about half message %d failed", q.d.phys, exc_info=result)
    elif answer.done():
        pass
    elif isinstance(result, asyncio.CancelledError):
        answer.cancel()
    elif isinstance(result, BaseException):
        answer.set_exception(result)
    else:
        answer.set_result(result)
    if q.holds_turn is not None:
        q.holds_turn.release(q.d.phys)


def marker_stored(result: Any, tag: str, decision: str, phys: object) -> bool:
    """Log a refused op-record write; True when ``result`` is a stored one."""
    if result.ok:
        return True
    log.error(
        "writing the %s op record (%s) for half message %s failed: %s (a restart re-derives it)",
        tag,
        decision,
        phys,
        result,
    )
    return False
