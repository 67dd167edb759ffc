"""Routing requests by code: :class:`Dispatcher` maps request codes to processors, with hooks that run first."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from txmq.protocol.frame import RemotingCommand

if TYPE_CHECKING:
    from txmq.net.connection import Connection, RequestHandler

Hook = Callable[["Connection", RemotingCommand], "RemotingCommand | None"]
"""Runs before the processor. Returning a response answers the request without the processor (an ACL denial);
raising answers SYSTEM_ERROR with the exception text, as RocketMQ does for exceptions thrown by RPC hooks."""

_REQUEST_CODE_NOT_SUPPORTED = 3


class Dispatcher:
    """A :data:`RequestHandler` that picks a processor by ``cmd.code``.

    Unknown codes are answered ``REQUEST_CODE_NOT_SUPPORTED`` (3) with RocketMQ's remark
    ``" request type <code> not supported"`` (leading space included), unless a ``default`` processor is given.
    """

    def __init__(
        self,
        processors: Mapping[int, RequestHandler] | None = None,
        *,
        default: RequestHandler | None = None,
    ) -> None:
        self._processors: dict[int, RequestHandler] = {int(c): p for c, p in (processors or {}).items()}
        self._default = default
        self._hooks: list[Hook] = []

    def register(self, code: int, processor: RequestHandler) -> None:
        """Serve ``code`` with ``processor`` (replacing any earlier one)."""
        self._processors[int(code)] = processor

    def add_hook(self, hook: Hook) -> None:
        """Run ``hook(connection, cmd)`` before every processor, in the order hooks were added."""
        self._hooks.append(hook)

    @property
    def codes(self) -> frozenset[int]:
        return frozenset(self._processors)

    def __call__(self, connection: Any, cmd: RemotingCommand) -> Any:  # a Connection (tests pass None)
        for hook in self._hooks:
            answer = hook(connection, cmd)
            if answer is not None:
                return answer
        processor = self._processors.get(cmd.code, self._default)
        if processor is None:
            return cmd.response(_REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        return processor(connection, cmd)
