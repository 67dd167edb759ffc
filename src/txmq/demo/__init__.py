"""Runnable demonstrations of txmq (``txmq demo ...``)."""
