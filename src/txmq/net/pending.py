"""A response that comes later, without a future: what a handler returns when its answer waits for something (the
store's group commit, a slave's acknowledgement) and nothing else needs to await it.

A future of asyncio hands each of its callbacks to the event loop, to run on a later turn: a send answered through
a future cost a future, two scheduled callbacks (the request timing's and the connection's) and a loop turn between
the store's answer and the response being written. :class:`Pending` calls its callbacks at once, in the order they
were added, from whoever settles it (the callback that completes the writer's group, on the event loop).

A callback is called as ``callback(response, error)``: ``error`` is None, or the exception that settled it instead
of a response. One callback's failure is logged and does not keep the others from running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("txmq.net")

Then = Callable[[Any, "BaseException | None"], None]


class Pending:
    """A response to come: :meth:`then` adds a callback, :meth:`resolve` or :meth:`fail` settles it once."""

    __slots__ = ("_callbacks", "done", "error", "response")

    def __init__(self) -> None:
        self._callbacks: list[Then] = []
        self.done = False
        self.response: Any = None
        self.error: BaseException | None = None

    def then(self, callback: Then) -> None:
        """Call ``callback(response, error)`` once settled (at once when it already is)."""
        if self.done:
            _call(callback, self.response, self.error)
        else:
            self._callbacks.append(callback)

    def resolve(self, response: Any) -> None:
        """Settle with ``response`` (a RemotingCommand, or None for no answer); a second settling is ignored."""
        self._settle(response, None)

    def fail(self, error: BaseException) -> None:
        """Settle with ``error`` instead of a response; a second settling is ignored."""
        self._settle(None, error)

    def _settle(self, response: Any, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        self.response = response
        self.error = error
        callbacks = self._callbacks
        self._callbacks = []
        for callback in callbacks:
            _call(callback, response, error)

    def as_future(self) -> asyncio.Future[Any]:
        """A future of the response, for code that awaits (tests, the rare caller that is not a connection)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.then(_SettleFuture(future))
        return future

    def __repr__(self) -> str:
        state = "pending" if not self.done else ("failed" if self.error is not None else "resolved")
        return f"<Pending {state}>"


class _SettleFuture:
    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def __call__(self, response: Any, error: BaseException | None) -> None:
        future = self.future
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(response)


def _call(callback: Then, response: Any, error: BaseException | None) -> None:
    try:
        callback(response, error)
    except Exception:
        log.exception("a pending response's callback %r failed", callback)
