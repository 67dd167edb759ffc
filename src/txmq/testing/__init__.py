"""Test tools shipped with txmq (as ``trio.testing`` is with trio): a fake clock, polling with one timeout,
waiting for a broker's background services, in-memory connections, an in-process broker, a small disk that fills
up, and real ``txmq dev`` and broker processes on loopback.

Nothing here imports pytest.
"""

from txmq.broker.ha.etcd_process import EtcdServer, etcd_binary
from txmq.testing._broker import InProcessBroker, wait_idle
from txmq.testing._clock import FakeClock, settle
from txmq.testing._disk import fill, small_tmpfs, tmpfs_unavailable
from txmq.testing._eventually import DEFAULT_TIMEOUT, aeventually, eventually
from txmq.testing._memory import MemoryTransport, memory_connection_pair
from txmq.testing._processes import DevCluster, ExtraBroker, NameServerProcess, free_port

__all__ = [
    "DEFAULT_TIMEOUT",
    "DevCluster",
    "EtcdServer",
    "ExtraBroker",
    "FakeClock",
    "InProcessBroker",
    "MemoryTransport",
    "NameServerProcess",
    "aeventually",
    "etcd_binary",
    "eventually",
    "fill",
    "free_port",
    "memory_connection_pair",
    "settle",
    "small_tmpfs",
    "tmpfs_unavailable",
    "wait_idle",
]
