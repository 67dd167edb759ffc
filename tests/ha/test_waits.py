"""The SYNC_MASTER sends' waits (txmq.ha.waits.ReplicaWaits): each settled exactly once, acknowledged in offset order,
timed out in deadline order, whatever order they arrive in; compared with a plain model by Hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.ha.waits import ReplicaWait, ReplicaWaits


class _Log:
    def __init__(self) -> None:
        self.settled: list[tuple[str, ReplicaWait]] = []

    def settle(self, name: str):  # type: ignore[no-untyped-def]
        return lambda outcome: self.settled.append((name, outcome))


def test_acks_settle_waits_up_to_the_offset_lowest_first() -> None:
    log, waits = _Log(), ReplicaWaits()
    for name, offset in (("a", 100), ("b", 200), ("c", 300)):
        waits.add(offset, 10.0, log.settle(name))
    assert waits.acked(99) == -1 and log.settled == []
    assert waits.acked(250) == 200
    assert log.settled == [("a", ReplicaWait.PUT_OK), ("b", ReplicaWait.PUT_OK)]
    assert len(waits) == 1 and waits.next_deadline() == 10.0


def test_a_wait_that_arrives_with_a_lower_offset_is_kept_in_offset_order() -> None:
    log, waits = _Log(), ReplicaWaits()
    waits.add(300, 10.0, log.settle("late"))
    waits.add(100, 10.0, log.settle("early"))
    waits.add(100, 10.0, log.settle("early2"))
    waits.acked(100)
    assert log.settled == [("early", ReplicaWait.PUT_OK), ("early2", ReplicaWait.PUT_OK)]
    waits.acked(300)
    assert [n for n, _ in log.settled] == ["early", "early2", "late"]


def test_deadlines_time_out_waits_once_and_acks_skip_them() -> None:
    log, waits = _Log(), ReplicaWaits()
    waits.add(100, 1.0, log.settle("a"))
    waits.add(200, 2.0, log.settle("b"))
    waits.expire(0.5)
    assert log.settled == [] and waits.next_deadline() == 1.0
    waits.expire(1.0)
    assert log.settled == [("a", ReplicaWait.FLUSH_SLAVE_TIMEOUT)]
    assert waits.acked(500) == 200  # "a" is over: only "b" is acknowledged
    assert log.settled[-1] == ("b", ReplicaWait.PUT_OK)
    waits.expire(10.0)
    assert len(log.settled) == 2 and len(waits) == 0 and waits.next_deadline() is None


def test_waits_with_other_timeouts_expire_by_their_own_deadline() -> None:
    log, waits = _Log(), ReplicaWaits()
    waits.add(100, 5.0, log.settle("long"))
    waits.add(200, 1.0, log.settle("short"))
    assert waits.next_deadline() == 1.0
    waits.expire(1.0)
    assert log.settled == [("short", ReplicaWait.FLUSH_SLAVE_TIMEOUT)]
    assert waits.next_deadline() == 5.0
    waits.expire(5.0)
    assert log.settled[-1] == ("long", ReplicaWait.FLUSH_SLAVE_TIMEOUT)


def test_settle_all_ends_every_pending_wait_with_the_outcome() -> None:
    log, waits = _Log(), ReplicaWaits()
    waits.add(100, 1.0, log.settle("a"))
    waits.add(200, 1.0, log.settle("b"))
    waits.acked(100)
    waits.settle_all(ReplicaWait.FENCED)
    assert log.settled == [("a", ReplicaWait.PUT_OK), ("b", ReplicaWait.FENCED)]
    waits.acked(1000)
    waits.expire(100.0)
    assert len(log.settled) == 2 and len(waits) == 0


def test_a_settle_that_adds_a_wait_does_not_settle_anything_twice() -> None:
    waits = ReplicaWaits()
    seen: list[str] = []

    def first(outcome: ReplicaWait) -> None:
        seen.append("first")
        waits.add(50, 1.0, lambda o: seen.append("added"))

    waits.add(100, 1.0, first)
    waits.acked(100)
    assert seen == ["first"] and len(waits) == 1
    waits.acked(100)
    assert seen == ["first", "added"]


def test_many_waits_compact_as_they_are_acknowledged() -> None:
    waits = ReplicaWaits()
    count = [0]
    for i in range(5000):
        waits.add(i, 1.0, lambda o: count.__setitem__(0, count[0] + 1))
        if i % 7 == 6:
            waits.acked(i - 3)
    waits.acked(10**9)
    assert count[0] == 5000 and len(waits) == 0
    assert len(waits._by_offset) == 0  # nothing lingers once all are settled


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 50), st.integers(0, 20)),
        st.tuples(st.just("ack"), st.integers(-1, 60), st.just(0)),
        st.tuples(st.just("expire"), st.integers(0, 25), st.just(0)),
        st.tuples(st.just("fence"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_the_waits_behave_as_a_plain_list_of_them(actions: list[tuple[str, int, int]]) -> None:
    """Model: a list of (offset, arrival, deadline) not yet settled; an ack settles those at or below it in
    (offset, arrival) order; an expiry those whose deadline has passed in arrival order."""
    waits = ReplicaWaits()
    got: list[tuple[int, ReplicaWait]] = []
    want: list[tuple[int, ReplicaWait]] = []
    model: list[tuple[int, int, int]] = []
    for n, (action, a, b) in enumerate(actions):
        if action == "add":
            waits.add(a, float(b), lambda o, n=n: got.append((n, o)))
            model.append((a, n, b))
        elif action == "ack":
            done = sorted(w for w in model if w[0] <= a)
            want += [(w[1], ReplicaWait.PUT_OK) for w in done]
            model = [w for w in model if w[0] > a]
            highest = waits.acked(a)
            assert highest == (done[-1][0] if done else -1)
        elif action == "expire":
            done = sorted((w for w in model if w[2] <= a), key=lambda w: w[1])
            want += [(w[1], ReplicaWait.FLUSH_SLAVE_TIMEOUT) for w in done]
            model = [w for w in model if w[2] > a]
            waits.expire(float(a))
        else:
            want += [(w[1], ReplicaWait.FENCED) for w in sorted(model, key=lambda w: w[1])]
            model = []
            waits.settle_all(ReplicaWait.FENCED)
        assert len(waits) == len(model)
        expected_deadline = min((w[2] for w in model), default=None)
        assert waits.next_deadline() == (None if expected_deadline is None else float(expected_deadline))
    assert got == want
