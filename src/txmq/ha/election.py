"""Automatic failover decided without IO: one replica's view of its ``brokerName`` as held in etcd (the master's
leased record, the epoch history, the in-sync set), and what the replica does about it.

:class:`ReplicaController` is a state machine with an explicit table (:data:`TRANSITIONS`); the driver
(:mod:`txmq.broker.ha.controller`) feeds it what it read from etcd and the outcome of its requests, with times from
the injected clock, and carries out the effects it returns. etcd does the agreeing (a lease and a compare-and-swap
transaction); nothing here is a consensus protocol.

:func:`truncation_point` is RocketMQ 5's epoch-file rule: bytes a replica wrote under an epoch that a later epoch's
master never had (past where that master started) are cut before the replica follows again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from txmq.errors import TxmqError


class IllegalElectionTransition(TxmqError):
    """An input the controller's table does not allow in its state (a bug in the driver)."""


class EpochConflict(TxmqError):
    """This replica's epoch file disagrees with the history in etcd: it cannot tell which of its bytes are valid."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Epoch ``epoch`` began at commit-log offset ``start_offset`` (its master's log end when it was elected)."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The master of a brokerName as etcd holds it (under the master's lease)."""

    addr: str  # broker address, host:port (the replica's identity)
    ha_addr: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What etcd holds for one brokerName at one revision."""

    leader: LeaderRecord | None
    epoch: int  # the last epoch handed out, 0 before the first election
    history: tuple[EpochEntry, ...]
    sync_set: frozenset[str] | None  # None: never written (a new brokerName: any replica may be the first master)


def truncation_point(local: Sequence[EpochEntry], history: Sequence[EpochEntry]) -> int | None:
    """The offset this replica's commit log must be cut at before it follows the master of ``history``'s last
    epoch, or None when all its bytes are in that master's log too. ``local`` is the replica's epoch file: the epochs
    its bytes were written (or copied) under, with their start offsets."""
    if not local:
        return None
    last = local[-1]
    known = {e.epoch: e.start_offset for e in history}
    if last.epoch not in known:
        if any(e.epoch > last.epoch for e in history) or not history:
            raise EpochConflict(
                f"this replica's log ends in epoch {last.epoch}, which the controller's history "
                f"{[e.epoch for e in history]} does not have"
            )
        return None
    if known[last.epoch] != last.start_offset:
        raise EpochConflict(
            f"epoch {last.epoch} started at {last.start_offset} here but at {known[last.epoch]} in the controller"
        )
    later = [e.start_offset for e in history if e.epoch > last.epoch]
    return min(later) if later else None


class Role(enum.Enum):
    FOLLOWING = "following"  # a slave (knowing its master or waiting for one)
    CAMPAIGNING = "campaigning"  # the election transaction is out
    LEADING = "leading"  # the master, its lease renewed in time
    FENCED = "fenced"  # the master, but its lease may have expired: acknowledges nothing
    REJOINING = "rejoining"  # going back to a slave (truncating its tail first)
    CLOSED = "closed"


class Input(enum.Enum):
    OBSERVED = "observed"  # a fresh ClusterView
    WON = "won"
    LOST = "lost"
    RENEWED = "renewed"  # a lease keep-alive was answered
    LEASE_GONE = "lease-gone"  # etcd says the lease no longer exists
    TICK = "tick"
    REJOINED = "rejoined"  # the driver restarted the broker as a slave
    CLOSE = "close"


# (role, input) -> the roles that input may lead to; which one is decided by the method from the view and the time.
TRANSITIONS: dict[tuple[Role, Input], frozenset[Role]] = {
    (Role.FOLLOWING, Input.OBSERVED): frozenset({Role.FOLLOWING, Role.CAMPAIGNING, Role.REJOINING}),
    (Role.FOLLOWING, Input.TICK): frozenset({Role.FOLLOWING}),
    (Role.FOLLOWING, Input.CLOSE): frozenset({Role.CLOSED}),
    (Role.CAMPAIGNING, Input.WON): frozenset({Role.LEADING}),
    (Role.CAMPAIGNING, Input.LOST): frozenset({Role.FOLLOWING}),
    (Role.CAMPAIGNING, Input.TICK): frozenset({Role.CAMPAIGNING}),
    (Role.CAMPAIGNING, Input.CLOSE): frozenset({Role.CLOSED}),
    (Role.LEADING, Input.OBSERVED): frozenset({Role.LEADING, Role.FENCED, Role.CAMPAIGNING, Role.REJOINING}),
    (Role.LEADING, Input.RENEWED): frozenset({Role.LEADING}),
    (Role.LEADING, Input.LEASE_GONE): frozenset({Role.FENCED}),
    (Role.LEADING, Input.TICK): frozenset({Role.LEADING, Role.FENCED}),
    (Role.LEADING, Input.CLOSE): frozenset({Role.CLOSED}),
    (Role.FENCED, Input.OBSERVED): frozenset({Role.FENCED, Role.CAMPAIGNING, Role.REJOINING}),
    (Role.FENCED, Input.RENEWED): frozenset({Role.FENCED}),  # too late: the lease may be gone; the view decides
    (Role.FENCED, Input.LEASE_GONE): frozenset({Role.FENCED}),
    (Role.FENCED, Input.TICK): frozenset({Role.FENCED}),
    (Role.FENCED, Input.CLOSE): frozenset({Role.CLOSED}),
    (Role.REJOINING, Input.REJOINED): frozenset({Role.FOLLOWING}),
    (Role.REJOINING, Input.TICK): frozenset({Role.REJOINING}),
    (Role.REJOINING, Input.OBSERVED): frozenset({Role.REJOINING}),
    (Role.REJOINING, Input.CLOSE): frozenset({Role.CLOSED}),
}


# -- effects


@dataclass(frozen=True, slots=True)
class Campaign:
    """Stop copying from any master, then run the election transaction with the log's end as the epoch's start;
    compare against ``view`` (the revisions it was read at) and feed :meth:`ReplicaController.won` or ``lost``."""

    epoch: int  # the epoch to take (view.epoch + 1)


@dataclass(frozen=True, slots=True)
class BecomeMaster:
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class Follow:
    """Copy from this master (the epoch file is consistent with it: record ``history`` as this replica's)."""

    leader: LeaderRecord
    history: tuple[EpochEntry, ...]


@dataclass(frozen=True, slots=True)
class Rejoin:
    """Restart as a slave of ``leader`` after cutting the commit log at ``truncate_at`` (None: no cut)."""

    leader: LeaderRecord | None
    truncate_at: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Fence:
    reason: str


@dataclass(frozen=True, slots=True)
class PublishSyncSet:
    members: frozenset[str]


Effect = Campaign | BecomeMaster | Follow | Rejoin | Fence | PublishSyncSet


class ReplicaController:
    """One replica (identified by its broker address) of one brokerName.

    Times are the clock's monotonic seconds. ``lease_ttl`` is the etcd lease's TTL; a master considers itself fenced
    once ``fence_after`` seconds passed since it *sent* the last keep-alive that was answered (etcd restarts the TTL
    no earlier than it received that request, so the master stops acknowledging before etcd can elect another)."""

    def __init__(self, *, me: str, local_epochs: Sequence[EpochEntry], lease_ttl: float, fence_after: float) -> None:
        if not 0 < fence_after < lease_ttl:
            raise ValueError(f"fence_after ({fence_after}) must be below the lease TTL ({lease_ttl})")
        self.me = me
        self.local_epochs: list[EpochEntry] = list(local_epochs)
        self.lease_ttl = lease_ttl
        self.fence_after = fence_after
        self.role = Role.FOLLOWING
        self.epoch = 0  # the epoch this replica leads (LEADING/FENCED) or last followed
        self.following: LeaderRecord | None = None
        self.lease_valid_until = 0.0
        self.serving_as_master = False  # the broker runs as a master (from BecomeMaster until it rejoins)
        self.fence_reason = ""

    def _move(self, event: Input, target: Role) -> None:
        allowed = TRANSITIONS.get((self.role, event))
        if allowed is None or target not in allowed:
            raise IllegalElectionTransition(f"election: {event.value} in role {self.role.value} -> {target.value}")
        self.role = target

    def _check(self, event: Input) -> None:
        if (self.role, event) not in TRANSITIONS:
            raise IllegalElectionTransition(f"election: {event.value} in role {self.role.value}")

    @property
    def acknowledging(self) -> bool:
        """True while this replica may acknowledge writes as the master."""
        return self.role is Role.LEADING

    # -- inputs

    def observed(self, view: ClusterView, now: float, *, log_end: int, in_sync: Iterable[str] = ()) -> list[Effect]:
        """A fresh read of etcd. ``log_end``: this replica's commit-log end; ``in_sync``: (a master) the slaves that
        have everything acknowledged so far."""
        self._check(Input.OBSERVED)
        if self.role is Role.REJOINING:
            self._move(Input.OBSERVED, Role.REJOINING)
            return []
        leader = view.leader
        if self.role is Role.FOLLOWING:
            if leader is None:
                if view.sync_set is None or self.me in view.sync_set:
                    self._move(Input.OBSERVED, Role.CAMPAIGNING)
                    return [Campaign(view.epoch + 1)]
                self._move(Input.OBSERVED, Role.FOLLOWING)
                return []
            if leader.addr == self.me:
                # A master record naming this replica while it is a slave: a lease this process no longer holds
                # (a restart within the TTL). Wait for it to expire, then campaign.
                self._move(Input.OBSERVED, Role.FOLLOWING)
                return []
            cut = truncation_point(self.local_epochs, view.history)
            if cut is not None and cut < log_end:
                self._move(Input.OBSERVED, Role.REJOINING)
                return [Rejoin(leader, cut, f"epoch {leader.epoch} began at {cut}; this log ends at {log_end}")]
            if self.serving_as_master:  # a master that lost its campaign: restart as a slave
                self._move(Input.OBSERVED, Role.REJOINING)
                return [Rejoin(leader, None, f"{leader.addr} won epoch {leader.epoch}")]
            self._move(Input.OBSERVED, Role.FOLLOWING)
            if leader == self.following:
                return []
            self.following = leader
            self.epoch = leader.epoch
            history = tuple(e for e in view.history if e.epoch <= leader.epoch)
            self.local_epochs = list(history)
            return [Follow(leader, history)]
        # LEADING or FENCED
        mine = leader is not None and leader.addr == self.me and leader.epoch == self.epoch
        if mine:
            if self.role is Role.FENCED:
                self._move(Input.OBSERVED, Role.FENCED)  # the record outlives the lease by at most the TTL
                return []
            self._move(Input.OBSERVED, Role.LEADING)
            wanted = frozenset({self.me, *in_sync})
            return [PublishSyncSet(wanted)] if view.sync_set != wanted else []
        if leader is None:
            effects: list[Effect] = []
            if self.role is Role.LEADING:
                effects.append(self._fence("the master record is gone from the controller (lease expired)"))
            # Nobody leads: this replica was the master, so it is in the sync set unless another was elected.
            if view.sync_set is None or self.me in view.sync_set:
                self._move(Input.OBSERVED, Role.CAMPAIGNING)
                return [*effects, Campaign(view.epoch + 1)]
            self._move(Input.OBSERVED, Role.FENCED)
            return effects
        # Another master (or this one at another epoch): step down and rejoin as its slave.
        effects = [self._fence(f"{leader.addr} is the master at epoch {leader.epoch}")] if self.acknowledging else []
        self._move(Input.OBSERVED, Role.REJOINING)
        cut = truncation_point(self.local_epochs, view.history)
        return [*effects, Rejoin(leader, cut if cut is not None and cut < log_end else None, "another master")]

    def _fence(self, reason: str) -> Fence:
        self.fence_reason = reason
        return Fence(reason)

    def won(self, epoch: int, start_offset: int, now: float, lease_sent_at: float) -> list[Effect]:
        self._move(Input.WON, Role.LEADING)
        self.epoch = epoch
        self.following = None
        self.serving_as_master = True
        self.lease_valid_until = lease_sent_at + self.fence_after
        self.local_epochs.append(EpochEntry(epoch, start_offset))
        self.fence_reason = ""
        return [BecomeMaster(epoch, start_offset)]

    def lost(self) -> list[Effect]:
        self._move(Input.LOST, Role.FOLLOWING)
        self.following = None  # resume copying from whoever leads (the next view says)
        return []

    def renewed(self, sent_at: float) -> list[Effect]:
        self._check(Input.RENEWED)
        if self.role is Role.LEADING:
            self.lease_valid_until = max(self.lease_valid_until, sent_at + self.fence_after)
        self._move(Input.RENEWED, self.role)
        return []

    def lease_gone(self) -> list[Effect]:
        self._check(Input.LEASE_GONE)
        if self.role is Role.LEADING:
            self._move(Input.LEASE_GONE, Role.FENCED)
            return [self._fence("the controller says this master's lease expired")]
        self._move(Input.LEASE_GONE, Role.FENCED)
        return []

    def tick(self, now: float) -> list[Effect]:
        self._check(Input.TICK)
        if self.role is Role.LEADING and now >= self.lease_valid_until:
            self._move(Input.TICK, Role.FENCED)
            return [self._fence(f"the lease was not renewed for {self.fence_after:.1f} s")]
        self._move(Input.TICK, self.role)
        return []

    def rejoined(self, leader: LeaderRecord | None, local_epochs: Sequence[EpochEntry]) -> list[Effect]:
        self._move(Input.REJOINED, Role.FOLLOWING)
        self.serving_as_master = False
        self.local_epochs = list(local_epochs)
        self.following = None
        self.epoch = leader.epoch if leader is not None else self.epoch
        return []

    def close(self) -> None:
        self._move(Input.CLOSE, Role.CLOSED)
