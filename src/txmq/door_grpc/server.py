"""The gRPC door's server: a ``grpc.aio`` server on h2c (plaintext HTTP/2) in the broker's event loop, serving
:class:`~txmq.door_grpc.service.MessagingDoor` on ``grpcListenPort``."""

from __future__ import annotations

import logging

import grpc

from txmq.door_grpc.pb import service_pb2_grpc
from txmq.door_grpc.service import MessagingDoor

log = logging.getLogger("txmq.door_grpc")

# Room above the largest body for the rest of a SendMessage request, so that a body just over the limit gets
# MESSAGE_BODY_TOO_LARGE from the door rather than RESOURCE_EXHAUSTED from gRPC.
REQUEST_OVERHEAD_BYTES = 1 << 20
SHUTDOWN_GRACE_SECONDS = 1.0


class GrpcDoor:
    def __init__(self, door: MessagingDoor, *, host: str, port: int, max_message_size: int) -> None:
        self.door = door
        self.host = host
        self.port = port
        self.max_request_bytes = max_message_size + REQUEST_OVERHEAD_BYTES
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port (the one picked when ``port`` is 0)."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ]
        )
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.door, server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"the gRPC door cannot listen on {address}")
        await server.start()
        self._server = server
        self.port = port
        return port

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_SECONDS)
            self._server = None
