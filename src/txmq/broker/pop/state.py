"""The pop consumption state of consumer groups, with no IO: leases on queue offsets and their checked transitions.

A consumer group that receives a message takes a *lease* on its queue offset: the message is INVISIBLE to the group
until the lease's deadline. An ack ends the lease; a change of invisible duration replaces it with a new handle and
deadline; when the deadline passes the lease is REVIVING until the broker has stored its retry (or dead-letter)
copy, then DONE. A FIFO group redelivers in place instead: REVIVING -> VISIBLE -> INVISIBLE again.

Every change is an :class:`Entry`; :meth:`PopTable.apply` is the one place a transition happens, both live and in
the fold of the journal at start, so the journal replays to exactly the live table. Time is passed in (ms).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

QueueKey = tuple[str, str, int]  # (group, topic, queue_id)


class LeaseState(enum.Enum):
    NEW = "new"  # never handed to the group (no lease object exists in this state)
    INVISIBLE = "invisible"  # handed out; hidden from the group until its deadline
    REVIVING = "reviving"  # the deadline passed (or the consumer asked for the DLQ): its copy is being stored
    VISIBLE = "visible"  # FIFO: due again in place, at the same offset
    ACKED = "acked"  # done for the group (terminal; the lease is forgotten)
    DONE = "done"  # its retry or dead-letter copy is stored (terminal; the lease is forgotten)


class PopEvent(enum.Enum):
    RECEIVE = "receive"
    ACK = "ack"
    CHANGE = "change"  # change invisible duration
    EXPIRE = "expire"
    DEAD_LETTER = "dead_letter"
    STORED = "stored"  # the retry / dead-letter copy is stored
    IN_PLACE = "in_place"  # FIFO: redeliver at the same offset


# The transition table: (state, event) -> next state. A pair that is not here raises IllegalPopTransition.
TRANSITIONS: dict[tuple[LeaseState, PopEvent], LeaseState] = {
    (LeaseState.NEW, PopEvent.RECEIVE): LeaseState.INVISIBLE,
    (LeaseState.VISIBLE, PopEvent.RECEIVE): LeaseState.INVISIBLE,
    (LeaseState.INVISIBLE, PopEvent.ACK): LeaseState.ACKED,
    (LeaseState.INVISIBLE, PopEvent.CHANGE): LeaseState.INVISIBLE,
    (LeaseState.INVISIBLE, PopEvent.EXPIRE): LeaseState.REVIVING,
    (LeaseState.INVISIBLE, PopEvent.DEAD_LETTER): LeaseState.REVIVING,
    (LeaseState.REVIVING, PopEvent.STORED): LeaseState.DONE,
    (LeaseState.REVIVING, PopEvent.IN_PLACE): LeaseState.VISIBLE,
    (LeaseState.VISIBLE, PopEvent.STORED): LeaseState.DONE,  # its message left the store before it came back
}
TERMINAL = frozenset({LeaseState.ACKED, LeaseState.DONE})


class IllegalPopTransition(Exception):
    """A (state, event) pair the table has no row for, or a handle that is not the lease's current one."""

    def __init__(self, state: LeaseState, event: PopEvent, detail: str = "") -> None:
        super().__init__(f"{event.value} is not allowed on a {state.value} message{': ' + detail if detail else ''}")
        self.state = state
        self.event = event


@dataclass(slots=True)
class Lease:
    offset: int
    state: LeaseState
    handle: int  # the generation a receipt handle names; a changed lease gets a new one
    deadline_ms: int
    attempt: int  # deliveries of this offset to the group (FIFO redelivers in place)


@dataclass(slots=True)
class QueueProgress:
    """One (group, topic, queue): offsets below ``next_offset`` were handed out, or skipped by the filter."""

    next_offset: int
    leases: dict[int, Lease] = field(default_factory=dict)

    def low_water(self) -> int:
        """Every offset below this is finished for the group."""
        return min(self.leases, default=self.next_offset)

    def held(self) -> bool:
        """A consumer holds one of its messages, or one is on its way back (what blocks a FIFO queue)."""
        return any(lease.state in (LeaseState.INVISIBLE, LeaseState.REVIVING) for lease in self.leases.values())


