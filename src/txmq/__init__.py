"""txmq: a message broker that speaks Apache RocketMQ's protocol, centred on transactional messages."""

__version__ = "0.1.0"
