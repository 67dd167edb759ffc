"""The sends a SYNC_MASTER holds until a slave has their bytes: who waits for which commit-log offset, until when, and
whom to tell how the wait ended. No IO and no clock of its own: the driver (:class:`txmq.broker.ha.master.HaMaster`)
feeds it the slaves' acknowledged offsets and the time, and arms one timer for :meth:`ReplicaWaits.next_deadline`.

Compiled with mypyc (setup.py ``HOT_MODULES``): every replicated send passes through here twice. A wait is one small
object in two queues, with no future and no timer of its own: sends are stored in order, so both their offsets and
their deadlines (one ``syncFlushTimeout`` for all) nearly always arrive in increasing order, and an acknowledgement or
a timer settles the waits at the front of a queue.
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from collections.abc import Callable
from typing import Final


class ReplicaWait(enum.Enum):
    """How a SYNC_MASTER send's wait for its slave ended (RocketMQ's PutMessageStatus names)."""

    PUT_OK = "PUT_OK"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    FENCED = "FENCED"  # controller mode: this master's lease may have expired; it acknowledges nothing


_PUT_OK: Final = ReplicaWait.PUT_OK
_TIMEOUT: Final = ReplicaWait.FLUSH_SLAVE_TIMEOUT

Settle = Callable[[ReplicaWait], None]


class Wait:
    """One send's wait: until a slave has the log durably up to ``offset``, or ``deadline`` (monotonic seconds)."""

    __slots__ = ("deadline", "offset", "seq", "settle", "settled")

    def __init__(self, offset: int, seq: int, deadline: float, settle: Settle) -> None:
        self.offset = offset
        self.seq = seq  # the order of arrival, which breaks ties between equal offsets
        self.deadline = deadline
        self.settle = settle
        self.settled = False

    def key(self) -> tuple[int, int]:
        return self.offset, self.seq


class ReplicaWaits:
    """The waits of one master. ``settle(outcome)`` of each is called exactly once: PUT_OK from :meth:`acked`,
    FLUSH_SLAVE_TIMEOUT from :meth:`expire`, or the outcome given to :meth:`settle_all`."""

    def __init__(self) -> None:
        self._by_offset: list[Wait] = []  # sorted by (offset, seq); settled waits may linger until trimmed
        self._head = 0  # waits before this index in _by_offset are settled and dropped lazily
        self._by_deadline: deque[Wait] = deque()  # in arrival order: deadlines in order when the timeouts are equal
        self._seq = 0
        self._ordered = True  # _by_deadline's deadlines never decrease (false once waits with other timeouts mix)
        self.pending = 0  # waits not settled yet

    def __len__(self) -> int:
        return self.pending

    def add(self, offset: int, deadline: float, settle: Settle) -> Wait:
        self._seq += 1
        wait = Wait(offset, self._seq, deadline, settle)
        by_offset = self._by_offset
        if len(by_offset) == self._head or by_offset[-1].offset <= offset:
            by_offset.append(wait)
        else:  # a send stored before one already waiting (a later append's end was read first): keep the order
            keys = [w.key() for w in by_offset[self._head :]]
            by_offset.insert(self._head + bisect.bisect_right(keys, wait.key()), wait)
        queue = self._by_deadline
        if queue and queue[-1].deadline > deadline:
            self._ordered = False
        queue.append(wait)
        self.pending += 1
        return wait

    def acked(self, offset: int) -> int:
        """A slave (every slave that must) has the log durably up to ``offset``: the waits for offsets up to it end
        with PUT_OK, lowest first. Returns the highest offset of a wait settled here (-1: none)."""
        by_offset = self._by_offset
        i = self._head
        n = len(by_offset)
        highest = -1
        while i < n:
            wait = by_offset[i]
            if wait.offset > offset:
                break
            i += 1
            self._head = i  # before the call: what it does cannot make a wait settle twice
            if not wait.settled:
                wait.settled = True
                self.pending -= 1
                highest = wait.offset
                wait.settle(_PUT_OK)
        self._compact()
        return highest

    def expire(self, now: float) -> None:
        """The waits whose deadline has passed end with FLUSH_SLAVE_TIMEOUT (in arrival order)."""
        queue = self._by_deadline
        if not self._ordered:
            for wait in queue:
                if not wait.settled and wait.deadline <= now:
                    wait.settled = True
                    self.pending -= 1
                    wait.settle(_TIMEOUT)
            left = [w for w in queue if not w.settled]
            self._by_deadline = deque(left)
            self._ordered = all(left[i].deadline <= left[i + 1].deadline for i in range(len(left) - 1))
            self._compact()
            return
        while queue:
            wait = queue[0]
            if not wait.settled:
                if wait.deadline > now:
                    break
                wait.settled = True
                self.pending -= 1
                wait.settle(_TIMEOUT)
            queue.popleft()
        self._compact()

    def next_deadline(self) -> float | None:
        """When :meth:`expire` has something to do next (None: nothing waits). Drops settled waits from the front."""
        queue = self._by_deadline
        while queue and queue[0].settled:
            queue.popleft()
        if not queue:
            return None
        if self._ordered:
            return queue[0].deadline  # the usual case: one timeout for all, so arrival order is deadline order
        return min(w.deadline for w in queue if not w.settled)

    def settle_all(self, outcome: ReplicaWait) -> None:
        """Every wait ends now with ``outcome`` (the master is fenced, or closing)."""
        waits = [w for w in self._by_deadline if not w.settled]
        self._by_offset = []
        self._head = 0
        self._by_deadline = deque()
        self._ordered = True
        self.pending = 0
        for wait in waits:
            wait.settled = True
            wait.settle(outcome)

    def _compact(self) -> None:
        by_offset = self._by_offset
        head = self._head
        while head < len(by_offset) and by_offset[head].settled:
            head += 1
        if head >= 1024 and head * 2 >= len(by_offset):
            del by_offset[:head]
            head = 0
        elif head == len(by_offset):
            by_offset.clear()
            head = 0
        self._head = head
