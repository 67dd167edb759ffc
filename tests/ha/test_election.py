"""The controller's decisions without IO (txmq.ha.election): the table walked over every (role, input) pair, the
lease and fencing with explicit times (the fake clock's seconds), elections, and the epoch-file truncation rule."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from txmq.ha.election import (
    TRANSITIONS,
    BecomeMaster,
    Campaign,
    ClusterView,
    EpochConflict,
    EpochEntry,
    Fence,
    Follow,
    IllegalElectionTransition,
    Input,
    LeaderRecord,
    PublishSyncSet,
    Rejoin,
    ReplicaController,
    Role,
    truncation_point,
)
from txmq.testing import FakeClock

ME, OTHER = "10.0.0.1:10911", "10.0.0.2:10911"
TTL, FENCE_AFTER = 3.0, 2.0


def view(
    leader: LeaderRecord | None = None,
    epoch: int = 0,
    history: tuple[EpochEntry, ...] = (),
    sync: frozenset[str] | None = None,
) -> ClusterView:
    return ClusterView(leader, epoch, history, sync)


def controller(local: tuple[EpochEntry, ...] = ()) -> ReplicaController:
    return ReplicaController(me=ME, local_epochs=list(local), lease_ttl=TTL, fence_after=FENCE_AFTER)


def leading(clock: FakeClock) -> ReplicaController:
    c = controller()
    assert c.observed(view(), clock.monotonic(), log_end=0) == [Campaign(1)]
    assert c.won(1, 0, clock.monotonic(), clock.monotonic()) == [BecomeMaster(1, 0)]
    return c


MINE = LeaderRecord(ME, "10.0.0.1:10912", 1)
THEIRS = LeaderRecord(OTHER, "10.0.0.2:10912", 2)


def in_role(role: Role, clock: FakeClock) -> ReplicaController:
    if role is Role.FOLLOWING:
        return controller()
    if role is Role.CAMPAIGNING:
        c = controller()
        c.observed(view(), clock.monotonic(), log_end=0)
        return c
    c = leading(clock)
    if role is Role.LEADING:
        return c
    if role is Role.FENCED:
        c.tick(clock.monotonic() + FENCE_AFTER)
        return c
    if role is Role.REJOINING:
        c.observed(view(THEIRS, 2, (EpochEntry(1, 0), EpochEntry(2, 0)), frozenset({OTHER})), 0.0, log_end=0)
        return c
    c.close()
    return c


def inputs(clock: FakeClock) -> dict[Input, list[Callable[[ReplicaController], object]]]:
    t = clock.monotonic()
    hist = (EpochEntry(1, 0), EpochEntry(2, 100))
    return {
        Input.OBSERVED: [
            lambda c: c.observed(view(), t, log_end=0),
            lambda c: c.observed(view(sync=frozenset({OTHER})), t, log_end=0),
            lambda c: c.observed(view(MINE, 1, hist[:1], frozenset({ME})), t, log_end=0),
            lambda c: c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), t, log_end=50),
            lambda c: c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), t, log_end=150),
        ],
        Input.WON: [lambda c: c.won(1, 0, t, t)],
        Input.LOST: [lambda c: c.lost()],
        Input.RENEWED: [lambda c: c.renewed(t)],
        Input.LEASE_GONE: [lambda c: c.lease_gone()],
        Input.TICK: [lambda c: c.tick(t), lambda c: c.tick(t + 10)],
        Input.REJOINED: [lambda c: c.rejoined(THEIRS, list(hist))],
        Input.CLOSE: [lambda c: c.close()],
    }


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("event", list(Input))
def test_every_role_and_input_follows_the_table(role: Role, event: Input) -> None:
    clock = FakeClock()
    for apply in inputs(clock)[event]:
        c = in_role(role, clock)
        allowed = TRANSITIONS.get((role, event))
        if allowed is None:
            with pytest.raises(IllegalElectionTransition):
                apply(c)
            assert c.role is role  # a refused input changes nothing
        else:
            apply(c)
            assert c.role in allowed, (role, event, c.role)


def test_a_new_brokername_elects_the_first_replica_that_campaigns_and_the_other_follows() -> None:
    clock = FakeClock()
    a = leading(clock)
    assert a.role is Role.LEADING and a.acknowledging
    assert a.local_epochs == [EpochEntry(1, 0)]
    b = ReplicaController(me=OTHER, local_epochs=[], lease_ttl=TTL, fence_after=FENCE_AFTER)
    seen = view(MINE, 1, (EpochEntry(1, 0),), frozenset({ME}))
    assert b.observed(seen, 0.0, log_end=0) == [Follow(MINE, (EpochEntry(1, 0),))]
    assert b.observed(seen, 0.5, log_end=0) == []  # already following: nothing to do
    assert b.local_epochs == [EpochEntry(1, 0)]


def test_a_slave_outside_the_in_sync_set_never_campaigns() -> None:
    c = controller()
    assert c.observed(view(sync=frozenset({OTHER})), 0.0, log_end=0) == []
    assert c.role is Role.FOLLOWING
    assert c.observed(view(sync=frozenset({OTHER, ME})), 0.0, log_end=0) == [Campaign(1)]


async def test_the_master_fences_itself_before_its_lease_can_expire_unless_renewed() -> None:
    clock = FakeClock()
    c = leading(clock)
    await clock.advance(1.0)
    assert c.renewed(clock.monotonic()) == []  # sent at 1.0: valid until 3.0
    await clock.advance(1.9)
    assert c.tick(clock.monotonic()) == [] and c.acknowledging
    await clock.advance(0.1)
    effects = c.tick(clock.monotonic())
    assert effects == [Fence("the lease was not renewed for 2.0 s")]
    assert c.role is Role.FENCED and not c.acknowledging
    # An answer to a keep-alive sent earlier does not unfence: only a fresh view (or a new election) decides.
    assert c.renewed(clock.monotonic() - 0.5) == [] and c.role is Role.FENCED


def test_a_lease_etcd_no_longer_has_fences_at_once() -> None:
    c = leading(FakeClock())
    assert c.lease_gone() == [Fence("the controller says this master's lease expired")]
    assert c.role is Role.FENCED


def test_a_fenced_master_campaigns_again_when_nobody_leads_and_it_is_still_in_sync() -> None:
    clock = FakeClock()
    c = leading(clock)
    c.tick(FENCE_AFTER)
    hist = (EpochEntry(1, 0),)
    assert c.observed(view(None, 1, hist, frozenset({ME})), 3.0, log_end=500) == [Campaign(2)]
    assert c.won(2, 500, 3.1, 3.0) == [BecomeMaster(2, 500)]
    assert c.acknowledging and c.local_epochs == [EpochEntry(1, 0), EpochEntry(2, 500)]


def test_a_master_whose_record_vanished_fences_and_campaigns_in_one_step() -> None:
    c = leading(FakeClock())
    effects = c.observed(view(None, 1, (EpochEntry(1, 0),), frozenset({ME, OTHER})), 1.0, log_end=10)
    assert effects == [Fence("the master record is gone from the controller (lease expired)"), Campaign(2)]
    assert c.role is Role.CAMPAIGNING and not c.acknowledging


def test_an_old_master_that_finds_another_master_rejoins_and_cuts_what_the_new_one_never_had() -> None:
    c = leading(FakeClock())  # epoch 1 from offset 0
    hist = (EpochEntry(1, 0), EpochEntry(2, 4096))
    effects = c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), 1.0, log_end=5000)
    assert effects == [Fence(f"{OTHER} is the master at epoch 2"), Rejoin(THEIRS, 4096, "another master")]
    assert c.role is Role.REJOINING
    assert c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), 1.5, log_end=5000) == []  # busy rejoining
    c.rejoined(THEIRS, [EpochEntry(1, 0)])
    assert c.role is Role.FOLLOWING and not c.serving_as_master
    # Cut to 4096 now: nothing more to cut, it follows and takes the controller's history as its own.
    assert c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), 2.0, log_end=4096) == [Follow(THEIRS, hist)]


def test_a_slave_ahead_of_the_new_master_rejoins_with_a_cut() -> None:
    c = controller((EpochEntry(1, 0),))
    hist = (EpochEntry(1, 0), EpochEntry(2, 700))
    effects = c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), 0.0, log_end=900)
    assert effects == [Rejoin(THEIRS, 700, "epoch 2 began at 700; this log ends at 900")]


def test_a_master_that_lost_its_campaign_restarts_as_a_slave() -> None:
    clock = FakeClock()
    c = leading(clock)
    c.tick(FENCE_AFTER)
    c.observed(view(None, 1, (EpochEntry(1, 0),), frozenset({ME})), 3.0, log_end=10)
    assert c.lost() == []
    hist = (EpochEntry(1, 0), EpochEntry(2, 10))
    assert c.observed(view(THEIRS, 2, hist, frozenset({OTHER})), 3.5, log_end=10) == [
        Rejoin(THEIRS, None, f"{OTHER} won epoch 2")
    ]


def test_the_master_publishes_the_in_sync_set_it_sees() -> None:
    c = leading(FakeClock())
    mine = view(MINE, 1, (EpochEntry(1, 0),), frozenset({ME}))
    assert c.observed(mine, 0.5, log_end=0, in_sync={OTHER}) == [PublishSyncSet(frozenset({ME, OTHER}))]
    grown = view(MINE, 1, (EpochEntry(1, 0),), frozenset({ME, OTHER}))
    assert c.observed(grown, 1.0, log_end=0, in_sync={OTHER}) == []
    assert c.observed(grown, 1.5, log_end=0, in_sync=()) == [PublishSyncSet(frozenset({ME}))]


def test_a_restarted_replica_waits_for_its_own_stale_record_to_expire() -> None:
    c = controller((EpochEntry(1, 0),))
    assert c.observed(view(MINE, 1, (EpochEntry(1, 0),), frozenset({ME, OTHER})), 0.0, log_end=10) == []
    assert c.role is Role.FOLLOWING


def test_fence_after_must_be_below_the_ttl() -> None:
    with pytest.raises(ValueError):
        ReplicaController(me=ME, local_epochs=[], lease_ttl=3, fence_after=3)


@pytest.mark.parametrize(
    ("local", "history", "cut"),
    [
        ((), (EpochEntry(1, 0),), None),  # a new replica has nothing to cut
        ((EpochEntry(1, 0),), (EpochEntry(1, 0),), None),  # still the current epoch
        ((EpochEntry(1, 0),), (EpochEntry(1, 0), EpochEntry(2, 300)), 300),
        ((EpochEntry(1, 0),), (EpochEntry(1, 0), EpochEntry(2, 300), EpochEntry(3, 900)), 300),
        ((EpochEntry(1, 0), EpochEntry(2, 300)), (EpochEntry(1, 0), EpochEntry(2, 300), EpochEntry(3, 800)), 800),
        ((EpochEntry(5, 0),), (EpochEntry(3, 0),), None),  # etcd knows less (a lost write): keep everything
    ],
)
def test_truncation_point_follows_the_epoch_histories(
    local: tuple[EpochEntry, ...], history: tuple[EpochEntry, ...], cut: int | None
) -> None:
    assert truncation_point(local, history) == cut


@pytest.mark.parametrize(
    ("local", "history"),
    [
        ((EpochEntry(1, 0),), (EpochEntry(1, 50), EpochEntry(2, 300))),  # epoch 1 started elsewhere
        ((EpochEntry(2, 0),), (EpochEntry(1, 0), EpochEntry(3, 300))),  # epoch 2 unknown, later ones exist
        ((EpochEntry(2, 0),), ()),  # no history at all (etcd wiped)
    ],
)
def test_an_epoch_file_that_disagrees_with_the_controller_is_refused(
    local: tuple[EpochEntry, ...], history: tuple[EpochEntry, ...]
) -> None:
    with pytest.raises(EpochConflict):
        truncation_point(local, history)
