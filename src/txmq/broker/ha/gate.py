"""What a broker's role asks of a write that an acknowledgement depends on, whichever door or service made it.

One object per broker (``app.replica_gate``), read at the moment of each write, so a promotion changes every user at
once: the 4.x door's sends, END_TRANSACTION's committed copy and op marker, the delay service's re-puts and the gRPC
door all ask it the same two questions.

* :meth:`ReplicaGate.refusal`: may this broker take a write at all? A slave may not (RocketMQ's meaning of
  SLAVE_NOT_AVAILABLE); a fenced master may not (its tail may be cut when it rejoins).
* :meth:`ReplicaGate.replicated`: has every slave that must have the log up to ``offset`` got it durably? Only a
  SYNC_MASTER waits; anything else answers PUT_OK at once.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from txmq.broker.ha.master import ReplicaWait

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig
    from txmq.broker.ha.master import HaMaster
    from txmq.store.message_store import MessageStore


class Refusal(enum.Enum):
    SLAVE = "SLAVE"  # this broker is a slave: writes go to its master
    FENCED = "FENCED"  # a master whose controller lease may have lapsed


class ReplicaGate:
    def __init__(self, config: BrokerConfig, store: MessageStore) -> None:
        self.config = config
        self.store = store
        self.master: HaMaster | None = None  # set while this broker is a master with an HA port

    def refusal(self) -> tuple[Refusal, str] | None:
        """Why this broker must take no write now, or None."""
        if self.config.is_slave:
            return Refusal.SLAVE, (
                f"this broker ({self.config.broker_addr}) is a SLAVE of {self.config.broker_name}: it takes no "
                "writes; send to its master"
            )
        master = self.master
        if master is not None:
            reason = master.fence_reason()
            if reason:
                return Refusal.FENCED, (
                    f"this master is fenced ({reason}); it acknowledges nothing until the controller confirms a "
                    "master: retry, the route will name the new one"
                )
        return None

    @property
    def waits(self) -> bool:
        """True when writes wait for a slave (a SYNC_MASTER)."""
        return self.master is not None and self.config.broker_role == "SYNC_MASTER"

    async def replicated(self, offset: int | None = None) -> ReplicaWait:
        """Wait until the slaves that must have it hold the commit log durably up to ``offset`` (default: the log's
        end now, which covers every append already stored)."""
        master = self.master
        if master is None or self.config.broker_role != "SYNC_MASTER":
            return ReplicaWait.PUT_OK
        end = self.store.max_physical_offset() if offset is None else offset
        return await master.wait_replicated(end, self.config.sync_flush_timeout / 1000)
