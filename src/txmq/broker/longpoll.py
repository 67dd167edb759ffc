"""Long polling: PULL requests that found nothing wait here until their queue grows or their time runs out."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txmq.clock import Clock, TimerHandle

log = logging.getLogger("txmq.broker")


@dataclass(slots=True, eq=False)
class HeldPull:
    topic: str
    queue_id: int
    offset: int
    resume: Callable[[], None]  # re-runs the pull once without suspension and answers
    timer: TimerHandle | None = None
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class PullHoldService:
    """Parks pulls per ``(topic, queueId)``; the store's new-message notification or the clock wakes them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._held: dict[tuple[str, int], list[HeldPull]] = {}

    def hold(self, topic: str, queue_id: int, offset: int, timeout_s: float, resume: Callable[[], None]) -> HeldPull:
        held = HeldPull(topic, queue_id, offset, resume)
        self._held.setdefault((topic, queue_id), []).append(held)
        held.timer = self.clock.call_later(timeout_s, self._expire, held)
        return held

    def _fire(self, held: HeldPull) -> None:
        if held.done:
            return
        held.done = True
        if held.timer is not None:
            held.timer.cancel()
        try:
            held.resume()
        except Exception:  # a failing resume must not stop the others from being woken
            log.exception("resuming a held pull on %s:%d failed", held.topic, held.queue_id)

    def _expire(self, held: HeldPull) -> None:
        waiting = self._held.get((held.topic, held.queue_id))
        if waiting is not None:
            try:
                waiting.remove(held)
            except ValueError:
                pass
            if not waiting:
                del self._held[(held.topic, held.queue_id)]
        self._fire(held)

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        """New entries are visible up to ``max_offset`` (exclusive): wake the pulls waiting below it."""
        waiting = self._held.get((topic, queue_id))
        if not waiting:
            return
        ready = [h for h in waiting if h.offset < max_offset]
        if not ready:
            return
        rest = [h for h in waiting if h.offset >= max_offset]
        if rest:
            self._held[(topic, queue_id)] = rest
        else:
            del self._held[(topic, queue_id)]
        for held in ready:
            self._fire(held)

    def release_all(self) -> None:
        """Answer every held pull now (shutdown)."""
        everything = [h for hs in self._held.values() for h in hs]
        self._held.clear()
        for held in everything:
            self._fire(held)

    def held_count(self) -> int:
        return sum(len(v) for v in self._held.values())
