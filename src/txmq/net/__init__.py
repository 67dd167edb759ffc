"""asyncio connections over the remoting codec: :class:`Server`, :func:`connect`, :class:`Connection`, routing.

Both ends use the same :class:`Connection`, so a server can send requests to a client on the client's own socket
(transaction checks). Handlers never block the read loop: responses are written as handlers finish, by opaque.
"""

from txmq.net.connection import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_WRITE_BUFFER_HIGH,
    CloseCallback,
    Connection,
    RequestHandler,
    connect,
)
from txmq.net.dispatcher import Dispatcher, Hook
from txmq.net.loop import install_event_loop
from txmq.net.server import Server

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_WRITE_BUFFER_HIGH",
    "CloseCallback",
    "Connection",
    "Dispatcher",
    "Hook",
    "RequestHandler",
    "Server",
    "connect",
    "install_event_loop",
]
