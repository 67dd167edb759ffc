"""Compatibility tests that drive official RocketMQ clients against txmq."""
