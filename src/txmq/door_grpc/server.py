"""The gRPC door's server: a ``grpc.aio`` server on h2c (plaintext HTTP/2) in the broker's event loop, serving
:class:`~txmq.door_grpc.service.MessagingDoor` on ``grpcListenPort``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from txmq.door_grpc.pb import service_pb2
from txmq.door_grpc.service import Malformed, MessagingDoor

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
        server.add_generic_rpc_handlers((messaging_handlers(self.door),))
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises when the address is taken
            port, problem = 0, str(exc)
        else:
            problem = "address in use?"
        if port == 0:
            raise OSError(f"the gRPC door cannot listen on {address} ({problem}); grpcListenPort=0 turns it off")
        await server.start()
        self._server = server
        self.port = port
        return port

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_SECONDS)
            self._server = None


def _tolerant(message_class: type[Message]) -> Callable[[bytes], Any]:
    """A request parser that hands a malformed request to the method as :class:`Malformed` (answered with
    BAD_REQUEST in the RPC's own response) instead of failing the call with gRPC's UNKNOWN."""
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {name}: {exc}")

    return parse


def messaging_handlers(door: MessagingDoor) -> grpc.GenericRpcHandler:
    """``apache.rocketmq.v2.MessagingService``'s methods, as the generated registration builds them, but with
    tolerant request parsing."""
    service = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    handlers = {}
    for method in service.methods:
        parse = _tolerant(GetMessageClass(method.input_type))
        serialize = GetMessageClass(method.output_type).SerializeToString
        behaviour = getattr(door, method.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(behaviour, request_deserializer=parse, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
