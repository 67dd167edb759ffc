"""The one exception hierarchy of txmq.

Every error txmq raises on purpose derives from :class:`TxmqError`. Errors that a broker answers over the wire carry
a RocketMQ response code and a remark a person can act on.
"""

from __future__ import annotations

import errno


class TxmqError(Exception):
    """Base class of every error txmq raises on purpose."""


class ProtocolError(TxmqError):
    """Bytes that do not follow RocketMQ's wire or record format."""


class RecordDecodeError(ProtocolError):
    """A commit-log record (or a batch body) that cannot be decoded."""


class FrameError(ProtocolError):
    """A remoting frame or header that cannot be decoded."""


class StoreError(TxmqError):
    """A failure of the message store."""


class StoreClosedError(StoreError):
    """The store was used after it was closed."""


class DiskFullError(StoreError):
    """The store's disk has no room for a new file: this append is refused, and the next one tries again."""


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error that caused it, is a full disk (or an exhausted quota)."""
    while exc is not None:
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
            return True
        exc = exc.__cause__
    return False


class CorruptStoreError(StoreError):
    """A store file whose content cannot be trusted (and could not be repaired)."""


class ConfigError(TxmqError):
    """A configuration value or file that is not valid."""


class FilterExpressionError(TxmqError):
    """A message-filter expression (RocketMQ's SQL92 selector) that cannot be compiled.

    ``expression`` is the text as given; ``column`` the 1-based position of the fault when it is known.
    """

    def __init__(self, message: str, expression: str | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.expression = expression
        self.column = column


class RemotingError(TxmqError):
    """A remote call failed: connection lost, timeout, or an error answer.

    ``code`` is the RocketMQ response code when the peer answered with one, else ``None``.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class RequestTimeoutError(RemotingError):
    """No response arrived within the timeout."""


class ConnectionClosedError(RemotingError):
    """The connection closed before the response arrived."""


class ConnectError(RemotingError):
    """A connection could not be established (refused, unreachable, or timed out)."""


# ---------------------------------------------------------------------------------------------------------------
# Client (txmq.client)


class MQClientError(TxmqError):
    """A client-side failure: bad arguments, a client used before start or after shutdown, nothing left to try."""


class NoRouteError(MQClientError):
    """The name server knows no route (no live broker) for a topic."""

    def __init__(self, topic: str, detail: str | None = None) -> None:
        message = f"No route info of this topic: {topic}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
        self.topic = topic


class MQBrokerError(RemotingError):
    """A broker or name server answered with an error code; the message carries its remark."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None) -> None:
        message = f"CODE: {code} DESC: {remark or ''}"
        if addr:
            message += f" BROKER: {addr}"
        super().__init__(message, code)
        self.remark = remark
        self.addr = addr
