"""The pop lease table: every (state, event) pair against the written table, and the journal fold equals the live
table after any sequence of changes (Hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from txmq.broker.pop.state import (
    TRANSITIONS,
    Entry,
    IllegalPopTransition,
    LeaseState,
    PopEvent,
    PopTable,
)

KEY = ("G", "T", 0)


def _table_with(state: LeaseState) -> tuple[PopTable, int]:
    """A table whose offset 0 is in ``state``; returns it and the lease's handle."""
    table = PopTable()
    table.start(KEY, 0)
    if state is LeaseState.NEW:
        return table, 0
    handle = table.receive(KEY, 0, deadline_ms=1_000).handle
    if state is LeaseState.INVISIBLE:
        return table, handle
    if state is LeaseState.ACKED:
        table.ack(KEY, 0, handle)
        return table, handle
    table.expire_due(1_000)
    if state is LeaseState.REVIVING:
        return table, handle
    if state is LeaseState.VISIBLE:
        table.in_place(KEY, 0)
        return table, handle
    table.stored(KEY, 0)  # DONE
    return table, handle


def _fire(table: PopTable, event: PopEvent, handle: int) -> None:
    if event is PopEvent.RECEIVE:
        table.receive(KEY, 0, deadline_ms=5_000)
    elif event is PopEvent.ACK:
        table.ack(KEY, 0, handle)
    elif event is PopEvent.CHANGE:
        table.change(KEY, 0, handle, 9_000)
    elif event is PopEvent.EXPIRE:
        if not table.expire_due(10**12):
            raise IllegalPopTransition(table.state_of(KEY, 0), event)
    elif event is PopEvent.DEAD_LETTER:
        table.dead_letter(KEY, 0, handle)
    elif event is PopEvent.STORED:
        table.stored(KEY, 0)
    else:
        table.in_place(KEY, 0)


@pytest.mark.parametrize("state", list(LeaseState))
@pytest.mark.parametrize("event", list(PopEvent))
def test_every_state_and_event_pair_follows_the_table(state: LeaseState, event: PopEvent) -> None:
    table, handle = _table_with(state)
    # ACKED and DONE are forgotten: they read as "finished" (ACKED) below next_offset.
    shown = LeaseState.ACKED if state in (LeaseState.ACKED, LeaseState.DONE) else state
    assert table.state_of(KEY, 0) is shown
    expected = TRANSITIONS.get((shown, event))
    if expected is None:
        with pytest.raises(IllegalPopTransition):
            _fire(table, event, handle)
        return
    _fire(table, event, handle)
    after = table.state_of(KEY, 0)
    assert after is (LeaseState.ACKED if expected in (LeaseState.ACKED, LeaseState.DONE) else expected)


def test_an_old_handle_is_refused_after_a_change() -> None:
    table = PopTable()
    table.start(KEY, 0)
    old = table.receive(KEY, 0, deadline_ms=1_000).handle
    _, new = table.change(KEY, 0, old, 2_000)
    with pytest.raises(IllegalPopTransition, match="out of date"):
        table.ack(KEY, 0, old)
    table.ack(KEY, 0, new)
    assert table.progress(KEY).low_water() == 1  # type: ignore[union-attr]


def test_low_water_is_the_oldest_unfinished_offset() -> None:
    table = PopTable()
    table.start(KEY, 0)
    handles = [table.receive(KEY, i, deadline_ms=1_000).handle for i in range(3)]
    table.ack(KEY, 1, handles[1])
    table.ack(KEY, 2, handles[2])
    assert table.progress(KEY).low_water() == 0  # type: ignore[union-attr]
    table.ack(KEY, 0, handles[0])
    assert table.progress(KEY).low_water() == 3  # type: ignore[union-attr]


class JournalFold(RuleBasedStateMachine):
    """Whatever happens live, replaying the journalled entries (and a snapshot round trip) gives the same table."""

    def __init__(self) -> None:
        super().__init__()
        self.table = PopTable()
        self.journal: list[list[object]] = []
        self.now = 0
        self.keys = [("G", "T", q) for q in range(2)]
        for key in self.keys:
            self._log(self.table.start(key, 0))

    def _log(self, entry: Entry) -> None:
        self.journal.append(entry.to_row())

    @rule(q=st.integers(0, 1), ms=st.integers(1, 50))
    def receive_next(self, q: int, ms: int) -> None:
        key = self.keys[q]
        offset = self.table.progress(key).next_offset  # type: ignore[union-attr]
        self._log(self.table.receive(key, offset, self.now + ms))

    @rule(data=st.data())
    def ack_one(self, data: st.DataObject) -> None:
        leases = [(k, le) for k, le in self.table.leases() if le.state is LeaseState.INVISIBLE]
        if leases:
            key, lease = data.draw(st.sampled_from(leases))
            self._log(self.table.ack(key, lease.offset, lease.handle))

    @rule(data=st.data(), ms=st.integers(1, 50))
    def change_one(self, data: st.DataObject, ms: int) -> None:
        leases = [(k, le) for k, le in self.table.leases() if le.state is LeaseState.INVISIBLE]
        if leases:
            key, lease = data.draw(st.sampled_from(leases))
            self._log(self.table.change(key, lease.offset, lease.handle, self.now + ms)[0])

    @rule(ms=st.integers(1, 30), in_place=st.booleans())
    def time_passes(self, ms: int, in_place: bool) -> None:
        self.now += ms
        for key, lease in self.table.expire_due(self.now):
            if in_place:
                self._log(self.table.in_place(key, lease.offset))
            else:
                self._log(self.table.stored(key, lease.offset))

    @rule(data=st.data())
    def receive_again(self, data: st.DataObject) -> None:
        visible = [(k, le) for k, le in self.table.leases() if le.state is LeaseState.VISIBLE]
        if visible:
            key, lease = data.draw(st.sampled_from(visible))
            self._log(self.table.receive(key, lease.offset, self.now + 10))

    @invariant()
    def fold_equals_live(self) -> None:
        folded = PopTable()
        for row in self.journal:
            folded.replay(Entry.from_row(row))
        # REVIVING is not journalled: it is INVISIBLE (past its deadline) on disk, and expires again at start.
        live = self.table.snapshot()
        for queue in live["queues"]:  # type: ignore[attr-defined]
            for lease in queue[4]:
                if lease[1] == LeaseState.REVIVING.value:
                    lease[1] = LeaseState.INVISIBLE.value
        assert folded.snapshot() == live
        assert PopTable.from_snapshot(folded.snapshot()).snapshot() == folded.snapshot()


TestJournalFold = JournalFold.TestCase
TestJournalFold.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
