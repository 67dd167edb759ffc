"""txmq: a message broker that speaks Apache RocketMQ's protocol, centred on transactional messages."""

# Before any other txmq module: picks the compiled hot path or its .py sources (TXMQ_PURE_PYTHON=1).
from txmq import _hotpath  # noqa: F401

__version__ = "0.1.0"
