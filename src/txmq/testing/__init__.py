"""Test tools shipped with txmq (as ``trio.testing`` is with trio): a fake clock, polling with one timeout,
waiting for a broker's background services, in-memory connections and an in-process broker.

Nothing here imports pytest.
"""

from txmq.testing._broker import InProcessBroker, wait_idle
from txmq.testing._clock import FakeClock, settle
from txmq.testing._eventually import DEFAULT_TIMEOUT, aeventually, eventually
from txmq.testing._memory import MemoryTransport, memory_connection_pair

__all__ = [
    "DEFAULT_TIMEOUT",
    "FakeClock",
    "InProcessBroker",
    "MemoryTransport",
    "aeventually",
    "eventually",
    "memory_connection_pair",
    "settle",
    "wait_idle",
]
