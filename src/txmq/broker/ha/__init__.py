"""The asyncio driver of :mod:`txmq.ha`: a master's HA port (:mod:`.master`), a slave's link to its master and its
copies of the master's metadata (:mod:`.slave`)."""

from txmq.broker.ha.master import HaMaster, ReplicaWait
from txmq.broker.ha.slave import HaSlave

__all__ = ["HaMaster", "HaSlave", "ReplicaWait"]
