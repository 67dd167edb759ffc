"""The durable message store: commit log, consume queues, key index, checkpoint, recovery and retention."""
