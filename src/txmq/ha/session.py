"""The two ends of one HA connection as state machines with no IO.

:class:`MasterSession` decides, for one slave, whether its greeting and its offset reports are acceptable, what to
ship next (from the slave's durable end, at most ``window`` bytes ahead of what it acknowledged) and what offset the
slave has durably. :class:`SlaveSession` checks that the master's bytes continue exactly where the slave's log ends,
asks the driver to apply them, and reports the durable end after each apply. Inputs come in, effects go out; every
(state, input) pair that can happen is in a table, and anything else raises :class:`IllegalHaTransition`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txmq.errors import TxmqError
from txmq.ha.wire import VERSION, Accept, Data, Hello, Refuse, Report


class IllegalHaTransition(TxmqError):
    """An input the session's table does not allow in its state (a bug in the driver, not bad input)."""


# -- effects (what the driver carries out)


@dataclass(frozen=True, slots=True)
class SendAccept:
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class SendRefuse:
    reason: str


@dataclass(frozen=True, slots=True)
class Acked:
    """The slave has the commit log durably up to ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class SendReport:
    offset: int


@dataclass(frozen=True, slots=True)
class Apply:
    """Append these master bytes to the local commit log at ``offset`` (durably), then feed ``applied``."""

    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Fail:
    """The session is over: log ``reason`` and close the connection."""

    reason: str


Effect = SendAccept | SendRefuse | Acked | SendReport | Apply | Fail


def coalesce(effects: list[Effect], segment_size: int) -> list[Effect]:
    """``effects`` with each run of :class:`Apply` whose bytes follow one another within one commit-log segment
    merged into one: the frames a slave reads at once are written and fsynced once, not once per frame (each
    fsync waits for the one before, and the master's sends wait for all of them)."""
    out: list[Effect] = []
    run: list[Apply] = []

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(Apply(run[0].offset, b"".join(a.data for a in run)))
        run.clear()

    for effect in effects:
        if isinstance(effect, Apply):
            if run:
                end = run[-1].offset + len(run[-1].data)
                last = effect.offset + len(effect.data) - 1
                if effect.offset != end or run[0].offset // segment_size != last // segment_size:
                    close_run()
            run.append(effect)
        else:
            close_run()
            out.append(effect)
    close_run()
    return out


# -- the master's end


class MasterState(enum.Enum):
    AWAIT_HELLO = "await-hello"
    AWAIT_REPORT = "await-report"
    STREAMING = "streaming"
    CLOSED = "closed"


class MasterInput(enum.Enum):
    HELLO = "hello"
    REPORT = "report"
    SHIPPED = "shipped"
    CLOSE = "close"


# (state, input) -> the state it moves to when the input is acceptable; an unacceptable one (a wrong broker, an offset
# the master cannot serve) always moves to CLOSED with a refusal.
MASTER_TRANSITIONS: dict[tuple[MasterState, MasterInput], MasterState] = {
    (MasterState.AWAIT_HELLO, MasterInput.HELLO): MasterState.AWAIT_REPORT,
    (MasterState.AWAIT_HELLO, MasterInput.REPORT): MasterState.CLOSED,  # a report before any greeting: a stranger
    (MasterState.AWAIT_REPORT, MasterInput.REPORT): MasterState.STREAMING,
    (MasterState.AWAIT_REPORT, MasterInput.HELLO): MasterState.CLOSED,
    (MasterState.STREAMING, MasterInput.REPORT): MasterState.STREAMING,
    (MasterState.STREAMING, MasterInput.HELLO): MasterState.CLOSED,
    (MasterState.STREAMING, MasterInput.SHIPPED): MasterState.STREAMING,
    (MasterState.AWAIT_HELLO, MasterInput.CLOSE): MasterState.CLOSED,
    (MasterState.AWAIT_REPORT, MasterInput.CLOSE): MasterState.CLOSED,
    (MasterState.STREAMING, MasterInput.CLOSE): MasterState.CLOSED,
}


class MasterSession:
    """One slave as its master sees it."""

    def __init__(self, *, broker_name: str, segment_size: int, chunk_size: int = 1 << 20, window: int = 8 << 20):
        self.broker_name = broker_name
        self.segment_size = segment_size
        self.chunk_size = chunk_size
        self.window = window
        self.state = MasterState.AWAIT_HELLO
        self.slave_name = ""
        self.acked = -1  # the slave's durable end, -1 until its first report
        self.shipped_to = -1  # the first byte not yet shipped
        self.close_reason = ""

    def _move(self, event: MasterInput) -> MasterState:
        target = MASTER_TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalHaTransition(f"HA master session: {event.value} in state {self.state.value}")
        return target

    def _refuse(self, reason: str) -> list[Effect]:
        self.state = MasterState.CLOSED
        self.close_reason = reason
        return [SendRefuse(reason), Fail(reason)]

    def hello(self, frame: Hello, *, min_offset: int, max_offset: int) -> list[Effect]:
        target = self._move(MasterInput.HELLO)
        if target is MasterState.CLOSED:
            return self._refuse("a second greeting on one connection")
        if frame.version != VERSION:
            return self._refuse(f"HA protocol version {frame.version} is not supported (this master speaks {VERSION})")
        if frame.broker_name != self.broker_name:
            return self._refuse(
                f"the slave belongs to broker {frame.broker_name!r}, this master is {self.broker_name!r}"
            )
        if frame.segment_size != self.segment_size:
            return self._refuse(
                f"the slave's mappedFileSizeCommitLog is {frame.segment_size}, the master's {self.segment_size}: "
                "replicas must use the same segment size"
            )
        self.state = target
        self.slave_name = frame.broker_name
        return [SendAccept(min_offset, max_offset)]

    def report(self, frame: Report, *, min_offset: int, max_offset: int) -> list[Effect]:
        target = self._move(MasterInput.REPORT)
        offset = frame.offset
        if self.state is MasterState.AWAIT_HELLO:
            return self._refuse("an offset report before any greeting: not a txmq slave")
        if self.state is MasterState.AWAIT_REPORT:
            if offset > max_offset:
                return self._refuse(
                    f"the slave claims commit-log offset {offset}, beyond this master's end {max_offset}: it holds "
                    "bytes the master never had (truncate it or start it on an empty store)"
                )
            if offset < min_offset:
                return self._refuse(
                    f"the slave asks for offset {offset}, but this master's commit log starts at {min_offset} "
                    "(older segments were deleted): start the slave on an empty store copied from a later point"
                )
            self.state = target
            self.acked = self.shipped_to = offset
            return [Acked(offset)]
        if offset < self.acked:
            return self._refuse(f"the slave's offset went back from {self.acked} to {offset}")
        if offset > self.shipped_to:
            return self._refuse(f"the slave claims offset {offset}, but only {self.shipped_to} was shipped to it")
        self.state = target
        if offset == self.acked:
            return []
        self.acked = offset
        return [Acked(offset)]

    def next_chunk(self, max_offset: int) -> tuple[int, int] | None:
        """The byte range to ship next, or None (nothing new, or the window of unacknowledged bytes is full). The
        driver may ship less (up to a segment end or a record boundary) and says how much with :meth:`shipped`."""
        if self.state is not MasterState.STREAMING:
            return None
        start = self.shipped_to
        end = min(max_offset, start + self.chunk_size, self.acked + self.window)
        return (start, end) if end > start else None

    def shipped(self, start: int, end: int) -> None:
        target = self._move(MasterInput.SHIPPED)
        if start != self.shipped_to or end <= start:
            raise IllegalHaTransition(f"shipped [{start}, {end}) but the next byte to ship is {self.shipped_to}")
        self.state = target
        self.shipped_to = end

    def close(self, reason: str) -> None:
        self.state = self._move(MasterInput.CLOSE)
        self.close_reason = self.close_reason or reason

    @property
    def in_sync(self) -> bool:
        return self.state is MasterState.STREAMING


# -- the slave's end


class SlaveState(enum.Enum):
    GREETING = "greeting"  # the greeting is sent, the master's answer not yet here
    REPLICATING = "replicating"
    CLOSED = "closed"


class SlaveInput(enum.Enum):
    ACCEPT = "accept"
    REFUSE = "refuse"
    DATA = "data"
    APPLIED = "applied"
    CLOSE = "close"


SLAVE_TRANSITIONS: dict[tuple[SlaveState, SlaveInput], SlaveState] = {
    (SlaveState.GREETING, SlaveInput.ACCEPT): SlaveState.REPLICATING,
    (SlaveState.GREETING, SlaveInput.REFUSE): SlaveState.CLOSED,
    (SlaveState.GREETING, SlaveInput.DATA): SlaveState.CLOSED,  # data before the answer: not a txmq master
    (SlaveState.GREETING, SlaveInput.CLOSE): SlaveState.CLOSED,
    (SlaveState.REPLICATING, SlaveInput.DATA): SlaveState.REPLICATING,
    (SlaveState.REPLICATING, SlaveInput.APPLIED): SlaveState.REPLICATING,
    (SlaveState.REPLICATING, SlaveInput.ACCEPT): SlaveState.CLOSED,
    (SlaveState.REPLICATING, SlaveInput.REFUSE): SlaveState.CLOSED,
    (SlaveState.REPLICATING, SlaveInput.CLOSE): SlaveState.CLOSED,
}


class SlaveSession:
    """The link to the master as a slave sees it. ``durable`` is the local commit log's durable end."""

    def __init__(self, durable: int) -> None:
        self.state = SlaveState.GREETING
        self.durable = durable
        self.expected = durable  # the next byte the master must send: durable + what is being applied
        self.master_max = -1
        self.close_reason = ""

    def _move(self, event: SlaveInput) -> SlaveState:
        target = SLAVE_TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalHaTransition(f"HA slave session: {event.value} in state {self.state.value}")
        return target

    def _fail(self, reason: str) -> list[Effect]:
        self.state = SlaveState.CLOSED
        self.close_reason = reason
        return [Fail(reason)]

    def accept(self, frame: Accept) -> list[Effect]:
        if self._move(SlaveInput.ACCEPT) is SlaveState.CLOSED:
            return self._fail("the master greeted twice")
        if self.durable > frame.max_offset:
            return self._fail(
                f"this slave's commit log ends at {self.durable}, beyond the master's end {frame.max_offset}: it "
                "holds bytes the master never had"
            )
        if self.durable < frame.min_offset:
            return self._fail(f"the master's commit log starts at {frame.min_offset}, past this slave's end")
        self.state = SlaveState.REPLICATING
        self.master_max = frame.max_offset
        return [SendReport(self.durable)]

    def refuse(self, frame: Refuse) -> list[Effect]:
        self._move(SlaveInput.REFUSE)
        return self._fail(f"the master refused this slave: {frame.reason}")

    def data(self, frame: Data) -> list[Effect]:
        if self._move(SlaveInput.DATA) is SlaveState.CLOSED:
            return self._fail("the master sent data before accepting the greeting")
        if not frame.data:
            return []  # the master is alive
        if frame.offset != self.expected:
            return self._fail(f"the master sent bytes at {frame.offset}, this slave's log continues at {self.expected}")
        self.expected += len(frame.data)
        return [Apply(frame.offset, frame.data)]

    def applied(self, end: int) -> list[Effect]:
        self._move(SlaveInput.APPLIED)
        if not self.durable < end <= self.expected:
            raise IllegalHaTransition(f"applied up to {end}, but {self.durable} was durable and {self.expected} sent")
        self.durable = end
        return [SendReport(end)]

    def close(self, reason: str) -> None:
        self.state = self._move(SlaveInput.CLOSE)
        self.close_reason = self.close_reason or reason
