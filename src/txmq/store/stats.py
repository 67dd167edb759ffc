"""Store statistics: puts, bytes, flushes, flush latency and group sizes.

Counters are written by the append pipeline's thread only and read from anywhere; a reader may see a snapshot that
is a few updates old, which is fine for monitoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class Histogram:
    """Counts in power-of-two buckets: bucket ``i`` holds values in ``[2**(i-1), 2**i)`` (bucket 0 holds 0)."""

    __slots__ = ("buckets", "count", "max", "total")

    def __init__(self, buckets: int = 40) -> None:
        self.buckets = [0] * buckets
        self.count = 0
        self.total = 0
        self.max = 0

    def add(self, value: int) -> None:
        i = value.bit_length() if value > 0 else 0
        buckets = self.buckets
        buckets[i if i < len(buckets) else -1] += 1
        self.count += 1
        self.total += value
        if value > self.max:
            self.max = value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def percentile(self, p: float) -> int:
        """Upper bound of the bucket holding the ``p``-th percentile (0 when empty); exact to within a factor of 2."""
        if not self.count:
            return 0
        rank = p / 100.0 * self.count
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if n and seen >= rank:
                return min((1 << i) - 1 if i else 0, self.max)
        return self.max

    def snapshot(self) -> dict[str, object]:
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.percentile(50),
            "p99": self.percentile(99),
            "max": self.max,
            "buckets": {(1 << i) - 1 if i else 0: n for i, n in enumerate(self.buckets) if n},
        }


@dataclass(slots=True)
class StoreStats:
    """What the store has done since it was opened."""

    put_requests: int = 0  # put/put_many calls that were written
    put_messages: int = 0
    put_bytes: int = 0
    put_failures: int = 0
    groups: int = 0  # write groups (one write call sequence + one dispatch each)
    flushes: int = 0  # commit-log fdatasync calls
    group_waits: int = 0  # group-commit waits (groupCommitWaitMicros) the writer made
    flush_latency_us: Histogram = field(default_factory=Histogram)
    group_messages: Histogram = field(default_factory=Histogram)  # messages per group: the group-commit factor
    checkpoint_latency_us: Histogram = field(default_factory=Histogram)  # CQ + index flush + checkpoint file
    topic_puts: dict[str, int] = field(default_factory=dict)
    topic_bytes: dict[str, int] = field(default_factory=dict)  # record bytes stored per topic

    def snapshot(self) -> dict[str, object]:
        return {
            "put_requests": self.put_requests,
            "put_messages": self.put_messages,
            "put_bytes": self.put_bytes,
            "put_failures": self.put_failures,
            "groups": self.groups,
            "flushes": self.flushes,
            "group_waits": self.group_waits,
            "flush_latency_us": self.flush_latency_us.snapshot(),
            "group_messages": self.group_messages.snapshot(),
            "checkpoint_latency_us": self.checkpoint_latency_us.snapshot(),
            "topic_puts": dict(self.topic_puts),
            "topic_bytes": dict(self.topic_bytes),
        }
