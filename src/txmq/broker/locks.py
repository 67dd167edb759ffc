"""Queue locks for orderly consumption (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ), with RocketMQ's 60 s lifetime."""

from __future__ import annotations

from dataclasses import dataclass

LOCK_MAX_LIVE_SECONDS = 60.0

QueueKey = tuple[str, str, int]  # topic, brokerName, queueId


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_update: float


class QueueLockManager:
    """Per group, which client holds which queue. Times are the caller's monotonic seconds."""

    def __init__(self, lifetime_seconds: float = LOCK_MAX_LIVE_SECONDS) -> None:
        self.lifetime = lifetime_seconds
        self._locks: dict[str, dict[QueueKey, _Lock]] = {}

    def _live(self, lock: _Lock | None, now: float) -> bool:
        return lock is not None and now - lock.last_update <= self.lifetime

    def try_lock(self, group: str, client_id: str, queues: list[QueueKey], now: float) -> list[QueueKey]:
        """Lock what is free or expired (or already ours); return every requested queue this client now holds."""
        table = self._locks.setdefault(group, {})
        held = []
        for mq in queues:
            lock = table.get(mq)
            if lock is None or lock.client_id == client_id or not self._live(lock, now):
                table[mq] = _Lock(client_id, now)
                held.append(mq)
        return held

    def unlock(self, group: str, client_id: str, queues: list[QueueKey]) -> None:
        table = self._locks.get(group, {})
        for mq in queues:
            lock = table.get(mq)
            if lock is not None and lock.client_id == client_id:
                del table[mq]

    def holder(self, group: str, mq: QueueKey, now: float) -> str | None:
        lock = self._locks.get(group, {}).get(mq)
        return lock.client_id if self._live(lock, now) else None