@dataclass(frozen=True, slots=True)
class Entry:
    """One journalled change. ``kind``: S start, L lease, A ack, C change, D done, V visible again, N advance."""

    kind: str
    key: QueueKey
    offset: int = 0
    handle: int = 0
    deadline_ms: int = 0
    attempt: int = 0

    def to_row(self) -> list[object]:
        group, topic, queue_id = self.key
        return [self.kind, group, topic, queue_id, self.offset, self.handle, self.deadline_ms, self.attempt]

    @classmethod
    def from_row(cls, row: list[object]) -> Entry:
        kind, group, topic, queue_id, offset, handle, deadline, attempt = row
        return cls(
            str(kind),
            (str(group), str(topic), int(queue_id)),
            int(offset),
            int(handle),
            int(deadline),
            int(attempt),  # type: ignore[call-overload]
        )


_EVENT_OF_KIND = {"L": PopEvent.RECEIVE, "A": PopEvent.ACK, "C": PopEvent.CHANGE, "D": PopEvent.STORED}


class PopTable:
    """All groups' pop progress. Mutators return the :class:`Entry` to journal; :meth:`apply` replays one."""

    def __init__(self) -> None:
        self.queues: dict[QueueKey, QueueProgress] = {}
        self.last_handle = 0

    # -- reading ------------------------------------------------------------------------------------------------

    def progress(self, key: QueueKey) -> QueueProgress | None:
        return self.queues.get(key)

    def lease(self, key: QueueKey, offset: int) -> Lease | None:
        queue = self.queues.get(key)
        return None if queue is None else queue.leases.get(offset)

    def state_of(self, key: QueueKey, offset: int) -> LeaseState:
        """The state of an offset; an offset with no lease is NEW above ``next_offset`` and finished below it
        (reported as ACKED: acked, revived or skipped, the group is done with it)."""
        lease = self.lease(key, offset)
        if lease is not None:
            return lease.state
        queue = self.queues.get(key)
        return LeaseState.NEW if queue is None or offset >= queue.next_offset else LeaseState.ACKED

    def leases(self) -> Iterator[tuple[QueueKey, Lease]]:
        for key, queue in self.queues.items():
            for lease in queue.leases.values():
                yield key, lease

    def next_deadline_ms(self) -> int | None:
        deadlines = [lease.deadline_ms for _, lease in self.leases() if lease.state is LeaseState.INVISIBLE]
        return min(deadlines, default=None)

    # -- changes (each returns what to journal) ------------------------------------------------------------------

    def start(self, key: QueueKey, offset: int) -> Entry:
        return self.apply(Entry("S", key, offset))

    def advance(self, key: QueueKey, next_offset: int) -> Entry:
        """Offsets below ``next_offset`` were skipped (the group's filter does not match them)."""
        return self.apply(Entry("N", key, next_offset))

    def receive(self, key: QueueKey, offset: int, deadline_ms: int) -> Entry:
        lease = self.lease(key, offset)
        attempt = 1 if lease is None else lease.attempt + 1
        return self.apply(Entry("L", key, offset, self.last_handle + 1, deadline_ms, attempt))

    def ack(self, key: QueueKey, offset: int, handle: int) -> Entry:
        return self.apply(Entry("A", key, offset, handle))

    def change(self, key: QueueKey, offset: int, handle: int, deadline_ms: int) -> tuple[Entry, int]:
        """A new deadline under a new handle (returned); the old handle is no longer valid."""
        self._check(key, offset, PopEvent.CHANGE, handle)
        new_handle = self.last_handle + 1
        return self.apply(Entry("C", key, offset, handle, deadline_ms, new_handle)), new_handle

    def expire_due(self, now_ms: int) -> list[tuple[QueueKey, Lease]]:
        """INVISIBLE leases whose deadline has passed move to REVIVING; not journalled (after a restart they expire
        again)."""
        due = []
        for key, lease in self.leases():
            if lease.state is LeaseState.INVISIBLE and lease.deadline_ms <= now_ms:
                lease.state = self._next(lease.state, PopEvent.EXPIRE)
                due.append((key, lease))
        return due

    def dead_letter(self, key: QueueKey, offset: int, handle: int) -> Lease:
        """The consumer gave up on the message (ForwardMessageToDeadLetterQueue): REVIVING, bound for the DLQ."""
        lease = self._check(key, offset, PopEvent.DEAD_LETTER, handle)
        lease.state = self._next(lease.state, PopEvent.DEAD_LETTER)
        return lease

    def stored(self, key: QueueKey, offset: int) -> Entry:
        return self.apply(Entry("D", key, offset))

    def in_place(self, key: QueueKey, offset: int) -> Entry:
        return self.apply(Entry("V", key, offset))

    # -- the one place transitions happen --------------------------------------------------------------------------

    @staticmethod
    def _next(state: LeaseState, event: PopEvent) -> LeaseState:
        try:
            return TRANSITIONS[(state, event)]
        except KeyError:
            raise IllegalPopTransition(state, event) from None

    def _check(self, key: QueueKey, offset: int, event: PopEvent, handle: int | None) -> Lease:
        lease = self.lease(key, offset)
        if lease is None:
            raise IllegalPopTransition(self.state_of(key, offset), event)
        self._next(lease.state, event)
        if handle is not None and lease.handle != handle:
            raise IllegalPopTransition(lease.state, event, "the receipt handle is out of date (changed or expired)")
        return lease

    def apply(self, entry: Entry) -> Entry:
        key = entry.key
        queue = self.queues.get(key)
        if entry.kind == "S":
            if queue is None:
                self.queues[key] = QueueProgress(entry.offset)
            return entry
        if queue is None:
            raise IllegalPopTransition(LeaseState.NEW, _EVENT_OF_KIND.get(entry.kind, PopEvent.RECEIVE), "no queue")
        if entry.kind == "N":
            queue.next_offset = max(queue.next_offset, entry.offset)
        elif entry.kind == "L":
            lease = queue.leases.get(entry.offset)
            state = lease.state if lease is not None else self.state_of(key, entry.offset)
            self._next(state, PopEvent.RECEIVE)
            queue.leases[entry.offset] = Lease(
                entry.offset, LeaseState.INVISIBLE, entry.handle, entry.deadline_ms, entry.attempt
            )
            queue.next_offset = max(queue.next_offset, entry.offset + 1)
            self.last_handle = max(self.last_handle, entry.handle)
        elif entry.kind == "A":
            self._check(key, entry.offset, PopEvent.ACK, entry.handle)
            del queue.leases[entry.offset]
        elif entry.kind == "C":
            lease = self._check(key, entry.offset, PopEvent.CHANGE, entry.handle)
            lease.handle = entry.attempt  # a change's new handle travels in the attempt slot
            lease.deadline_ms = entry.deadline_ms
            self.last_handle = max(self.last_handle, entry.attempt)
        elif entry.kind == "D":
            lease = self._check(key, entry.offset, PopEvent.STORED, None)
            del queue.leases[entry.offset]
        elif entry.kind == "V":
            lease = self._check(key, entry.offset, PopEvent.IN_PLACE, None)
            lease.state = LeaseState.VISIBLE
        else:
            raise ValueError(f"unknown pop journal entry kind {entry.kind!r}")
        return entry

    def replay(self, entry: Entry) -> None:
        """:meth:`apply` for the fold at start: a REVIVING lease was INVISIBLE on disk (expiry is not journalled),
        so D and V first expire it."""
        if entry.kind in ("D", "V"):
            lease = self.lease(entry.key, entry.offset)
            if lease is not None and lease.state is LeaseState.INVISIBLE:
                lease.state = LeaseState.REVIVING
        self.apply(entry)

    # -- snapshot ------------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        return {
            "lastHandle": self.last_handle,
            "queues": [
                [
                    group,
                    topic,
                    queue_id,
                    q.next_offset,
                    [[le.offset, le.state.value, le.handle, le.deadline_ms, le.attempt] for le in q.leases.values()],
                ]
                for (group, topic, queue_id), q in self.queues.items()
            ],
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, object]) -> PopTable:
        table = cls()
        table.last_handle = int(data.get("lastHandle", 0))  # type: ignore[call-overload]
        for group, topic, queue_id, next_offset, leases in data.get("queues", []):  # type: ignore[attr-defined]
            queue = QueueProgress(int(next_offset))
            for offset, state, handle, deadline, attempt in leases:
                # A REVIVING lease is saved as INVISIBLE: its deadline has passed, so it expires again at once.
                restored = LeaseState(state)
                if restored is LeaseState.REVIVING:
                    restored = LeaseState.INVISIBLE
                queue.leases[int(offset)] = Lease(int(offset), restored, int(handle), int(deadline), int(attempt))
            table.queues[(str(group), str(topic), int(queue_id))] = queue
        return table
