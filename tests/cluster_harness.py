"""The real-process harness now lives in ``txmq.testing`` (the fault campaign uses it too); kept as an import path."""

from txmq.testing._processes import READY_LINE, DevCluster, ExtraBroker, free_port

__all__ = ["READY_LINE", "DevCluster", "ExtraBroker", "free_port"]
